//! Interop with the tools users already have: Hugging Face GPT-2 weights
//! in and out ([`hf`]), and the byte-level token spelling that
//! transformers' and llama.cpp's tokenizers share ([`bytelevel`]).
//! Depends on the engine, the data sources' vocabularies and the GGUF
//! writer; nothing below depends on it.

pub mod bert;
mod bert_config;
mod bert_export;
mod bert_names;
pub mod bytelevel;
mod export;
pub mod gguf_gpt2;
pub mod hf;
mod hf_files;
pub mod lora;
pub mod onnx;
pub mod peft;
pub mod saved;

use std::sync::Arc;

pub use export::{export, Model, Written};

use crate::engine::{Bert, Cnn, Gpt, Mlp, ModelSpec};
use crate::quant::LlamaGguf;
use crate::{Error, Result};

/// The model a checkpoint's `model_config` describes (see
/// [`ModelSpec::config`]), to rebuild it without its recipe. Starting
/// weights are not read again: the checkpoint holds the trained ones.
pub fn spec_from_config(config: &serde_json::Value) -> Result<Arc<dyn ModelSpec>> {
    let (kind, options) = config
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.iter().next())
        .ok_or_else(|| Error::Config(format!("model config {config}: not {{ kind: options }}")))?;
    let bad = |e: serde_json::Error| Error::Config(format!("model config `{kind}`: {e}"));
    let o = options.clone();
    Ok(match kind.as_str() {
        "mlp" => Arc::new(serde_json::from_value::<Mlp>(o).map_err(bad)?),
        "cnn" => Arc::new(serde_json::from_value::<Cnn>(o).map_err(bad)?),
        "gpt" => {
            let mut g: Gpt = serde_json::from_value(o).map_err(bad)?;
            g.initial = None;
            Arc::new(g)
        }
        "bert" => {
            let mut b: Bert = serde_json::from_value(o).map_err(bad)?;
            b.initial = None;
            Arc::new(b)
        }
        "llama_gguf" => Arc::new(serde_json::from_value::<LlamaGguf>(o).map_err(bad)?),
        other => {
            return Err(Error::Config(format!(
                "model config: unknown kind `{other}`"
            )))
        }
    })
}
