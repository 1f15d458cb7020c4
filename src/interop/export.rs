//! Writing a model (a run's, or a checkpoint's) in the formats other tools
//! read: the one entry `run:export{}` and `taper export` share.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value as G;
use candle_core::Tensor;

use crate::data::Vocab;
use crate::engine::{Gpt, ModelSpec};
use crate::quant::{export_gguf, ExportFormat, ExportSummary, LlamaGguf};
use crate::{Error, Result};

/// A model to write: what it is, its weights by taper's names, the
/// vocabulary of its text (if any), and the step it was trained to.
pub struct Model<'a> {
    pub spec: &'a dyn ModelSpec,
    pub params: HashMap<String, Tensor>,
    pub vocab: Option<&'a Vocab>,
    /// Class names, label 0 first, where the run's data knew them.
    pub classes: Option<&'a [String]>,
    /// How an image file becomes the model's input, for a run on images.
    pub image_input: Option<&'a crate::data::ImageInput>,
    /// How a CSV row becomes the model's input, for a run on a CSV file.
    pub table_input: Option<&'a crate::data::TableInput>,
    /// How other data's samples were standardized, for a run on them.
    pub sample_input: Option<&'a crate::data::SampleInput>,
    /// How a sample of arrays becomes the model's input, for a run on them.
    pub array_input: Option<&'a crate::data::ArrayInput>,
    /// A multi-label classifier (its labels: the table's target columns).
    pub multi_label: bool,
    pub step: u64,
}

/// What an export wrote: for the record, the line and `run:export`'s table.
#[derive(Debug, Clone, Default)]
pub struct Written {
    pub bytes: u64,
    pub f32_bytes: Option<u64>,
    pub quantized: Option<usize>,
    pub kept_f32: Option<usize>,
    /// Said after the format: what kind of file, counts, notes.
    pub detail: String,
}

/// Writes `model` to `path` as `format` ("gguf", "hf", "gguf-lora", "peft"
/// or "onnx"),
/// GGUF weight matrices in `ty`. A `taper.model.llama_gguf` as "gguf" is
/// its base file with the training merged in (`merge`, which only a llama
/// takes, says so explicitly).
pub fn export(
    model: &Model,
    path: &Path,
    format: &str,
    ty: ExportFormat,
    merge: bool,
) -> Result<Written> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    match format {
        "hf" => hf(model, path),
        "gguf-lora" => lora_adapter(model, path),
        "peft" => peft_adapter(model, path),
        "onnx" => onnx(model, path),
        // A llama's file is only useful to llama.cpp with the training in
        // it: merging is what `gguf` means for one.
        "gguf" if merge || as_llama(model, "gguf").is_ok() => merged(model, path, ty),
        "gguf" => gguf_file(model, path, ty),
        other => Err(Error::Config(format!(
            "unknown format `{other}` (gguf, hf, gguf-lora, peft, onnx)"
        ))),
    }
}

/// The model's spec as a `taper.model.<kind>` one, or why it is not one
/// (`what` names the format asking).
fn spec_as<T: serde::de::DeserializeOwned>(model: &Model, kind: &str, what: &str) -> Result<T> {
    model
        .spec
        .config()
        .and_then(|c| c.get(kind).cloned())
        .and_then(|g| serde_json::from_value(g).ok())
        .ok_or_else(|| {
            Error::Config(format!(
                "{what} is for taper.model.{kind}; this model is {}",
                model.spec.describe()
            ))
        })
}

fn as_gpt(model: &Model, format: &str) -> Result<Gpt> {
    spec_as(model, "gpt", &format!("format {format}"))
}

fn as_llama(model: &Model, what: &str) -> Result<LlamaGguf> {
    spec_as(model, "llama_gguf", what)
}

fn hf(model: &Model, path: &Path) -> Result<Written> {
    let (bert, gpt) = (
        spec_as::<crate::engine::Bert>(model, "bert", "format hf"),
        as_gpt(model, "hf"),
    );
    let out = match (bert, gpt) {
        (Ok(bert), _) => {
            // A multi-label classifier's labels are its target columns.
            let labels: Option<Vec<String>> = match model.multi_label {
                true => model
                    .table_input
                    .map(|t| t.targets.iter().map(|c| c.name()).collect()),
                false => model.classes.map(<[String]>::to_vec),
            };
            let names = super::bert_export::Labels {
                names: labels.as_deref(),
                multi_label: model.multi_label,
            };
            super::bert_export::export(path, &bert, &model.params, names)?
        }
        (_, Ok(gpt)) => super::hf::export(path, &gpt, &model.params, model.vocab)?,
        _ => {
            return Err(Error::Config(format!(
                "format hf is for taper.model.gpt and taper.model.bert; this model is {}",
                model.spec.describe()
            )))
        }
    };
    let mut detail = format!(", {} files", out.files.len());
    if let Some(note) = out.note {
        detail.push_str(&format!("; {note}"));
    }
    Ok(Written {
        bytes: out.bytes,
        detail,
        ..Written::default()
    })
}

