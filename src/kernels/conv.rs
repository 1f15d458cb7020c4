//! The 3x3 convolution of `taper.model.cnn` (padding 1, stride 1) as one op
//! with its own backward. candle 0.11's CPU conv2d has an im2col forward,
//! but its backward is a transposed convolution and a convolution of the
//! input by the gradient, both direct loops: in a `perf` profile of the CNN
//! step they and the thread pool waiting on them were most of the time.
//! Here each sample is unfolded (im2col: `[C*9, H*W]`), and the forward and
//! both gradients are one `gemm` each per sample, samples across threads:
//!
//! - `y_b = W [O, C*9] col_b + bias`
//! - `dW = sum_b dy_b [O, H*W] col_b^T`, `dbias = sum_b,h,w dy`
//! - `dx_b = col2im(W^T dy_b)`
//!
//! f32 on the CPU; elsewhere candle's `conv2d`.
//!
//! The 2x2 max-pool after it is one op too ([`max_pool2x2`]): one pass
//! forward, and a backward that routes each gradient to its window's
//! maximum, where the composed version (reshape, two `max` reductions) takes
//! four nodes and candle's strided reductions.

use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor,
};
use gemm::{gemm, Parallelism};
use rayon::prelude::*;

/// `conv2d(x, w, padding 1) + b` for `x [B, C, H, W]`, `w [O, C, 3, 3]`, `b [O]`.
pub fn conv3x3(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    if fused_ok(x, w, b) {
        return x
            .contiguous()?
            .apply_op3(&w.contiguous()?, &b.contiguous()?, Conv3x3);
    }
    let y = x.conv2d(w, 1, 1, 1, 1)?;
    y.broadcast_add(&b.reshape((1, (), 1, 1))?)
}

fn fused_ok(x: &Tensor, w: &Tensor, b: &Tensor) -> bool {
    let cpu_f32 = |t: &Tensor| t.device().is_cpu() && t.dtype() == candle_core::DType::F32;
    super::fused()
        && [x, w, b].iter().all(|t| cpu_f32(t))
        && x.rank() == 4
        && w.dims().len() == 4
        && w.dims()[2..] == [3, 3]
        && w.dims()[1] == x.dims()[1]
        && b.dims() == [w.dims()[0]]
}

/// Shapes: (batch, in channels, height, width, out channels).
fn dims(x: &Layout, w: &Layout) -> Result<(usize, usize, usize, usize, usize)> {
    let (b, c, h, wd) = x.shape().dims4()?;
    let (o, c2, k1, k2) = w.shape().dims4()?;
    if c2 != c || k1 != 3 || k2 != 3 {
        bail!("conv3x3: input {:?}, weight {:?}", x.dims(), w.dims())
    }
    Ok((b, c, h, wd, o))
}

thread_local! {
    /// Each thread's im2col buffer, kept between calls: every element is
    /// written before it is read, so it is never zeroed again.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's scratch buffer of at least `n` floats.
fn with_scratch<T>(n: usize, f: impl FnOnce(&mut [f32]) -> T) -> T {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < n {
            s.resize(n, 0.0);
        }
        f(&mut s[..n])
    })
}

/// The column range `(dst, src)` of kernel column `kx` in a row of width
/// `w`: output column `xo` reads input column `xo + kx - 1`.
fn shifted(kx: usize, w: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    match kx {
        0 => (1..w, 0..w - 1),
        1 => (0..w, 0..w),
        _ => (0..w - 1, 1..w),
    }
}

/// `x [C, H, W]` unfolded into `col [C*9, H*W]`, zeros outside the image.
fn im2col(x: &[f32], c: usize, h: usize, w: usize, col: &mut [f32]) {
    let hw = h * w;
    if w == 0 {
        return;
    }
    for ci in 0..c {
        let img = &x[ci * hw..(ci + 1) * hw];
        for ky in 0..3 {
            for kx in 0..3 {
                let row = &mut col[(ci * 9 + ky * 3 + kx) * hw..][..hw];
                let (to, from) = shifted(kx, w);
                for y in 0..h {
                    let out = &mut row[y * w..(y + 1) * w];
                    let sy = y + ky;
                    if sy == 0 || sy > h {
                        out.fill(0.0);
                        continue;
                    }
                    let src = &img[(sy - 1) * w..sy * w];
                    out[to.clone()].copy_from_slice(&src[from.clone()]);
                    match kx {
                        0 => out[0] = 0.0,
                        2 => out[w - 1] = 0.0,
                        _ => {}
                    }
                }
            }
        }
    }
}

