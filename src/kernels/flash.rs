//! The tiled causal attention of `kernels/flash.cu` (FlashAttention-2's
//! algorithm on tensor cores): the forward keeps each query row's
//! log-sum-exp instead of any `t x t` tensor, and the backward recomputes
//! the weights from it tile by tile, in two kernels (dQ, then dK and dV)
//! so that no two blocks add into the same gradient and results repeat
//! bit for bit. f16 and bf16, head widths 16, 32 and 64; `attention.rs`
//! picks it (`set_flash`) and keeps the cuBLAS path for the rest.

use std::sync::{Arc, Mutex, MutexGuard};

use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::CudaDType;
use candle_core::{bail, CudaStorage, DType, Layout, Result, WithDType};

use super::attention::Dims;
use super::blas::int;
use super::cuda::{alloc, kernel, run, suffix, view, FLASH};

/// Whether the kernels take this dtype and head width.
pub(super) fn takes(dtype: DType, hd: usize) -> bool {
    matches!(dtype, DType::F16 | DType::BF16) && matches!(hd, 16 | 32 | 64)
}

/// Each query row's log-sum-exp, `[b * heads, t]` in f32, which the
/// forward leaves here for the backward of the same op.
#[derive(Clone, Default)]
pub(super) struct Lse(Arc<Mutex<Option<CudaSlice<f32>>>>);

impl Lse {
    fn slot(&self) -> MutexGuard<'_, Option<CudaSlice<f32>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Takes it: the backward runs once, and frees it when done.
    pub(super) fn take(&self) -> Option<CudaSlice<f32>> {
        self.slot().take()
    }
}

/// A block per (64 rows, batch x head), as `flash.cu` expects: 4 warps of
/// 16 rows, or 2 of 32 (`rows`, [`super::set_flash_rows`]).
fn blocks(t: usize, bh: usize, rows: usize) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (int(t.div_ceil(64))? as u32, int(bh)? as u32, 1),
        block_dim: (if rows == 32 { 64 } else { 128 }, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The kernel for this dtype, head width and rows a warp: `_r32` for 32.
fn name<T: WithDType>(base: &str, d: Dims, rows: usize) -> Result<String> {
    let r32 = if rows == 32 { "_r32" } else { "" };
    Ok(format!("{base}_{}_{}{r32}", suffix(T::DTYPE)?, d.hd))
}

/// `qkv [b, t, 3c]` to `y [b, t, c]`, leaving the log-sum-exp in `lse`;
/// warps of `rows` (16 or 32) query rows.
pub(super) fn forward<T: CudaDType + DeviceRepr + WithDType>(
    s: &CudaStorage,
    l: &Layout,
    (heads, rows): (usize, usize),
    lse: &Lse,
) -> Result<CudaStorage> {
    let (b, d) = Dims::of(l, heads)?;
    let (t, c) = (d.t, d.c());
    if !takes(T::DTYPE, d.hd) {
        bail!(
            "flash attention takes f16 or bf16 heads of 16, 32 or 64, not {:?} x {}",
            T::DTYPE,
            d.hd
        )
    }
    let qkv = view::<T>(s, l, "flash attention")?;
    let dev = &s.device;
    let y = alloc::<T>(dev, b * t * c)?;
    let m = alloc::<f32>(dev, b * heads * t)?;
    if b * t > 0 {
        let f = kernel!(FLASH, dev, name::<T>("flash_forward", d, rows)?);
        let (t_i, heads_i, scale) = (int(t)?, int(heads)?, d.scale());
        let mut a = f.builder();
        a.arg(&qkv)
            .arg(&y)
            .arg(&m)
            .arg(&t_i)
            .arg(&heads_i)
            .arg(&scale);
        run(&mut a, blocks(t, b * heads, rows)?)?;
    }
    *lse.slot() = Some(m);
    Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
}

/// `(qkv, y, dy)` and the forward's log-sum-exp to `dqkv`; warps of
/// `rows` (16 or 32) queries, then keys.
pub(super) fn backward<T: CudaDType + DeviceRepr + WithDType>(
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
    (s3, l3): (&CudaStorage, &Layout),
    lse: &CudaSlice<f32>,
    (heads, rows): (usize, usize),
) -> Result<CudaStorage> {
    let (b, d) = Dims::of(l1, heads)?;
    let (t, c) = (d.t, d.c());
    let qkv = view::<T>(s1, l1, "flash attention backward")?;
    let y = view::<T>(s2, l2, "flash attention backward output")?;
    let dy = view::<T>(s3, l3, "flash attention backward gradient")?;
    if y.len() != b * t * c || dy.len() != b * t * c || lse.len() != b * heads * t {
        bail!(
            "flash attention backward: y {}, dy {} and lse {} values for [{b}, {t}, {c}]",
            y.len(),
            dy.len(),
            lse.len()
        )
    }
    let dev = &s1.device;
    let dqkv = alloc::<T>(dev, b * t * 3 * c)?;
    if b * t > 0 {
        let delta = alloc::<f32>(dev, b * heads * t)?;
        let (t_i, heads_i, scale) = (int(t)?, int(heads)?, d.scale());
        let cfg = blocks(t, b * heads, rows)?;
        let f = kernel!(FLASH, dev, name::<T>("flash_backward_dq", d, rows)?);
        let mut a = f.builder();
        a.arg(&qkv).arg(&y).arg(&dy).arg(lse).arg(&delta).arg(&dqkv);
        a.arg(&t_i).arg(&heads_i).arg(&scale);
        run(&mut a, cfg)?;
        let f = kernel!(FLASH, dev, name::<T>("flash_backward_dkv", d, rows)?);
        let mut a = f.builder();
        a.arg(&qkv).arg(&dy).arg(lse).arg(&delta).arg(&dqkv);
        a.arg(&t_i).arg(&heads_i).arg(&scale);
        run(&mut a, cfg)?;
    }
    Ok(CudaStorage::wrap_cuda_slice(dqkv, dev.clone()))
}
