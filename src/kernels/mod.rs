//! taper's own kernels: fused operations as candle custom ops (GELU,
//! softmax, layer norm, rotary embedding, chunked cross-entropy), the fused AdamW update and
//! blockwise 8-bit quantization. Each has a CPU
//! implementation, which is both what CPU training runs and the reference
//! for the CUDA kernels in `kernels/*.cu` (still to come).

pub mod adamw;
mod chunked_ce;
mod gelu;
pub mod quant8;
mod rope;
mod rows;

pub use chunked_ce::chunked_cross_entropy;
pub use gelu::gelu;
pub use rope::rope_interleaved;
pub use rows::{layer_norm, softmax_last_dim};

/// The f32 values a CPU kernel reads: contiguous storage only (callers
/// make their inputs contiguous first).
fn f32_slice<'a>(
    s: &'a candle_core::CpuStorage,
    l: &candle_core::Layout,
    what: &str,
) -> candle_core::Result<&'a [f32]> {
    let candle_core::CpuStorage::F32(v) = s else {
        candle_core::bail!("{what}: expected an f32 tensor")
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => candle_core::bail!("{what}: expected a contiguous tensor"),
    }
}

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
