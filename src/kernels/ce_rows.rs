//! Cross-entropy over rows of logits, fused: each row's loss in one pass,
//! and the logits' gradient in another (`kernels/ce.cu` on CUDA; the CPU
//! versions here run on the CPU and are the kernels' references). The
//! chunked cross-entropy (`chunked_ce.rs`) runs them on one block of logits
//! at a time.
//!
//! With label smoothing `eps` (as `torch.nn.CrossEntropyLoss`), a row's loss
//! is `lse - (1 - eps) z_y - eps mean(z)` and its logit gradient
//! `softmax(z) - (1 - eps) onehot(y) - eps / V`.
//!
//! Rows may be padded: only their first `live` values are the vocabulary
//! (the loss ignores the rest and their gradient is 0). The chunked
//! cross-entropy pads on CUDA, where cuBLAS runs an odd row length (GPT-2's
//! 50257) on slow unaligned kernels.

use candle_core::{
    bail, CpuStorage, CustomOp2, DType, InplaceOp3, Layout, Result, Shape, Tensor, D,
};
use multiversion::multiversion;
use rayon::prelude::*;

use super::vexp;

/// log-sum-exp and mean of a row: its max, then the sums of `exp(z - max)`
/// and of `z` in one pass, in lanes the compiler vectorizes (a row of
/// SmolLM2's logits is 49152 values; `f32::exp` is a libm call per value
/// and a sum in one accumulator a serial chain).
#[multiversion(targets("x86_64+avx2+fma"))]
pub(super) fn lse_mean(z: &[f32]) -> (f32, f32) {
    let max = vexp::max(z);
    let (sum, total) = vexp::sum_exp_and_sum(z, max);
    (max + sum.ln(), total / z.len() as f32)
}

/// A row of logits into its gradient, `(softmax - spread) * k + bad`; the
/// target's `keep * k` is the caller's.
#[multiversion(targets("x86_64+avx2+fma"))]
fn grad_row(row: &mut [f32], lse: f32, spread: f32, k: f32, bad: f32) {
    for x in row.iter_mut() {
        *x = (vexp::exp(*x - lse) - spread) * k + bad;
    }
}

pub(super) fn u32_slice<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [u32]> {
    let CpuStorage::U32(v) = s else {
        bail!("cross-entropy: expected u32 targets")
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => bail!("cross-entropy: expected contiguous targets"),
    }
}

/// Each row's loss: `(z [rows, V], targets [rows] u32) -> [rows] f32`.
/// A target outside the vocabulary gives NaN, as on CUDA.
pub(super) struct RowLoss {
    pub smoothing: f32,
    /// The vocabulary: the first `live` values of each row.
    pub live: usize,
}

/// The vocabulary size of rows of `cols` (`live`, checked).
fn live_of(live: usize, cols: usize) -> Result<usize> {
    if live == 0 || live > cols {
        bail!("cross-entropy: a vocabulary of {live} in rows of {cols}")
    }
    Ok(live)
}

impl CustomOp2 for RowLoss {
    fn name(&self) -> &'static str {
        "taper-ce-row-loss"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let z = super::f32_slice(s1, l1, "cross-entropy logits")?;
        let y = u32_slice(s2, l2)?;
        let cols = super::rows::last_dim(l1);
        let v = live_of(self.live, cols)?;
        let eps = self.smoothing;
        let out = z
            .par_chunks(cols)
            .map(|z| &z[..v])
            .zip(y)
            .map(|(z, &y)| match z.get(y as usize) {
                Some(&zy) => {
                    let (lse, mean) = lse_mean(z);
                    lse - (1.0 - eps) * zy - eps * mean
                }
                None => f32::NAN,
            })
            .collect();
        Ok((CpuStorage::F32(out), Shape::from(y.len())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use self::cuda::loss;
        use super::cuda::by_float;
        let rows = l1.shape().elem_count() / super::rows::last_dim(l1);
        let out = by_float!(s1, loss(self, (s1, l1), (s2, l2)))?;
        Ok((out, Shape::from(rows)))
    }
}

/// The logits turned into their gradient, in place: `z [rows, V]` with
/// `(targets, g [1] f32)`, where `g` is the loss's incoming gradient (a
/// tensor, so that on CUDA nothing waits for it on the host) and `scale` is
/// 1 / rows of the whole batch. In place, so a chunk's logits and its
/// gradient never take two buffers.
pub(super) struct RowGrad {
    pub scale: f32,
    pub smoothing: f32,
    /// As [`RowLoss::live`].
    pub live: usize,
}

impl InplaceOp3 for RowGrad {
    fn name(&self) -> &'static str {
        "taper-ce-row-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let CpuStorage::F32(z) = s1 else {
            bail!("cross-entropy logits: expected an f32 tensor")
        };
        let Some((a, b)) = l1.contiguous_offsets() else {
            bail!("cross-entropy logits: expected a contiguous tensor")
        };
        let y = u32_slice(s2, l2)?;
        let g = super::f32_slice(s3, l3, "cross-entropy gradient")?;
        let cols = super::rows::last_dim(l1);
        let v = live_of(self.live, cols)?;
        if (b - a) / cols != y.len() || g.len() != 1 {
            bail!(
                "cross-entropy: {} rows, {} targets, {} gradients",
                (b - a) / cols,
                y.len(),
                g.len()
            )
        }
        let k = g[0] * self.scale;
        let (keep, spread) = (1.0 - self.smoothing, self.smoothing / v as f32);
        z[a..b].par_chunks_mut(cols).zip(y).for_each(|(row, &y)| {
            let (row, pad) = row.split_at_mut(v);
            pad.fill(0.0);
            let (lse, _) = lse_mean(row);
            let bad = if (y as usize) < v { 0.0 } else { f32::NAN };
            grad_row(row, lse, spread, k, bad);
            if let Some(x) = row.get_mut(y as usize) {
                *x -= keep * k;
            }
        });
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<()> {
        // s3: the loss's incoming gradient, one f32.
        let third = ("gradients", (|_| 1) as fn(usize) -> usize);
        cuda::in_place(self, "ce_grad", third, (s1, l1), (s2, l2), (s3, l3))
    }
}

