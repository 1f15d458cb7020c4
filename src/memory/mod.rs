//! Host memory: a counting global allocator and the malloc tuning the binary
//! applies at start.

mod counting;
pub mod inject;
mod malloc;
pub mod oom;
pub mod planner;

pub use counting::{CountingAlloc, HostMemory};
pub use malloc::tune_malloc;
pub use oom::{OomCause, OomError, Phase};
