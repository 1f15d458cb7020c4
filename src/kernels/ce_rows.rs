//! Cross-entropy over rows of logits, fused: each row's loss in one pass,
//! and the logits' gradient in another (`kernels/ce.cu` on CUDA; the CPU
//! versions here are their references). The chunked cross-entropy runs
//! them on one block of logits at a time on CUDA, where the head's matmuls
//! stay on cuBLAS (see `by_chunks`).
//!
//! With label smoothing `eps` (as `torch.nn.CrossEntropyLoss`), a row's loss
//! is `lse - (1 - eps) z_y - eps mean(z)` and its logit gradient
//! `softmax(z) - (1 - eps) onehot(y) - eps / V`.

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// log-sum-exp and mean of a row.
pub(super) fn lse_mean(z: &[f32]) -> (f32, f32) {
    let max = z.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let sum: f32 = z.iter().map(|&x| (x - max).exp()).sum();
    (max + sum.ln(), z.iter().sum::<f32>() / z.len() as f32)
}

fn u32_slice<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [u32]> {
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
        let v = super::rows::last_dim(l1);
        let eps = self.smoothing;
        let out = z
            .par_chunks(v)
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
        let out = by_float!(s1, loss(self.smoothing, (s1, l1), (s2, l2)))?;
        Ok((out, Shape::from(rows)))
    }
}

/// The logits' gradient: `(z, targets, g [1] f32) -> dz` like `z`, where
/// `g` is the loss's incoming gradient (a tensor, so that on CUDA nothing
/// waits for it on the host) and `scale` is 1 / rows of the whole batch.
pub(super) struct RowGrad {
    pub scale: f32,
    pub smoothing: f32,
}