/// Adds `col [C*9, H*W]` back onto `x [C, H, W]` (im2col's adjoint).
fn col2im(col: &[f32], c: usize, h: usize, w: usize, x: &mut [f32]) {
    let hw = h * w;
    if w == 0 {
        return;
    }
    for ci in 0..c {
        let img = &mut x[ci * hw..(ci + 1) * hw];
        for ky in 0..3 {
            for kx in 0..3 {
                let row = &col[(ci * 9 + ky * 3 + kx) * hw..][..hw];
                let (from, to) = shifted(kx, w);
                for y in 0..h {
                    let sy = y + ky;
                    if sy == 0 || sy > h {
                        continue;
                    }
                    let dst = &mut img[(sy - 1) * w..sy * w];
                    let src = &row[y * w..(y + 1) * w];
                    for (d, v) in dst[to.clone()].iter_mut().zip(&src[from.clone()]) {
                        *d += v;
                    }
                }
            }
        }
    }
}

/// Row-major `dst [m, n] = a(m x k) b(k x n) + (keep ? dst : 0)`, where each
/// operand is given with its (row stride, column stride).
#[allow(clippy::too_many_arguments)]
fn mm(
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    keep: bool,
    a: &[f32],
    (a_rs, a_cs): (usize, usize),
    b: &[f32],
    (b_rs, b_cs): (usize, usize),
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    debug_assert!(dst.len() >= m * n);
    // SAFETY: dst is m x n row-major (row stride n); a and b are read only
    // at (i, l) -> i * rs + l * cs within their m x k and k x n extents, which
    // the callers size exactly.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            keep,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        )
    }
}

struct Conv3x3;

impl CustomOp3 for Conv3x3 {
    fn name(&self) -> &'static str {
        "taper-conv3x3"
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
        let x = super::f32_slice(s1, l1, "conv input")?;
        let w = super::f32_slice(s2, l2, "conv weight")?;
        let bias = super::f32_slice(s3, l3, "conv bias")?;
        let (b, c, h, wd, o) = dims(l1, l2)?;
        let (hw, c9) = (h * wd, c * 9);
        let mut y = vec![0f32; b * o * hw];
        if hw > 0 && o > 0 {
            y.par_chunks_mut(o * hw)
                .zip(x.par_chunks(c * hw))
                .for_each(|(ys, xs)| {
                    with_scratch(c9 * hw, |col| {
                        im2col(xs, c, h, wd, col);
                        for (oi, plane) in ys.chunks_mut(hw).enumerate() {
                            plane.fill(bias[oi]);
                        }
                        mm((o, hw, c9), ys, true, w, (c9, 1), col, (hw, 1));
                    })
                });
        }
        Ok((CpuStorage::F32(y), Shape::from((b, o, h, wd))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // The first layer's input is data: no gradient, no col2im.
        let wants_dx = x.track_op();
        let (x, w, dy) = (x.detach(), w.detach(), dy.detach().contiguous()?);
        let dx = match wants_dx {
            true => Some(dy.apply_op2_no_bwd(&w, &InputGrad)?),
            false => None,
        };
        let dw = x.apply_op2_no_bwd(&dy, &WeightGrad)?;
        // candle's strided sum over (0, 2, 3) was a sixth of the CNN step.
        let db = dy.apply_op1_no_bwd(&ChannelSum)?;
        Ok((dx, Some(dw), Some(db)))
    }
}

/// `dx_b = col2im(W^T dy_b)`, from `dy [B, O, H, W]` and `w [O, C, 3, 3]`.
struct InputGrad;

impl CustomOp2 for InputGrad {
    fn name(&self) -> &'static str {
        "taper-conv3x3-input-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let dy = super::f32_slice(s1, l1, "conv output gradient")?;
        let w = super::f32_slice(s2, l2, "conv weight")?;
        let (b, o, h, wd) = l1.shape().dims4()?;
        let (o2, c, _, _) = l2.shape().dims4()?;
        if o2 != o {
            bail!(
                "conv3x3 backward: gradient {:?}, weight {:?}",
                l1.dims(),
                l2.dims()
            )
        }
        let (hw, c9) = (h * wd, c * 9);
        let mut dx = vec![0f32; b * c * hw];
        if hw > 0 && c > 0 {
            dx.par_chunks_mut(c * hw)
                .zip(dy.par_chunks(o * hw))
                .for_each(|(dxs, dys)| {
                    with_scratch(c9 * hw, |col| {
                        // W^T [C*9, O] read from w [O, C*9].
                        mm((c9, hw, o), col, false, w, (1, c9), dys, (hw, 1));
                        col2im(col, c, h, wd, dxs);
                    })
                });
        }
        Ok((CpuStorage::F32(dx), Shape::from((b, c, h, wd))))
    }
}

