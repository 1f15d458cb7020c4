//! Causal self-attention as one op, straight from the fused `qkv`
//! projection, with a backward that recomputes the attention weights
//! (flash-attention style) instead of keeping them.
//!
//! The composed version (`composed` below, which the GPT used before) is
//! about a dozen candle ops over `[batch, heads, t, t]` tensors: three
//! `contiguous` copies of q, k and v, the scale, the mask, the softmax and
//! the transposes back; in backward candle zero-fills and then adds a
//! gradient for each of them. Here each (batch, head) pair is a task that
//! reads q, k and v in place (strided `gemm` calls: no copies), works on one
//! block of query rows at a time, and writes its slice of `[b, t, c]`. Query
//! block `r` only needs keys up to its last row, so the masked upper
//! triangle is never multiplied. Nothing of size `t x t` outlives the op.
//!
//! f32 on the CPU (`attention_cpu.rs`); f32, f16 and bf16 on CUDA
//! (`attention_cuda.rs`: the same algorithm with cuBLAS products, or with
//! `set_flash` the tiled kernel of `flash.rs`); elsewhere the composed ops.

use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp3, DType, Device, Layout, Result, Shape, Tensor,
};

use super::attention_cpu::{Dropped, Keys};
use super::Dropout;

/// `qkv [b, t, 3c]` (q, k and v side by side, each `[b, t, heads, c / heads]`,
/// as `Linear(c, 3c)` writes them) to `[b, t, c]`: causal softmax attention
/// with scale `1 / sqrt(c / heads)`.
pub fn causal_attention(qkv: &Tensor, heads: usize) -> Result<Tensor> {
    causal_attention_dropped(qkv, heads, None)
}

/// [`causal_attention`] with the weights dropped out by `drop` (the draw,
/// and the batch's place of `qkv`'s first sample; each row `(sample, head,
/// query)` of the draw). The CPU's fused op draws the masks in place; on
/// CUDA dropout takes the composed ops, with the `[b, heads, t, t]` mask in
/// memory.
pub fn causal_attention_dropped(
    qkv: &Tensor,
    heads: usize,
    drop: Option<(Dropout, usize)>,
) -> Result<Tensor> {
    let (_, _, c3) = qkv.dims3()?;
    if heads == 0 || c3 % (3 * heads) != 0 {
        bail!("attention: qkv width {c3} is not 3 x a multiple of {heads} heads")
    }
    if super::covers(qkv) && (drop.is_none() || qkv.device().is_cpu()) {
        let flash = super::flash() && flash_takes(qkv, heads);
        let mut op = Attention::new(heads, flash, super::flash_rows());
        op.drop = drop;
        qkv.contiguous()?.apply_op1(op)
    } else {
        composed(qkv, heads, drop)
    }
}

/// The same attention through the tiled kernel of `kernels/flash.cu`
/// whatever [`super::set_flash`] says: CUDA, f16 or bf16, heads of 16, 32
/// or 64; an error elsewhere.
pub fn flash_attention(qkv: &Tensor, heads: usize) -> Result<Tensor> {
    flash_attention_rows(qkv, heads, super::flash_rows())
}

/// [`flash_attention`] with warps of `rows` rows (16 or 32), whatever
/// [`super::set_flash_rows`] says.
pub fn flash_attention_rows(qkv: &Tensor, heads: usize, rows: usize) -> Result<Tensor> {
    if !matches!(rows, 16 | 32) {
        bail!("flash attention: warps take 16 or 32 rows, not {rows}")
    }
    let (_, _, c3) = qkv.dims3()?;
    if !flash_takes(qkv, heads) {
        bail!(
            "flash attention takes f16 or bf16 on CUDA with heads of 16, 32 or 64, not {:?} on {:?} \
             with {heads} heads of {c3} / 3",
            qkv.dtype(),
            qkv.device().location()
        )
    }
    qkv.contiguous()?
        .apply_op1(Attention::new(heads, true, rows))
}

