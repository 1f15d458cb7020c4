//! A Llama-architecture language model read from a GGUF file (SmolLM2 and
//! other llama.cpp exports), its weights frozen in their quantized types,
//! with low-rank adapters on chosen projections: QLoRA fine-tuning.
//!
//! Only the adapters are parameters of the run, so the optimizer, the
//! gradients and checkpoints hold nothing else. Every op on the way down
//! is differentiable (the frozen matmuls through [`QLinear`]), so each
//! adapter gets its true gradient.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Module, Result, Tensor, D};
use candle_nn::{Init, VarBuilder};
use serde::Deserialize;

use super::lora::{LoraLinear, QLinear};
use crate::engine::model::{ModelSpec, TrainModule};

/// `taper.model.llama_gguf{ path, lora_rank = 8, lora_alpha = 16,
/// lora_targets = { "attn_q", "attn_v" }, layers = all, context = 512 }`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct LlamaGguf {
    pub path: PathBuf,
    #[serde(default = "LlamaGguf::default_rank")]
    pub lora_rank: usize,
    #[serde(default = "LlamaGguf::default_alpha")]
    pub lora_alpha: f64,
    /// Projections that get adapters: attn_q, attn_k, attn_v, attn_output,
    /// ffn_gate, ffn_up, ffn_down.
    #[serde(default = "LlamaGguf::default_targets")]
    pub lora_targets: Vec<String>,
    /// Use only the first `layers` blocks (quick experiments and tests).
    pub layers: Option<usize>,
    /// The longest sequence trained on or generated from.
    #[serde(default = "LlamaGguf::default_context")]
    pub context: usize,
    /// Requantize the blocks' projection weights to this type ("q8_0",
    /// "q4_0", "q4_1", "f16"); default: keep the file's types.
    pub base: Option<String>,
    /// "lora" (adapters on the frozen quantized base) or "full" (every
    /// weight dequantized to f32 and trained: the comparison QLoRA saves
    /// memory against).
    #[serde(default = "LlamaGguf::default_train")]
    pub train: String,
}

const PROJECTIONS: [&str; 7] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

impl LlamaGguf {
    fn default_rank() -> usize {
        8
    }
    fn default_alpha() -> f64 {
        16.0
    }
    fn default_targets() -> Vec<String> {
        vec!["attn_q".into(), "attn_v".into()]
    }
    fn default_context() -> usize {
        512
    }
    fn default_train() -> String {
        "lora".into()
    }

    fn full(&self) -> Result<bool> {
        match self.train.as_str() {
            "lora" => Ok(false),
            "full" => Ok(true),
            other => candle_core::bail!("llama_gguf: unknown train `{other}` (lora, full)"),
        }
    }

    fn used_layers(&self, w: &Weights) -> usize {
        self.layers.unwrap_or(w.layers).min(w.layers)
    }

    /// Every tensor the model uses, by GGUF name.
    fn tensor_names(&self, w: &Weights) -> Vec<String> {
        let mut names = vec![
            "token_embd.weight".to_string(),
            "output_norm.weight".to_string(),
        ];
        if w.tensors.contains_key("output.weight") {
            names.push("output.weight".into());
        }
        for i in 0..self.used_layers(w) {
            names.push(format!("blk.{i}.attn_norm.weight"));
            names.push(format!("blk.{i}.ffn_norm.weight"));
            names.extend(PROJECTIONS.iter().map(|p| format!("blk.{i}.{p}.weight")));
        }
        names
    }

    /// The file's hyperparameters and frozen weights, requantized as `base`
    /// asks (read once per path and base).
    pub fn weights(&self) -> Result<Arc<Weights>> {
        type Key = (PathBuf, Option<String>);
        static CACHE: Mutex<Vec<(Key, Arc<Weights>)>> = Mutex::new(Vec::new());
        let key = (self.path.clone(), self.base.clone());
        let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, w)) = cache.iter().find(|(k, _)| k == &key) {
            return Ok(w.clone());
        }
        let mut w = Weights::read(&self.path)?;
        if let Some(b) = &self.base {
            let dtype = match b.as_str() {
                "q8_0" => GgmlDType::Q8_0,
                "q4_0" => GgmlDType::Q4_0,
                "q4_1" => GgmlDType::Q4_1,
                "f16" => GgmlDType::F16,
                other => {
                    candle_core::bail!("llama_gguf: unknown base `{other}` (q8_0, q4_0, q4_1, f16)")
                }
            };
            for (name, t) in w.tensors.iter_mut() {
                let proj = PROJECTIONS
                    .iter()
                    .any(|p| name.ends_with(&format!(".{p}.weight")));
                if proj && t.dtype() != dtype {
                    *t = Arc::new(QTensor::quantize(&t.dequantize(&Device::Cpu)?, dtype)?);
                }
            }
        }
        let w = Arc::new(w);
        cache.push((key, w.clone()));
        Ok(w)
    }
}

/// A GGUF llama file, read.
pub struct Weights {
    pub vocab: usize,
    pub dim: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub rope_base: f32,
    pub eps: f64,
    pub tensors: HashMap<String, Arc<QTensor>>,
    /// The token embedding, dequantized once for lookups.
    pub embed: Tensor,
}