/// `dW = sum_b dy_b col_b^T`, from `x [B, C, H, W]` and `dy [B, O, H, W]`.
struct WeightGrad;

impl CustomOp2 for WeightGrad {
    fn name(&self) -> &'static str {
        "taper-conv3x3-weight-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s1, l1, "conv input")?;
        let dy = super::f32_slice(s2, l2, "conv output gradient")?;
        let (b, c, h, wd) = l1.shape().dims4()?;
        let (b2, o, h2, w2) = l2.shape().dims4()?;
        if (b2, h2, w2) != (b, h, wd) {
            bail!(
                "conv3x3 backward: input {:?}, gradient {:?}",
                l1.dims(),
                l2.dims()
            )
        }
        let (hw, c9) = (h * wd, c * 9);
        let dw = x
            .par_chunks(c * hw)
            .zip(dy.par_chunks(o * hw))
            .fold(
                || vec![0f32; o * c9],
                |mut acc, (xs, dys)| {
                    with_scratch(c9 * hw, |col| {
                        im2col(xs, c, h, wd, col);
                        // dy_b [O, HW] times col^T [HW, C*9], read from col [C*9, HW].
                        mm((o, c9, hw), &mut acc, true, dys, (hw, 1), col, (1, hw));
                    });
                    acc
                },
            )
            .reduce(
                || vec![0f32; o * c9],
                |mut a, b| {
                    a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
                    a
                },
            );
        Ok((CpuStorage::F32(dw), Shape::from((o, c, 3, 3))))
    }
}

/// `dy [B, O, H, W]` summed to `[O]`: the bias gradient.
struct ChannelSum;

impl CustomOp1 for ChannelSum {
    fn name(&self) -> &'static str {
        "taper-channel-sum"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let dy = super::f32_slice(s, l, "conv output gradient")?;
        let (b, o, h, w) = l.shape().dims4()?;
        let hw = h * w;
        let sums: Vec<f32> = (0..o)
            .into_par_iter()
            .map(|oi| {
                (0..b)
                    .map(|bi| {
                        let at = (bi * o + oi) * hw;
                        dy[at..at + hw].iter().map(|&v| v as f64).sum::<f64>()
                    })
                    .sum::<f64>() as f32
            })
            .collect();
        Ok((CpuStorage::F32(sums), Shape::from(o)))
    }
}

/// 2x2 max-pooling of `x [B, C, H, W]` (stride 2; an odd last row or column
/// is dropped), f32 on the CPU; None elsewhere (the caller composes it).
pub fn max_pool2x2(x: &Tensor) -> Result<Option<Tensor>> {
    if !(super::fused()
        && x.device().is_cpu()
        && x.dtype() == candle_core::DType::F32
        && x.rank() == 4)
    {
        return Ok(None);
    }
    x.contiguous()?.apply_op1(MaxPool).map(Some)
}

struct MaxPool;

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
fn row_pair(xs: &[f32], w: usize, i: usize) -> (&[f32], &[f32]) {
    let top = &xs[2 * i * w..];
    (&top[..w], &top[w..2 * w])
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
        if h2 > 0 && w2 > 0 {
            y.par_chunks_mut(h2 * w2)
                .zip(x.par_chunks(h * w))
                .for_each(|(ys, xs)| {
                    for (i, out) in ys.chunks_exact_mut(w2).enumerate() {
                        let (r0, r1) = row_pair(xs, w, i);
                        for (j, o) in out.iter_mut().enumerate() {
                            let at = 2 * j;
                            *o = window_max(r0[at], r0[at + 1], r1[at], r1[at + 1]).0;
                        }
                    }
                });
        }
        Ok((CpuStorage::F32(y), Shape::from((b, c, h2, w2))))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let dy = dy.detach().contiguous()?;
        Ok(Some(x.detach().apply_op2_no_bwd(&dy, &MaxPoolGrad)?))
    }
}

