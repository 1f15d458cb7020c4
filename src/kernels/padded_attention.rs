//! Bidirectional self-attention over padded texts (a BERT's) as one op,
//! from the fused `qkv` projection: each batch element's queries attend to
//! the first `lens[b]` keys, its text, and its padding keys are never
//! multiplied. The algorithm is the causal op's (`attention_cpu.rs`): no
//! copies of q, k and v, nothing of size `t x t` kept for the backward,
//! which recomputes the weights. f32 on the CPU; elsewhere the composed
//! ops with an additive mask.

use candle_core::{CpuStorage, CustomOp1, CustomOp3, DType, Layout, Result, Shape, Tensor};

use super::attention::Dims;
use super::attention_cpu::{backward_storage, forward, Dropped, Keys};
use super::Dropout;

/// `qkv [b, t, 3c]` (q, k and v side by side, each `[b, t, heads, c /
/// heads]`) to `[b, t, c]`: softmax attention with scale `1 / sqrt(c /
/// heads)`, batch element `i`'s rows over its first `lens[i]` keys. With
/// `drop` (the draw, and the batch's place of `qkv`'s first sample) the
/// weights are dropped out, each row `(sample, head, query)` of the draw.
pub fn padded_attention(
    qkv: &Tensor,
    heads: usize,
    lens: &[usize],
    drop: Option<(Dropout, usize)>,
) -> Result<Tensor> {
    let (b, t, c3) = qkv.dims3()?;
    if heads == 0 || c3 % (3 * heads) != 0 {
        candle_core::bail!("attention: qkv width {c3} is not 3 x a multiple of {heads} heads")
    }
    if lens.len() != b || lens.iter().any(|&n| n == 0 || n > t) {
        candle_core::bail!("attention: key lengths {lens:?} for a batch of {b} of {t} positions")
    }
    if super::fused() && qkv.device().is_cpu() && qkv.dtype() == DType::F32 {
        let op = Padded {
            heads,
            lens: lens.to_vec(),
            drop,
        };
        qkv.contiguous()?.apply_op1(op)
    } else {
        composed(qkv, heads, lens, drop)
    }
}

/// The same from candle's differentiable ops: padding keys get a large
/// negative score before the softmax; dropout's mask drawn as the fused op
/// draws it, in memory.
fn composed(
    qkv: &Tensor,
    heads: usize,
    lens: &[usize],
    drop: Option<(Dropout, usize)>,
) -> Result<Tensor> {
    let (b, t, _) = qkv.dims3()?;
    let mask: Vec<f32> = lens
        .iter()
        .flat_map(|&n| (0..t).map(move |j| if j < n { 0.0 } else { -1e9 }))
        .collect();
    let mask = Tensor::from_vec(mask, (b, 1, 1, t), qkv.device())?.to_dtype(qkv.dtype())?;
    super::attention::composed_masked(qkv, heads, &mask, drop)
}

struct Padded {
    heads: usize,
    lens: Vec<usize>,
    drop: Option<(Dropout, usize)>,
}

impl CustomOp1 for Padded {
    fn name(&self) -> &'static str {
        "taper-padded-attention"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (b, d) = Dims::of(l, self.heads)?;
        let qkv = super::f32_slice(s, l, "attention")?;
        let y = forward(
            qkv,
            b,
            d,
            Keys::Lengths(&self.lens),
            Dropped::of(&self.drop),
        );
        Ok((CpuStorage::F32(y), Shape::from((b, d.t, d.c()))))
    }

    fn bwd(&self, qkv: &Tensor, y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let grad = PaddedGrad {
            heads: self.heads,
            lens: self.lens.clone(),
            drop: self.drop,
        };
        Ok(Some(qkv.apply_op3_no_bwd(y, &dy.contiguous()?, &grad)?))
    }
}

/// `(qkv, y, dy)` to `dqkv`, recomputing the weights.
struct PaddedGrad {
    heads: usize,
    lens: Vec<usize>,
    drop: Option<(Dropout, usize)>,
}

impl CustomOp3 for PaddedGrad {
    fn name(&self) -> &'static str {
        "taper-padded-attention-grad"
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
        let keys = (Keys::Lengths(&self.lens), Dropped::of(&self.drop));
        backward_storage((s1, l1), (s2, l2), (s3, l3), self.heads, keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// The fused op against the composed ops, forward and gradient, on
    /// texts of several lengths (one a single position, one the whole
    /// width) and more than one block of rows; without dropout and with
    /// it (the same masks, drawn in the kernel and in memory).
    #[test]
    fn matches_the_composed_attention() -> Result<()> {
        let (b, t, heads, hd) = (3, 70, 3, 8);
        let lens = [70, 1, 37];
        let qkv = Var::from_tensor(&Tensor::randn(
            0f32,
            1.0,
            (b, t, 3 * heads * hd),
            &Device::Cpu,
        )?)?;
        let probe = Tensor::randn(0f32, 1.0, (b, t, heads * hd), &Device::Cpu)?;
        let draw = Dropout::new(0.2, 3, 4, 5).map(|d| (d, 2));
        let mut outputs = Vec::new();
        for drop in [None, draw] {
            let fused = padded_attention(qkv.as_tensor(), heads, &lens, drop)?;
            let plain = composed(qkv.as_tensor(), heads, &lens, drop)?;
            let diff = (&fused - &plain)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(diff < 1e-5, "outputs differ by {diff}");
            let g1 = (&fused * &probe)?.sum_all()?.backward()?;
            let g2 = (&plain * &probe)?.sum_all()?.backward()?;
            let (g1, g2) = (g1.get(&qkv).unwrap(), g2.get(&qkv).unwrap());
            let diff = (g1 - g2)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(diff < 1e-4, "gradients differ by {diff}");
            // Padding keys get no gradient: their k and v never count.
            let dk = g1.narrow(1, 1, t - 1)?.get(1)?;
            assert_eq!(
                dk.narrow(1, heads * hd, 2 * heads * hd)?
                    .abs()?
                    .max_all()?
                    .to_scalar::<f32>()?,
                0.0
            );
            outputs.push(fused);
        }
        let moved = (&outputs[0] - &outputs[1])?.abs()?.max_all()?;
        assert!(moved.to_scalar::<f32>()? > 0.1, "dropout changed nothing");
        // The last two texts alone, as the batch's second and third: the
        // same outputs as in the whole batch.
        let (d, _) = draw.unwrap();
        let part = qkv.as_tensor().narrow(0, 1, 2)?;
        let part = padded_attention(&part, heads, &lens[1..], Some((d, 3)))?;
        let diff = (outputs[1].narrow(0, 1, 2)? - part)?.abs()?.max_all()?;
        assert_eq!(diff.to_scalar::<f32>()?, 0.0);
        Ok(())
    }
}
