//! The Llama network a [`LlamaGguf`] spec builds: frozen quantized
//! projections (with adapters, or trained in f32 for `train = "full"`),
//! RMS norms, rotary attention with grouped-query heads, SwiGLU MLPs.
//! Blocks can be recomputed in the backward (see `engine::recompute`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use candle_core::{Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use super::llama::{LlamaGguf, Weights, PROJECTIONS};
use super::lora::{LoraLinear, QLinear};
use crate::engine::model::TrainModule;
use crate::engine::Draw;
use crate::kernels::Dropout;

enum Proj {
    Frozen(QLinear),
    Lora(LoraLinear),
    /// A trained f32 weight `[out, in]` (`train = "full"`).
    Full(Tensor),
}

impl Proj {
    /// `x` through the projection; an adapter's input dropped out by
    /// `drop` (training with `lora_dropout`).
    fn forward_drawn(&self, x: &Tensor, drop: Option<&Dropout>, first: usize) -> Result<Tensor> {
        match self {
            Proj::Frozen(p) => p.forward(x),
            Proj::Lora(p) => p.forward_drawn(x, drop, first),
            Proj::Full(w) => x.broadcast_matmul(&w.t()?),
        }
    }
}

impl Module for Proj {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_drawn(x, None, 0)
    }
}

struct Block {
    attn_norm: Tensor,
    ffn_norm: Tensor,
    p: HashMap<&'static str, Proj>,
}

/// A block's draws of `lora_dropout` in a training step, one per
/// projection (each adapter drops out its own input, as each of PEFT's
/// LoRA layers has its own `nn.Dropout`): block `i`'s projection `j` (in
/// [`PROJECTIONS`]' order) is site `1 + 7i + j`. None in evaluation.
#[derive(Clone, Copy, Default)]
struct Drops {
    sites: [Option<Dropout>; PROJECTIONS.len()],
    /// The batch's place of the piece's first sample.
    first: usize,
}

impl Drops {
    fn of(draw: Option<Draw>, rate: f64, block: usize) -> Drops {
        let Some(d) = draw else {
            return Drops::default();
        };
        let at = 1 + (PROJECTIONS.len() * block) as u64;
        Drops {
            sites: std::array::from_fn(|j| Dropout::new(rate, d.seed, d.step, at + j as u64)),
            first: d.first,
        }
    }
}

pub struct LlamaNet {
    w: Arc<Weights>,
    /// Shared with the other models built from the file on this device.
    embed: Arc<Tensor>,
    head: Proj,
    norm: Tensor,
    blocks: Vec<Arc<Block>>,
    context: usize,
    /// Dropout on each adapter's input in training (PEFT's `lora_dropout`).
    lora_dropout: f64,
    /// Recompute every n-th block in the backward (0: none).
    recompute: AtomicUsize,
}

impl Block {
    /// The tensors the block reads whose gradients a step needs.
    fn params(&self) -> Vec<Tensor> {
        let mut out = vec![self.attn_norm.clone(), self.ffn_norm.clone()];
        for p in self.p.values() {
            match p {
                Proj::Frozen(_) => {}
                Proj::Lora(l) => out.extend([l.a.clone(), l.b.clone()]),
                Proj::Full(w) => out.push(w.clone()),
            }
        }
        out
    }

    /// Projection `name` of `x`, with its draw of `drop`.
    fn proj(&self, name: &str, x: &Tensor, drop: &Drops) -> Result<Tensor> {
        let j = PROJECTIONS.iter().position(|p| *p == name);
        let site = j.and_then(|j| drop.sites[j].as_ref());
        self.p[name].forward_drawn(x, site, drop.first)
    }

