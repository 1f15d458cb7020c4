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
//! f32 on the CPU. On CUDA (`conv_cuda.rs`, `kernels/conv.cu`), in f32,
//! f16 or bf16, the same: im2col and col2im kernels around cuBLAS
//! products, samples batched in chunks of bounded scratch. Elsewhere
//! candle's `conv2d`.
//!
//! The 2x2 max-pool after it is one op too (`pool.rs`).

use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor,
};

use super::conv_cpu::{col2im, im2col, with_scratch};
use super::mm;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
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
    let here = |t: &Tensor| {
        t.dtype() == x.dtype() && t.device().same_device(x.device()) && super::covers(t)
    };
    [x, w, b].iter().all(|t| here(t))
        && x.rank() == 4
        && w.dims().len() == 4
        && w.dims()[2..] == [3, 3]
        && w.dims()[1] == x.dims()[1]
        && b.dims() == [w.dims()[0]]
}

/// Shapes: (batch, in channels, height, width, out channels).
pub(super) fn dims(x: &Layout, w: &Layout) -> Result<(usize, usize, usize, usize, usize)> {
    let (b, c, h, wd) = x.shape().dims4()?;
    let (o, c2, k1, k2) = w.shape().dims4()?;
    if c2 != c || k1 != 3 || k2 != 3 {
        bail!("conv3x3: input {:?}, weight {:?}", x.dims(), w.dims())
    }
    Ok((b, c, h, wd, o))
}

/// The input gradient's shapes from `dy [B, O, H, W]` and `w [O, C, 3, 3]`:
/// (batch, out channels, in channels, height, width).
pub(super) fn input_grad_dims(
    dy: &Layout,
    w: &Layout,
) -> Result<(usize, usize, usize, usize, usize)> {
    let (b, o, h, wd) = dy.shape().dims4()?;
    let (o2, c, _, _) = w.shape().dims4()?;
    if o2 != o {
        bail!(
            "conv3x3 backward: gradient {:?}, weight {:?}",
            dy.dims(),
            w.dims()
        )
    }
    Ok((b, o, c, h, wd))
}

/// The weight gradient's shapes from `x [B, C, H, W]` and `dy [B, O, H, W]`:
/// (batch, in channels, out channels, height, width).
pub(super) fn weight_grad_dims(
    x: &Layout,
    dy: &Layout,
) -> Result<(usize, usize, usize, usize, usize)> {
    let (b, c, h, wd) = x.shape().dims4()?;
    let (b2, o, h2, w2) = dy.shape().dims4()?;
    if (b2, h2, w2) != (b, h, wd) {
        bail!(
            "conv3x3 backward: input {:?}, gradient {:?}",
            x.dims(),
            dy.dims()
        )
    }
    Ok((b, c, o, h, wd))
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
        let fill = |bi: usize, ys: &mut [std::mem::MaybeUninit<f32>]| {
            for (plane, &v) in ys.chunks_mut(hw.max(1)).zip(bias) {
                plane.iter_mut().for_each(|y| {
                    y.write(v);
                });
            }
            // SAFETY: the o planes of hw values, the whole chunk, were just
            // written.
            let ys = unsafe { super::written(ys) };
            if hw > 0 && c9 > 0 {
                with_scratch(c9 * hw, |col| {
                    im2col(&x[bi * c * hw..(bi + 1) * c * hw], c, h, wd, col);
                    mm((o, hw, c9), ys, true, w, (c9, 1), col, (hw, 1));
                })
            }
        };
        // SAFETY: `fill` writes each sample's o planes whole.
        let y = unsafe { super::par_written(b * o * hw, o * hw, fill) };
        Ok((CpuStorage::F32(y), Shape::from((b, o, h, wd))))
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
        let (b, _, h, wd, o) = dims(l1, l2)?;
        let y = super::cuda::by_float!(s1, forward((s1, l1), (s2, l2), (s3, l3)))?;
        Ok((y, Shape::from((b, o, h, wd))))
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
        let (b, o, c, h, wd) = input_grad_dims(l1, l2)?;
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

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        use super::conv_cuda::input_grad;
        let (b, _, c, h, wd) = input_grad_dims(l1, l2)?;
        let dx = super::cuda::by_float!(s1, input_grad((s1, l1), (s2, l2)))?;
        Ok((dx, Shape::from((b, c, h, wd))))
    }
}

/// Samples whose weight gradients one thread adds up before the blocks are
/// summed in order.
const SAMPLES: usize = 4;

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
        let (_, c, o, h, wd) = weight_grad_dims(l1, l2)?;
        let (hw, c9) = (h * wd, c * 9);
        // Blocks of samples across threads, added in block order.
        let (x_block, dy_block) = (c * hw * SAMPLES, o * hw * SAMPLES);
        let dw = super::sum_in_order(dy.len().div_ceil(dy_block.max(1)), o * c9, |block| {
            let mut acc = vec![0f32; o * c9];
            let x = x[block * x_block..].chunks(c * hw);
            for (xs, dys) in x.zip(dy[block * dy_block..].chunks(o * hw)).take(SAMPLES) {
                with_scratch(c9 * hw, |col| {
                    im2col(xs, c, h, wd, col);
                    // dy_b [O, HW] times col^T [HW, C*9], read from col [C*9, HW].
                    mm((o, c9, hw), &mut acc, true, dys, (hw, 1), col, (1, hw));
                });
            }
            acc
        });
        Ok((CpuStorage::F32(dw), Shape::from((o, c, 3, 3))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        use super::conv_cuda::weight_grad;
        let (_, c, o, _, _) = weight_grad_dims(l1, l2)?;
        let dw = super::cuda::by_float!(s1, weight_grad((s1, l1), (s2, l2)))?;
        Ok((dw, Shape::from((o, c, 3, 3))))
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

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        use super::conv_cuda::channel_sum;
        let o = l.shape().dims4()?.1;
        let sums = super::cuda::by_float!(s, channel_sum(s, l))?;
        Ok((sums, Shape::from(o)))
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
}
