//! taper's own kernels: fused operations as candle custom ops. Each has a
//! CPU implementation, which is both what CPU training runs and the
//! reference for the CUDA kernels in `kernels/*.cu` (still to come).

mod gelu;
mod rows;

pub use gelu::gelu;
pub use rows::{layer_norm, softmax_last_dim};

use std::sync::atomic::{AtomicBool, Ordering};

static FUSED: AtomicBool = AtomicBool::new(true);

/// Whether models use the fused kernels (default: yes). `taper bench
/// kernels` switches them off and on to compare within one process; the
/// binary reads `TAPER_FUSED_KERNELS=0` at start.
pub fn set_fused(on: bool) {
    FUSED.store(on, Ordering::Relaxed);
}

pub fn fused() -> bool {
    FUSED.load(Ordering::Relaxed)
}