    /// `x` through the block: attention and MLP, each with its residual.
    fn forward(&self, w: &Weights, x: &Tensor, rope: &Rope, drop: &Drops) -> Result<Tensor> {
        let h = crate::kernels::rms_norm(x, &self.attn_norm, w.eps)?;
        let heads = Heads {
            nh: w.heads,
            nkv: w.kv_heads,
        };
        let x = (x + attention(heads, (self, drop), &h, rope)?)?;
        let h = crate::kernels::rms_norm(&x, &self.ffn_norm, w.eps)?;
        let gate = self.proj("ffn_gate", &h, drop)?;
        let up = self.proj("ffn_up", &h, drop)?;
        let down = self.proj("ffn_down", &crate::kernels::swiglu(&gate, &up)?, drop)?;
        x + down
    }
}

/// The rotary angles of a sequence length.
#[derive(Clone)]
struct Rope {
    cos: Tensor,
    sin: Tensor,
}

/// Grouped-query heads: `nh` query heads, each group of `nh / nkv`
/// consecutive ones sharing a key/value head.
#[derive(Clone, Copy)]
struct Heads {
    nh: usize,
    nkv: usize,
}

fn attention(
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

impl LlamaNet {
    /// The last hidden states of `idx`, with `lora_dropout` drawn from
    /// `draw` (training) or none.
    fn hidden(&self, idx: &Tensor, draw: Option<Draw>) -> Result<Tensor> {
        let (b, t) = idx.dims2()?;
        if t > self.context {
            candle_core::bail!("llama: {t} tokens exceed the context of {}", self.context);
        }
        let mut x = self
            .embed
            .embedding(&idx.flatten_all()?)?
            .reshape((b, t, ()))?;
        let hd = self.w.dim / self.w.heads;
        let inv: Vec<f32> = (0..hd / 2)
            .map(|i| 1.0 / self.w.rope_base.powf(2.0 * i as f32 / hd as f32))
            .collect();
        let pos: Vec<f32> = (0..t)
            .flat_map(|p| inv.iter().map(move |f| p as f32 * f))
            .collect();
        let ang = Tensor::from_vec(pos, (t, hd / 2), x.device())?;
        let rope = Rope {
            cos: ang.cos()?.to_dtype(x.dtype())?,
            sin: ang.sin()?.to_dtype(x.dtype())?,
        };
        let every = self.recompute.load(Ordering::Relaxed);
        for (i, blk) in self.blocks.iter().enumerate() {
            // A recomputed block draws the same masks again.
            let drop = Drops::of(draw, self.lora_dropout, i);
            x = if every > 0 && i % every == 0 {
                let (b, w, r) = (Arc::clone(blk), Arc::clone(&self.w), rope.clone());
                let f: crate::engine::recompute::Block =
                    Arc::new(move |x: &Tensor| b.forward(&w, x, &r, &drop));
                crate::engine::recompute::checkpoint(&x, blk.params(), f)?
            } else {
                blk.forward(&self.w, &x, &rope, &drop)?
            };
        }
        crate::kernels::rms_norm(&x, &self.norm, self.w.eps)
    }
}

impl Module for LlamaNet {
    fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        self.head.forward(&self.hidden(idx, None)?)
    }
}

impl TrainModule for LlamaNet {
    fn forward_train(&self, idx: &Tensor, draw: Draw) -> Result<Tensor> {
        self.head.forward(&self.hidden(idx, Some(draw))?)
    }

    fn set_recompute(&self, every: usize) -> bool {
        self.recompute.store(every, Ordering::Relaxed);
        true
    }

    /// For the chunked loss (`cross_entropy{ chunk = n }`): a trained head
    /// as it is; a frozen head tied to the embedding (SmolLM2's) as the
    /// embedding's dequantized copy, which the lookups keep anyway, so the
    /// full logits and a per-step dequantized head never exist. Its
    /// products are then f32, without the 8-bit rounding of the hidden
    /// states that the quantized head (and llama.cpp) makes. A separate
    /// frozen head: none, and the loss takes the full logits.
    fn hidden_and_head(&self, idx: &Tensor, draw: Draw) -> Result<Option<(Tensor, Tensor)>> {
        let head = match &self.head {
            Proj::Full(w) => w.clone(),
            Proj::Frozen(_) if !self.w.tensors.contains_key("output.weight") => {
                (*self.embed).clone()
            }
            _ => return Ok(None),
        };
        Ok(Some((self.hidden(idx, Some(draw))?, head)))
    }
}