/// The chunked cross-entropy's row work on its own, for `taper bench
/// elementwise`: each row's loss against `targets` (u32), the logits `z`
/// (rows of which the first `live` values are the vocabulary) turned in
/// place into their gradient, as [`loss_and_grad`] does for the mean over
/// the rows.
pub fn rows_loss_and_grad(z: &Tensor, targets: &Tensor, live: usize) -> Result<Tensor> {
    let rows = z.elem_count() / z.dim(D::Minus1)?.max(1);
    let op = RowGrad {
        scale: 1.0 / rows.max(1) as f32,
        smoothing: 0.0,
        live,
    };
    loss_and_grad(z, targets, &op)
}

/// Each row's loss (`[rows]` f32, as [`RowLoss`]), and the logits `z`
/// turned in place into their gradient for an incoming gradient of 1 (as
/// [`RowGrad`] with `g = 1`). On CUDA one kernel does both
/// (`ce_loss_grad` in `kernels/ce.cu`): two passes over each row instead of
/// five. Elsewhere the two ops, one after the other.
pub(super) fn loss_and_grad(z: &Tensor, targets: &Tensor, op: &RowGrad) -> Result<Tensor> {
    let rows = z.elem_count() / z.dim(D::Minus1)?.max(1);
    if z.device().is_cuda() {
        let loss = Tensor::zeros(rows, DType::F32, z.device())?;
        z.inplace_op3(targets, &loss, &LossGrad(op))?;
        return Ok(loss);
    }
    let loss = z.apply_op2_no_bwd(
        targets,
        &RowLoss {
            smoothing: op.smoothing,
            live: op.live,
        },
    )?;
    z.inplace_op3(targets, &Tensor::ones(1, DType::F32, z.device())?, op)?;
    Ok(loss)
}

/// [`loss_and_grad`] on CUDA: `z` in place, with `(targets, loss)`, where
/// `loss` is a buffer made for the losses. candle's in-place ops change one
/// tensor; the kernel also writes the other, which nothing else holds.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct LossGrad<'a>(&'a RowGrad);