#[cfg(feature = "cuda")]
fn flash_takes(qkv: &Tensor, heads: usize) -> bool {
    let c3 = qkv.dims().last().copied().unwrap_or(0);
    qkv.device().is_cuda()
        && heads > 0
        && c3 % (3 * heads) == 0
        && super::flash::takes(qkv.dtype(), c3 / 3 / heads)
}

#[cfg(not(feature = "cuda"))]
fn flash_takes(_: &Tensor, _: usize) -> bool {
    false
}

/// The `[t, t]` additive mask of the composed attention: -inf above the
/// diagonal.
pub fn causal_mask(t: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let m: Vec<f32> = (0..t * t)
        .map(|i| {
            if i % t > i / t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Tensor::from_vec(m, (t, t), &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(device)
}

/// The same attention from candle's differentiable ops, with the mask
/// built here: only the fallback needs it, so the fused path's step builds
/// (and on a GPU uploads) no `t x t` mask.
fn composed(qkv: &Tensor, heads: usize, drop: Option<(Dropout, usize)>) -> Result<Tensor> {
    let t = qkv.dim(1)?;
    let mask = causal_mask(t, qkv.dtype(), qkv.device())?;
    composed_masked(qkv, heads, &mask, drop)
}

/// Softmax attention from candle's differentiable ops, `mask` (broadcast
/// to `[b, heads, t, t]`) added to the scaled scores; with `drop` (the
/// draw, and the batch's place of `qkv`'s first sample) the weights times
/// its `[b, heads, t, t]` mask, in memory, as the fused ops draw it.
pub(super) fn composed_masked(
    qkv: &Tensor,
    heads: usize,
    mask: &Tensor,
    drop: Option<(Dropout, usize)>,
) -> Result<Tensor> {
    let (b, t, c3) = qkv.dims3()?;
    let drop = match drop {
        Some((d, first)) => Some(
            d.mask(first, &[b, heads, t, t], qkv.device())?
                .to_dtype(qkv.dtype())?,
        ),
        None => None,
    };
    let (c, hd) = (c3 / 3, c3 / 3 / heads);
    let qkv = qkv.reshape((b, t, 3, heads, hd))?;
    let part = |i: usize| {
        qkv.narrow(2, i, 1)?
            .squeeze(2)?
            .transpose(1, 2)?
            .contiguous()
    };
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let att = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?;
    let mut att = super::softmax_last_dim(&att.broadcast_add(mask)?)?;
    if let Some(drop) = &drop {
        att = att.mul(drop)?;
    }
    att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, c))
}

/// The shape of one call: `t` positions, `heads` heads of width `hd`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Dims {
    pub(super) t: usize,
    pub(super) heads: usize,
    pub(super) hd: usize,
}

impl Dims {
    pub(super) fn of(l: &Layout, heads: usize) -> Result<(usize, Dims)> {
        let (b, t, c3) = l.shape().dims3()?;
        Ok((
            b,
            Dims {
                t,
                heads,
                hd: c3 / 3 / heads,
            },
        ))
    }
    pub(super) fn c(&self) -> usize {
        self.heads * self.hd
    }
    pub(super) fn scale(&self) -> f32 {
        1.0 / (self.hd as f32).sqrt()
    }
    /// Offsets of q, k and v of (batch `b`, head `h`) in `qkv`, and of
    /// that head's columns in a `[b, t, c]` tensor.
    pub(super) fn offsets(&self, b: usize, h: usize) -> (usize, usize) {
        let c = self.c();
        (
            b * self.t * 3 * c + h * self.hd,
            b * self.t * c + h * self.hd,
        )
    }
}

struct Attention {
    heads: usize,
    /// On CUDA, the tiled kernels (`flash.rs`) rather than cuBLAS.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    flash: bool,
    /// Rows a warp of the tiled kernels owns (16 or 32).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    rows: usize,
    /// What the flash forward leaves for the backward.
    #[cfg(feature = "cuda")]
    lse: super::flash::Lse,
    /// Dropout on the weights (the CPU's kernel only).
    drop: Option<(Dropout, usize)>,
}

