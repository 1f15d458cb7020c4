//! A QLoRA run's adapters for llama.cpp: as its LoRA adapter file
//! (`general.type = adapter`, tensors `blk.N.attn_q.weight.lora_a`, which
//! `llama_lora_adapter_init` loads over the base model), or merged into the
//! base model's weights as a whole GGUF file.
//!
//! taper's adapters are `A [r, in]` and `B [out, r]` with the update
//! `(alpha / r) B A`, as PEFT's; llama.cpp scales by `alpha / r` with `r`
//! read from A, so the same `adapter.lora.alpha` gives the same update.

use std::collections::HashMap;
use std::io::BufWriter;
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use crate::engine::checkpoint::write_atomically;
use crate::quant::{ExportFormat, ExportSummary, LlamaGguf};
use crate::{Error, Result};

/// One adapted projection: its base weight's name and its trained A, B.
pub(super) struct Adapter {
    pub(super) weight: String,
    pub(super) a: Tensor,
    pub(super) b: Tensor,
}

/// The run's adapters (f32, on the CPU), in order of their weights' names.
pub(super) fn adapters(spec: &LlamaGguf, params: &HashMap<String, Tensor>) -> Result<Vec<Adapter>> {
    if spec.train != "lora" {
        return Err(Error::Config(format!(
            "the model trains `{}`, not LoRA adapters",
            spec.train
        )));
    }
    let mut out: Vec<Adapter> = params
        .iter()
        .filter_map(|(name, a)| {
            let stem = name.strip_suffix(".lora_a")?;
            Some((stem, a))
        })
        .map(|(stem, a)| {
            let b = params
                .get(&format!("{stem}.lora_b"))
                .ok_or_else(|| Error::Config(format!("adapter `{stem}` has A but no B")))?;
            Ok(Adapter {
                weight: format!("{stem}.weight"),
                a: a.to_dtype(DType::F32)?.to_device(&Device::Cpu)?,
                b: b.to_dtype(DType::F32)?.to_device(&Device::Cpu)?,
            })
        })
        .collect::<Result<_>>()?;
    if out.is_empty() {
        return Err(Error::Config("the run has no LoRA adapters".into()));
    }
    out.sort_by(|x, y| x.weight.cmp(&y.weight));
    Ok(out)
}

/// What [`export_adapter`] wrote.
pub struct AdapterSummary {
    pub tensors: usize,
    pub bytes: u64,
}

/// Writes the adapters as a llama.cpp LoRA adapter (f32). Refused for a
/// run that used only the file's first blocks: llama.cpp applies an
/// adapter over the whole base file, which would run blocks the run never
/// saw (the merged `gguf` export writes the model it trained).
pub fn export_adapter(
    path: &Path,
    spec: &LlamaGguf,
    params: &HashMap<String, Tensor>,
) -> Result<AdapterSummary> {
    use gguf_file::Value as G;
    let blocks = spec.weights()?.layers;
    if let Some(n) = spec.layers.filter(|&n| n < blocks) {
        return Err(Error::Config(format!(
            "gguf-lora: the run used the first {n} of the {blocks} blocks of {}; llama.cpp \
             applies an adapter over all {blocks}, a model the run never trained. Export \
             `gguf` instead: the {n} blocks it trained, with the adapters merged",
            spec.path.display()
        )));
    }
    let list = adapters(spec, params)?;
    let mut qs = Vec::new();
    for a in &list {
        qs.push((
            format!("{}.lora_a", a.weight),
            QTensor::quantize(&a.a, GgmlDType::F32)?,
        ));
        qs.push((
            format!("{}.lora_b", a.weight),
            QTensor::quantize(&a.b, GgmlDType::F32)?,
        ));
    }
    let meta = vec![
        ("general.architecture", G::String("llama".into())),
        ("general.type", G::String("adapter".into())),
        ("adapter.type", G::String("lora".into())),
        ("adapter.lora.alpha", G::F32(spec.lora_alpha as f32)),
        (
            "general.name",
            G::String(format!("taper LoRA for {}", spec.path.display())),
        ),
    ];
    write_gguf(path, &meta, &qs)?;
    Ok(AdapterSummary {
        tensors: qs.len(),
        bytes: std::fs::metadata(path)
            .map_err(|e| Error::io(path, e))?
            .len(),
    })
}

