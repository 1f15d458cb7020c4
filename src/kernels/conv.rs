//! The convolution of `taper.model.cnn` (a square kernel, zero padding,
//! stride 1) as one op with its own backward. candle 0.11's CPU conv2d has
//! an im2col forward, but its backward is a transposed convolution and a
//! convolution of the input by the gradient, both direct loops: in a `perf`
//! profile of the CNN step they and the thread pool waiting on them were
//! most of the time. Here each sample is unfolded (im2col:
//! `[C*k*k, Ho*Wo]`), and the forward and both gradients are one `gemm` each
//! per sample, samples across threads:
//!
//! - `y_b = W [O, C*k*k] col_b + bias`
//! - `dW = sum_b dy_b [O, Ho*Wo] col_b^T`, `dbias = sum_b,h,w dy`
//! - `dx_b = col2im(W^T dy_b)`
//!
//! f32 on the CPU, any kernel size and padding. On CUDA (`conv_cuda.rs`,
//! `kernels/conv.cu`) the same in f32, f16 or bf16: im2col and col2im
//! kernels around cuBLAS products, samples batched in chunks of bounded
//! scratch. Elsewhere (other dtypes, other devices) candle's `conv2d`.
//!
//! The backward's three ops are in `conv_grad.rs`; the 2x2 max-pool after
//! it is one op too (`pool.rs`).

use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};

use super::conv_cpu::{im2col, with_scratch, Geometry};
use super::conv_grad::{ChannelSum, InputGrad, WeightGrad};
use super::mm;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;

/// `conv2d(x, w, padding 1) + b` for `x [B, C, H, W]`, `w [O, C, 3, 3]`, `b [O]`.
pub fn conv3x3(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    conv2d(x, w, b, 1)
}

/// `conv2d(x, w, padding) + b` (stride 1) for `x [B, C, H, W]`,
/// `w [O, C, k, k]`, `b [O]`: `[B, O, H + 2 padding - k + 1, ...]`.
pub fn conv2d(x: &Tensor, w: &Tensor, b: &Tensor, padding: usize) -> Result<Tensor> {
    if let Some(op) = fused(x, w, b, padding) {
        return x
            .contiguous()?
            .apply_op3(&w.contiguous()?, &b.contiguous()?, op);
    }
    let y = x.conv2d(w, padding, 1, 1, 1)?;
    y.broadcast_add(&b.reshape((1, (), 1, 1))?)
}

/// The fused op for these operands, if it takes them: any square kernel
/// (on the CPU in f32, on CUDA in f32, f16 or bf16: `super::covers`).
fn fused(x: &Tensor, w: &Tensor, b: &Tensor, padding: usize) -> Option<Conv> {
    let here = |t: &Tensor| {
        t.dtype() == x.dtype() && t.device().same_device(x.device()) && super::covers(t)
    };
    let (wd, xd) = (w.dims(), x.dims());
    let square = wd.len() == 4 && wd[2] == wd[3] && wd[2] > 0;
    let ok = [x, w, b].iter().all(|t| here(t))
        && xd.len() == 4
        && square
        && wd[1] == xd[1]
        && b.dims() == [wd[0]];
    let op = Conv {
        k: wd.get(2).copied()?,
        p: padding,
    };
    // A kernel larger than the padded image is left to candle.
    let (ho, wo) = op.geometry(xd.get(1..4)?).out();
    (ok && ho > 0 && wo > 0).then_some(op)
}

/// Shapes: (batch, geometry, out channels), from `x [B, C, H, W]` and
/// `w [O, C, k, k]`.
pub(super) fn shapes(x: &Layout, w: &Layout, op: &Conv) -> Result<(usize, Geometry, usize)> {
    let (b, c, h, wd) = x.shape().dims4()?;
    let (o, c2, k1, k2) = w.shape().dims4()?;
    if c2 != c || (k1, k2) != (op.k, op.k) {
        bail!("conv2d: input {:?}, weight {:?}", x.dims(), w.dims())
    }
    Ok((b, op.geometry(&[c, h, wd]), o))
}