impl Attention {
    fn new(heads: usize, flash: bool, rows: usize) -> Self {
        Attention {
            heads,
            flash,
            rows,
            #[cfg(feature = "cuda")]
            lse: Default::default(),
            drop: None,
        }
    }
}

impl CustomOp1 for Attention {
    fn name(&self) -> &'static str {
        "taper-causal-attention"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (b, d) = Dims::of(l, self.heads)?;
        let qkv = super::f32_slice(s, l, "attention")?;
        let (keys, drop) = (Keys::Causal, Dropped::of(&self.drop));
        let y = super::attention_cpu::forward(qkv, b, d, keys, drop);
        Ok((CpuStorage::F32(y), Shape::from((b, d.t, d.c()))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::attention_cuda::forward;
        use super::flash::forward as flash;
        let (b, d) = Dims::of(l, self.heads)?;
        let y = if self.flash {
            super::cuda::by_float!(s, flash(s, l, (self.heads, self.rows), &self.lse))?
        } else {
            super::cuda::by_float!(s, forward(s, l, self.heads))?
        };
        Ok((y, Shape::from((b, d.t, d.c()))))
    }

    fn bwd(&self, qkv: &Tensor, y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let grad = AttentionGrad {
            heads: self.heads,
            drop: self.drop,
            #[cfg(feature = "cuda")]
            rows: self.rows,
            #[cfg(feature = "cuda")]
            lse: self.lse.clone(),
        };
        Ok(Some(qkv.apply_op3_no_bwd(y, &dy.contiguous()?, &grad)?))
    }
}

/// `(qkv, y, dy)` to `dqkv`, recomputing each block's weights `P`:
/// `dV += P^T dY`, `dP = dY V^T`, `dS = P (dP - rowsum(dY y))`,
/// `dQ = scale dS K`, `dK += scale dS^T Q`.
struct AttentionGrad {
    heads: usize,
    drop: Option<(Dropout, usize)>,
    #[cfg(feature = "cuda")]
    rows: usize,
    #[cfg(feature = "cuda")]
    lse: super::flash::Lse,
}

impl CustomOp3 for AttentionGrad {
    fn name(&self) -> &'static str {
        "taper-causal-attention-grad"
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
        let keys = (Keys::Causal, Dropped::of(&self.drop));
        super::attention_cpu::backward_storage((s1, l1), (s2, l2), (s3, l3), self.heads, keys)
    }

