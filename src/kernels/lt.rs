//! The dense layer's forward through cuBLASLt (f16 and bf16 on CUDA): one
//! call computes `x W^T + b`, the bias added in the product's epilogue
//! (`CUBLASLT_EPILOGUE_BIAS`), as PyTorch's `F.linear` runs it. The cuBLAS
//! path (`dense_cuda.rs`) first writes the bias into every output row, and
//! its product reads them back (beta = 1): a write and a read of the whole
//! output that this saves. cudarc's `CudaBlasLT` asks cuBLASLt's heuristic
//! for the algorithm, with a 32 MiB workspace on Hopper.
//!
//! Off unless switched on ([`super::set_cublaslt`], `TAPER_CUBLASLT=1`):
//! it has not yet run on a GPU. `taper bench products --compare-cublaslt`
//! times both paths, and `tests/cuda_kernels.rs` checks this one against
//! the CPU. If cuBLASLt refuses a product (no algorithm for the shape), the
//! product takes the cuBLAS path, and the refusal is printed once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::cuda_backend::cudarc::cublaslt::{CudaBlasLT, Matmul, MatmulConfig};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView};
use candle_core::cuda_backend::DeviceId;
use candle_core::{CudaDevice, DType, Result, WithDType};

/// Byte alignment cuBLASLt's heuristic assumes of every operand by default
/// (`CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES`): views that start
/// elsewhere take the cuBLAS path.
const ALIGN: usize = 256;

/// One cuBLASLt handle (and workspace) per device, on its stream.
fn handle(dev: &CudaDevice) -> Result<Arc<CudaBlasLT>> {
    static HANDLES: OnceLock<Mutex<HashMap<DeviceId, Arc<CudaBlasLT>>>> = OnceLock::new();
    let mut map = HANDLES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(h) = map.get(&dev.id()) {
        return Ok(h.clone());
    }
    let h = Arc::new(
        CudaBlasLT::new(dev.cuda_stream()).map_err(|e| candle_core::Error::Cuda(Box::new(e)))?,
    );
    map.insert(dev.id(), h.clone());
    Ok(h)
}

/// Whether [`linear_bias`] applies: f16 or bf16 (f32 would run in TF32,
/// changing the results), every operand starting on a 256-byte boundary
/// (offsets in elements into buffers that are).
pub(super) fn applies<T: WithDType>(offsets: [usize; 3]) -> bool {
    matches!(T::DTYPE, DType::F16 | DType::BF16)
        && offsets
            .iter()
            .all(|o| (o * std::mem::size_of::<T>()).is_multiple_of(ALIGN))
}

/// `y [rows, n] = x [rows, k] W^T + b` for `w [n, k]`, `b [n]`, row-major.
/// cuBLASLt is column-major, where these read as their transposes, so it is
/// asked for `y^T [n, rows] = W x^T` with the bias on `y^T`'s rows. `Err`
/// when cuBLASLt refuses (the caller falls back).
pub(super) fn linear_bias<T>(
    dev: &CudaDevice,
    (x, w, b): (&CudaView<'_, T>, &CudaView<'_, T>, &CudaView<'_, T>),
    y: &mut CudaSlice<T>,
    (rows, n, k): (usize, usize, usize),
) -> Result<()>
where
    CudaBlasLT: Matmul<T>,
{
    let lt = handle(dev)?;
    let cfg = MatmulConfig {
        transa: true,
        transb: false,
        transc: false,
        m: n as u64,
        n: rows as u64,
        k: k as u64,
        alpha: 1.0,
        lda: k as i64,
        ldb: k as i64,
        beta: 0.0,
        ldc: n as i64,
        stride_a: None,
        stride_b: None,
        stride_c: None,
        stride_bias: None,
        batch_size: None,
    };
    // SAFETY: the caller checked the lengths: w holds n x k values, x
    // rows x k, b n, and y rows x n; the layouts above read no further.
    unsafe { lt.matmul(cfg, w, x, y, Some(b), None) }
        .map_err(|e| candle_core::Error::Cuda(Box::new(e)))
}

static REFUSED: AtomicBool = AtomicBool::new(false);

/// Notes that cuBLASLt refused a product (which then takes the cuBLAS
/// path), printing the first refusal.
pub(super) fn note_refusal(e: &candle_core::Error, (rows, n, k): (usize, usize, usize)) {
    if !REFUSED.swap(true, Ordering::Relaxed) {
        crate::tell!(
            "taper: cuBLASLt refused the dense product [{rows}x{k}] x [{k}x{n}] ({e}); \
             refused products take cuBLAS"
        );
    }
}

/// Whether cuBLASLt has refused a product since the last call (the tests
/// check that the shapes they mean to send it are not refused).
pub fn take_refused() -> bool {
    REFUSED.swap(false, Ordering::Relaxed)
}