/// The input gradient's shapes from `dy [B, O, Ho, Wo]` and
/// `w [O, C, k, k]`: (batch, out channels, the input's geometry).
pub(super) fn input_grad_shapes(
    dy: &Layout,
    w: &Layout,
    op: &Conv,
) -> Result<(usize, usize, Geometry)> {
    let (b, o, ho, wo) = dy.shape().dims4()?;
    let (o2, c, _, _) = w.shape().dims4()?;
    // The input's size from the output's: h = ho - 2p + k - 1.
    let size = |n: usize| (n + op.k - 1).checked_sub(2 * op.p);
    let (Some(h), Some(wd)) = (size(ho), size(wo)) else {
        bail!(
            "conv2d backward: gradient {:?}, padding {}",
            dy.dims(),
            op.p
        )
    };
    if o2 != o {
        bail!(
            "conv2d backward: gradient {:?}, weight {:?}",
            dy.dims(),
            w.dims()
        )
    }
    Ok((b, o, op.geometry(&[c, h, wd])))
}

/// The weight gradient's shapes from `x [B, C, H, W]` and
/// `dy [B, O, Ho, Wo]`: (the input's geometry, out channels).
pub(super) fn weight_grad_shapes(x: &Layout, dy: &Layout, op: &Conv) -> Result<(Geometry, usize)> {
    let (b, c, h, wd) = x.shape().dims4()?;
    let (b2, o, ho, wo) = dy.shape().dims4()?;
    let g = op.geometry(&[c, h, wd]);
    if (b2, ho, wo) != (b, g.out().0, g.out().1) {
        bail!(
            "conv2d backward: input {:?}, gradient {:?}",
            x.dims(),
            dy.dims()
        )
    }
    Ok((g, o))
}

/// The convolution: a `k x k` kernel, `p` zeros on every side.
#[derive(Debug, Clone, Copy)]
pub(super) struct Conv {
    pub k: usize,
    pub p: usize,
}

impl Conv {
    pub fn geometry(&self, chw: &[usize]) -> Geometry {
        Geometry {
            c: chw[0],
            h: chw[1],
            w: chw[2],
            k: self.k,
            p: self.p,
        }
    }
}

