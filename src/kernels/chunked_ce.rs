//! Chunked (fused) cross-entropy for a language-model head: the loss of
//! `hidden [N, d] @ head [V, d]^T` against targets, computed a block of rows
//! at a time, so the full `N x V` logits and their gradient never exist at
//! once (Liger-Kernel's fused linear cross-entropy). When a backward will
//! follow, the forward turns each block's logits straight into that block's
//! gradients for the hidden states and the head, for an incoming gradient
//! of 1, and keeps those; the backward multiplies them by the real one. So
//! the logits are computed once: recomputing them in the backward cost the
//! GPT-2 step a fourth product of the head (about 0.6 TFLOP at batch 8).
//! Under f16 (whose per-row gradients need the loss scale first) and when
//! nothing is tracked the forward keeps only the loss, and the backward
//! recomputes the logits.
//!
//! Tensor ops around the fused row ops of `ce_rows` (their CPU code, or
//! their CUDA kernels; the matmuls stay candle's, cuBLAS on a GPU). Callers
//! check [`super::covers`] first; other devices and dtypes take the composed
//! head and loss.

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

use super::ce_rows::{RowGrad, RowLoss};

/// The mean cross-entropy of `hidden [N, d] @ head [V, d]^T` against
/// `targets [N]`, `chunk` rows at a time. Differentiable in `hidden` and
/// `head`. On the CPU an out-of-range target is an error; on CUDA (where
/// checking would cost a sync per step) it makes the loss NaN.
pub fn chunked_cross_entropy(
    hidden: &Tensor,
    head: &Tensor,
    targets: &Tensor,
    chunk: usize,
    label_smoothing: f64,
) -> Result<Tensor> {
    let (n, d) = hidden.dims2()?;
    let (v, d2) = head.dims2()?;
    if d != d2 {
        bail!("chunked cross-entropy: hidden size {d}, head {v}x{d2}")
    }
    if !super::covers(hidden) {
        bail!(
            "chunked cross-entropy: no fused path for {:?} on {:?}",
            hidden.dtype(),
            hidden.device()
        )
    }
    if targets.elem_count() != n {
        bail!(
            "chunked cross-entropy: {n} rows, {} targets",
            targets.elem_count()
        )
    }
    if targets.device().is_cpu() {
        let ids: Vec<u32> = targets.flatten_all()?.to_dtype(DType::U32)?.to_vec1()?;
        if let Some(t) = ids.iter().find(|&&t| t as usize >= v) {
            bail!("chunked cross-entropy: target {t} is not below the vocabulary size {v}")
        }
    }
    // The gradients are made in the forward when a backward will want
    // them; not under f16, whose per-row gradients (about 1 / rows) fall
    // into its subnormals unless the loss scale multiplies them first.
    let early = (hidden.track_op() || head.track_op()) && hidden.dtype() != DType::F16;
    by_chunks(
        hidden,
        head,
        targets,
        chunk.max(1),
        label_smoothing as f32,
        early,
    )
}

/// The chunked cross-entropy as tensor ops around [`RowLoss`] and
/// [`RowGrad`]: the mean loss of `hidden [N, d] @ head [V, d]^T` against
/// `targets`, `chunk` rows at a time, forward and backward; with `early`,
/// the gradients are made in the forward (see the module's text).
fn by_chunks(
    hidden: &Tensor,
    head: &Tensor,
    targets: &Tensor,
    chunk: usize,
    smoothing: f32,
    early: bool,
) -> Result<Tensor> {
    let n = hidden.dim(0)?;
    if n == 0 {
        bail!("chunked cross-entropy: no rows")
    }
    let targets = targets
        .flatten_all()?
        .to_dtype(DType::U32)?
        .to_device(hidden.device())?;
    let (h, live) = (hidden.detach(), head.dim(0)?);
    let w = padded_head(&head.detach())?;
    let wt = w.t()?;
    let grad = RowGrad {
        scale: 1.0 / n as f32,
        smoothing,
        live,
    };
    let mut total: Option<Tensor> = None;
    let mut sums = Grads::new(head.track_op());
    for start in (0..n).step_by(chunk) {
        let len = chunk.min(n - start);
        let hc = h.narrow(0, start, len)?;
        let z = hc.matmul(&wt)?;
        let y = targets.narrow(0, start, len)?.contiguous()?;
        let l = if early {
            let l = super::ce_rows::loss_and_grad(&z, &y, &grad)?;
            sums.add(&z, &hc, &w)?;
            l
        } else {
            z.apply_op2_no_bwd(&y, &RowLoss { smoothing, live })?
        };
        let l = l.sum_all()?;
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
        early: early.then(|| sums.done(live)).transpose()?,
    };
    hidden.apply_op3(head, &loss, op)
}

