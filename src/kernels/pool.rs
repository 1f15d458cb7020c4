//! The 2x2 max-pool after the CNN's convolutions, as one op: one pass
//! forward, and a backward that routes each gradient to its window's
//! maximum, where the composed version (reshape, two `max` reductions) takes
//! four nodes and candle's strided reductions. f32 on the CPU; f32, f16 and
//! bf16 on CUDA (`conv_cuda.rs`, `kernels/conv.cu`); elsewhere the caller
//! composes it.

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use multiversion::multiversion;
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

/// 2x2 max-pooling of `x [B, C, H, W]` (stride 2; an odd last row or column
/// is dropped), where [`super::covers`] takes `x`; None elsewhere (the
/// caller composes it).
pub fn max_pool2x2(x: &Tensor) -> Result<Option<Tensor>> {
    if !(super::covers(x) && x.rank() == 4) {
        return Ok(None);
    }
    x.contiguous()?.apply_op1(MaxPool::default()).map(Some)
}

#[derive(Default)]
struct MaxPool {
    /// Where each window's maximum is (0..4, a byte a window), from the CPU
    /// forward: the backward reads these instead of the window's four
    /// inputs. A backward that reread the input, long after the forward
    /// and past the caches (conv1's output is 3.2 MB in
    /// `scripts/fashion_mnist.lua`), was 14% of that recipe's samples.
    places: Mutex<Option<Arc<Vec<u8>>>>,
}

/// The maximum of a 2x2 window `[a, b; c, d]` and its place in it (0..4):
/// the first of equal maxima, row by row, and a NaN kept where it comes
/// first. Selects, not branches: on real activations the comparisons are
/// coin flips, and mispredicted branches made the pool a quarter of the CNN
/// step; these compile to vector compares and blends.
#[inline(always)]
fn window_max(a: f32, b: f32, c: f32, d: f32) -> (f32, u32) {
    let (mut m, mut k) = (a, 0);
    for (v, i) in [(b, 1), (c, 2), (d, 3)] {
        let gt = v > m;
        m = if gt { v } else { m };
        k = if gt { i } else { k };
    }
    (m, k)
}

/// Output row `i` of one `[H, W]` plane: the two input rows it pools.
#[inline(always)]
fn row_pair(xs: &[f32], w: usize, i: usize) -> (&[f32], &[f32]) {
    let top = &xs[2 * i * w..];
    (&top[..w], &top[w..2 * w])
}

/// One `[H, W]` plane `xs` (rows of `w`) pooled into `ys` (`H/2` rows of
/// `w/2`), with each window's place of its maximum in `ks` (as `ys`).
#[multiversion(targets("x86_64+avx2+fma"))]
fn pool_plane(xs: &[f32], w: usize, ys: &mut [f32], ks: &mut [u8]) {
    let rows = ys.chunks_exact_mut(w / 2).zip(ks.chunks_exact_mut(w / 2));
    for (i, (out, places)) in rows.enumerate() {
        let (r0, r1) = row_pair(xs, w, i);
        for (j, (o, k)) in out.iter_mut().zip(places).enumerate() {
            let at = 2 * j;
            let (m, at_max) = window_max(r0[at], r0[at + 1], r1[at], r1[at + 1]);
            (*o, *k) = (m, at_max as u8);
        }
    }
}

/// One plane's gradient `dxs` (`h` rows of `w`) from the pooled gradient
/// `dys` and the places of the maxima `ks` (both `h/2` rows of `w/2`): each
/// value onto its window's maximum, zeros elsewhere; every value of `dxs`
/// written.
#[multiversion(targets("x86_64+avx2+fma"))]
fn grad_plane_at(ks: &[u8], dys: &[f32], (h, w): (usize, usize), dxs: &mut [MaybeUninit<f32>]) {
    let (h2, w2) = (h / 2, w / 2);
    for i in 0..h2 {
        let (g, k) = (&dys[i * w2..(i + 1) * w2], &ks[i * w2..(i + 1) * w2]);
        let (d0, d1) = dxs[2 * i * w..2 * (i + 1) * w].split_at_mut(w);
        for (j, (&g, &k)) in g.iter().zip(k).enumerate() {
            let at = 2 * j;
            // Every place of the window written: no branch.
            let pick = |i| if k == i { g } else { 0.0 };
            d0[at].write(pick(0));
            d0[at + 1].write(pick(1));
            d1[at].write(pick(2));
            d1[at + 1].write(pick(3));
        }
        // An odd last column.
        for d in [d0, d1] {
            d[2 * w2..].iter_mut().for_each(|v| {
                v.write(0.0);
            });
        }
    }
    // An odd last row (or all of a plane too small to pool).
    dxs[2 * h2 * w..].iter_mut().for_each(|v| {
        v.write(0.0);
    });
}

