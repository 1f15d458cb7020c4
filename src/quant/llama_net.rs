//! The Llama network a [`LlamaGguf`] spec builds: frozen quantized
//! projections (with adapters, or trained in f32 for `train = "full"`),
//! RMS norms, rotary attention with grouped-query heads
//! (`llama_attention.rs`), SwiGLU MLPs.
//! Blocks can be recomputed in the backward (see `engine::recompute`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use candle_core::{Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use super::llama::{LlamaGguf, Weights, PROJECTIONS};
use super::llama_attention::{attention, Heads, Rope};
use super::lora::{LoraLinear, QLinear};
use crate::engine::model::TrainModule;
use crate::engine::Draw;
use crate::kernels::Dropout;

pub(super) enum Proj {
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

pub(super) struct Block {
    pub(super) attn_norm: Tensor,
    pub(super) ffn_norm: Tensor,
    pub(super) p: HashMap<&'static str, Proj>,
}

/// A block's draws of `lora_dropout` in a training step, one per
/// projection (each adapter drops out its own input, as each of PEFT's
/// LoRA layers has its own `nn.Dropout`): block `i`'s projection `j` (in
/// [`PROJECTIONS`]' order) is site `1 + 7i + j`. None in evaluation.
#[derive(Clone, Copy, Default)]
pub(super) struct Drops {
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
    pub(super) fn proj(&self, name: &str, x: &Tensor, drop: &Drops) -> Result<Tensor> {
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
        let rope = Rope::new(t, self.w.dim / self.w.heads, self.w.rope_base, &x)?;
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
