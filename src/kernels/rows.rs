//! Row-wise fused ops over the last dimension, with backward: softmax here,
//! layer norm in `layer_norm.rs`. candle's own fused versions record no backward (candle
//! #2168), and the composed versions taper used instead cost a reduction,
//! a broadcast and a temporary per step, forward and backward; in a profile
//! of the GPT step, candle's strided reductions in backward alone took 16%.
//!
//! f32 CPU tensors take the fused path (rows split across threads), as do
//! CUDA tensors (`kernels/rows.cu`, a block per row); other devices and
//! dtypes take the composed, differentiable versions.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

/// Rows per task.
pub(super) const ROWS: usize = 64;

pub(super) fn fused_ok(x: &Tensor) -> bool {
    super::covers(x) && x.rank() >= 1
}

pub(super) fn last_dim(l: &Layout) -> usize {
    l.shape().dims().last().copied().unwrap_or(1).max(1)
}

/// Softmax over the last dimension.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    if fused_ok(x) {
        x.contiguous()?.apply_op1(Softmax)
    } else {
        candle_nn::ops::softmax(x, D::Minus1)
    }
}

struct Softmax;

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "taper-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s, l, "softmax")?;
        let n = last_dim(l);
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(n * ROWS)
            .zip(x.par_chunks(n * ROWS))
            .for_each(|(o, x)| {
                for (o, x) in o.chunks_mut(n).zip(x.chunks(n)) {
                    let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                    let mut sum = 0f32;
                    for (o, &x) in o.iter_mut().zip(x) {
                        *o = (x - m).exp();
                        sum += *o;
                    }
                    let r = 1.0 / sum;
                    o.iter_mut().for_each(|o| *o *= r);
                }
            });
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::cuda::{by_float, rows, ROWS as M};
        let out = by_float!(s, rows(&M, "softmax_fwd", &[(s, l)], &[]))?;
        Ok((out, l.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(
            res.apply_op2_no_bwd(&grad.contiguous()?, &SoftmaxGrad)?,
        ))
    }
}

/// `y * (g - sum(g * y))` per row, from the softmax output `y`.
struct SoftmaxGrad;

impl CustomOp2 for SoftmaxGrad {
    fn name(&self) -> &'static str {
        "taper-softmax-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (y, g) = (
            super::f32_slice(s1, l1, "softmax backward")?,
            super::f32_slice(s2, l2, "softmax backward")?,
        );
        let n = last_dim(l1);
        let mut out = vec![0f32; y.len()];
        out.par_chunks_mut(n * ROWS)
            .zip(y.par_chunks(n * ROWS).zip(g.par_chunks(n * ROWS)))
            .for_each(|(o, (y, g))| {
                for ((o, y), g) in o.chunks_mut(n).zip(y.chunks(n)).zip(g.chunks(n)) {
                    let dot: f32 = y.iter().zip(g).map(|(y, g)| y * g).sum();
                    for ((o, &y), &g) in o.iter_mut().zip(y).zip(g) {
                        *o = y * (g - dot);
                    }
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
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::cuda::{by_float, rows, ROWS as M};
        let out = by_float!(s1, rows(&M, "softmax_bwd", &[(s1, l1), (s2, l2)], &[]))?;
        Ok((out, l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::layer_norm::layer_norm;
    use super::*;
    use candle_core::{DType, Device, Var};

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap()
    }

    /// Forward and every gradient against the composed ops, computed in
    /// float64 (the reference), on strided input; rows of 24 (whole
    /// groups of the layer norm's eight accumulators), 29 (and a tail) and
    /// 5 (a tail alone).
    #[test]
    fn softmax_and_layer_norm_match_float64_composed_ops() -> Result<()> {
        for n in [24, 29, 5] {
            rows_match_float64(n)?;
        }
        Ok(())
    }

    fn rows_match_float64(n: usize) -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::randn(0f32, 3.0, (n, 37), &dev)?.t()?)?;
        let w = Var::from_tensor(&Tensor::randn(1f32, 0.5, n, &dev)?)?;
        let b = Var::from_tensor(&Tensor::randn(0f32, 0.5, n, &dev)?)?;
        // A loss that weights every output differently.
        let probe = Tensor::randn(0f32, 1.0, (37, n), &dev)?;
        let loss = |y: Tensor| (y * &probe)?.sum_all();

        let x64 = x.to_dtype(DType::F64)?;
        let (w64, b64) = (w.to_dtype(DType::F64)?, b.to_dtype(DType::F64)?);
        let probe64 = probe.to_dtype(DType::F64)?;
        let (xv, wv, bv) = (
            Var::from_tensor(&x64)?,
            Var::from_tensor(&w64)?,
            Var::from_tensor(&b64)?,
        );

        let y = softmax_last_dim(x.as_tensor())?;
        let y64 = candle_nn::ops::softmax(xv.as_tensor(), D::Minus1)?;
        assert!(max_diff(&y, &y64.to_dtype(DType::F32)?) < 1e-6);
        let g = loss(y)?.backward()?;
        let g64 = (y64 * &probe64)?.sum_all()?.backward()?;
        let d = max_diff(
            g.get(&x).unwrap(),
            &g64.get(&xv).unwrap().to_dtype(DType::F32)?,
        );
        assert!(d < 1e-5, "softmax dx {d} (rows of {n})");

        let y = layer_norm(x.as_tensor(), &w, &b, 1e-5)?;
        let y64 = layer_norm(xv.as_tensor(), &wv, &bv, 1e-5)?; // f64: the composed ops
        assert!(
            max_diff(&y, &y64.to_dtype(DType::F32)?) < 2e-5,
            "rows of {n}"
        );
        let g = loss(y)?.backward()?;
        let g64 = (y64 * &probe64)?.sum_all()?.backward()?;
        for (v, v64, what) in [(&x, &xv, "dx"), (&w, &wv, "dw"), (&b, &bv, "db")] {
            let d = max_diff(
                g.get(v).unwrap(),
                &g64.get(v64).unwrap().to_dtype(DType::F32)?,
            );
            assert!(d < 5e-5, "layer_norm {what} {d} (rows of {n})");
        }
        Ok(())
    }
}
