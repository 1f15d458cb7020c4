//! Row-wise fused ops over the last dimension, with backward: softmax and
//! layer norm. candle's own fused versions record no backward (candle
//! #2168), and the composed versions taper used instead cost a reduction,
//! a broadcast and a temporary per step, forward and backward; in a profile
//! of the GPT step, candle's strided reductions in backward alone took 16%.
//!
//! f32 CPU tensors take the fused path (rows split across threads), as do
//! CUDA tensors (`kernels/rows.cu`, a block per row); other devices and
//! dtypes take the composed, differentiable versions.

use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, D,
};
use rayon::prelude::*;

/// Rows per task.
const ROWS: usize = 64;

fn fused_ok(x: &Tensor) -> bool {
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

/// Layer norm over the last dimension with weight `w` and bias `b`.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    if fused_ok(x) && w.dtype() == x.dtype() && b.dtype() == x.dtype() {
        x.contiguous()?
            .apply_op3(&w.contiguous()?, &b.contiguous()?, LayerNorm(eps as f32))
    } else {
        let mean = x.mean_keepdim(D::Minus1)?;
        let xc = x.broadcast_sub(&mean)?;
        let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
        let xn = xc.broadcast_div(&(var + eps)?.sqrt()?)?;
        xn.broadcast_mul(w)?.broadcast_add(b)
    }
}

/// A row's mean and 1/std.
#[inline]
fn moments(x: &[f32], eps: f32) -> (f32, f32) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    (mean, 1.0 / (var + eps).sqrt())
}

