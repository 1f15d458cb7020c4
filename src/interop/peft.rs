//! A QLoRA run's adapters as a PEFT LoRA adapter folder
//! (`adapter_model.safetensors` and `adapter_config.json`), which
//! `PeftModel.from_pretrained` loads over the base model as transformers
//! reads it from the same GGUF file (`from_pretrained(dir, gguf_file=...)`),
//! and which the tools that take PEFT adapters (vLLM, TGI, the Hub) take.
//!
//! taper's adapters are PEFT's: `A [r, in]`, `B [out, r]`, the update
//! `(alpha / r) B A`. One difference of layout: a GGUF file stores the query
//! and key projections' rows permuted for llama.cpp's interleaved rotary
//! embedding, which transformers permutes back when it reads the file; B's
//! rows of those projections are permuted back in the same way here.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;
use serde_json::json;

use super::hf::{write_f32_safetensors, write_json};
use super::lora::adapters;
use crate::quant::LlamaGguf;
use crate::{Error, Result};

/// What [`export_peft`] wrote.
pub struct PeftSummary {
    pub tensors: usize,
    pub bytes: u64,
    /// transformers' module names of the adapted projections.
    pub targets: Vec<String>,
}

/// transformers' module of a llama block's projection, by its GGUF name.
fn module(gguf: &str) -> Option<&'static str> {
    Some(match gguf {
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    })
}

/// The rows of `b` (`[heads * head_dim, r]`) as transformers orders them:
/// llama.cpp's converter interleaved each head's two halves
/// (`reshape(heads, 2, half, ..).swapaxes(1, 2)`), and transformers'
/// `_reverse_permute_weights` undoes it.
fn unpermute(b: &Tensor, heads: usize) -> Result<Tensor> {
    let (rows, r) = b.dims2()?;
    let half = rows / heads / 2;
    Ok(b.reshape((heads, half, 2, r))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, r))?)
}

/// Writes `dir/adapter_model.safetensors` (f32, PEFT's names:
/// `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`) and
/// `dir/adapter_config.json`. Refused for a run that used only the file's
/// first blocks: PEFT applies the adapter to the whole model, whose other
/// blocks the run never saw.
pub fn export_peft(
    dir: &Path,
    spec: &LlamaGguf,
    params: &HashMap<String, Tensor>,
) -> Result<PeftSummary> {
    let w = spec.weights()?;
    if let Some(n) = spec.layers.filter(|&n| n < w.layers) {
        return Err(Error::Config(format!(
            "peft: the run used the first {n} of the {} blocks of {}; PEFT applies an adapter \
             to the whole model, one the run never trained. Export `gguf` instead: the {n} \
             blocks it trained, with the adapters merged",
            w.layers,
            spec.path.display()
        )));
    }
    let mut tensors = Vec::new();
    let mut targets = Vec::new();
    for a in adapters(spec, params)? {
        let unknown = || Error::Config(format!("peft: no transformers module for `{}`", a.weight));
        let mut parts = a.weight.split('.');
        let (block, proj) = match (parts.next(), parts.next(), parts.next()) {
            (Some("blk"), Some(n), Some(p)) => (n, p),
            _ => return Err(unknown()),
        };
        let m = module(proj).ok_or_else(unknown)?;
        let b = match proj {
            "attn_q" => unpermute(&a.b, w.heads)?,
            "attn_k" => unpermute(&a.b, w.kv_heads)?,
            _ => a.b.clone(),
        };
        let stem = format!("base_model.model.model.layers.{block}.{m}");
        tensors.push((format!("{stem}.lora_A.weight"), a.a.contiguous()?));
        tensors.push((format!("{stem}.lora_B.weight"), b));
        let short = m.rsplit('.').next().unwrap_or(m).to_string();
        if !targets.contains(&short) {
            targets.push(short);
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let weights = dir.join("adapter_model.safetensors");
    write_f32_safetensors(&weights, &tensors)?;
    let config = dir.join("adapter_config.json");
    write_json(
        &config,
        &json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": spec.lora_rank,
            "lora_alpha": spec.lora_alpha,
            "lora_dropout": spec.lora_dropout,
            "target_modules": targets,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "init_lora_weights": true,
            "inference_mode": true,
            "base_model_name_or_path": null,
            "revision": null,
            "modules_to_save": null,
        }),
    )?;
    let mut bytes = 0;
    for f in [&weights, &config] {
        bytes += std::fs::metadata(f).map_err(|e| Error::io(f, e))?.len();
    }
    Ok(PeftSummary {
        tensors: tensors.len(),
        bytes,
        targets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// llama.cpp's converter permutes HF rows as
    /// `w.reshape(heads, 2, half, ..).swapaxes(1, 2)`; `unpermute` is its
    /// inverse.
    #[test]
    fn rows_go_back_to_transformers_order() -> Result<()> {
        let (heads, half, r) = (3, 2, 2);
        let rows = heads * 2 * half;
        let hf: Vec<f32> = (0..rows * r).map(|v| v as f32).collect();
        let hf = Tensor::from_vec(hf, (rows, r), &Device::Cpu)?;
        let gguf = hf
            .reshape((heads, 2, half, r))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((rows, r))?;
        assert_ne!(gguf.to_vec2::<f32>()?, hf.to_vec2::<f32>()?);
        assert_eq!(
            unpermute(&gguf, heads)?.to_vec2::<f32>()?,
            hf.to_vec2::<f32>()?
        );
        Ok(())
    }
}
