//! Memory: a counting global allocator and the malloc tuning the binary
//! applies at start (host), the driver's figures, pool trimming and the
//! `--mem-limit` ballast (device), the container's limit, OOM classification
//! and the planner.

pub mod container;
mod counting;
pub mod device;
pub mod inject;
mod malloc;
pub mod oom;
pub mod planner;

pub use counting::{CountingAlloc, HostMemory};
pub use malloc::tune_malloc;
pub use oom::{OomCause, OomError, Phase};