impl Weights {
    fn read(path: &Path) -> Result<Weights> {
        let mut f = std::fs::File::open(path)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", path.display())))?;
        let c = gguf_file::Content::read(&mut f).map_err(|e| {
            candle_core::Error::Msg(format!("{}: not a GGUF file ({e})", path.display()))
        })?;
        let arch = c
            .metadata
            .get("general.architecture")
            .map(|v| v.to_string())
            .transpose()?;
        if arch.map(String::as_str) != Some("llama") {
            candle_core::bail!("{}: architecture {arch:?}, expected llama", path.display());
        }
        let u = |k: &str| -> Result<usize> {
            match c.metadata.get(&format!("llama.{k}")) {
                Some(v) => Ok(v.to_u32()? as usize),
                None => candle_core::bail!("{}: no llama.{k}", path.display()),
            }
        };
        let f32v = |k: &str, d: f32| -> Result<f32> {
            c.metadata
                .get(&format!("llama.{k}"))
                .map_or(Ok(d), |v| v.to_f32())
        };
        let mut tensors = HashMap::new();
        for name in c.tensor_infos.keys() {
            tensors.insert(
                name.clone(),
                Arc::new(c.tensor(&mut f, name, &Device::Cpu)?),
            );
        }
        let embed = match tensors.get("token_embd.weight") {
            Some(t) => t.dequantize(&Device::Cpu)?,
            None => candle_core::bail!("{}: no token_embd.weight", path.display()),
        };
        Ok(Weights {
            vocab: embed.dim(0)?,
            dim: u("embedding_length")?,
            layers: u("block_count")?,
            heads: u("attention.head_count")?,
            kv_heads: u("attention.head_count_kv")?,
            rope_base: f32v("rope.freq_base", 10000.0)?,
            eps: f32v("attention.layer_norm_rms_epsilon", 1e-5)? as f64,
            tensors,
            embed,
        })
    }

    fn get(&self, name: &str) -> Result<Arc<QTensor>> {
        match self.tensors.get(name) {
            Some(t) => Ok(t.clone()),
            None => candle_core::bail!("gguf: no tensor {name}"),
        }
    }

    /// Bytes of the frozen weights as stored.
    pub fn frozen_bytes(&self) -> usize {
        self.tensors
            .values()
            .map(|t| t.storage_size_in_bytes())
            .sum()
    }
}

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
    blocks: Vec<Block>,
    context: usize,
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(w)
}

impl LlamaNet {
    fn attention(
        &self,
        blk: &Block,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
    ) -> Result<Tensor> {
        let (b, t, c) = x.dims3()?;
        let (nh, nkv) = (self.w.heads, self.w.kv_heads);
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
        let (cos, sin) = (ang.cos()?, ang.sin()?);
        let mask = crate::kernels::causal_mask(t, x.dtype(), x.device())?;
        for blk in &self.blocks {
            let h = rms_norm(&x, &blk.attn_norm, self.w.eps)?;
            x = (&x + self.attention(blk, &h, &cos, &sin, &mask)?)?;
            let h = rms_norm(&x, &blk.ffn_norm, self.w.eps)?;
            let gate = candle_nn::ops::silu(&blk.p["ffn_gate"].forward(&h)?)?;
            let up = blk.p["ffn_up"].forward(&h)?;
            x = (&x + blk.p["ffn_down"].forward(&(gate * up)?)?)?;
        }
        rms_norm(&x, &self.norm, self.w.eps)
    }
}

impl Module for LlamaNet {
    fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        self.head.forward(&self.hidden(idx)?)
    }
}

/// The head is frozen and quantized: the chunked loss does not apply, so
/// the default (no separable head) stands.
impl TrainModule for LlamaNet {}

impl LlamaGguf {
    fn net(&self, vb: VarBuilder) -> Result<LlamaNet> {
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
            blocks.push(Block {
                attn_norm: f32t(&format!("blk.{i}.attn_norm.weight"))?,
                ffn_norm: f32t(&format!("blk.{i}.ffn_norm.weight"))?,
                p,
            });
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
        })
    }
}

impl ModelSpec for LlamaGguf {
    fn config(&self) -> Option<serde_json::Value> {
        crate::engine::model::tagged_config("llama_gguf", self)
    }

    fn describe(&self) -> String {
        let name = self
            .path
            .file_name()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        let layers = self
            .layers
            .map(|l| format!(" (first {l} layers)"))
            .unwrap_or_default();
        if self.train == "full" {
            return format!("llama_gguf {name}{layers} full fine-tuning");
        }
        let base = self
            .base
            .as_ref()
            .map(|b| format!(" base {b}"))
            .unwrap_or_default();
        format!(
            "llama_gguf {name}{layers}{base} lora rank {} alpha {} on {}",
            self.lora_rank,
            self.lora_alpha,
            self.lora_targets.join(",")
        )
    }

    fn build(&self, vb: VarBuilder) -> Result<Box<dyn Module>> {
        Ok(Box::new(self.net(vb)?))
    }

    fn initial_params(&self) -> Result<Vec<(String, Tensor)>> {
        if !self.full()? {
            return Ok(Vec::new());
        }
        let w = self.weights()?;
        self.tensor_names(&w)
            .into_iter()
            .map(|n| Ok((n.clone(), w.get(&n)?.dequantize(&Device::Cpu)?)))
            .collect()
    }

    fn build_train(&self, vb: VarBuilder) -> Result<Box<dyn TrainModule>> {
        Ok(Box::new(self.net(vb)?))
    }

    fn context(&self) -> Option<usize> {
        Some(self.context)
    }
}
