//! taper's own kernels: fused operations as candle custom ops (GELU, the
//! residual add, softmax, layer norm, bias add, dense layer, causal
//! attention, rotary embedding, chunked cross-entropy, the CNN's
//! convolution and 2x2 max-pool), the fused
//! AdamW update and blockwise 8-bit quantization. Each has a CPU
//! implementation, which is both what CPU training runs and the reference
//! for its CUDA kernel in `kernels/*.cu` (built with the `cuda` feature;
//! `tests/cuda_kernels.rs` compares the two on a GPU).

pub mod adamw;
pub mod adamw_mixed;
mod add;
mod attention;
mod attention_cpu;
#[cfg(feature = "cuda")]
mod attention_cuda;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod attention_plan;
mod bias;
#[cfg(feature = "cuda")]
mod blas;
mod ce_rows;
mod chunked_ce;
mod conv;
mod conv_cpu;
#[cfg(feature = "cuda")]
mod conv_cuda;
mod conv_grad;
#[cfg(feature = "cuda")]
mod cuda;
mod dense;
#[cfg(feature = "cuda")]
mod dense_cuda;
pub mod device_state;
mod dropout;
mod embedding;
#[cfg(feature = "cuda")]
mod flash;
mod gelu;
mod gelu_erf;
mod in_order;
mod layer_norm;
#[cfg(feature = "cuda")]
mod lt;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod mat;
mod norm;
mod padded_attention;
mod pool;
pub mod quant8;
mod relu;
mod rms_norm;
mod rope;
mod rows;
mod swiglu;
mod vexp;
mod weight_grad;

pub use add::{add, install as install_add};
pub use attention::{
    causal_attention, causal_attention_dropped, causal_mask, flash_attention, flash_attention_rows,
};
pub use bias::{bias_add, bias_grad};
pub use ce_rows::rows_loss_and_grad;
pub use chunked_ce::{chunked_cross_entropy, padded_head};
pub use conv::{conv2d, conv3x3};
pub use dense::{linear, linear_grads};
pub use dropout::{dropout, Dropout};
pub use embedding::embedding;
pub use gelu::{gelu, gelu_grad};
pub use gelu_erf::gelu_erf;
use in_order::sum_in_order;
pub use layer_norm::{layer_norm, layer_norm_grad};
pub use norm::{clip_factor, clip_factor_of, sum_squares, sum_squares_all};
pub use padded_attention::padded_attention;
pub use pool::max_pool2x2;
pub use relu::relu;
pub use rms_norm::rms_norm;
pub use rope::rope_interleaved;
pub use rows::softmax_last_dim;
pub use swiglu::swiglu;

