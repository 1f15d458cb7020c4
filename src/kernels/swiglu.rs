//! SwiGLU's product `silu(g) * u` (Llama's MLP: `g` the gate projection,
//! `u` the up projection), fused with a backward for f32 on the CPU: one
//! pass forward, one pass for both gradients. candle's `silu` and the
//! product are two ops forward, and the backward of `silu` is seven more
//! (the sigmoid rebuilt from a negation, an exponential, an add and a
//! reciprocal, then the derivative's products), each a pass over
//! `[tokens, 1536]` with its own temporary, and `f32::exp` a libm call per
//! value. Other devices and dtypes take candle's ops.

use std::mem::MaybeUninit;

use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use multiversion::multiversion;
use rayon::prelude::*;

/// Elements per task: below this, threads cost more than they save.
const CHUNK: usize = 1 << 14;

/// `silu(gate) * up`, `silu(g) = g / (1 + e^-g)`; both of one shape.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if gate.shape() != up.shape() {
        bail!(
            "swiglu: gate {:?} and up {:?} differ in shape",
            gate.dims(),
            up.dims()
        )
    }
    if super::covers(gate) && gate.device().is_cpu() && up.dtype() == gate.dtype() {
        gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)
    } else {
        candle_nn::ops::silu(gate)? * up
    }
}

/// `1 / (1 + e^-g)`; 0 or 1 where `e^-g` leaves f32's range.
#[inline(always)]
fn sigmoid(g: f32) -> f32 {
    1.0 / (1.0 + super::vexp::exp(-g))
}

/// `o = silu(g) * u`, every value of `o` written.
#[multiversion(targets("x86_64+avx2+fma"))]
fn forward_into(g: &[f32], u: &[f32], o: &mut [MaybeUninit<f32>]) {
    for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
        o.write(g * sigmoid(g) * u);
    }
}

/// With `s = sigmoid(g)`: `dg = dy u s (1 + g (1 - s))`, `du = dy g s`;
/// every value of `dg` and `du` written.
#[multiversion(targets("x86_64+avx2+fma"))]
fn backward_into(
    (g, u, dy): (&[f32], &[f32], &[f32]),
    dg: &mut [MaybeUninit<f32>],
    du: &mut [MaybeUninit<f32>],
) {
    for i in 0..dg.len() {
        let (g, u, dy) = (g[i], u[i], dy[i]);
        let s = sigmoid(g);
        dg[i].write(dy * u * s * (1.0 + g * (1.0 - s)));
        du[i].write(dy * g * s);
    }
}

struct SwiGlu;

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "taper-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = super::f32_slice(s1, l1, "swiglu gate")?;
        let u = super::f32_slice(s2, l2, "swiglu up")?;
        if g.len() != u.len() {
            bail!("swiglu: gate of {} values, up of {}", g.len(), u.len())
        }
        let fill = |i: usize, o: &mut [MaybeUninit<f32>]| {
            let at = i * CHUNK;
            forward_into(&g[at..][..o.len()], &u[at..][..o.len()], o)
        };
        // SAFETY: forward_into writes every value of its chunk.
        let out = unsafe { super::par_written(g.len(), CHUNK, fill) };
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let n = gate.elem_count();
        let all = gate.apply_op3_no_bwd(up, &grad.contiguous()?, &SwiGluGrad)?;
        let part = |i: usize| all.narrow(0, i * n, n)?.reshape(gate.shape());
        Ok((Some(part(0)?), Some(part(1)?)))
    }
}

/// The backward: `[dg; du]` flat from `(gate, up, dy)`.
struct SwiGluGrad;

impl CustomOp3 for SwiGluGrad {
    fn name(&self) -> &'static str {
        "taper-swiglu-grad"
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
        let g = super::f32_slice(s1, l1, "swiglu backward")?;
        let u = super::f32_slice(s2, l2, "swiglu backward")?;
        let dy = super::f32_slice(s3, l3, "swiglu backward")?;
        let n = g.len();
        if u.len() != n || dy.len() != n {
            bail!("swiglu backward: {n}, {} and {} values", u.len(), dy.len())
        }
        let mut out = Vec::with_capacity(2 * n);
        let (dg, du) = out.spare_capacity_mut()[..2 * n].split_at_mut(n);
        dg.par_chunks_mut(CHUNK)
            .zip(du.par_chunks_mut(CHUNK))
            .enumerate()
            .for_each(|(i, (dg, du))| {
                let at = i * CHUNK;
                let m = dg.len();
                backward_into((&g[at..][..m], &u[at..][..m], &dy[at..][..m]), dg, du)
            });
        // SAFETY: backward_into wrote every value of both halves.
        unsafe { out.set_len(2 * n) };
        Ok((CpuStorage::F32(out), Shape::from(2 * n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Gates from -100 to 100 (mostly within ±8, where silu bends), ups
    /// and incoming gradients spread around zero.
    fn inputs(n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let g = (0..n)
            .map(|i| match i % 97 {
                0 => -100.0,
                1 => 100.0,
                2 => 0.0,
                _ => 8.0 * (i as f32 * 0.377).sin(),
            })
            .collect();
        let u = (0..n)
            .map(|i| 2.0 * (i as f32 * 0.713 + 1.0).cos())
            .collect();
        let dy = (0..n).map(|i| (i as f32 * 0.291 + 2.0).sin()).collect();
        (g, u, dy)
    }

    /// Forward and both gradients against float64, over more than a
    /// chunk (and a partial one).
    #[test]
    fn fused_swiglu_matches_float64() -> Result<()> {
        let dev = Device::Cpu;
        let (rows, cols) = (37, 1000);
        let (g, u, dy) = inputs(rows * cols);
        let gv = Var::from_vec(g.clone(), (rows, cols), &dev)?;
        let uv = Var::from_vec(u.clone(), (rows, cols), &dev)?;
        let dyt = Tensor::from_vec(dy.clone(), (rows, cols), &dev)?;
        let y = swiglu(&gv, &uv)?;
        let grads = (y.clone() * &dyt)?.sum_all()?.backward()?;
        let got = [
            y.flatten_all()?.to_vec1::<f32>()?,
            grads.get(&gv).expect("dg").flatten_all()?.to_vec1()?,
            grads.get(&uv).expect("du").flatten_all()?.to_vec1()?,
        ];
        for (i, ((&g, &u), &dy)) in g.iter().zip(&u).zip(&dy).enumerate() {
            let (g, u, dy) = (g as f64, u as f64, dy as f64);
            let s = 1.0 / (1.0 + (-g).exp());
            let want = [g * s * u, dy * u * s * (1.0 + g * (1.0 - s)), dy * g * s];
            for (k, w) in want.iter().enumerate() {
                let v = got[k][i] as f64;
                assert!(
                    (v - w).abs() <= 4e-7 * (1.0 + w.abs()),
                    "{k} at {i} (g {g}): {v} vs {w}"
                );
            }
        }
        Ok(())
    }

    /// Other dtypes take candle's ops, with their gradients.
    #[test]
    fn float64_takes_candles_ops() -> Result<()> {
        let dev = Device::Cpu;
        let g = Var::from_vec(vec![-1.5f64, 0.0, 2.0], 3, &dev)?;
        let u = Var::from_vec(vec![0.5f64, -2.0, 3.0], 3, &dev)?;
        let grads = swiglu(&g, &u)?.sum_all()?.backward()?;
        let du = grads.get(&u).expect("du").to_vec1::<f64>()?;
        let s = 1.0 / (1.0 + (-2.0f64).exp());
        assert!((du[2] - 2.0 * s).abs() < 1e-12, "{du:?}");
        Ok(())
    }
}