/// Writes the model the run trained as a llama file: the base with each
/// trained matrix in `format` (vectors, and rows that are not whole blocks,
/// in f32): with LoRA each adapted projection as `W + (alpha / r) B A`;
/// with `train = "full"` every trained tensor as it is. Every other tensor
/// is as the run used it (`base` requantizes the file's projections), and
/// the metadata (the tokenizer included) as the file holds it, but for the
/// block count of a run that used only its first `layers` blocks.
pub fn export_merged(
    path: &Path,
    spec: &LlamaGguf,
    params: &HashMap<String, Tensor>,
    format: ExportFormat,
) -> Result<ExportSummary> {
    let trained = trained_weights(spec, params)?;
    let weights = spec.weights()?;
    let layers = spec.layers.unwrap_or(weights.layers).min(weights.layers);
    let mut f = std::fs::File::open(&spec.path).map_err(|e| Error::io(&spec.path, e))?;
    let content = gguf_file::Content::read(&mut f)?;
    let dtype = format.ggml();
    let mut summary = ExportSummary::default();
    let mut merged: HashMap<&str, QTensor> = HashMap::new();
    for (name, w) in &trained {
        summary.f32_bytes += 4 * w.elem_count() as u64;
        let whole_blocks = w.dims().last().is_some_and(|d| d % dtype.block_size() == 0);
        let q = if w.rank() == 2 && whole_blocks {
            summary.quantized += 1;
            QTensor::quantize(w, dtype)?
        } else {
            summary.kept_f32 += 1;
            QTensor::quantize(w, GgmlDType::F32)?
        };
        merged.insert(name.as_str(), q);
    }
    let unused_block = |name: &str| {
        let block = name.strip_prefix("blk.").and_then(|r| r.split('.').next());
        block.and_then(|b| b.parse::<usize>().ok()) >= Some(layers)
    };
    let mut names: Vec<&String> = weights.tensors.keys().collect();
    names.sort();
    let mut tensors: Vec<(&str, &QTensor)> = Vec::new();
    for name in names {
        if !merged.contains_key(name.as_str()) && !unused_block(name) {
            let t = &weights.tensors[name];
            summary.f32_bytes += 4 * t.shape().elem_count() as u64;
            tensors.push((name.as_str(), t));
        }
    }
    tensors.extend(merged.iter().map(|(n, q)| (*n, q)));
    let block_count = gguf_file::Value::U32(layers as u32);
    let meta: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| match k.as_str() {
            "llama.block_count" => (k.as_str(), &block_count),
            _ => (k.as_str(), v),
        })
        .collect();
    write_gguf_refs(path, &meta, &tensors)?;
    summary.bytes = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len();
    Ok(summary)
}

/// The tensors a run changed, by the base file's names, in f32 on the CPU:
/// the merged projections (LoRA), or every trained tensor (`full`).
fn trained_weights(
    spec: &LlamaGguf,
    params: &HashMap<String, Tensor>,
) -> Result<Vec<(String, Tensor)>> {
    let f32_cpu = |t: &Tensor| t.to_dtype(DType::F32)?.to_device(&Device::Cpu);
    if spec.train == "full" {
        let mut out = params
            .iter()
            .map(|(n, t)| Ok((n.clone(), f32_cpu(t)?)))
            .collect::<Result<Vec<_>>>()?;
        out.sort_by(|x, y| x.0.cmp(&y.0));
        return Ok(out);
    }
    let weights = spec.weights()?;
    let scale = spec.lora_alpha / spec.lora_rank as f64;
    adapters(spec, params)?
        .into_iter()
        .map(|a| {
            let base = weights.tensors.get(&a.weight).ok_or_else(|| {
                Error::Config(format!("{}: no tensor {}", spec.path.display(), a.weight))
            })?;
            let w = (base.dequantize(&Device::Cpu)? + (a.b.matmul(&a.a)? * scale)?)?;
            Ok((a.weight, w))
        })
        .collect()
}

fn write_gguf(
    path: &Path,
    meta: &[(&str, gguf_file::Value)],
    tensors: &[(String, QTensor)],
) -> Result<()> {
    let meta: Vec<(&str, &gguf_file::Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, q)| (k.as_str(), q)).collect();
    write_gguf_refs(path, &meta, &refs)
}

fn write_gguf_refs(
    path: &Path,
    meta: &[(&str, &gguf_file::Value)],
    tensors: &[(&str, &QTensor)],
) -> Result<()> {
    write_atomically(path, |tmp| {
        let file = std::fs::File::create(tmp).map_err(|e| Error::io(tmp, e))?;
        let mut w = BufWriter::new(file);
        gguf_file::write(&mut w, meta, tensors)?;
        w.into_inner().map_err(|e| Error::io(tmp, e.into_error()))?;
        Ok(())
    })
}
