//! The Llama network a [`LlamaGguf`] spec builds: frozen quantized
//! projections (with adapters, or trained in f32 for `train = "full"`),
//! RMS norms, rotary attention with grouped-query heads, SwiGLU MLPs.
//! Blocks can be recomputed in the backward (see `engine::recompute`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use candle_core::{Device, Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use super::llama::{LlamaGguf, Weights, PROJECTIONS};
use super::lora::{LoraLinear, QLinear};
use crate::engine::model::TrainModule;

enum Proj {
    Frozen(QLinear),
    Lora(LoraLinear),
    /// A trained f32 weight `[out, in]` (`train = "full"`).
    Full(Tensor),
}

impl Module for Proj {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Proj::Frozen(p) => p.forward(x),
            Proj::Lora(p) => p.forward(x),
            Proj::Full(w) => x.broadcast_matmul(&w.t()?),
        }
    }
}

struct Block {
    attn_norm: Tensor,
    ffn_norm: Tensor,
    p: HashMap<&'static str, Proj>,
}

pub struct LlamaNet {
    w: Arc<Weights>,
    embed: Tensor,
    head: Proj,
    norm: Tensor,
    blocks: Vec<Arc<Block>>,
    context: usize,
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

    /// `x` through the block: attention and MLP, each with its residual.
    fn forward(&self, w: &Weights, x: &Tensor, rope: &Rope) -> Result<Tensor> {
        let h = crate::kernels::rms_norm(x, &self.attn_norm, w.eps)?;
        let x = (x + attention(w, self, &h, rope)?)?;
        let h = crate::kernels::rms_norm(&x, &self.ffn_norm, w.eps)?;
        let gate = candle_nn::ops::silu(&self.p["ffn_gate"].forward(&h)?)?;
        let up = self.p["ffn_up"].forward(&h)?;
        x + self.p["ffn_down"].forward(&(gate * up)?)?
    }
}

/// The rotary angles and the causal mask of a sequence length.
#[derive(Clone)]
struct Rope {
    cos: Tensor,
    sin: Tensor,
    mask: Tensor,
}

fn attention(w: &Weights, blk: &Block, x: &Tensor, rope: &Rope) -> Result<Tensor> {
    let (cos, sin, mask) = (&rope.cos, &rope.sin, &rope.mask);
    {
        let (b, t, c) = x.dims3()?;
        let (nh, nkv) = (w.heads, w.kv_heads);
        let hd = c / nh;
        let heads = |p: &str, n: usize| -> Result<Tensor> {
            blk.p[p]
                .forward(x)?
                .reshape((b, t, n, hd))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = crate::kernels::rope_interleaved(&heads("attn_q", nh)?, cos, sin)?;
        let k = crate::kernels::rope_interleaved(&heads("attn_k", nkv)?, cos, sin)?;
        let v = heads("attn_v", nkv)?;
        // Grouped-query attention: each key/value head serves nh / nkv
        // consecutive query heads.
        let rep = |z: Tensor| -> Result<Tensor> {
            z.unsqueeze(2)?
                .expand((b, nkv, nh / nkv, t, hd))?
                .reshape((b, nh, t, hd))
        };
        let (k, v) = (rep(k)?, rep(v)?);
        let att = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?.broadcast_add(mask)?;
        let att = crate::kernels::softmax_last_dim(&att)?;
        let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, c))?;
        blk.p["attn_output"].forward(&y)
    }
}

impl LlamaNet {
    fn hidden(&self, idx: &Tensor) -> Result<Tensor> {
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
            cos: ang.cos()?,
            sin: ang.sin()?,
            mask: crate::kernels::causal_mask(t, x.dtype(), x.device())?,
        };
        let every = self.recompute.load(Ordering::Relaxed);
        for (i, blk) in self.blocks.iter().enumerate() {
            x = if every > 0 && i % every == 0 {
                let (b, w, r) = (Arc::clone(blk), Arc::clone(&self.w), rope.clone());
                let f: crate::engine::recompute::Block =
                    Arc::new(move |x: &Tensor| b.forward(&w, x, &r));
                crate::engine::recompute::checkpoint(&x, blk.params(), f)?
            } else {
                blk.forward(&self.w, &x, &rope)?
            };
        }
        crate::kernels::rms_norm(&x, &self.norm, self.w.eps)
    }
}

impl Module for LlamaNet {
    fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        self.head.forward(&self.hidden(idx)?)
    }
}

impl TrainModule for LlamaNet {
    fn set_recompute(&self, every: usize) -> bool {
        self.recompute.store(every, Ordering::Relaxed);
        true
    }

    /// For the chunked loss (`cross_entropy{ chunk = n }`), on the CPU: a
    /// trained head as it is; a frozen head tied to the embedding (SmolLM2's)
    /// as the embedding's dequantized copy, which the lookups keep anyway,
    /// so the full logits and a per-step dequantized head never exist. Its
    /// products are then f32, without the 8-bit rounding of the hidden
    /// states that the quantized head (and llama.cpp) makes. A separate
    /// frozen head, or CUDA: none, and the loss takes the full logits.
    fn hidden_and_head(&self, idx: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
        if !idx.device().is_cpu() {
            return Ok(None);
        }
        let head = match &self.head {
            Proj::Full(w) => w.clone(),
            Proj::Frozen(_) if !self.w.tensors.contains_key("output.weight") => self.embed.clone(),
            _ => return Ok(None),
        };
        Ok(Some((self.hidden(idx)?, head)))
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
        // Frozen f32 tensors (norms) come from the file, trained ones from vb.
        let f32t = |name: &str| -> Result<Tensor> {
            if full {
                let shape = w.get(name)?.shape().clone();
                vb.get_with_hints(shape, name, Init::Const(0.0))
            } else {
                w.get(name)?.dequantize(&Device::Cpu)
            }
        };
        let mut blocks = Vec::with_capacity(layers);
        for i in 0..layers {
            let mut p = HashMap::new();
            for name in PROJECTIONS {
                let q = w.get(&format!("blk.{i}.{name}.weight"))?;
                let base = QLinear { weight: q.clone() };
                let proj = if full {
                    Proj::Full(f32t(&format!("blk.{i}.{name}.weight"))?)
                } else if self.lora_targets.iter().any(|t| t == name) {
                    let (o, inp) = q.shape().dims2()?;
                    let r = self.lora_rank;
                    let bound = 1.0 / (inp as f64).sqrt();
                    let vb = vb.pp(format!("blk.{i}.{name}"));
                    Proj::Lora(LoraLinear {
                        base,
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
                    Proj::Frozen(base)
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
            (embed, Proj::Full(head))
        } else {
            let head = match w.tensors.get("output.weight") {
                Some(q) => q.clone(),
                None => w.get("token_embd.weight")?,
            };
            (w.embed.clone(), Proj::Frozen(QLinear { weight: head }))
        };
        Ok(LlamaNet {
            embed,
            head,
            norm: f32t("output_norm.weight")?,
            blocks,
            context: self.context,
            w,
            recompute: AtomicUsize::new(0),
        })
    }
}
