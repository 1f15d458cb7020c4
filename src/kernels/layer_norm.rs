//! Layer norm over the last dimension, fused, with a backward (candle's
//! fused `layer_norm` records none, candle #2168): one pass forward; the
//! input gradient in one pass per row, the weight and bias gradients as
//! column sums. f32 on the CPU (rows split across threads), f32/f16/bf16 on
//! CUDA (`kernels/rows.cu`); elsewhere the composed differentiable ops.

use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, D};
use multiversion::multiversion;
use rayon::prelude::*;
use std::mem::MaybeUninit;

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

/// Accumulators a row's sums keep: one would be a serial chain of
/// dependent adds (floating-point adds are not reordered for it), which for
/// the Shakespeare GPT's rows of 64 made the layer norm a tenth of its CPU
/// step; eight, added in a fixed order, make a loop the compiler vectorizes.
const LANES: usize = 8;

/// `Σ f(v)` over `x`, in [`LANES`] accumulators.
#[inline(always)]
pub(super) fn lane_sum(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder().iter().fold(0f32, |s, &v| s + f(v));
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    acc.iter().fold(tail, |s, &a| s + a)
}

/// A row's mean and 1/std.
#[inline(always)]
fn moments(x: &[f32], eps: f32) -> (f32, f32) {
    let n = x.len() as f32;
    let mean = lane_sum(x, |v| v) / n;
    let var = lane_sum(x, |v| (v - mean) * (v - mean)) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// `(Σ g w, Σ g w (x - mean))` over a row, in [`LANES`] accumulators each.
#[inline(always)]
pub(super) fn grad_sums(x: &[f32], g: &[f32], w: &[f32], mean: f32) -> (f32, f32) {
    let (mut a, mut c) = ([0f32; LANES], [0f32; LANES]);
    let (xs, gs, ws) = (
        x.chunks_exact(LANES),
        g.chunks_exact(LANES),
        w.chunks_exact(LANES),
    );
    let (mut sa, mut sc) = (0f32, 0f32);
    for ((&x, &g), &w) in xs
        .remainder()
        .iter()
        .zip(gs.remainder())
        .zip(ws.remainder())
    {
        sa += g * w;
        sc += g * w * (x - mean);
    }
    for ((x, g), w) in xs.zip(gs).zip(ws) {
        for l in 0..LANES {
            let gw = g[l] * w[l];
            a[l] += gw;
            c[l] += gw * (x[l] - mean);
        }
    }
    let add = |s: f32, v: &[f32; LANES]| v.iter().fold(s, |s, &v| s + v);
    (add(sa, &a), add(sc, &c))
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
        let fill = |i: usize, o: &mut [MaybeUninit<f32>]| {
            norm_rows(&x[i * n * ROWS..][..o.len()], (w, b), self.0, o);
        };
        // SAFETY: `fill` writes every value of its rows of n.
        let out = unsafe { super::par_written(x.len(), n * ROWS, fill) };
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
        let (dx, dw, db) = layer_norm_grad(x, w, grad, self.0 as f64)?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

/// The layer norm's backward alone: `(dx, dw, db)` for the input `x`, the
/// weight `w` and the output's gradient `grad`, recording no graph (`taper
/// bench elementwise` times it). f32 on the CPU, f32/f16/bf16 on CUDA.
pub fn layer_norm_grad(
    x: &Tensor,
    w: &Tensor,
    grad: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (x, w, g) = (x.contiguous()?, w.contiguous()?, grad.contiguous()?);
    let n = x.dim(D::Minus1)?;
    let count = x.elem_count();
    // [dx; dw; db] in one buffer, as the one kernel writes them.
    let all = x.apply_op3_no_bwd(&w, &g, &LayerNormGrad(eps as f32))?;
    let dx = all.narrow(0, 0, count)?.reshape(x.shape())?;
    // A copy, so that the small weight gradients held until the update do
    // not keep the whole buffer (dx's part) alive with them.
    let dwb = all.narrow(0, count, 2 * n)?.reshape((2, n))?.copy()?;
    Ok((dx, dwb.get(0)?, dwb.get(1)?))
}

/// The layer norm's backward: `[dx; dw; db]` flat, for the input `x`, the
/// weight `w` and the incoming gradient `g`, where per row
/// `dx = rstd * (g*w - mean(g*w) - x̂ * mean(g*w*x̂))`, and over rows
/// `dw = sum g*x̂`, `db = sum g`.
struct LayerNormGrad(f32);

impl CustomOp3 for LayerNormGrad {
    fn name(&self) -> &'static str {
        "taper-layer-norm-grad"
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
        let mut out = vec![0f32; x.len() + 2 * n];
        let (dx, dwb) = out.split_at_mut(x.len());
        grad_x(x, w, g, n, self.0, dx);
        dwb.copy_from_slice(&grad_wb(x, g, n, self.0));
        let len = out.len();
        Ok((CpuStorage::F32(out), Shape::from(len)))
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
        use super::cuda::by_float;
        let len = l1.shape().elem_count() + 2 * last_dim(l1);
        let io = [(s1, l1), (s2, l2), (s3, l3)];
        let out = by_float!(s1, layer_norm_grad_cuda(io, self.0))?;
        Ok((out, Shape::from(len)))
    }
}

/// Rows of `x` (each as long as `w` and `b`) normalized into `o`, every
/// value written.
#[multiversion(targets("x86_64+avx2+fma"))]
fn norm_rows(x: &[f32], (w, b): (&[f32], &[f32]), eps: f32, o: &mut [MaybeUninit<f32>]) {
    let n = w.len();
    for (o, x) in o.chunks_mut(n).zip(x.chunks(n)) {
        let (mean, rstd) = moments(x, eps);
        for i in 0..n {
            o[i].write((x[i] - mean) * rstd * w[i] + b[i]);
        }
    }
}

/// dx, rows split across threads.
fn grad_x(x: &[f32], w: &[f32], g: &[f32], n: usize, eps: f32, out: &mut [f32]) {
    out.par_chunks_mut(n * ROWS)
        .zip(x.par_chunks(n * ROWS).zip(g.par_chunks(n * ROWS)))
        .for_each(|(o, (x, g))| grad_x_rows((x, g), w, eps, o));
}

/// dx of rows of `x` and `g`, each as long as `w`.
#[multiversion(targets("x86_64+avx2+fma"))]
fn grad_x_rows((x, g): (&[f32], &[f32]), w: &[f32], eps: f32, o: &mut [f32]) {
    let n = w.len();
    for ((o, x), g) in o.chunks_mut(n).zip(x.chunks(n)).zip(g.chunks(n)) {
        let (mean, rstd) = moments(x, eps);
        let (a, c) = grad_sums(x, g, w, mean);
        let (a, c) = (a / n as f32, c * rstd / n as f32);
        for i in 0..n {
            let xh = (x[i] - mean) * rstd;
            o[i] = rstd * (g[i] * w[i] - a - xh * c);
        }
    }
}

/// `[dw; db]`: sums over rows, in blocks of rows across threads, added in
/// block order.
fn grad_wb(x: &[f32], g: &[f32], n: usize, eps: f32) -> Vec<f32> {
    super::sum_in_order(x.len().div_ceil((n * ROWS).max(1)), 2 * n, |block| {
        let at = block * n * ROWS;
        let mut acc = vec![0f32; 2 * n];
        for (x, g) in x[at..].chunks(n).zip(g[at..].chunks(n)).take(ROWS) {
            let (mean, rstd) = moments(x, eps);
            for i in 0..n {
                acc[i] += g[i] * (x[i] - mean) * rstd;
                acc[n + i] += g[i];
            }
        }
        acc
    })
}

/// The backward on CUDA into one buffer `[dx; dw; db]`. Rows of up to 6144
/// take one kernel (`layer_norm_bwd`: one pass over x and g) and the sum of
/// its blocks' partial sums; longer rows take dx from one kernel and the
/// weight gradients from three (each row's mean and 1/std, partial sums over
/// chunks of rows, the chunks added up). No atomics either way, so the
/// result does not depend on scheduling.
#[cfg(feature = "cuda")]
fn layer_norm_grad_cuda<T>(
    [(s1, l1), (s2, l2), (s3, l3)]: [(&candle_core::CudaStorage, &Layout); 3],
    eps: f32,
) -> Result<candle_core::CudaStorage>
where
    T: candle_core::cuda_backend::CudaDType
        + candle_core::cuda_backend::cudarc::driver::DeviceRepr
        + candle_core::WithDType,
{
    use super::cuda::{
        alloc, column_chunks, kernel, layer_norm_bwd_plan, row_groups, rows_cols, run, suffix,
        sum_chunks, view, ROWS as M,
    };
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    let (rows, cols) = rows_cols(l1);
    let what = "layer_norm backward";
    let (x, w, g) = (
        view::<T>(s1, l1, what)?,
        view::<T>(s2, l2, what)?,
        view::<T>(s3, l3, what)?,
    );
    if g.len() != x.len() || w.len() != cols {
        bail!(
            "{what}: {} inputs, {} gradients, a weight of {} for rows of {cols}",
            x.len(),
            g.len(),
            w.len()
        )
    }
    let dev = &s1.device;
    let sfx = suffix(T::DTYPE)?;
    let n = rows * cols;
    let mut out = alloc::<T>(dev, n + 2 * cols)?;
    let (cols_i, rows_i) = (cols as i32, rows as i32);
    // The partial sums of [dw; db] over chunks of rows, and their count.
    let (partial, chunks) = if rows == 0 {
        (super::cuda::zeros::<f32>(dev, 2 * cols)?, 1)
    } else if let Some((warps, per, blocks)) = layer_norm_bwd_plan(rows, cols) {
        let partial = alloc::<f32>(dev, blocks * 2 * cols)?;
        let f = kernel!(M, dev, format!("layer_norm_bwd_{sfx}"));
        let mut dx = out.slice_mut(0..n);
        let per_i = per as i32;
        let mut b = f.builder();
        b.arg(&x).arg(&w).arg(&g).arg(&mut dx).arg(&partial);
        b.arg(&cols_i).arg(&rows_i).arg(&per_i).arg(&eps);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (32, warps as u32, 1),
            shared_mem_bytes: 0,
        };
        run(&mut b, cfg)?;
        (partial, blocks)
    } else {
        let f = kernel!(M, dev, format!("layer_norm_bwd_x_{sfx}"));
        let mut dx = out.slice_mut(0..n);
        let mut b = f.builder();
        b.arg(&x).arg(&w).arg(&g).arg(&mut dx);
        b.arg(&cols_i).arg(&rows_i).arg(&eps);
        run(&mut b, row_groups(rows, cols))?;
        // float2 (mean, rstd) per row.
        let stats = alloc::<f32>(dev, 2 * rows)?;
        let f = kernel!(M, dev, format!("layer_norm_stats_{sfx}"));
        let mut b = f.builder();
        b.arg(&x).arg(&stats).arg(&cols_i).arg(&rows_i).arg(&eps);
        run(&mut b, row_groups(rows, cols))?;
        let (per, chunks) = column_chunks(rows);
        // A block per (chunk, tile of 256 columns), a thread per column.
        let cfg = LaunchConfig {
            grid_dim: (chunks as u32, cols.div_ceil(256) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let partial = alloc::<f32>(dev, chunks * 2 * cols)?;
        let f = kernel!(M, dev, format!("layer_norm_bwd_wb_partial_{sfx}"));
        let per_i = per as i32;
        let mut b = f.builder();
        b.arg(&x).arg(&g).arg(&stats).arg(&partial);
        b.arg(&rows_i).arg(&cols_i).arg(&per_i);
        run(&mut b, cfg)?;
        (partial, chunks)
    };
    let f = kernel!(M, dev, format!("layer_norm_bwd_wb_final_{sfx}"));
    let chunks_i = chunks as i32;
    let mut dwb = out.slice_mut(n..);
    let mut b = f.builder();
    b.arg(&partial).arg(&mut dwb).arg(&chunks_i).arg(&cols_i);
    run(&mut b, sum_chunks(2 * cols))?;
    Ok(candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone()))
}