#[derive(Clone, Copy)]
struct LayerNorm(f32);

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "taper-layer-norm"
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
        let x = super::f32_slice(s1, l1, "layer_norm")?;
        let (w, b) = (
            super::f32_slice(s2, l2, "layer_norm weight")?,
            super::f32_slice(s3, l3, "layer_norm bias")?,
        );
        let n = last_dim(l1);
        if w.len() != n || b.len() != n {
            bail!(
                "layer_norm: rows of {n} but weight {} and bias {}",
                w.len(),
                b.len()
            )
        }
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(n * ROWS)
            .zip(x.par_chunks(n * ROWS))
            .for_each(|(o, x)| {
                for (o, x) in o.chunks_mut(n).zip(x.chunks(n)) {
                    let (mean, rstd) = moments(x, self.0);
                    for i in 0..n {
                        o[i] = (x[i] - mean) * rstd * w[i] + b[i];
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
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::cuda::{by_float, rows, ROWS as M};
        let n = last_dim(l1);
        if l2.shape().elem_count() != n || l3.shape().elem_count() != n {
            bail!(
                "layer_norm: rows of {n} but weight {:?} and bias {:?}",
                l2.shape(),
                l3.shape()
            )
        }
        let io = [(s1, l1), (s2, l2), (s3, l3)];
        let out = by_float!(s1, rows(&M, "layer_norm_fwd", &io, &[self.0]))?;
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let g = grad.contiguous()?;
        let dx = x.apply_op3_no_bwd(w, &g, &LayerNormGradX(self.0))?;
        let dwb = x.apply_op2_no_bwd(&g, &LayerNormGradWB(self.0))?;
        Ok((Some(dx), Some(dwb.get(0)?), Some(dwb.get(1)?)))
    }
}

/// dx = rstd * (g*w - mean(g*w) - x̂ * mean(g*w*x̂)), per row.
struct LayerNormGradX(f32);

impl CustomOp3 for LayerNormGradX {
    fn name(&self) -> &'static str {
        "taper-layer-norm-grad-x"
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
        let x = super::f32_slice(s1, l1, "layer_norm backward")?;
        let w = super::f32_slice(s2, l2, "layer_norm backward")?;
        let g = super::f32_slice(s3, l3, "layer_norm backward")?;
        let n = last_dim(l1);
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(n * ROWS)
            .zip(x.par_chunks(n * ROWS).zip(g.par_chunks(n * ROWS)))
            .for_each(|(o, (x, g))| {
                for ((o, x), g) in o.chunks_mut(n).zip(x.chunks(n)).zip(g.chunks(n)) {
                    let (mean, rstd) = moments(x, self.0);
                    let (mut a, mut c) = (0f32, 0f32);
                    for i in 0..n {
                        let gw = g[i] * w[i];
                        a += gw;
                        c += gw * (x[i] - mean) * rstd;
                    }
                    let (a, c) = (a / n as f32, c / n as f32);
                    for i in 0..n {
                        let xh = (x[i] - mean) * rstd;
                        o[i] = rstd * (g[i] * w[i] - a - xh * c);
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
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::cuda::{by_float, rows, ROWS as M};
        let io = [(s1, l1), (s2, l2), (s3, l3)];
        let out = by_float!(s1, rows(&M, "layer_norm_bwd_x", &io, &[self.0]))?;
        Ok((out, l1.shape().clone()))
    }
}

/// [dw; db] = [sum over rows of g*x̂; sum over rows of g], as a (2, n) tensor.
struct LayerNormGradWB(f32);

impl CustomOp2 for LayerNormGradWB {
    fn name(&self) -> &'static str {
        "taper-layer-norm-grad-wb"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s1, l1, "layer_norm backward")?;
        let g = super::f32_slice(s2, l2, "layer_norm backward")?;
        let n = last_dim(l1);
        let sums = x
            .par_chunks(n * ROWS)
            .zip(g.par_chunks(n * ROWS))
            .map(|(x, g)| {
                let mut acc = vec![0f32; 2 * n];
                for (x, g) in x.chunks(n).zip(g.chunks(n)) {
                    let (mean, rstd) = moments(x, self.0);
                    for i in 0..n {
                        acc[i] += g[i] * (x[i] - mean) * rstd;
                        acc[n + i] += g[i];
                    }
                }
                acc
            })
            .reduce(
                || vec![0f32; 2 * n],
                |mut a, b| {
                    a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
                    a
                },
            );
        Ok((CpuStorage::F32(sums), Shape::from((2, n))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::cuda::by_float;
        let n = last_dim(l1);
        let out = by_float!(s1, layer_norm_wb_cuda((s1, l1), (s2, l2), self.0))?;
        Ok((out, Shape::from((2, n))))
    }
}

/// The weight and bias gradients on CUDA, in three launches: each row's
/// mean and 1/std; partial sums over chunks of rows (a thread per column,
/// so reads are coalesced); the chunks added up. No atomics, so the result
/// does not depend on scheduling.
#[cfg(feature = "cuda")]
fn layer_norm_wb_cuda<T>(
    (s1, l1): (&candle_core::CudaStorage, &Layout),
    (s2, l2): (&candle_core::CudaStorage, &Layout),
    eps: f32,
) -> Result<candle_core::CudaStorage>
where
    T: candle_core::cuda_backend::CudaDType
        + candle_core::cuda_backend::cudarc::driver::DeviceRepr
        + candle_core::cuda_backend::cudarc::driver::ValidAsZeroBits
        + candle_core::WithDType,
{
    use super::cuda::{
        alloc, elementwise, kernel, per_row, rows_cols, run, suffix, view, ROWS as M,
    };
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    let (rows, cols) = rows_cols(l1);
    let (x, g) = (
        view::<T>(s1, l1, "layer_norm backward")?,
        view::<T>(s2, l2, "layer_norm backward")?,
    );
    if g.len() != x.len() {
        bail!(
            "layer_norm backward: {} inputs but {} gradients",
            x.len(),
            g.len()
        )
    }
    let dev = &s1.device;
    let sfx = suffix(T::DTYPE)?;
    if rows == 0 {
        let zeros = dev.alloc_zeros::<T>(2 * cols)?;
        return Ok(candle_core::CudaStorage::wrap_cuda_slice(
            zeros,
            dev.clone(),
        ));
    }
    let cols_i = cols as i32;
    let rows_i = rows as i32;
    // float2 (mean, rstd) per row.
    let stats = alloc::<f32>(dev, 2 * rows)?;
    let f = kernel!(M, dev, format!("layer_norm_stats_{sfx}"));
    let mut b = f.builder();
    b.arg(&x).arg(&stats).arg(&cols_i).arg(&eps);
    run(&mut b, per_row(rows, cols))?;

    // At most 1024 chunks of at least 32 rows.
    let per = rows.div_ceil(1024).max(32);
    let chunks = rows.div_ceil(per);
    let (per_i, chunks_i) = (per as i32, chunks as i32);
    let partial = alloc::<f32>(dev, chunks * 2 * cols)?;
    let f = kernel!(M, dev, format!("layer_norm_bwd_wb_partial_{sfx}"));
    let mut b = f.builder();
    b.arg(&x).arg(&g).arg(&stats).arg(&partial);
    b.arg(&rows_i).arg(&cols_i).arg(&per_i);
    let cfg = LaunchConfig {
        grid_dim: (chunks as u32, cols.div_ceil(256) as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    run(&mut b, cfg)?;

    let out = alloc::<T>(dev, 2 * cols)?;
    let f = kernel!(M, dev, format!("layer_norm_bwd_wb_final_{sfx}"));
    let mut b = f.builder();
    b.arg(&partial).arg(&out).arg(&chunks_i).arg(&cols_i);
    run(&mut b, elementwise(2 * cols))?;
    Ok(candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

#[cfg(test)]
mod tests {
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
    /// float64 (the reference), on strided input.
    #[test]
    fn softmax_and_layer_norm_match_float64_composed_ops() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::randn(0f32, 3.0, (24, 37), &dev)?.t()?)?;
        let w = Var::from_tensor(&Tensor::randn(1f32, 0.5, 24, &dev)?)?;
        let b = Var::from_tensor(&Tensor::randn(0f32, 0.5, 24, &dev)?)?;
        // A loss that weights every output differently.
        let probe = Tensor::randn(0f32, 1.0, (37, 24), &dev)?;
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
        assert!(d < 1e-5, "softmax dx {d}");

        let y = layer_norm(x.as_tensor(), &w, &b, 1e-5)?;
        let y64 = layer_norm(xv.as_tensor(), &wv, &bv, 1e-5)?; // f64: the composed ops
        assert!(max_diff(&y, &y64.to_dtype(DType::F32)?) < 2e-5);
        let g = loss(y)?.backward()?;
        let g64 = (y64 * &probe64)?.sum_all()?.backward()?;
        for (v, v64, what) in [(&x, &xv, "dx"), (&w, &wv, "dw"), (&b, &bv, "db")] {
            let d = max_diff(
                g.get(v).unwrap(),
                &g64.get(v64).unwrap().to_dtype(DType::F32)?,
            );
            assert!(d < 5e-5, "layer_norm {what} {d}");
        }
        Ok(())
    }
}