/// Each output gradient onto its window's maximum in `x`.
struct MaxPoolGrad;

impl CustomOp2 for MaxPoolGrad {
    fn name(&self) -> &'static str {
        "taper-max-pool-2x2-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s1, l1, "max-pool input")?;
        let dy = super::f32_slice(s2, l2, "max-pool gradient")?;
        let (b, c, h, w) = l1.shape().dims4()?;
        let (h2, w2) = (h / 2, w / 2);
        if l2.dims() != [b, c, h2, w2] {
            bail!(
                "max-pool backward: input {:?}, gradient {:?}",
                l1.dims(),
                l2.dims()
            )
        }
        let mut dx = vec![0f32; b * c * h * w];
        if h2 > 0 && w2 > 0 {
            dx.par_chunks_mut(h * w)
                .zip(x.par_chunks(h * w).zip(dy.par_chunks(h2 * w2)))
                .for_each(|(dxs, (xs, dys))| {
                    for (i, g) in dys.chunks_exact(w2).enumerate() {
                        let (r0, r1) = row_pair(xs, w, i);
                        let (d0, d1) = dxs[2 * i * w..2 * (i + 1) * w].split_at_mut(w);
                        for (j, &g) in g.iter().enumerate() {
                            let at = 2 * j;
                            let k = window_max(r0[at], r0[at + 1], r1[at], r1[at + 1]).1;
                            // Every place of the window written: no branch.
                            let pick = |i| if k == i { g } else { 0.0 };
                            d0[at] = pick(0);
                            d0[at + 1] = pick(1);
                            d1[at] = pick(2);
                            d1[at + 1] = pick(3);
                        }
                    }
                });
        }
        Ok((CpuStorage::F32(dx), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    /// Forward and the three gradients against candle's conv2d in f64, at
    /// odd sizes (edges on every side).
    #[test]
    fn matches_candle_conv2d_in_float64() -> Result<()> {
        let dev = Device::Cpu;
        let vals = |n: usize, m: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * m) % 1009) as f32 / 504.5 - 1.0)
                .collect()
        };
        let (b, c, h, w, o) = (3, 2, 7, 6, 5);
        let x = Var::from_tensor(&Tensor::from_vec(
            vals(b * c * h * w, 7919),
            (b, c, h, w),
            &dev,
        )?)?;
        let k = Var::from_tensor(&Tensor::from_vec(
            vals(o * c * 9, 104_729),
            (o, c, 3, 3),
            &dev,
        )?)?;
        let bias = Var::from_tensor(&Tensor::from_vec(vals(o, 31), o, &dev)?)?;
        let probe = Tensor::from_vec(vals(b * o * h * w, 613), (b, o, h, w), &dev)?;
        let y = conv3x3(x.as_tensor(), k.as_tensor(), bias.as_tensor())?;
        assert_eq!(y.dims(), &[b, o, h, w]);
        let g = (&y * &probe)?.sum_all()?.backward()?;

        let f64v =
            |v: &Var| -> Result<Var> { Var::from_tensor(&v.as_tensor().to_dtype(DType::F64)?) };
        let (x64, k64, b64) = (f64v(&x)?, f64v(&k)?, f64v(&bias)?);
        let y64 = x64
            .as_tensor()
            .conv2d(k64.as_tensor(), 1, 1, 1, 1)?
            .broadcast_add(&b64.as_tensor().reshape((1, o, 1, 1))?)?;
        let g64 = (&y64 * probe.to_dtype(DType::F64)?)?
            .sum_all()?
            .backward()?;
        let err = |a: &Tensor, r: &Tensor| -> Result<f64> {
            let d = (a.to_dtype(DType::F64)? - r)?
                .abs()?
                .flatten_all()?
                .max(0)?;
            Ok(d.to_scalar::<f64>()? / r.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()?)
        };
        assert!(err(&y, &y64)? < 1e-6, "forward");
        for (v, r, what) in [
            (&x, &x64, "input"),
            (&k, &k64, "weight"),
            (&bias, &b64, "bias"),
        ] {
            let e = err(g.get(v).expect("gradient"), g64.get(r).expect("gradient"))?;
            assert!(e < 1e-6, "{what} gradient error {e}");
        }
        Ok(())
    }

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
