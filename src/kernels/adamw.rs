//! Fused AdamW: one pass per parameter tensor that reads the gradient once
//! and updates the weights and both moments in place. candle's AdamW (and
//! taper's composed reference in `engine::optim`) runs about ten tensor ops
//! per parameter, each allocating a temporary the size of the parameter.
//!
//! The CPU version keeps the moments in host buffers owned by the optimizer
//! and writes the weights through candle's in-place op, so a step allocates
//! nothing. It is the reference for the CUDA kernel in `kernels/adamw.cu`.

use std::cell::RefCell;

use candle_core::{bail, CpuStorage, InplaceOp2, Layout, Result, Tensor};
use multiversion::multiversion;
use rayon::prelude::*;

/// Elements per task.
const CHUNK: usize = 1 << 14;

/// One step's hyperparameters, with the bias corrections folded in:
/// `theta = theta * decay - step_size * m / (sqrt(v) / sqrt_bc2 + eps)`.
#[derive(Debug, Clone, Copy)]
pub struct AdamWStep {
    pub beta1: f32,
    pub beta2: f32,
    /// `1 - beta1` and `1 - beta2`, computed in f64 as PyTorch does (in f32,
    /// `1 - 0.999f32` is off by 5e-5 relative).
    pub one_minus_beta1: f32,
    pub one_minus_beta2: f32,
    pub eps: f32,
    /// `1 - lr * weight_decay`.
    pub decay: f32,
    /// `lr / (1 - beta1^t)`.
    pub step_size: f32,
    /// `sqrt(1 - beta2^t)`.
    pub sqrt_bc2: f32,
}

impl AdamWStep {
    /// PyTorch's `AdamW` rule at step `t` (counting from 1).
    pub fn new(lr: f64, betas: (f64, f64), eps: f64, weight_decay: f64, t: u64) -> Self {
        let t = t.min(i32::MAX as u64) as i32;
        AdamWStep {
            beta1: betas.0 as f32,
            beta2: betas.1 as f32,
            one_minus_beta1: (1.0 - betas.0) as f32,
            one_minus_beta2: (1.0 - betas.1) as f32,
            eps: eps as f32,
            decay: (1.0 - lr * weight_decay) as f32,
            step_size: (lr / (1.0 - betas.0.powi(t))) as f32,
            sqrt_bc2: (1.0 - betas.1.powi(t)).sqrt() as f32,
        }
    }

    /// The update of one element; `m` and `v` already hold the new moments.
    #[inline(always)]
    pub(crate) fn apply(&self, theta: f32, m: f32, v: f32) -> f32 {
        theta * self.decay - self.step_size * m / (v.sqrt() / self.sqrt_bc2 + self.eps)
    }

    /// New moments from the old ones and the gradient.
    #[inline(always)]
    pub(crate) fn moments(&self, m: f32, v: f32, g: f32) -> (f32, f32) {
        (
            self.beta1 * m + self.one_minus_beta1 * g,
            self.beta2 * v + self.one_minus_beta2 * g * g,
        )
    }
}

/// The update over host slices of equal length.
pub fn adamw_slices(theta: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], h: &AdamWStep) {
    assert!(
        theta.len() == g.len() && g.len() == m.len() && m.len() == v.len(),
        "adamw: slices of different lengths"
    );
    theta
        .par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
        .for_each(|((theta, g), (m, v))| update_chunk(theta, g, m, v, h));
}

#[multiversion(targets("x86_64+avx2+fma"))]
fn update_chunk(theta: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], h: &AdamWStep) {
    for i in 0..theta.len() {
        let (mi, vi) = h.moments(m[i], v[i], g[i]);
        m[i] = mi;
        v[i] = vi;
        theta[i] = h.apply(theta[i], mi, vi);
    }
}

/// Runs `f(weights, gradient)` over an f32 CPU tensor's storage in place.
struct Op<F> {
    f: RefCell<F>,
}

impl<F: FnMut(&mut [f32], &[f32]) -> Result<()>> InplaceOp2 for Op<F> {
    fn name(&self) -> &'static str {
        "taper-adamw"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dst_l: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> Result<()> {
        let CpuStorage::F32(theta) = dst else {
            bail!("adamw: expected f32 weights")
        };
        let Some((a, b)) = dst_l.contiguous_offsets() else {
            bail!("adamw: expected contiguous weights")
        };
        let g = super::f32_slice(gs, gl, "adamw gradient")?;
        if g.len() != b - a {
            bail!("adamw: {} weights but {} gradients", b - a, g.len())
        }
        (self.f.borrow_mut())(&mut theta[a..b], g)
    }
}

