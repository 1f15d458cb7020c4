//! A Llama-architecture language model read from a GGUF file (SmolLM2 and
//! other llama.cpp exports), its weights frozen in their quantized types,
//! with low-rank adapters on chosen projections: QLoRA fine-tuning.
//!
//! Only the adapters are parameters of the run, so the optimizer, the
//! gradients and checkpoints hold nothing else. Every op on the way down
//! is differentiable (the frozen matmuls through [`QLinear`](super::lora::QLinear)), so each
//! adapter gets its true gradient.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Module, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

use crate::engine::model::{ModelSpec, TrainModule};

/// `taper.model.llama_gguf{ path, lora_rank = 8, lora_alpha = 16,
/// lora_targets = { "attn_q", "attn_v" }, lora_dropout = 0, layers = all,
/// context = 512 }`.
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
    /// Dropout on each adapter's input in training (PEFT's `lora_dropout`;
    /// the QLoRA paper's 0.05 to 0.1); 0, none, by default.
    #[serde(default)]
    pub lora_dropout: f64,
}

pub(super) const PROJECTIONS: [&str; 7] = [
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

    pub(super) fn full(&self) -> Result<bool> {
        match self.train.as_str() {
            "lora" => Ok(false),
            "full" => Ok(true),
            other => candle_core::bail!("llama_gguf: unknown train `{other}` (lora, full)"),
        }
    }

    pub(super) fn used_layers(&self, w: &Weights) -> usize {
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
            let Some(dtype) = base_type(b) else {
                candle_core::bail!("llama_gguf: unknown base `{b}` (q8_0, q4_0, q4_1, f16)")
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

/// The GGML type a `base` option names.
fn base_type(name: &str) -> Option<GgmlDType> {
    match name {
        "q8_0" => Some(GgmlDType::Q8_0),
        "q4_0" => Some(GgmlDType::Q4_0),
        "q4_1" => Some(GgmlDType::Q4_1),
        "f16" => Some(GgmlDType::F16),
        _ => None,
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
        use crate::error::candle_message as said;
        let mut f = std::fs::File::open(path)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", path.display())))?;
        let c = gguf_file::Content::read(&mut f).map_err(|e| {
            candle_core::Error::Msg(format!(
                "{}: not a GGUF file ({})",
                path.display(),
                said(&e)
            ))
        })?;
        let arch = c
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok());
        if arch.map(String::as_str) != Some("llama") {
            candle_core::bail!(
                "{}: its architecture is {}; taper.model.llama_gguf reads llama.cpp's `llama`",
                path.display(),
                arch.map_or("not given".to_string(), |a| format!("`{a}`"))
            );
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
            let t = c.tensor(&mut f, name, &Device::Cpu).map_err(|e| {
                let size = std::fs::metadata(path).map_or(0, |m| m.len());
                candle_core::Error::Msg(format!(
                    "{}: tensor {name}: {} (the file is {size} bytes; truncated?)",
                    path.display(),
                    said(&e)
                ))
            })?;
            tensors.insert(name.clone(), Arc::new(t));
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

    pub(super) fn get(&self, name: &str) -> Result<Arc<QTensor>> {
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

impl ModelSpec for LlamaGguf {
    /// Checks the options against each other and the file, reading it (the
    /// read is cached, so the run's build costs nothing more): what the
    /// recipe asked for that cannot work is a [`Error::Config`], a file that
    /// cannot be read as a llama is an [`Error::Data`].
    fn check(&self) -> crate::Result<()> {
        use crate::Error;
        let bad = |msg: String| Err(Error::Config(msg));
        if !["lora", "full"].contains(&self.train.as_str()) {
            return bad(format!("unknown train `{}` (lora, full)", self.train));
        }
        let lora = self.train == "lora";
        if let Some(t) = self
            .lora_targets
            .iter()
            .find(|t| !PROJECTIONS.contains(&t.as_str()))
        {
            return bad(format!(
                "unknown lora target `{t}` ({})",
                PROJECTIONS.join(", ")
            ));
        }
        if lora && self.lora_targets.is_empty() {
            return bad("lora_targets is empty: no adapters, nothing to train".into());
        }
        if lora && self.lora_rank == 0 {
            return bad("lora_rank must be at least 1".into());
        }
        if !(self.lora_alpha.is_finite() && self.lora_alpha > 0.0) {
            return bad(format!(
                "lora_alpha must be positive, got {}",
                self.lora_alpha
            ));
        }
        if self.context == 0 {
            return bad("context must be at least 1".into());
        }
        if !(0.0..1.0).contains(&self.lora_dropout) {
            return bad(format!(
                "lora_dropout {} is not a rate in [0, 1)",
                self.lora_dropout
            ));
        }
        if !lora && self.lora_dropout > 0.0 {
            return bad(format!(
                "lora_dropout {}: train = \"full\" has no adapters to drop out the inputs of",
                self.lora_dropout
            ));
        }
        if let Some(b) = self.base.as_deref().filter(|b| base_type(b).is_none()) {
            return bad(format!("unknown base `{b}` (q8_0, q4_0, q4_1, f16)"));
        }
        let w = self
            .weights()
            .map_err(|e| Error::Data(crate::error::candle_message(&e)))?;
        match self.layers {
            Some(0) => bad(format!(
                "layers must be 1 to the file's {} blocks (leave it out for all)",
                w.layers
            )),
            Some(n) if n > w.layers => bad(format!(
                "layers = {n}, but {} has {} blocks",
                self.path.display(),
                w.layers
            )),
            _ => Ok(()),
        }
    }

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
        let drop = crate::engine::dropout::describe_rate(self.lora_dropout);
        format!(
            "llama_gguf {name}{layers}{base} lora rank {} alpha {} on {}{drop}",
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

    fn causal(&self) -> bool {
        true
    }
}
