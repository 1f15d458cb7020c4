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