/// The gradients of the hidden states and of the head, chunk by chunk; the
/// head's only where something upstream wants it (not for a frozen head,
/// such as a QLoRA model's dequantized embedding).
struct Grads {
    dh: Vec<Tensor>,
    dw: Option<Tensor>,
    head: bool,
}

impl Grads {
    fn new(head: bool) -> Grads {
        Grads {
            dh: Vec::new(),
            dw: None,
            head,
        }
    }

    /// A chunk's: `dz [len, V]` (the logits' gradient), `hc [len, d]`, and
    /// the (padded) head `w [V, d]`.
    fn add(&mut self, dz: &Tensor, hc: &Tensor, w: &Tensor) -> Result<()> {
        self.dh.push(dz.matmul(w)?);
        if !self.head {
            return Ok(());
        }
        let part = dz.t()?.matmul(hc)?;
        self.dw = Some(match self.dw.take() {
            Some(acc) => (acc + part)?,
            None => part,
        });
        Ok(())
    }

    /// `(dh [N, d], dw [live, d])`: the padding's rows of the head gradient
    /// dropped.
    fn done(self, live: usize) -> Result<(Tensor, Option<Tensor>)> {
        let dw = match self.dw {
            Some(dw) => Some(dw.narrow(0, 0, live)?),
            None if self.head => bail!("chunked cross-entropy: no chunks"),
            None => None,
        };
        Ok((Tensor::cat(&self.dh, 0)?, dw))
    }
}

/// The head as the logits' products take it: on CUDA, rows of zeros up to a
/// multiple of 64, so that the logits' rows are aligned. cuBLAS runs GPT-2's
/// 50257 columns on unaligned fallback kernels: in the GPT-2 step's kernel
/// profile (`scripts/gpu-check.sh profile`) the head's products took 23 ms
/// of 77. The padded logits are ignored by the row kernels ([`RowLoss`]'s
/// `live`).
pub fn padded_head(head: &Tensor) -> Result<Tensor> {
    let v = head.dim(0)?;
    if head.device().is_cpu() || v % 64 == 0 {
        return Ok(head.clone());
    }
    head.pad_with_zeros(0, 0, v.next_multiple_of(64) - v)
}