/// Calls `f(weights, gradient)` on the storage of `theta` (an f32 CPU
/// tensor, usually a `Var`'s), which it updates in place.
pub fn update_inplace(
    theta: &Tensor,
    g: &Tensor,
    f: impl FnMut(&mut [f32], &[f32]) -> Result<()>,
) -> Result<()> {
    let g = g.contiguous()?;
    theta.inplace_op2(&g, &Op { f: RefCell::new(f) })
}

/// Updates `theta` in place from the gradient `g`, with the moments in `m`
/// and `v`.
pub fn adamw_inplace(
    theta: &Tensor,
    g: &Tensor,
    m: &mut [f32],
    v: &mut [f32],
    h: &AdamWStep,
) -> Result<()> {
    update_inplace(theta, g, |theta, g| {
        if m.len() != g.len() || v.len() != g.len() {
            bail!(
                "adamw: {} gradients but {} and {} moments",
                g.len(),
                m.len(),
                v.len()
            )
        }
        adamw_slices(theta, g, m, v, h);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// torch.optim.AdamW's rule in float64.
    fn reference(theta: &mut [f64], g: &[f64], m: &mut [f64], v: &mut [f64], t: i32) {
        let (lr, b1, b2, eps, wd) = (1e-2, 0.9, 0.95, 1e-8, 0.1);
        for i in 0..theta.len() {
            theta[i] *= 1.0 - lr * wd;
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            let mh = m[i] / (1.0 - f64::powi(b1, t));
            let vh = v[i] / (1.0 - f64::powi(b2, t));
            theta[i] -= lr * mh / (vh.sqrt() + eps);
        }
    }

    #[test]
    fn fused_adamw_matches_float64_over_steps() {
        // More elements than one chunk, so the threads split the work.
        let n = CHUNK * 2 + 77;
        let mut theta: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
        let mut theta64: Vec<f64> = theta.iter().map(|&x| x as f64).collect();
        let (mut m, mut v) = (vec![0f32; n], vec![0f32; n]);
        let (mut m64, mut v64) = (vec![0f64; n], vec![0f64; n]);
        for step in 1..=20 {
            let g64: Vec<f64> = (0..n)
                .map(|i| ((i * step) as f64 * 0.013).cos() * (1.0 + (i % 5) as f64))
                .collect();
            let g: Vec<f32> = g64.iter().map(|&x| x as f32).collect();
            let h = AdamWStep::new(1e-2, (0.9, 0.95), 1e-8, 0.1, step as u64);
            adamw_slices(&mut theta, &g, &mut m, &mut v, &h);
            reference(&mut theta64, &g64, &mut m64, &mut v64, step as i32);
        }
        for i in 0..n {
            assert!(
                (theta[i] as f64 - theta64[i]).abs() < 2e-5,
                "{i}: {} vs {}",
                theta[i],
                theta64[i]
            );
        }
    }

    #[test]
    fn the_inplace_op_writes_the_tensor_and_checks_sizes() -> Result<()> {
        let dev = candle_core::Device::Cpu;
        let theta = candle_core::Var::new(&[1f32, -2.0, 3.0], &dev)?;
        let g = Tensor::new(&[0.5f32, 0.5, -1.0], &dev)?;
        let (mut m, mut v) = (vec![0f32; 3], vec![0f32; 3]);
        let h = AdamWStep::new(0.1, (0.9, 0.999), 1e-8, 0.0, 1);
        adamw_inplace(theta.as_tensor(), &g, &mut m, &mut v, &h)?;
        // The first step moves each weight by lr against the gradient's sign.
        let got: Vec<f32> = theta.as_tensor().to_vec1()?;
        for (a, b) in got.iter().zip([0.9f32, -2.1, 3.1]) {
            assert!((a - b).abs() < 1e-6, "{got:?}");
        }
        assert!((m[0] - 0.05).abs() < 1e-7 && (v[2] - 0.001).abs() < 1e-9);
        let err = adamw_inplace(theta.as_tensor(), &g, &mut m[..2], &mut v, &h).unwrap_err();
        assert!(err.to_string().contains("moments"), "{err}");
        Ok(())
    }
}