impl CustomOp1 for MaxPool {
    fn name(&self) -> &'static str {
        "taper-max-pool-2x2"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s, l, "max-pool input")?;
        let (b, c, h, w) = l.shape().dims4()?;
        let (h2, w2) = (h / 2, w / 2);
        let mut y = vec![0f32; b * c * h2 * w2];
        let mut places = vec![0u8; y.len()];
        if h2 > 0 && w2 > 0 {
            y.par_chunks_mut(h2 * w2)
                .zip(places.par_chunks_mut(h2 * w2))
                .zip(x.par_chunks(h * w))
                .for_each(|((ys, ks), xs)| pool_plane(xs, w, ys, ks));
        }
        *self.places.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(places));
        Ok((CpuStorage::F32(y), Shape::from((b, c, h2, w2))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::conv_cuda::max_pool;
        let (b, c, h, w) = l.shape().dims4()?;
        let y = super::cuda::by_float!(s, max_pool(s, l))?;
        Ok((y, Shape::from((b, c, h / 2, w / 2))))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let dy = dy.detach().contiguous()?;
        let places = self
            .places
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let (Some(places), true) = (places, dy.device().is_cpu()) {
            let op = GradAt {
                places,
                dims: x.dims4()?,
            };
            return Ok(Some(dy.apply_op1_no_bwd(&op)?));
        }
        Ok(Some(x.detach().apply_op2_no_bwd(&dy, &MaxPoolGrad)?))
    }
}

/// The CPU backward from the forward's places of the maxima: each output
/// gradient onto its window's maximum.
struct GradAt {
    places: Arc<Vec<u8>>,
    /// The input's `[B, C, H, W]`.
    dims: (usize, usize, usize, usize),
}

impl CustomOp1 for GradAt {
    fn name(&self) -> &'static str {
        "taper-max-pool-2x2-grad-at"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let dy = super::f32_slice(s, l, "max-pool gradient")?;
        let (b, c, h, w) = self.dims;
        let (h2, w2) = (h / 2, w / 2);
        if l.dims() != [b, c, h2, w2] || self.places.len() != dy.len() {
            bail!(
                "max-pool backward: input {:?}, gradient {:?}",
                self.dims,
                l.dims()
            )
        }
        let fill = |plane: usize, dxs: &mut [MaybeUninit<f32>]| {
            let win = plane * h2 * w2..(plane + 1) * h2 * w2;
            grad_plane_at(&self.places[win.clone()], &dy[win], (h, w), dxs);
        };
        // SAFETY: `grad_plane_at` writes each plane's pooled windows, its
        // odd last column and its rows past the last window: all h * w values.
        let dx = unsafe { super::par_written(b * c * h * w, h * w, fill) };
        Ok((CpuStorage::F32(dx), Shape::from(self.dims)))
    }
}

/// The backward's shapes from `x [B, C, H, W]` and `dy [B, C, H/2, W/2]`.
#[cfg(feature = "cuda")]
pub(super) fn grad_dims(x: &Layout, dy: &Layout) -> Result<(usize, usize, usize, usize)> {
    let (b, c, h, w) = x.shape().dims4()?;
    if dy.dims() != [b, c, h / 2, w / 2] {
        bail!(
            "max-pool backward: input {:?}, gradient {:?}",
            x.dims(),
            dy.dims()
        )
    }
    Ok((b, c, h, w))
}

/// Each output gradient onto its window's maximum in `x` (CUDA).
struct MaxPoolGrad;