/// Gives the loss computed by [`by_chunks`] its place in the graph: the
/// forward passes the loss through. The backward multiplies the gradients
/// the forward made (`early`) by the incoming gradient; without them (under
/// f16) it recomputes each chunk's logits and turns them into that chunk's
/// gradients.
struct Attached {
    targets: Tensor,
    chunk: usize,
    smoothing: f32,
    /// `(dh, dw)` for an incoming gradient of 1.
    early: Option<(Tensor, Option<Tensor>)>,
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
        let g = grad.to_dtype(DType::F32)?.reshape(1)?;
        if let Some((dh, dw)) = &self.early {
            let scale = super::ce_rows::scale_by;
            let dw = dw.as_ref().map(|dw| scale(dw, &g)).transpose()?;
            return Ok((Some(scale(dh, &g)?), dw, None));
        }
        let (h, w, live) = (hidden.detach(), padded_head(&head.detach())?, head.dim(0)?);
        let n = h.dim(0)?;
        let op = RowGrad {
            scale: 1.0 / n as f32,
            smoothing: self.smoothing,
            live,
        };
        let wt = w.t()?;
        let mut sums = Grads::new(head.track_op());
        for start in (0..n).step_by(self.chunk) {
            let len = self.chunk.min(n - start);
            let hc = h.narrow(0, start, len)?;
            // The chunk's logits, turned into their gradient in place.
            let dz = hc.matmul(&wt)?;
            dz.inplace_op3(&self.targets.narrow(0, start, len)?.contiguous()?, &g, &op)?;
            sums.add(&dz, &hc, &w)?;
        }
        let (dh, dw) = sums.done(live)?;
        Ok((Some(dh), dw, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The composed reference: full logits, then cross-entropy, in float64.
    fn reference(h: &Tensor, w: &Tensor, y: &Tensor, eps: f64) -> Result<(f64, Tensor, Tensor)> {
        let h = candle_core::Var::from_tensor(&h.to_dtype(DType::F64)?)?;
        let w = candle_core::Var::from_tensor(&w.to_dtype(DType::F64)?)?;
        let logits = h.as_tensor().matmul(&w.as_tensor().t()?)?;
        let loss = crate::engine::loss::CrossEntropy {
            label_smoothing: eps,
            ..Default::default()
        }
        .loss(&logits, y)?;
        let g = loss.backward()?;
        Ok((
            loss.to_scalar::<f64>()?,
            g.get(h.as_tensor()).unwrap().clone(),
            g.get(w.as_tensor()).unwrap().clone(),
        ))
    }

    fn max_rel(a: &Tensor, b: &Tensor) -> Result<f64> {
        let a: Vec<f64> = a.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?;
        let b: Vec<f64> = b.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?;
        let scale = b.iter().fold(0f64, |m, x| m.max(x.abs()));
        Ok(a.iter()
            .zip(&b)
            .fold(0f64, |m, (x, y)| m.max((x - y).abs()))
            / scale)
    }

    /// Padded rows (as on CUDA): the row kernels read only the first `live`
    /// values, whatever the padding holds, and zero its gradient.
    #[test]
    fn padded_rows_give_the_unpadded_loss_and_gradient() -> Result<()> {
        let dev = Device::Cpu;
        let (rows, v, pad) = (5, 9, 7);
        let z = Tensor::randn(0f32, 2.0, (rows, v), &dev)?;
        let junk = (Tensor::randn(0f32, 1.0, (rows, pad), &dev)? * 50.0)?;
        let zp = Tensor::cat(&[&z, &junk], 1)?;
        let y = Tensor::new(&[0u32, 8, 3, 3, 5], &dev)?;
        let g = Tensor::new(&[0.5f32], &dev)?;
        for eps in [0.0, 0.1] {
            let loss = |z: &Tensor, live| {
                let op = RowLoss {
                    smoothing: eps,
                    live,
                };
                z.apply_op2_no_bwd(&y, &op)?.to_vec1::<f32>()
            };
            assert_eq!(loss(&z, v)?, loss(&zp, v)?);
            let grad = |z: &Tensor, live| -> Result<Tensor> {
                let z = z.copy()?;
                let op = RowGrad {
                    scale: 0.2,
                    smoothing: eps,
                    live,
                };
                z.inplace_op3(&y, &g, &op)?;
                Ok(z)
            };
            let (d, dp) = (grad(&z, v)?, grad(&zp, v)?);
            assert_eq!(d.to_vec2::<f32>()?, dp.narrow(1, 0, v)?.to_vec2::<f32>()?);
            assert!(dp
                .narrow(1, v, pad)?
                .flatten_all()?
                .to_vec1::<f32>()?
                .iter()
                .all(|&x| x == 0.0));
        }
        Ok(())
    }

    /// `by_chunks` directly (no host check of the targets, as on CUDA), on
    /// other shapes and random values.
    #[test]
    fn the_row_kernel_path_matches_float64_too() -> Result<()> {
        let dev = Device::Cpu;
        let (n, d, v) = (29, 12, 41);
        let h = Tensor::randn(0f32, 1.0, (n, d), &dev)?;
        let w = Tensor::randn(0f32, 0.5, (v, d), &dev)?;
        let y = Tensor::new(
            (0..n).map(|i| ((i * 5) % v) as u32).collect::<Vec<_>>(),
            &dev,
        )?;
        // With the gradients made in the forward, and recomputed in the
        // backward (as under f16).
        for (chunk, eps, early) in [
            (7, 0.0, true),
            (29, 0.1, true),
            (64, 0.0, true),
            (7, 0.1, false),
            (64, 0.0, false),
        ] {
            let (hv, wv) = (
                candle_core::Var::from_tensor(&h)?,
                candle_core::Var::from_tensor(&w)?,
            );
            let loss = by_chunks(hv.as_tensor(), wv.as_tensor(), &y, chunk, eps as f32, early)?;
            let g = (&loss * 2.0)?.backward()?;
            let (l64, dh64, dw64) = reference(&h, &w, &y, eps)?;
            let l = loss.to_scalar::<f32>()? as f64;
            assert!(
                (l - l64).abs() < 1e-5 * l64.abs(),
                "chunk {chunk}: {l} vs {l64}"
            );
            let dh = (g.get(hv.as_tensor()).unwrap() / 2.0)?;
            let dw = (g.get(wv.as_tensor()).unwrap() / 2.0)?;
            assert!(
                max_rel(&dh, &dh64)? < 1e-5,
                "chunk {chunk} eps {eps} {early}: dh"
            );
            assert!(
                max_rel(&dw, &dw64)? < 1e-5,
                "chunk {chunk} eps {eps} {early}: dw"
            );
        }
        Ok(())
    }

    #[test]
    fn matches_the_composed_loss_and_gradients_in_float64() -> Result<()> {
        let dev = Device::Cpu;
        let (n, d, v) = (37, 16, 50);
        let h: Vec<f32> = (0..n * d).map(|i| ((i as f32) * 0.731).sin()).collect();
        let w: Vec<f32> = (0..v * d)
            .map(|i| ((i as f32) * 0.313).cos() * 0.5)
            .collect();
        let y: Vec<u32> = (0..n).map(|i| ((i * 7) % v) as u32).collect();
        let (h, w) = (
            Tensor::from_vec(h, (n, d), &dev)?,
            Tensor::from_vec(w, (v, d), &dev)?,
        );
        let y = Tensor::new(y, &dev)?;
        for (chunk, eps) in [(8, 0.0), (37, 0.1), (5, 0.0), (100, 0.2)] {
            let (hv, wv) = (
                candle_core::Var::from_tensor(&h)?,
                candle_core::Var::from_tensor(&w)?,
            );
            let loss = chunked_cross_entropy(hv.as_tensor(), wv.as_tensor(), &y, chunk, eps)?;
            let g = (&loss * 3.0)?.backward()?;
            let (l64, dh64, dw64) = reference(&h, &w, &y, eps)?;
            let l = loss.to_scalar::<f32>()? as f64;
            assert!(
                (l - l64).abs() < 1e-5 * l64.abs(),
                "chunk {chunk}: {l} vs {l64}"
            );
            let dh = (g.get(hv.as_tensor()).unwrap() / 3.0)?;
            let dw = (g.get(wv.as_tensor()).unwrap() / 3.0)?;
            assert!(max_rel(&dh, &dh64)? < 1e-5, "chunk {chunk} eps {eps}: dh");
            assert!(max_rel(&dw, &dw64)? < 1e-5, "chunk {chunk} eps {eps}: dw");
        }
        let bad = Tensor::new(&[60u32; 37], &dev)?;
        let nan = by_chunks(&h, &w, &bad, 8, 0.0, false)?;
        assert!(
            nan.to_scalar::<f32>()?.is_nan(),
            "an unknown target gives NaN"
        );
        let err = chunked_cross_entropy(&h, &w, &bad, 8, 0.0).unwrap_err();
        assert!(err.to_string().contains("target 60"), "{err}");
        Ok(())
    }
}
