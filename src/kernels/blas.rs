//! Row-major matrix products through cuBLAS for taper's CUDA ops (the
//! fused attention and the dense layer): operands where they lie in their
//! buffers, at any offset and row stride, optionally transposed, batched.

use candle_core::cuda_backend::cudarc::cublas::sys::cublasOperation_t as Op;
use candle_core::cuda_backend::cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView};
use candle_core::cuda_backend::WrapErr;
use candle_core::{Result, WithDType};

pub(super) use super::mat::Mat;

pub(super) fn int(x: usize) -> Result<i32> {
    i32::try_from(x).map_err(|_| candle_core::Error::Msg(format!("{x} is too large for cuBLAS")))
}

/// Row-major `c = alpha a b + beta c` (`a` is m x k, `b` k x n) for each
/// of `batch` matrices. cuBLAS is column-major, where a row-major matrix
/// reads as its transpose, so it is asked for `c^T = b^T a^T`.
#[allow(clippy::too_many_arguments)]
pub(super) fn product<T: WithDType>(
    blas: &CudaBlas,
    batch: usize,
    (m, n, k): (usize, usize, usize),
    (alpha, beta): (f64, f64),
    (a, am): (&CudaView<'_, T>, Mat),
    (b, bm): (&CudaView<'_, T>, Mat),
    (c, cm): (&mut CudaSlice<T>, Mat),
) -> Result<()>
where
    CudaBlas: Gemm<T>,
{
    let op = |m: Mat| {
        if m.t {
            Op::CUBLAS_OP_T
        } else {
            Op::CUBLAS_OP_N
        }
    };
    let cfg = StridedBatchedConfig {
        gemm: GemmConfig {
            transa: op(bm),
            transb: op(am),
            m: int(n)?,
            n: int(m)?,
            k: int(k)?,
            alpha: T::from_f64(alpha),
            lda: int(bm.ld)?,
            ldb: int(am.ld)?,
            beta: T::from_f64(beta),
            ldc: int(cm.ld)?,
        },
        batch_size: int(batch)?,
        stride_a: bm.stride as i64,
        stride_b: am.stride as i64,
        stride_c: cm.stride as i64,
    };
    let (a, b) = (a.slice(am.off..), b.slice(bm.off..));
    let mut c = c.slice_mut(cm.off..);
    // SAFETY: the callers (attention_cuda, dense_cuda) check the buffers'
    // lengths against their layouts, and every matrix at these offsets and
    // strides lies inside its buffer.
    unsafe { blas.gemm_strided_batched(cfg, &b, &a, &mut c) }.w()
}
