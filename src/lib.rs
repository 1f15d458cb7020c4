//! taper: a training host. Models train on candle; the training loop belongs to
//! a Lua recipe. See `../shared/DESIGN.md` in the project's shared folder and
//! `docs/design.md` for the shape of things.
//!
//! Embedding: create a [`Host`], register your own model constructors or data
//! sources under the `taper` Lua module, and run a recipe:
//!
//! ```no_run
//! let mut host = taper::Host::new(taper::HostOptions::default())?;
//! host.run_file("scripts/digits.lua".as_ref())?;
//! # Ok::<(), taper::Error>(())
//! ```

/// `eprintln!` that drops the line when stderr cannot be written (the
/// terminal closed: a hung-up terminal answers every write with an error)
/// instead of panicking, so the run still writes its checkpoint and exits
/// with its own code.
#[macro_export]
macro_rules! tell {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($t)*);
    }};
}

pub mod bench;
pub mod data;
pub mod dist;
pub mod engine;
mod error;
pub mod host;
pub mod interop;
pub mod kernels;
pub mod memory;
pub mod plugins;
pub mod quant;
pub mod report;
pub mod run;

pub use error::{Error, Result};
pub use host::{Host, HostOptions};
