//! `taper bench`: benchmarks that print figures.

use crate::Result;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {}

pub fn run(_args: &BenchArgs) -> Result<()> {
    Ok(())
}
