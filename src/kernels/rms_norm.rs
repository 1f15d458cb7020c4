//! RMS norm over the last dimension (Llama's), fused, with a backward, for
//! f32 on the CPU: one pass forward, the input gradient in one pass per row,
//! the weight's as column sums, and only where the weight is trained. The
//! composed version (a square, a mean, an add, a square root, two
//! broadcasts, each with its own backward and temporaries) took 15% of a
//! QLoRA step on SmolLM2 (61 norms of [256, 576]); other devices and dtypes
//! still take it.

use std::mem::MaybeUninit;

use candle_core::{
    bail, CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, D,
};
use multiversion::multiversion;
use rayon::prelude::*;

use super::layer_norm::{grad_sums, lane_sum};
use super::rows::{last_dim, ROWS};

/// `x / sqrt(mean(x²) + eps) * w` over the last dimension. In f16 and
/// bf16 the mean and the division are in f32, as transformers' Llama
/// computes them, and the weight multiplies the result in the input's dtype.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    if super::covers(x) && x.device().is_cpu() && w.dtype() == x.dtype() && w.rank() == 1 {
        x.contiguous()?
            .apply_op2(&w.contiguous()?, RmsNorm(eps as f32))
    } else {
        let x32 = x.to_dtype(DType::F32)?;
        let ms = x32.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = x32.broadcast_div(&(ms + eps)?.sqrt()?)?;
        normed.to_dtype(x.dtype())?.broadcast_mul(w)
    }
}

/// A row's `1 / sqrt(mean(x²) + eps)`.
#[inline(always)]
fn rstd(x: &[f32], eps: f32) -> f32 {
    1.0 / (lane_sum(x, |v| v * v) / x.len() as f32 + eps).sqrt()
}

#[derive(Clone, Copy)]
struct RmsNorm(f32);

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "taper-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s1, l1, "rms_norm")?;
        let w = super::f32_slice(s2, l2, "rms_norm weight")?;
        let n = last_dim(l1);
        if w.len() != n {
            bail!("rms_norm: rows of {n} but a weight of {}", w.len())
        }
        let fill = |i: usize, o: &mut [MaybeUninit<f32>]| {
            norm_rows(&x[i * n * ROWS..][..o.len()], w, self.0, o);
        };
        // SAFETY: `fill` writes every value of its rows of n.
        let out = unsafe { super::par_written(x.len(), n * ROWS, fill) };
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw) = rms_norm_grad(x, w, grad, self.0, w.track_op())?;
        Ok((Some(dx), dw))
    }
}

/// `(dx, dw)`, `dw` only `with_w`.
fn rms_norm_grad(
    x: &Tensor,
    w: &Tensor,
    grad: &Tensor,
    eps: f32,
    with_w: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let (x, w, g) = (x.contiguous()?, w.contiguous()?, grad.contiguous()?);
    let (n, count) = (x.dim(D::Minus1)?, x.elem_count());
    let all = x.apply_op3_no_bwd(&w, &g, &RmsNormGrad { eps, with_w })?;
    let dx = all.narrow(0, 0, count)?.reshape(x.shape())?;
    // A copy, so that the weight's gradient held until the update does not
    // keep dx's part of the buffer alive.
    let dw = match with_w {
        true => Some(all.narrow(0, count, n)?.copy()?),
        false => None,
    };
    Ok((dx, dw))
}

/// The backward: `[dx; dw]` flat (`dw` only `with_w`), where per row, with
/// `r = rstd(x)`, `dx = r g w - x r³ Σ(g w x) / n`, and over rows
/// `dw = Σ g x r`.
struct RmsNormGrad {
    eps: f32,
    with_w: bool,
}

impl CustomOp3 for RmsNormGrad {
    fn name(&self) -> &'static str {
        "taper-rms-norm-grad"
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
        let x = super::f32_slice(s1, l1, "rms_norm backward")?;
        let w = super::f32_slice(s2, l2, "rms_norm backward")?;
        let g = super::f32_slice(s3, l3, "rms_norm backward")?;
        let n = last_dim(l1);
        if w.len() != n || g.len() != x.len() {
            bail!(
                "rms_norm backward: x {:?}, w [{}], g [{}]",
                l1.dims(),
                w.len(),
                g.len()
            )
        }
        let mut out = vec![0f32; x.len() + if self.with_w { n } else { 0 }];
        let (dx, dw) = out.split_at_mut(x.len());
        dx.par_chunks_mut(n * ROWS)
            .zip(x.par_chunks(n * ROWS).zip(g.par_chunks(n * ROWS)))
            .for_each(|(o, (x, g))| grad_x_rows((x, g), w, self.eps, o));
        if self.with_w {
            dw.copy_from_slice(&grad_w(x, g, n, self.eps));
        }
        let len = out.len();
        Ok((CpuStorage::F32(out), Shape::from(len)))
    }
}