impl CustomOp3 for RowGrad {
    fn name(&self) -> &'static str {
        "taper-ce-row-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let z = super::f32_slice(s1, l1, "cross-entropy logits")?;
        let y = u32_slice(s2, l2)?;
        let g = super::f32_slice(s3, l3, "cross-entropy gradient")?;
        let v = super::rows::last_dim(l1);
        let k = g[0] * self.scale;
        let (keep, spread) = (1.0 - self.smoothing, self.smoothing / v as f32);
        let mut out = z.to_vec();
        out.par_chunks_mut(v).zip(y).for_each(|(row, &y)| {
            let (lse, _) = lse_mean(row);
            let bad = if (y as usize) < v { 0.0 } else { f32::NAN };
            for (i, x) in row.iter_mut().enumerate() {
                let mut d = ((*x - lse).exp() - spread) * k + bad;
                if i == y as usize {
                    d -= keep * k;
                }
                *x = d;
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use self::cuda::grad;
        use super::cuda::by_float;
        let out = by_float!(s1, grad(self, (s1, l1), (s2, l2), (s3, l3)))?;
        Ok((out, l1.shape().clone()))
    }
}

/// The chunked cross-entropy as tensor ops around [`RowLoss`] and
/// [`RowGrad`]: the mean loss of `hidden [N, d] @ head [V, d]^T` against
/// `targets`, `chunk` rows at a time, forward and backward. What CUDA runs;
/// on the CPU, `chunked_ce::ChunkedCe` does the same in one op.
pub(super) fn by_chunks(
    hidden: &Tensor,
    head: &Tensor,
    targets: &Tensor,
    chunk: usize,
    smoothing: f32,
) -> Result<Tensor> {
    let n = hidden.dim(0)?;
    if n == 0 {
        bail!("chunked cross-entropy: no rows")
    }
    let targets = targets
        .flatten_all()?
        .to_dtype(DType::U32)?
        .to_device(hidden.device())?;
    let (h, w) = (hidden.detach(), head.detach());
    let wt = w.t()?;
    let mut total: Option<Tensor> = None;
    for start in (0..n).step_by(chunk) {
        let len = chunk.min(n - start);
        let z = h.narrow(0, start, len)?.matmul(&wt)?;
        let op = RowLoss { smoothing };
        let l = z
            .apply_op2_no_bwd(&targets.narrow(0, start, len)?, &op)?
            .sum_all()?;
        total = Some(match total {
            Some(t) => (t + l)?,
            None => l,
        });
    }
    let loss = (total.expect("n > 0") / n as f64)?;
    let op = Attached {
        targets,
        chunk,
        smoothing,
    };
    hidden.apply_op3(head, &loss, op)
}

/// Gives the loss computed by [`by_chunks`] its place in the graph: the
/// forward passes the loss through; the backward recomputes each chunk's
/// logits and turns them into that chunk's gradients.
struct Attached {
    targets: Tensor,
    chunk: usize,
    smoothing: f32,
}

impl CustomOp3 for Attached {
    fn name(&self) -> &'static str {
        "taper-chunked-cross-entropy"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Ok((s3.try_clone(l3)?, l3.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((s3.try_clone(l3)?, l3.shape().clone()))
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        head: &Tensor,
        _loss: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (h, w) = (hidden.detach(), head.detach());
        let n = h.dim(0)?;
        let g = grad.to_dtype(DType::F32)?.reshape(1)?;
        let op = RowGrad {
            scale: 1.0 / n as f32,
            smoothing: self.smoothing,
        };
        let wt = w.t()?;
        let mut dh = Vec::with_capacity(n.div_ceil(self.chunk));
        let mut dw: Option<Tensor> = None;
        for start in (0..n).step_by(self.chunk) {
            let len = self.chunk.min(n - start);
            let hc = h.narrow(0, start, len)?;
            let z = hc.matmul(&wt)?;
            let dz = z.apply_op3_no_bwd(&self.targets.narrow(0, start, len)?, &g, &op)?;
            dh.push(dz.matmul(&w)?);
            let part = dz.t()?.matmul(&hc)?;
            dw = Some(match dw {
                Some(acc) => (acc + part)?,
                None => part,
            });
        }
        Ok((Some(Tensor::cat(&dh, 0)?), dw, None))
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{bail, CudaStorage, Layout, Result, WithDType};

    use super::super::cuda::{alloc, kernel, per_row, rows_cols, run, suffix, view, CE};

    pub(super) fn loss<T: CudaDType + DeviceRepr + WithDType>(
        eps: f32,
        (s1, l1): (&CudaStorage, &Layout),
        (s2, l2): (&CudaStorage, &Layout),
    ) -> Result<CudaStorage> {
        let (rows, cols) = rows_cols(l1);
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
            b.arg(&z).arg(&y).arg(&out).arg(&cols_i).arg(&eps);
            run(&mut b, per_row(rows, cols))?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }

    pub(super) fn grad<T: CudaDType + DeviceRepr + WithDType>(
        op: &super::RowGrad,
        (s1, l1): (&CudaStorage, &Layout),
        (s2, l2): (&CudaStorage, &Layout),
        (s3, l3): (&CudaStorage, &Layout),
    ) -> Result<CudaStorage> {
        let (rows, cols) = rows_cols(l1);
        let z = view::<T>(s1, l1, "cross-entropy logits")?;
        let y = view::<u32>(s2, l2, "cross-entropy targets")?;
        let g = view::<f32>(s3, l3, "cross-entropy gradient")?;
        if y.len() != rows || g.len() != 1 {
            bail!(
                "cross-entropy: {rows} rows, {} targets, {} gradients",
                y.len(),
                g.len()
            )
        }
        let dev = &s1.device;
        let out = alloc::<T>(dev, rows * cols)?;
        if rows > 0 {
            let f = kernel!(CE, dev, format!("ce_grad_{}", suffix(T::DTYPE)?));
            let cols_i = cols as i32;
            let mut b = f.builder();
            b.arg(&z).arg(&y).arg(&g).arg(&out);
            b.arg(&cols_i).arg(&op.scale).arg(&op.smoothing);
            run(&mut b, per_row(rows, cols))?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
}
