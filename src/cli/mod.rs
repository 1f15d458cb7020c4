//! The `taper` command line, declared in `args`, run by `train` and
//! `commands`.

pub mod args;
pub mod commands;
pub mod train;
