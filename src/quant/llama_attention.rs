//! The Llama's attention: rotary positions (interleaved pairs, as
//! llama.cpp stores them), grouped-query heads, through the fused causal
//! attention kernel.

use candle_core::{Result, Tensor};

use super::llama_net::{Block, Drops};

/// The rotary angles of a sequence length.
#[derive(Clone)]
pub(super) struct Rope {
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
}

impl Rope {
    /// The angles of `t` positions for heads of `hd` values (rotary base
    /// `base`), in `like`'s dtype and on its device.
    pub(super) fn new(t: usize, hd: usize, base: f32, like: &Tensor) -> Result<Rope> {
        let inv: Vec<f32> = (0..hd / 2)
            .map(|i| 1.0 / base.powf(2.0 * i as f32 / hd as f32))
            .collect();
        let pos: Vec<f32> = (0..t)
            .flat_map(|p| inv.iter().map(move |f| p as f32 * f))
            .collect();
        let ang = Tensor::from_vec(pos, (t, hd / 2), like.device())?;
        Ok(Rope {
            cos: ang.cos()?.to_dtype(like.dtype())?,
            sin: ang.sin()?.to_dtype(like.dtype())?,
        })
    }
}

/// Grouped-query heads: `nh` query heads, each group of `nh / nkv`
/// consecutive ones sharing a key/value head.
#[derive(Clone, Copy)]
pub(super) struct Heads {
    pub(super) nh: usize,
    pub(super) nkv: usize,
}

/// Rotary, grouped-query causal attention of block `blk` on `x`, its
/// projections' adapters dropping out their inputs by `drop`.
pub(super) fn attention(
    heads: Heads,
    (blk, drop): (&Block, &Drops),
    x: &Tensor,
    rope: &Rope,
) -> Result<Tensor> {
    let (b, t, c) = x.dims3()?;
    let Heads { nh, nkv } = heads;
    let hd = c / nh;
    // A projection as `[b, t, n, hd]`; q and k rotated (the rotation works
    // on `[b, n, t, hd]`).
    let proj = |p: &str, n: usize| blk.proj(p, x, drop)?.reshape((b, t, n, hd));
    let rotated = |p: &str, n: usize| -> Result<Tensor> {
        let z = proj(p, n)?.transpose(1, 2)?;
        crate::kernels::rope_interleaved(&z, &rope.cos, &rope.sin)?.transpose(1, 2)
    };
    // Each key/value head repeated for the query heads of its group; the
    // backward sums the copies' gradients.
    let rep = |z: Tensor| -> Result<Tensor> {
        z.unsqueeze(3)?
            .expand((b, t, nkv, nh / nkv, hd))?
            .reshape((b, t, nh, hd))
    };
    let (q, k, v) = (
        rotated("attn_q", nh)?,
        rep(rotated("attn_k", nkv)?)?,
        rep(proj("attn_v", nkv)?)?,
    );
    // q, k and v side by side, as the GPT's fused projection gives them to
    // the fused causal attention (which keeps no `t x t` weights for the
    // backward; composed ops where it does not apply).
    let qkv = Tensor::cat(&[q, k, v], 2)?.reshape((b, t, 3 * c))?;
    let y = crate::kernels::causal_attention(&qkv, nh)?;
    blk.proj("attn_output", &y, drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::llama_net::{Block, Drops, Proj};
    use candle_core::Module;
    use candle_core::{DType, Device, Var};
    use std::collections::HashMap;

    /// The attention as the separate candle ops this file used before:
    /// heads transposed, keys and values repeated, scores masked.
    fn composed(h: Heads, blk: &Block, x: &Tensor, rope: &Rope) -> Result<Tensor> {
        let (b, t, c) = x.dims3()?;
        let hd = c / h.nh;
        let heads = |p: &str, n: usize| -> Result<Tensor> {
            blk.p[p]
                .forward(x)?
                .reshape((b, t, n, hd))?
                .transpose(1, 2)?
                .contiguous()
        };
        let rot = |z: Tensor| crate::kernels::rope_interleaved(&z, &rope.cos, &rope.sin);
        let q = rot(heads("attn_q", h.nh)?)?;
        let rep = |z: Tensor| -> Result<Tensor> {
            z.unsqueeze(2)?
                .expand((b, h.nkv, h.nh / h.nkv, t, hd))?
                .reshape((b, h.nh, t, hd))
        };
        let k = rep(rot(heads("attn_k", h.nkv)?)?)?;
        let v = rep(heads("attn_v", h.nkv)?)?;
        let mask = crate::kernels::causal_mask(t, x.dtype(), x.device())?;
        let att = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?.broadcast_add(&mask)?;
        let att = crate::kernels::softmax_last_dim(&att)?;
        let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, c))?;
        blk.p["attn_output"].forward(&y)
    }

    /// Values spread over [-1, 1], the same every run.
    fn spread(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Grouped-query attention through the fused op: the composed ops'
    /// output and gradients (input, each projection), f32 on the CPU, with
    /// 3 query heads to a key/value head and a length that is not a block's.
    #[test]
    fn fused_grouped_attention_matches_the_composed_ops() -> Result<()> {
        let dev = Device::Cpu;
        let (b, t, h) = (2, 11, Heads { nh: 6, nkv: 2 });
        let hd = 4;
        let c = h.nh * hd;
        let x = Var::from_vec(spread(b * t * c, 1), (b, t, c), &dev)?;
        let mut vars = vec![];
        let mut p = HashMap::new();
        for (i, (name, out)) in [
            ("attn_q", c),
            ("attn_k", h.nkv * hd),
            ("attn_v", h.nkv * hd),
            ("attn_output", c),
        ]
        .into_iter()
        .enumerate()
        {
            let w = (Tensor::from_vec(spread(out * c, 2 + i as u64), (out, c), &dev)? * 0.4)?;
            let w = Var::from_tensor(&w)?;
            vars.push(w.clone());
            p.insert(name, Proj::Full(w.as_tensor().clone()));
        }
        let blk = Block {
            attn_norm: Tensor::ones(c, DType::F32, &dev)?,
            ffn_norm: Tensor::ones(c, DType::F32, &dev)?,
            p,
        };
        let ang = Tensor::from_vec(spread(t * hd / 2, 9), (t, hd / 2), &dev)?;
        let rope = Rope {
            cos: ang.cos()?,
            sin: ang.sin()?,
        };
        let run = |f: &dyn Fn() -> Result<Tensor>| -> Result<Vec<Vec<f32>>> {
            let y = f()?;
            // A loss that weighs every output differently.
            let wts = Tensor::from_vec(spread(y.elem_count(), 10), y.shape(), &dev)?;
            let g = (y.clone() * wts)?.sum_all()?.backward()?;
            let mut out = vec![y.flatten_all()?.to_vec1::<f32>()?];
            for v in std::iter::once(&x).chain(&vars) {
                out.push(g.get(v).expect("a gradient").flatten_all()?.to_vec1()?);
            }
            Ok(out)
        };
        let fused = run(&|| attention(h, (&blk, &Drops::default()), &x, &rope))?;
        let reference = run(&|| composed(h, &blk, &x, &rope))?;
        for (i, (a, r)) in fused.iter().zip(&reference).enumerate() {
            let scale = r.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(scale > 1e-3, "{i}: a vanishing reference");
            for (p, q) in a.iter().zip(r) {
                assert!((p - q).abs() <= 1e-5 * scale, "{i}: {p} vs {q}");
            }
        }
        Ok(())
    }
}