impl LlamaGguf {
    pub(super) fn net(&self, vb: VarBuilder) -> Result<LlamaNet> {
        for t in &self.lora_targets {
            if !PROJECTIONS.contains(&t.as_str()) {
                candle_core::bail!(
                    "llama_gguf: unknown lora target `{t}` ({})",
                    PROJECTIONS.join(", ")
                );
            }
        }
        let w = self.weights()?;
        let full = self.full()?;
        let layers = self.used_layers(&w);
        // The file's weights are cached on the CPU; the run's device gets
        // its own copies of those it uses, the dequantized ones in the
        // working dtype (f32, or the low precision's).
        let (dev, dtype) = (vb.device().clone(), vb.dtype());
        // Frozen f32 tensors (norms) come from the file, trained ones from vb.
        let f32t = |name: &str| -> Result<Tensor> {
            if full {
                let shape = w.get(name)?.shape().clone();
                vb.get_with_hints(shape, name, Init::Const(0.0))
            } else {
                w.get(name)?.dequantize(&dev)?.to_dtype(dtype)
            }
        };
        let mut blocks = Vec::with_capacity(layers);
        for i in 0..layers {
            let mut p = HashMap::new();
            for name in PROJECTIONS {
                let q = w.get(&format!("blk.{i}.{name}.weight"))?;
                let proj = if full {
                    Proj::Full(f32t(&format!("blk.{i}.{name}.weight"))?)
                } else if self.lora_targets.iter().any(|t| t == name) {
                    let (o, inp) = q.shape().dims2()?;
                    let r = self.lora_rank;
                    let bound = 1.0 / (inp as f64).sqrt();
                    let vb = vb.pp(format!("blk.{i}.{name}"));
                    Proj::Lora(LoraLinear {
                        base: QLinear::on(q, &dev)?,
                        a: vb.get_with_hints(
                            (r, inp),
                            "lora_a",
                            Init::Uniform {
                                lo: -bound,
                                up: bound,
                            },
                        )?,
                        b: vb.get_with_hints((o, r), "lora_b", Init::Const(0.0))?,
                        scale: self.lora_alpha / r as f64,
                    })
                } else {
                    Proj::Frozen(QLinear::on(q, &dev)?)
                };
                p.insert(name, proj);
            }
            blocks.push(Arc::new(Block {
                attn_norm: f32t(&format!("blk.{i}.attn_norm.weight"))?,
                ffn_norm: f32t(&format!("blk.{i}.ffn_norm.weight"))?,
                p,
            }));
        }
        let (embed, head) = if full {
            let embed = f32t("token_embd.weight")?;
            let head = match w.tensors.contains_key("output.weight") {
                true => f32t("output.weight")?,
                false => embed.clone(),
            };
            (Arc::new(embed), Proj::Full(head))
        } else {
            let head = match w.tensors.get("output.weight") {
                Some(q) => q.clone(),
                None => w.get("token_embd.weight")?,
            };
            let target = format!("{:?} {dtype:?}", dev.location());
            let embed = super::device_copies::shared(&w.embed, &target, || {
                w.embed.to_device(&dev)?.to_dtype(dtype)
            })?;
            (embed, Proj::Frozen(QLinear::on(head, &dev)?))
        };
        Ok(LlamaNet {
            embed,
            head,
            norm: f32t("output_norm.weight")?,
            blocks,
            context: self.context,
            w,
            lora_dropout: self.lora_dropout,
            recompute: AtomicUsize::new(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

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