    /// After a flash forward, the flash backward (from its log-sum-exp and
    /// `y`); otherwise the cuBLAS one, which needs no `y`: its
    /// softmax-gradient kernel sums `dP * P` directly.
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
        use super::attention_cuda::backward;
        use super::flash::backward as flash;
        let dqkv = match self.lse.take() {
            Some(lse) => {
                let hr = (self.heads, self.rows);
                super::cuda::by_float!(s1, flash((s1, l1), (s2, l2), (s3, l3), &lse, hr))?
            }
            None => super::cuda::by_float!(s1, backward((s1, l1), (s3, l3), self.heads))?,
        };
        Ok((dqkv, l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    /// Forward and gradient against the composed ops in f64: a partial
    /// last block (150 = 64 + 64 + 22), exactly one block, one row short of
    /// and one past it, the distillation student's heads of 8, one head.
    #[test]
    fn matches_composed_attention_in_float64() -> Result<()> {
        check(2, 150, 3, 16)?;
        check(32, 64, 4, 8)?;
        check(3, 64, 4, 16)?;
        check(3, 63, 4, 16)?;
        check(3, 65, 1, 8)
    }

    /// The same with dropout on the weights: the fused op's masks, drawn in
    /// place, are the composed ops' (a mask in memory), forward and
    /// gradient, and a sample's are those of its place in the batch.
    #[test]
    fn dropout_matches_composed_attention_in_float64() -> Result<()> {
        let drop = Dropout::new(0.2, 1, 2, 3).map(|d| (d, 5));
        check_with(2, 150, 3, 16, drop)?;
        check_with(3, 65, 1, 8, drop)?;
        let x = Tensor::randn(0f32, 1.0, (3, 70, 3 * 16), &Device::Cpu)?;
        let whole = causal_attention_dropped(&x, 2, drop)?;
        let (d, _) = drop.unwrap();
        let part = causal_attention_dropped(&x.narrow(0, 1, 2)?, 2, Some((d, 6)))?;
        let diff = (whole.narrow(0, 1, 2)? - part)?.abs()?.max_all()?;
        assert_eq!(diff.to_scalar::<f32>()?, 0.0);
        let plain = causal_attention(&x, 2)?;
        let moved = (whole - plain)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(moved > 0.1, "dropout changed nothing");
        Ok(())
    }

    fn check(b: usize, t: usize, heads: usize, hd: usize) -> Result<()> {
        check_with(b, t, heads, hd, None)
    }

    fn check_with(
        b: usize,
        t: usize,
        heads: usize,
        hd: usize,
        drop: Option<(Dropout, usize)>,
    ) -> Result<()> {
        let c = heads * hd;
        let n = b * t * 3 * c;
        let vals: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
            .collect();
        let probe: Vec<f32> = (0..b * t * c)
            .map(|i| ((i * 104729) % 997) as f32 / 500.0 - 1.0)
            .collect();
        let x = Var::from_tensor(&Tensor::from_vec(vals, (b, t, 3 * c), &Device::Cpu)?)?;
        let probe = Tensor::from_vec(probe, (b, t, c), &Device::Cpu)?;
        let y = causal_attention_dropped(x.as_tensor(), heads, drop)?;
        let g = (&y * &probe)?.sum_all()?.backward()?;
        let dx = g.get(x.as_tensor()).expect("gradient");

        let x64 = Var::from_tensor(&x.as_tensor().to_dtype(DType::F64)?)?;
        let y64 = composed(x64.as_tensor(), heads, drop)?;
        let g64 = (&y64 * probe.to_dtype(DType::F64)?)?
            .sum_all()?
            .backward()?;
        let dx64 = g64.get(x64.as_tensor()).expect("gradient");

        let err = |a: &Tensor, r: &Tensor| -> Result<f64> {
            let diff = (a.to_dtype(DType::F64)? - r)?
                .abs()?
                .max_all()?
                .to_scalar::<f64>()?;
            Ok(diff / r.abs()?.max_all()?.to_scalar::<f64>()?)
        };
        let (ey, ed) = (err(&y, &y64)?, err(dx, dx64)?);
        assert!(ey < 1e-5, "forward relative error {ey}");
        assert!(ed < 1e-5, "gradient relative error {ed}");
        Ok(())
    }

    /// A row attends to nothing after itself: changing the last position's
    /// q, k and v leaves every earlier output as it was.
    #[test]
    fn later_positions_do_not_leak_into_earlier_ones() -> Result<()> {
        let (t, heads, c) = (70, 2, 8);
        let a: Vec<f32> = (0..t * 3 * c)
            .map(|i| (i % 13) as f32 / 6.0 - 1.0)
            .collect();
        let mut b = a.clone();
        b[(t - 1) * 3 * c..].iter_mut().for_each(|v| *v += 3.0);
        let run = |v: Vec<f32>| -> Result<Vec<f32>> {
            let x = Tensor::from_vec(v, (1, t, 3 * c), &Device::Cpu)?;
            causal_attention(&x, heads)?
                .narrow(1, 0, t - 1)?
                .flatten_all()?
                .to_vec1()
        };
        assert_eq!(run(a)?, run(b)?);
        Ok(())
    }
}
