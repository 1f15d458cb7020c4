//! Chunked (fused) cross-entropy for a language-model head: the loss of
//! `hidden [N, d] @ head [V, d]^T` against targets, computed a block of rows
//! at a time, so the full `N x V` logits and their gradient never exist at
//! once (Liger-Kernel's fused linear cross-entropy). The forward keeps
//! nothing but the loss; the backward recomputes each block's logits and
//! turns them straight into that block's gradients for the hidden states
//! and the head.
//!
//! With label smoothing `eps` (as `torch.nn.CrossEntropyLoss`), a row's loss
//! is `lse - (1 - eps) z_y - eps mean(z)` and its logit gradient
//! `softmax(z) - (1 - eps) onehot(y) - eps / V`.
//!
//! f32 on the CPU in one custom op (below); on CUDA, tensor ops around the
//! fused row kernels of `ce_rows` (the matmuls stay on cuBLAS). Callers
//! check [`super::covers`] first; other devices and dtypes take the
//! composed head and loss.

use candle_core::{bail, CpuStorage, CustomOp2, DType, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::ce_rows::lse_mean;

struct ChunkedCe {
    targets: Vec<u32>,
    chunk: usize,
    smoothing: f32,
}

/// The mean cross-entropy of `hidden [N, d] @ head [V, d]^T` against
/// `targets [N]`, `chunk` rows at a time. Differentiable in `hidden` and
/// `head`.
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
    if !(hidden.device().is_cpu() && hidden.dtype() == DType::F32) {
        if !super::covers(hidden) {
            bail!(
                "chunked cross-entropy: no fused path for {:?} on {:?}",
                hidden.dtype(),
                hidden.device()
            )
        }
        return super::ce_rows::by_chunks(
            hidden,
            head,
            targets,
            chunk.max(1),
            label_smoothing as f32,
        );
    }
    let targets: Vec<u32> = targets.flatten_all()?.to_vec1()?;
    if targets.len() != n {
        bail!("chunked cross-entropy: {n} rows, {} targets", targets.len())
    }
    if let Some(t) = targets.iter().find(|&&t| t as usize >= v) {
        bail!("chunked cross-entropy: target {t} is not below the vocabulary size {v}")
    }
    let op = ChunkedCe {
        targets,
        chunk: chunk.max(1),
        smoothing: label_smoothing as f32,
    };
    hidden.contiguous()?.apply_op2(&head.contiguous()?, op)
}

/// A CPU storage as a tensor (a copy).
fn tensor(s: &CpuStorage, l: &Layout, what: &str) -> Result<Tensor> {
    let v = super::f32_slice(s, l, what)?;
    Tensor::from_slice(v, l.shape(), &Device::Cpu)
}

impl ChunkedCe {
    /// Each row's loss, from its logits.
    fn row_losses(&self, logits: &[f32], v: usize, rows: std::ops::Range<usize>) -> Vec<f32> {
        logits
            .par_chunks(v)
            .zip(&self.targets[rows])
            .map(|(z, &y)| {
                let (lse, mean) = lse_mean(z);
                lse - (1.0 - self.smoothing) * z[y as usize] - self.smoothing * mean
            })
            .collect()
    }
}

