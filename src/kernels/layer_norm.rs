//! Layer norm over the last dimension, fused, with a backward (candle's
//! fused `layer_norm` records none, candle #2168): one pass forward; the
//! input gradient in one pass per row, the weight and bias gradients as
//! column sums. f32 on the CPU (rows split across threads), f32/f16/bf16 on
//! CUDA (`kernels/rows.cu`); elsewhere the composed differentiable ops.

use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

use super::rows::{fused_ok, last_dim, ROWS};

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
        alloc, column_chunks, elementwise, kernel, row_groups, rows_cols, run, suffix, view,
        ROWS as M,
    };
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
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
        let zeros = super::cuda::zeros::<T>(dev, 2 * cols)?;
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
    b.arg(&x).arg(&stats).arg(&cols_i).arg(&rows_i).arg(&eps);
    run(&mut b, row_groups(rows, cols))?;

    let (per, chunks, cfg) = column_chunks(rows, cols);
    let (per_i, chunks_i) = (per as i32, chunks as i32);
    let partial = alloc::<f32>(dev, chunks * 2 * cols)?;
    let f = kernel!(M, dev, format!("layer_norm_bwd_wb_partial_{sfx}"));
    let mut b = f.builder();
    b.arg(&x).arg(&g).arg(&stats).arg(&partial);
    b.arg(&rows_i).arg(&cols_i).arg(&per_i);
    run(&mut b, cfg)?;

    let out = alloc::<T>(dev, 2 * cols)?;
    let f = kernel!(M, dev, format!("layer_norm_bwd_wb_final_{sfx}"));
    let mut b = f.builder();
    b.arg(&partial).arg(&out).arg(&chunks_i).arg(&cols_i);
    run(&mut b, elementwise(2 * cols))?;
    Ok(candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone()))
}