impl CustomOp3 for Conv {
    fn name(&self) -> &'static str {
        "taper-conv2d"
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
        let (b, g, o) = shapes(l1, l2, self)?;
        let ((ho, wo), taps, chw) = (g.out(), g.taps(), g.c * g.h * g.w);
        let hw = ho * wo;
        let fill = |bi: usize, ys: &mut [std::mem::MaybeUninit<f32>]| {
            for (plane, &v) in ys.chunks_mut(hw.max(1)).zip(bias) {
                plane.iter_mut().for_each(|y| {
                    y.write(v);
                });
            }
            // SAFETY: the o planes of hw values, the whole chunk, were just
            // written.
            let ys = unsafe { super::written(ys) };
            if hw > 0 && taps > 0 {
                with_scratch(taps * hw, |col| {
                    im2col(&x[bi * chw..(bi + 1) * chw], g, col);
                    mm((o, hw, taps), ys, true, w, (taps, 1), col, (hw, 1));
                })
            }
        };
        // SAFETY: `fill` writes each sample's o planes whole.
        let y = unsafe { super::par_written(b * o * hw, o * hw, fill) };
        Ok((CpuStorage::F32(y), Shape::from((b, o, ho, wo))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        use super::conv_cuda::forward;
        let (b, g, o) = shapes(l1, l2, self)?;
        let y = super::cuda::by_float!(s1, forward(self, (s1, l1), (s2, l2), (s3, l3)))?;
        let (ho, wo) = g.out();
        Ok((y, Shape::from((b, o, ho, wo))))
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
            true => Some(dy.apply_op2_no_bwd(&w, &InputGrad(*self))?),
            false => None,
        };
        let dw = x.apply_op2_no_bwd(&dy, &WeightGrad(*self))?;
        // candle's strided sum over (0, 2, 3) was a sixth of the CNN step.
        let db = dy.apply_op1_no_bwd(&ChannelSum)?;
        Ok((dx, Some(dw), Some(db)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    /// Forward and the three gradients against candle's conv2d in f64, at
    /// odd sizes (edges on every side), for kernels of 1 to 7 with and
    /// without padding (PyTorch's `Conv2d(c, o, 5)` has none).
    #[test]
    fn matches_candle_conv2d_in_float64() -> Result<()> {
        for (k, p) in [
            (3, 1),
            (5, 0),
            (5, 2),
            (1, 0),
            (3, 0),
            (4, 1),
            (7, 3),
            (2, 3),
        ] {
            matches_candle_at(k, p)?;
        }
        Ok(())
    }

    fn matches_candle_at(k: usize, p: usize) -> Result<()> {
        let dev = Device::Cpu;
        let vals = |n: usize, m: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * m) % 1009) as f32 / 504.5 - 1.0)
                .collect()
        };
        let (b, c, h, w, o) = (3, 2, 7, 6, 5);
        let (ho, wo) = (h + 2 * p + 1 - k, w + 2 * p + 1 - k);
        let x = Var::from_tensor(&Tensor::from_vec(
            vals(b * c * h * w, 7919),
            (b, c, h, w),
            &dev,
        )?)?;
        let kw = Var::from_tensor(&Tensor::from_vec(
            vals(o * c * k * k, 104_729),
            (o, c, k, k),
            &dev,
        )?)?;
        let bias = Var::from_tensor(&Tensor::from_vec(vals(o, 31), o, &dev)?)?;
        let probe = Tensor::from_vec(vals(b * o * ho * wo, 613), (b, o, ho, wo), &dev)?;
        assert!(
            fused(x.as_tensor(), kw.as_tensor(), bias.as_tensor(), p).is_some(),
            "{k}x{k} padding {p} not fused"
        );
        let y = conv2d(x.as_tensor(), kw.as_tensor(), bias.as_tensor(), p)?;
        assert_eq!(y.dims(), &[b, o, ho, wo]);
        let g = (&y * &probe)?.sum_all()?.backward()?;

        let f64v =
            |v: &Var| -> Result<Var> { Var::from_tensor(&v.as_tensor().to_dtype(DType::F64)?) };
        let (x64, k64, b64) = (f64v(&x)?, f64v(&kw)?, f64v(&bias)?);
        let y64 = x64
            .as_tensor()
            .conv2d(k64.as_tensor(), p, 1, 1, 1)?
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
        assert!(err(&y, &y64)? < 1e-6, "{k}x{k} padding {p}: forward");
        for (v, r, what) in [
            (&x, &x64, "input"),
            (&kw, &k64, "weight"),
            (&bias, &b64, "bias"),
        ] {
            let e = err(g.get(v).expect("gradient"), g64.get(r).expect("gradient"))?;
            assert!(e < 1e-6, "{k}x{k} padding {p}: {what} gradient error {e}");
        }
        Ok(())
    }

    /// A kernel larger than the padded image is left to candle (the model
    /// refuses such sizes before: `Cnn::check`).
    #[test]
    fn a_kernel_larger_than_the_padded_image_is_not_fused() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::zeros((1, 1, 4, 4), DType::F32, &dev)?;
        let w = Tensor::zeros((2, 1, 7, 7), DType::F32, &dev)?;
        let b = Tensor::zeros(2, DType::F32, &dev)?;
        assert!(fused(&x, &w, &b, 1).is_none());
        assert!(fused(&x, &w, &b, 2).is_some());
        Ok(())
    }
}