impl CustomOp2 for ChunkedCe {
    fn name(&self) -> &'static str {
        "taper-chunked-cross-entropy"
    }

    fn cpu_fwd(
        &self,
        hs: &CpuStorage,
        hl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let h = tensor(hs, hl, "chunked cross-entropy hidden")?;
        let w = tensor(ws, wl, "chunked cross-entropy head")?;
        let (n, _) = h.dims2()?;
        let v = w.dim(0)?;
        let wt = w.t()?;
        let mut total = 0f64;
        for start in (0..n).step_by(self.chunk) {
            let len = self.chunk.min(n - start);
            let z = h.narrow(0, start, len)?.matmul(&wt)?;
            let z: Vec<f32> = z.flatten_all()?.to_vec1()?;
            total += self
                .row_losses(&z, v, start..start + len)
                .iter()
                .map(|&l| l as f64)
                .sum::<f64>();
        }
        Ok((
            CpuStorage::F32(vec![(total / n as f64) as f32]),
            Shape::from(()),
        ))
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        head: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (h, w) = (hidden.detach(), head.detach());
        let (n, _) = h.dims2()?;
        let v = w.dim(0)?;
        let scale = grad.to_dtype(DType::F32)?.to_scalar::<f32>()? / n as f32;
        let (keep, spread) = (1.0 - self.smoothing, self.smoothing / v as f32);
        let wt = w.t()?;
        let mut dh = Vec::with_capacity(n.div_ceil(self.chunk));
        let mut dw: Option<Tensor> = None;
        for start in (0..n).step_by(self.chunk) {
            let len = self.chunk.min(n - start);
            let hc = h.narrow(0, start, len)?;
            let mut z: Vec<f32> = hc.matmul(&wt)?.flatten_all()?.to_vec1()?;
            // Logits to their gradient, in place.
            z.par_chunks_mut(v)
                .zip(&self.targets[start..start + len])
                .for_each(|(row, &y)| {
                    let (lse, _) = lse_mean(row);
                    for x in row.iter_mut() {
                        *x = ((*x - lse).exp() - spread) * scale;
                    }
                    row[y as usize] -= keep * scale;
                });
            let dz = Tensor::from_vec(z, (len, v), h.device())?;
            dh.push(dz.matmul(&w)?);
            let part = dz.t()?.matmul(&hc)?;
            dw = Some(match dw {
                Some(acc) => (acc + part)?,
                None => part,
            });
        }
        Ok((Some(Tensor::cat(&dh, 0)?), dw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The composed reference: full logits, then cross-entropy, in float64.
    fn reference(h: &Tensor, w: &Tensor, y: &Tensor, eps: f64) -> Result<(f64, Tensor, Tensor)> {
        let h = candle_core::Var::from_tensor(&h.to_dtype(DType::F64)?)?;
        let w = candle_core::Var::from_tensor(&w.to_dtype(DType::F64)?)?;
        let logits = h.as_tensor().matmul(&w.as_tensor().t()?)?;
        let loss = crate::engine::loss::CrossEntropy {
            label_smoothing: eps,
            chunk: 0,
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

    /// The CUDA path's structure (`ce_rows::by_chunks`: tensor ops around
    /// the row kernels), run with the row kernels' CPU references.
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
        for (chunk, eps) in [(7, 0.0), (29, 0.1), (64, 0.0)] {
            let (hv, wv) = (
                candle_core::Var::from_tensor(&h)?,
                candle_core::Var::from_tensor(&w)?,
            );
            let loss = super::super::ce_rows::by_chunks(
                hv.as_tensor(),
                wv.as_tensor(),
                &y,
                chunk,
                eps as f32,
            )?;
            let g = (&loss * 2.0)?.backward()?;
            let (l64, dh64, dw64) = reference(&h, &w, &y, eps)?;
            let l = loss.to_scalar::<f32>()? as f64;
            assert!(
                (l - l64).abs() < 1e-5 * l64.abs(),
                "chunk {chunk}: {l} vs {l64}"
            );
            let dh = (g.get(hv.as_tensor()).unwrap() / 2.0)?;
            let dw = (g.get(wv.as_tensor()).unwrap() / 2.0)?;
            assert!(max_rel(&dh, &dh64)? < 1e-5, "chunk {chunk} eps {eps}: dh");
            assert!(max_rel(&dw, &dw64)? < 1e-5, "chunk {chunk} eps {eps}: dw");
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
        let nan = super::super::ce_rows::by_chunks(&h, &w, &bad, 8, 0.0)?;
        assert!(
            nan.to_scalar::<f32>()?.is_nan(),
            "an unknown target gives NaN"
        );
        let err = chunked_cross_entropy(&h, &w, &bad, 8, 0.0).unwrap_err();
        assert!(err.to_string().contains("target 60"), "{err}");
        Ok(())
    }
}