/// Row-major `dst [m, n] = a(m x k) b(k x n) + (keep ? dst : 0)`, where each
/// operand is given with its (row stride, column stride); one thread. The
/// CPU kernels' (convolution, weight gradient) product.
#[allow(clippy::too_many_arguments)]
fn mm(
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    keep: bool,
    a: &[f32],
    (a_rs, a_cs): (usize, usize),
    b: &[f32],
    (b_rs, b_cs): (usize, usize),
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    debug_assert!(dst.len() >= m * n);
    // SAFETY: dst is m x n row-major (row stride n); a and b are read only
    // at (i, l) -> i * rs + l * cs within their m x k and k x n extents, which
    // the callers size exactly.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            keep,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

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

/// A kernel's output of `n` floats, written in parallel chunks of `chunk`
/// values (the last may be shorter) by `fill(chunk index, chunk)`, with no
/// zero-fill first: for the CNN's megabyte outputs, calloc's memset was a
/// tenth of the step.
///
/// # Safety
/// `fill` must write every value of each chunk it is given.
unsafe fn par_written(
    n: usize,
    chunk: usize,
    fill: impl Fn(usize, &mut [std::mem::MaybeUninit<f32>]) + Sync,
) -> Vec<f32> {
    use rayon::prelude::*;
    let mut v = Vec::with_capacity(n);
    if n > 0 {
        v.spare_capacity_mut()[..n]
            .par_chunks_mut(chunk.max(1))
            .enumerate()
            .for_each(|(i, s)| fill(i, s));
    }
    // SAFETY: the caller's `fill` wrote all n values.
    unsafe { v.set_len(n) };
    v
}

/// An element-wise kernel's output: `f(x chunk, output chunk)` over
/// chunks of `chunk` values, in parallel, with no zero-fill first.
///
/// # Safety
/// `f` must write every value of the output chunk it is given (as long as
/// its `x` chunk).
unsafe fn par_map_written(
    x: &[f32],
    chunk: usize,
    f: impl Fn(&[f32], &mut [std::mem::MaybeUninit<f32>]) + Sync,
) -> Vec<f32> {
    let chunk = chunk.max(1);
    let fill = |i: usize, o: &mut [std::mem::MaybeUninit<f32>]| f(&x[i * chunk..][..o.len()], o);
    // SAFETY: the caller's `f` writes every value of each chunk.
    unsafe { par_written(x.len(), chunk, fill) }
}

/// [`par_map_written`] over two inputs of one length (`what` names the op
/// in the error when they differ).
///
/// # Safety
/// As [`par_map_written`].
unsafe fn par_zip_written(
    what: &str,
    (x, g): (&[f32], &[f32]),
    chunk: usize,
    f: impl Fn(&[f32], &[f32], &mut [std::mem::MaybeUninit<f32>]) + Sync,
) -> candle_core::Result<Vec<f32>> {
    if x.len() != g.len() {
        candle_core::bail!("{what}: {} inputs but {} gradients", x.len(), g.len())
    }
    let chunk = chunk.max(1);
    let fill = |i: usize, o: &mut [std::mem::MaybeUninit<f32>]| {
        f(&x[i * chunk..][..o.len()], &g[i * chunk..][..o.len()], o)
    };
    // SAFETY: the caller's `f` writes every value of each chunk.
    Ok(unsafe { par_written(x.len(), chunk, fill) })
}

/// A chunk that [`par_written`]'s `fill` has written whole, as floats.
///
/// # Safety
/// Every value of `s` must be initialized.
unsafe fn written(s: &mut [std::mem::MaybeUninit<f32>]) -> &mut [f32] {
    // SAFETY: MaybeUninit<f32> has f32's layout, and the caller
    // guarantees that every value is initialized.
    unsafe { &mut *(s as *mut [std::mem::MaybeUninit<f32>] as *mut [f32]) }
}

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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

static FLASH: AtomicBool = AtomicBool::new(true);

/// Whether the causal attention uses the tiled kernel of
/// `kernels/flash.cu` on CUDA where it applies (f16 or bf16, heads of 16,
/// 32 or 64), instead of cuBLAS products over the scores. On by default:
/// on an H100 it was faster at every context measured, 64 to 1024
/// (docs/performance.md); the binary reads `TAPER_FLASH_ATTENTION=0` at
/// start to switch it off.
pub fn set_flash(on: bool) {
    FLASH.store(on, Ordering::Relaxed);
}

pub fn flash() -> bool {
    FLASH.load(Ordering::Relaxed)
}

static FLASH_ROWS: AtomicUsize = AtomicUsize::new(16);

/// Rows a warp of the tiled attention kernel owns: 16 (the default: 4
/// warps a block) or 32 (2 warps, each B operand loaded from shared memory
/// once for twice the products, FlashAttention-2's arrangement; more
/// registers a thread). Both are checked against float64 under emulation
/// (`tests/emulated_kernels.rs`) and against the CPU on a GPU; which is
/// faster has not yet been measured. The binary reads `TAPER_FLASH_ROWS=32`
/// at start. Other values are refused.
pub fn set_flash_rows(rows: usize) -> candle_core::Result<()> {
    if !matches!(rows, 16 | 32) {
        candle_core::bail!("flash attention: warps take 16 or 32 rows, not {rows}")
    }
    FLASH_ROWS.store(rows, Ordering::Relaxed);
    Ok(())
}

pub fn flash_rows() -> usize {
    FLASH_ROWS.load(Ordering::Relaxed)
}

static CUBLASLT: AtomicBool = AtomicBool::new(false);

/// Whether the dense layer's forward on CUDA (f16, bf16) runs as one
/// cuBLASLt product with the bias in its epilogue, instead of the bias rows
/// and a cuBLAS product onto them (`lt.rs`). Off by default until measured
/// on a GPU; the binary reads `TAPER_CUBLASLT=1` at start to switch it on.
pub fn set_cublaslt(on: bool) {
    CUBLASLT.store(on, Ordering::Relaxed);
}

pub fn cublaslt() -> bool {
    CUBLASLT.load(Ordering::Relaxed)
}

#[cfg(feature = "cuda")]
pub use lt::take_refused as cublaslt_refused;

/// Whether a fused op takes `x`: f32 on the CPU; f32, f16 or bf16 on CUDA
/// (in a build with the `cuda` feature). Elsewhere the ops fall back to
/// candle's composed, differentiable versions.
pub fn covers(x: &candle_core::Tensor) -> bool {
    use candle_core::{DType, Device};
    fused()
        && match x.device() {
            Device::Cpu => x.dtype() == DType::F32,
            Device::Cuda(_) => {
                cfg!(feature = "cuda") && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
            }
            Device::Metal(_) => false,
        }
}