impl CustomOp2 for MaxPoolGrad {
    fn name(&self) -> &'static str {
        "taper-max-pool-2x2-grad"
    }

    /// The CPU forward keeps the places of the maxima, and its backward
    /// reads them ([`GradAt`]).
    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("max-pool backward: on the CPU it reads the forward's places of the maxima")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::conv_cuda::max_pool_grad;
        let dx = super::cuda::by_float!(s1, max_pool_grad((s1, l1), (s2, l2)))?;
        Ok((dx, l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Max-pooling and its gradient against the composed version (reshape
    /// and two `max`), at odd sizes, on distinct values (no ties).
    #[test]
    fn max_pool_matches_the_composed_version() -> Result<()> {
        let dev = Device::Cpu;
        let n = 2 * 3 * 7 * 9;
        let v: Vec<f32> = (0..n).map(|i| ((i * 7919) % n) as f32 / n as f32).collect();
        let x = Var::from_tensor(&Tensor::from_vec(v, (2, 3, 7, 9), &dev)?)?;
        let probe = Tensor::from_vec(
            (0..2 * 3 * 3 * 4)
                .map(|i| (i as f32 * 0.37).sin())
                .collect::<Vec<_>>(),
            (2, 3, 3, 4),
            &dev,
        )?;
        let y = max_pool2x2(x.as_tensor())?.expect("fused on the CPU");
        let g = (&y * &probe)?.sum_all()?.backward()?;
        let y0 = x
            .as_tensor()
            .narrow(2, 0, 6)?
            .narrow(3, 0, 8)?
            .reshape((2, 3, 3, 2, 4, 2))?
            .max(5)?
            .max(3)?;
        let g0 = (&y0 * &probe)?.sum_all()?.backward()?;
        assert_eq!(y.dims(), &[2, 3, 3, 4]);
        assert_eq!(
            y.flatten_all()?.to_vec1::<f32>()?,
            y0.flatten_all()?.to_vec1::<f32>()?
        );
        assert_eq!(
            g.get(&x)
                .expect("gradient")
                .flatten_all()?
                .to_vec1::<f32>()?,
            g0.get(&x)
                .expect("gradient")
                .flatten_all()?
                .to_vec1::<f32>()?
        );
        Ok(())
    }

    /// Equal maxima: the gradient goes to the first of them, row by row
    /// (as PyTorch's max_pool2d does), and a NaN first in its window is kept.
    #[test]
    fn ties_go_to_the_first_maximum() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::from_vec(
            vec![
                1f32,
                1.,
                0.,
                2.,
                1.,
                1.,
                2.,
                2.,
                f32::NAN,
                5.,
                0.,
                0.,
                9.,
                9.,
                0.,
                0.,
            ],
            (1, 1, 4, 4),
            &dev,
        )?)?;
        let y = max_pool2x2(x.as_tensor())?.expect("fused on the CPU");
        let probe = Tensor::from_vec(vec![1f32, 2., 3., 4.], (1, 1, 2, 2), &dev)?;
        let g = (&y * &probe)?.sum_all()?.backward()?;
        let flat = |t: &Tensor| t.flatten_all().and_then(|t| t.to_vec1::<f32>());
        let y = flat(&y)?;
        assert_eq!(y[..2], [1., 2.]);
        assert!(y[2].is_nan());
        assert_eq!(y[3], 0.);
        let gx = flat(g.get(&x).expect("gradient"))?;
        assert_eq!(
            gx,
            [1., 0., 0., 2., 0., 0., 0., 0., 3., 0., 4., 0., 0., 0., 0., 0.]
        );
        Ok(())
    }

    /// Planes with a single row or column pool to nothing, and their
    /// gradient is written as zeros, not left unset.
    #[test]
    fn planes_too_small_to_pool_get_zero_gradients() -> Result<()> {
        let dev = Device::Cpu;
        for shape in [(2, 3, 1, 5), (2, 3, 5, 1), (1, 2, 3, 3)] {
            let n = shape.0 * shape.1 * shape.2 * shape.3;
            let x =
                Var::from_tensor(&(Tensor::ones(shape, candle_core::DType::F32, &dev)? * 7.0)?)?;
            let y = max_pool2x2(x.as_tensor())?.expect("fused on the CPU");
            let g = (y.sum_all()? * 3.0)?.backward()?;
            let gx = g
                .get(&x)
                .expect("gradient")
                .flatten_all()?
                .to_vec1::<f32>()?;
            let pooled = y.elem_count();
            assert_eq!(
                gx.iter().filter(|&&v| v == 3.0).count(),
                pooled,
                "{shape:?}"
            );
            assert_eq!(
                gx.iter().filter(|&&v| v == 0.0).count(),
                n - pooled,
                "{shape:?}"
            );
        }
        Ok(())
    }

    /// `relu(pool(x))` is `pool(relu(x))`, gradient included (the CNN pools
    /// first): on values of both signs, windows all negative among them.
    #[test]
    fn relu_commutes_with_the_max_pool() -> Result<()> {
        let dev = Device::Cpu;
        let n = 2 * 3 * 6 * 8;
        let v: Vec<f32> = (0..n)
            .map(|i| (((i * 7919) % n) as f32 / n as f32) - 0.6)
            .collect();
        let x = Var::from_tensor(&Tensor::from_vec(v, (2, 3, 6, 8), &dev)?)?;
        let probe = Tensor::from_vec(
            (0..2 * 3 * 3 * 4)
                .map(|i| (i as f32 * 0.71).cos())
                .collect::<Vec<_>>(),
            (2, 3, 3, 4),
            &dev,
        )?;
        let a = max_pool2x2(x.as_tensor())?.expect("fused").relu()?;
        let b = max_pool2x2(&x.as_tensor().relu()?)?.expect("fused");
        let ga = (&a * &probe)?.sum_all()?.backward()?;
        let gb = (&b * &probe)?.sum_all()?.backward()?;
        let flat = |t: &Tensor| t.flatten_all().and_then(|t| t.to_vec1::<f32>());
        assert_eq!(flat(&a)?, flat(&b)?);
        assert_eq!(
            flat(ga.get(&x).expect("gradient"))?,
            flat(gb.get(&x).expect("gradient"))?
        );
        Ok(())
    }
}
