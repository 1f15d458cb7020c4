//! The convolution's backward (`conv.rs`): the input gradient (col2im of
//! `W^T dy`, a sample a thread), the weight gradient (blocks of samples,
//! summed in order) and the bias gradient (a sum per channel).

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape};
use rayon::prelude::*;

use super::conv::{input_grad_shapes, weight_grad_shapes, Conv};
use super::conv_cpu::{col2im, im2col, with_scratch};
use super::mm;

/// `dx_b = col2im(W^T dy_b)`, from `dy [B, O, Ho, Wo]` and `w [O, C, k, k]`.
pub(super) struct InputGrad(pub Conv);

impl CustomOp2 for InputGrad {
    fn name(&self) -> &'static str {
        "taper-conv2d-input-grad"
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
        let (b, o, g) = input_grad_shapes(l1, l2, &self.0)?;
        let ((ho, wo), taps, chw) = (g.out(), g.taps(), g.c * g.h * g.w);
        let hw = ho * wo;
        let mut dx = vec![0f32; b * chw];
        if hw > 0 && chw > 0 {
            dx.par_chunks_mut(chw)
                .zip(dy.par_chunks(o * hw))
                .for_each(|(dxs, dys)| {
                    with_scratch(taps * hw, |col| {
                        // W^T [C*k*k, O] read from w [O, C*k*k].
                        mm((taps, hw, o), col, false, w, (1, taps), dys, (hw, 1));
                        col2im(col, g, dxs);
                    })
                });
        }
        Ok((CpuStorage::F32(dx), Shape::from((b, g.c, g.h, g.w))))
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
        let (b, _, g) = input_grad_shapes(l1, l2, &self.0)?;
        let dx = super::cuda::by_float!(s1, input_grad(&self.0, (s1, l1), (s2, l2)))?;
        Ok((dx, Shape::from((b, g.c, g.h, g.w))))
    }
}

/// Samples whose weight gradients one thread adds up before the blocks are
/// summed in order.
const SAMPLES: usize = 4;

/// `dW = sum_b dy_b col_b^T`, from `x [B, C, H, W]` and `dy [B, O, Ho, Wo]`.
pub(super) struct WeightGrad(pub Conv);

impl CustomOp2 for WeightGrad {
    fn name(&self) -> &'static str {
        "taper-conv2d-weight-grad"
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
        let (g, o) = weight_grad_shapes(l1, l2, &self.0)?;
        let ((ho, wo), taps, chw) = (g.out(), g.taps(), g.c * g.h * g.w);
        let hw = ho * wo;
        // Blocks of samples across threads, added in block order.
        let (x_block, dy_block) = (chw * SAMPLES, o * hw * SAMPLES);
        let dw = super::sum_in_order(dy.len().div_ceil(dy_block.max(1)), o * taps, |block| {
            let mut acc = vec![0f32; o * taps];
            let x = x[block * x_block..].chunks(chw.max(1));
            for (xs, dys) in x.zip(dy[block * dy_block..].chunks(o * hw)).take(SAMPLES) {
                with_scratch(taps * hw, |col| {
                    im2col(xs, g, col);
                    // dy_b [O, HoWo] times col^T [HoWo, C*k*k], read from col.
                    mm((o, taps, hw), &mut acc, true, dys, (hw, 1), col, (1, hw));
                });
            }
            acc
        });
        Ok((CpuStorage::F32(dw), Shape::from((o, g.c, g.k, g.k))))
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
        let (g, o) = weight_grad_shapes(l1, l2, &self.0)?;
        let dw = super::cuda::by_float!(s1, weight_grad(&self.0, (s1, l1), (s2, l2)))?;
        Ok((dw, Shape::from((o, g.c, g.k, g.k))))
    }
}

/// `dy [B, O, H, W]` summed to `[O]`: the bias gradient.
pub(super) struct ChannelSum;

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