impl InplaceOp3 for LossGrad<'_> {
    fn name(&self) -> &'static str {
        "taper-ce-row-loss-grad"
    }

    fn cpu_fwd(
        &self,
        _: &mut CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<()> {
        bail!("cross-entropy: the fused loss and gradient run on CUDA only")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<()> {
        // s3: each row's loss, one f32 per row.
        let third = ("losses", (|rows| rows) as fn(usize) -> usize);
        cuda::in_place(self.0, "ce_loss_grad", third, (s1, l1), (s2, l2), (s3, l3))
    }
}

/// `x * g` for an f32 scalar `g` on `x`'s device, computed in f32 (on
/// CUDA one kernel, `scale_by` in `kernels/ce.cu`; elsewhere candle's
/// multiply in `x`'s dtype, which for the f32 of the CPU path is the same).
pub(super) fn scale_by(x: &Tensor, g: &Tensor) -> Result<Tensor> {
    let g = g.flatten_all()?;
    if x.device().is_cuda() {
        return x.contiguous()?.apply_op2_no_bwd(&g, &ScaleBy);
    }
    x.broadcast_mul(&g.to_dtype(x.dtype())?.reshape(())?)
}

struct ScaleBy;

impl CustomOp2 for ScaleBy {
    fn name(&self) -> &'static str {
        "taper-scale-by"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("scale_by: CUDA only (the CPU multiplies with candle)")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use self::cuda::scale;
        use super::cuda::by_float;
        let y = by_float!(s1, scale((s1, l1), (s2, l2)))?;
        Ok((y, l1.shape().clone()))
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{bail, CudaStorage, DType, Layout, Result, WithDType};

    use super::super::cuda::{alloc, kernel, packed, per_row, rows_cols, run, suffix, view, CE};

    pub(super) fn loss<T: CudaDType + DeviceRepr + WithDType>(
        op: &super::RowLoss,
        (s1, l1): (&CudaStorage, &Layout),
        (s2, l2): (&CudaStorage, &Layout),
    ) -> Result<CudaStorage> {
        let (rows, cols) = rows_cols(l1);
        let live = super::live_of(op.live, cols)? as i32;
        let z = view::<T>(s1, l1, "cross-entropy logits")?;
        let y = view::<u32>(s2, l2, "cross-entropy targets")?;
        if y.len() != rows {
            bail!("cross-entropy: {rows} rows but {} targets", y.len())
        }
        let dev = &s1.device;
        let out = alloc::<f32>(dev, rows)?;
        if rows > 0 {
            let f = kernel!(CE, dev, format!("ce_loss_{}", suffix(T::DTYPE)?));
            let cols_i = cols as i32;
            let mut b = f.builder();
            b.arg(&z).arg(&y).arg(&out).arg(&cols_i).arg(&live);
            b.arg(&op.smoothing);
            run(&mut b, per_row(rows, cols))?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }

    /// `kernel(z, targets, third, cols, live, scale, eps)` over the logits
    /// in `s1`, in place, a block per row; `third` is an f32 buffer of
    /// `len(rows)` values (`ce_grad`: the loss's incoming gradient;
    /// `ce_loss_grad`: each row's loss, written).
    pub(super) fn in_place(
        op: &super::RowGrad,
        kernel: &str,
        third: (&str, fn(usize) -> usize),
        s1: (&mut CudaStorage, &Layout),
        s2: (&CudaStorage, &Layout),
        s3: (&CudaStorage, &Layout),
    ) -> Result<()> {
        // by_float! cannot pass the storage on mutably.
        match candle_core::backend::BackendStorage::dtype(&*s1.0) {
            DType::F32 => in_place_as::<f32>(op, kernel, third, s1, s2, s3),
            DType::F16 => in_place_as::<half::f16>(op, kernel, third, s1, s2, s3),
            DType::BF16 => in_place_as::<half::bf16>(op, kernel, third, s1, s2, s3),
            other => bail!("taper's CUDA kernels take f32, f16 or bf16, not {other:?}"),
        }
    }

    fn in_place_as<T: CudaDType + DeviceRepr + WithDType>(
        op: &super::RowGrad,
        kernel: &str,
        (what, len): (&str, fn(usize) -> usize),
        (s1, l1): (&mut CudaStorage, &Layout),
        (s2, l2): (&CudaStorage, &Layout),
        (s3, l3): (&CudaStorage, &Layout),
    ) -> Result<()> {
        let (rows, cols) = rows_cols(l1);
        let live = super::live_of(op.live, cols)? as i32;
        let Some((a, b)) = l1.contiguous_offsets() else {
            bail!("cross-entropy logits: expected a contiguous tensor")
        };
        let y = view::<u32>(s2, l2, "cross-entropy targets")?;
        let third = view::<f32>(s3, l3, "cross-entropy")?;
        if y.len() != rows || third.len() != len(rows) {
            bail!(
                "cross-entropy: {rows} rows, {} targets, {} {what}",
                y.len(),
                third.len()
            )
        }
        let dev = s1.device.clone();
        let mut z = s1.as_cuda_slice_mut::<T>()?.slice_mut(a..b);
        if rows == 0 {
            return Ok(());
        }
        let f = kernel!(CE, dev, format!("{kernel}_{}", suffix(T::DTYPE)?));
        let cols_i = cols as i32;
        let mut b = f.builder();
        b.arg(&mut z).arg(&y).arg(&third);
        b.arg(&cols_i).arg(&live).arg(&op.scale).arg(&op.smoothing);
        run(&mut b, per_row(rows, cols))
    }

    /// `x * s[0]` (`s` an f32 scalar on the device).
    pub(super) fn scale<T: CudaDType + DeviceRepr + WithDType>(
        (s1, l1): (&CudaStorage, &Layout),
        (s2, l2): (&CudaStorage, &Layout),
    ) -> Result<CudaStorage> {
        let x = view::<T>(s1, l1, "scaled tensor")?;
        let s = view::<f32>(s2, l2, "scale")?;
        if s.len() != 1 {
            bail!("scale_by: a scale of {} values", s.len())
        }
        let dev = &s1.device;
        let n = x.len();
        let mut y = alloc::<T>(dev, n)?;
        if n > 0 {
            let f = kernel!(CE, dev, format!("scale_by_{}", suffix(T::DTYPE)?));
            let n_u = n as u64;
            let mut b = f.builder();
            b.arg(&x).arg(&s).arg(&mut y).arg(&n_u);
            run(&mut b, packed(n))?;
        }
        Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
    }
}