/// Rows of `x` (each as long as `w`) normalized into `o`, every value
/// written.
#[multiversion(targets("x86_64+avx2+fma"))]
fn norm_rows(x: &[f32], w: &[f32], eps: f32, o: &mut [MaybeUninit<f32>]) {
    let n = w.len();
    for (o, x) in o.chunks_mut(n).zip(x.chunks(n)) {
        let r = rstd(x, eps);
        for i in 0..n {
            o[i].write(x[i] * r * w[i]);
        }
    }
}

/// dx of rows of `x` and `g`, each as long as `w`.
#[multiversion(targets("x86_64+avx2+fma"))]
fn grad_x_rows((x, g): (&[f32], &[f32]), w: &[f32], eps: f32, o: &mut [f32]) {
    let n = w.len();
    for ((o, x), g) in o.chunks_mut(n).zip(x.chunks(n)).zip(g.chunks(n)) {
        let r = rstd(x, eps);
        let (_, s) = grad_sums(x, g, w, 0.0);
        let c = r * r * r * s / n as f32;
        for i in 0..n {
            o[i] = r * g[i] * w[i] - x[i] * c;
        }
    }
}

/// `dw`: sums over rows, in blocks of rows across threads, added in block
/// order.
fn grad_w(x: &[f32], g: &[f32], n: usize, eps: f32) -> Vec<f32> {
    super::sum_in_order(x.len().div_ceil((n * ROWS).max(1)), n, |block| {
        let at = block * n * ROWS;
        let mut acc = vec![0f32; n];
        for (x, g) in x[at..].chunks(n).zip(g[at..].chunks(n)).take(ROWS) {
            let r = rstd(x, eps);
            for i in 0..n {
                acc[i] += g[i] * x[i] * r;
            }
        }
        acc
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    fn wave(len: usize, step: f32, shift: f32) -> Vec<f32> {
        (0..len).map(|i| (i as f32 * step).sin() + shift).collect()
    }

    /// The forward and both gradients against float64, for rows of
    /// SmolLM2's width and of an odd one, over row counts that leave a
    /// partial block of rows; and the input's gradient alone where the
    /// weight is not trained.
    #[test]
    fn matches_float64_forward_and_backward() -> Result<()> {
        let dev = Device::Cpu;
        for (rows, n) in [(3, 37), (130, 576)] {
            let (xv, wv, gv) = (
                wave(rows * n, 0.377, 0.2),
                wave(n, 0.91, 1.0),
                wave(rows * n, 0.291, 0.0),
            );
            let eps = 1e-5;
            let x = Var::from_vec(xv.clone(), (rows, n), &dev)?;
            let w = Var::from_vec(wv.clone(), n, &dev)?;
            let g = Tensor::from_vec(gv.clone(), (rows, n), &dev)?;
            let y = rms_norm(x.as_tensor(), w.as_tensor(), eps)?;
            let grads = (&y * &g)?.sum_all()?.backward()?;
            let (y, dx) = (
                y.flatten_all()?.to_vec1::<f32>()?,
                grads.get(&x).expect("dx"),
            );
            let (dx, dw) = (
                dx.flatten_all()?.to_vec1::<f32>()?,
                grads.get(&w).expect("dw").to_vec1::<f32>()?,
            );
            let mut dw64 = vec![0f64; n];
            for r in 0..rows {
                let xr: Vec<f64> = xv[r * n..][..n].iter().map(|&v| v as f64).collect();
                let gr: Vec<f64> = gv[r * n..][..n].iter().map(|&v| v as f64).collect();
                let ms = xr.iter().map(|v| v * v).sum::<f64>() / n as f64;
                let rs = 1.0 / (ms + eps).sqrt();
                let s: f64 = (0..n).map(|i| gr[i] * wv[i] as f64 * xr[i]).sum();
                for i in 0..n {
                    let at = r * n + i;
                    let want_y = xr[i] * rs * wv[i] as f64;
                    let want_dx = rs * gr[i] * wv[i] as f64 - xr[i] * rs.powi(3) * s / n as f64;
                    dw64[i] += gr[i] * xr[i] * rs;
                    assert!(
                        (y[at] as f64 - want_y).abs() < 1e-5 * (1.0 + want_y.abs()),
                        "y[{at}]"
                    );
                    assert!(
                        (dx[at] as f64 - want_dx).abs() < 1e-5 * (1.0 + want_dx.abs()),
                        "dx[{at}]: {} vs {want_dx}",
                        dx[at]
                    );
                }
            }
            for (i, (a, b)) in dw.iter().zip(&dw64).enumerate() {
                assert!(
                    (*a as f64 - b).abs() < 1e-4 * (1.0 + b.abs()),
                    "dw[{i}]: {a} vs {b}"
                );
            }
            // A frozen weight: the same dx, and no dw.
            let frozen = Tensor::from_vec(wv.clone(), n, &dev)?;
            let y = rms_norm(x.as_tensor(), &frozen, eps)?;
            let grads = (&y * &g)?.sum_all()?.backward()?;
            let dx2 = grads.get(&x).expect("dx").flatten_all()?.to_vec1::<f32>()?;
            assert_eq!(dx, dx2);
            assert!(grads.get(&frozen).is_none());
            assert_eq!(x.dtype(), DType::F32);
        }
        Ok(())
    }
}