fn onnx(model: &Model, path: &Path) -> Result<Written> {
    use super::onnx::{Classifier, Meta};
    let (mlp, cnn) = (
        spec_as::<crate::engine::Mlp>(model, "mlp", "format onnx"),
        spec_as::<crate::engine::Cnn>(model, "cnn", "format onnx"),
    );
    let net = match (&mlp, &cnn) {
        (Ok(m), _) => Classifier::Mlp(m),
        (_, Ok(c)) => Classifier::Cnn(c),
        _ => {
            return Err(Error::Config(format!(
                "format onnx is for taper.model.mlp and taper.model.cnn; this model is {}",
                model.spec.describe()
            )))
        }
    };
    let meta = Meta {
        describe: model.spec.describe(),
        step: model.step,
        classes: model.classes,
        image_input: model.image_input,
        table_input: model.table_input,
        sample_input: model.sample_input,
        array_input: model.array_input,
    };
    let bytes = super::onnx::export(path, net, &model.params, &meta)?;
    let input = match net {
        Classifier::Mlp(m) => format!("[batch, {}]", m.inputs),
        Classifier::Cnn(c) => format!("[batch, {}, {}, {}]", c.input[0], c.input[1], c.input[2]),
    };
    let classes = match model.classes {
        Some(c) => format!(", {} class names", c.len()),
        None => String::new(),
    };
    Ok(Written {
        bytes,
        detail: format!(", input {input}, output logits{classes}"),
        ..Written::default()
    })
}

fn summary(s: ExportSummary, ty: ExportFormat, what: &str) -> Written {
    Written {
        bytes: s.bytes,
        f32_bytes: Some(s.f32_bytes),
        quantized: Some(s.quantized),
        kept_f32: Some(s.kept_f32),
        detail: format!(
            " {}, {what}, {} tensors quantized, {} kept f32, {:.2}x smaller than f32",
            ty.name(),
            s.quantized,
            s.kept_f32,
            s.f32_bytes as f64 / s.bytes.max(1) as f64
        ),
    }
}

fn gguf_file(model: &Model, path: &Path, ty: ExportFormat) -> Result<Written> {
    if let Ok(spec) = as_gpt(model, "gguf") {
        let s = super::gguf_gpt2::export(path, &spec, &model.params, model.vocab, ty, model.step)?;
        return Ok(summary(s, ty, "llama.cpp gpt2"));
    }
    let mut tensors: Vec<(String, Tensor)> = model.params.clone().into_iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let describe = model.spec.describe();
    let meta = vec![
        (
            "general.architecture".to_string(),
            G::String("taper".into()),
        ),
        ("general.name".to_string(), G::String(describe.clone())),
        ("taper.model".to_string(), G::String(describe)),
        ("taper.step".to_string(), G::String(model.step.to_string())),
        ("taper.format".to_string(), G::String(ty.name().into())),
    ];
    let s = export_gguf(path, &tensors, &meta, ty)?;
    Ok(summary(s, ty, "architecture taper"))
}

fn lora_adapter(model: &Model, path: &Path) -> Result<Written> {
    let spec = as_llama(model, "gguf-lora")?;
    let s = super::lora::export_adapter(path, &spec, &model.params)?;
    let mut detail = format!(", {} adapter tensors, alpha {}", s.tensors, spec.lora_alpha);
    if let Some(base) = &spec.base {
        detail.push_str(&format!(
            "; trained over the projections requantized to {base} (llama.cpp applies it over the file's own)"
        ));
    }
    Ok(Written {
        bytes: s.bytes,
        detail,
        ..Written::default()
    })
}

fn peft_adapter(model: &Model, path: &Path) -> Result<Written> {
    let spec = as_llama(model, "peft")?;
    let s = super::peft::export_peft(path, &spec, &model.params)?;
    let mut detail = format!(
        ", a folder: adapter_model.safetensors ({} tensors on {}, r {}, alpha {}) and adapter_config.json",
        s.tensors,
        s.targets.join(", "),
        spec.lora_rank,
        spec.lora_alpha
    );
    if let Some(base) = &spec.base {
        detail.push_str(&format!(
            "; trained over the projections requantized to {base} (transformers dequantizes the file's own)"
        ));
    }
    Ok(Written {
        bytes: s.bytes,
        detail,
        ..Written::default()
    })
}

fn merged(model: &Model, path: &Path, ty: ExportFormat) -> Result<Written> {
    let spec = as_llama(model, "merge = true")?;
    let s = super::lora::export_merged(path, &spec, &model.params, ty)?;
    let what = match spec.train.as_str() {
        "full" => "llama, its trained weights",
        _ => "llama, adapters merged",
    };
    Ok(summary(s, ty, what))
}
