//! A `taper.model.bert` run written for transformers: a
//! `BertForSequenceClassification` folder (`model.safetensors` with the
//! encoder under `bert.`, `config.json` naming the classes), with the
//! tokenizer files of the folder the run started from, so that
//! `pipeline("text-classification", model=DIR)` answers with the classes'
//! names.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde_json::{json, Map, Value};

use super::hf::{write_f32_safetensors, write_json, HfExport};
use crate::engine::Bert;
use crate::{Error, Result};

/// The tokenizer files transformers' `AutoTokenizer` reads for a BERT.
const TOKENIZER_FILES: [&str; 4] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
];

/// transformers' config for `spec` with `positions` position embeddings,
/// its classes named `classes` (label 0 first) or `LABEL_0`, ... as
/// transformers names them.
fn config_json(spec: &Bert, positions: usize, classes: Option<&[String]>) -> Value {
    let names: Vec<String> = match classes {
        Some(c) if c.len() == spec.outputs => c.to_vec(),
        _ => (0..spec.outputs).map(|i| format!("LABEL_{i}")).collect(),
    };
    let id2label: Map<String, Value> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (i.to_string(), json!(n)))
        .collect();
    let label2id: Map<String, Value> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), json!(i)))
        .collect();
    json!({
        "architectures": ["BertForSequenceClassification"],
        "model_type": "bert",
        "vocab_size": spec.vocab,
        "hidden_size": spec.width,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "intermediate_size": spec.intermediate,
        "hidden_act": "gelu",
        "max_position_embeddings": positions,
        "type_vocab_size": spec.type_vocab,
        "layer_norm_eps": spec.eps,
        "pad_token_id": spec.pad,
        "position_embedding_type": "absolute",
        "hidden_dropout_prob": spec.dropout,
        "attention_probs_dropout_prob": spec.attention_dropout,
        "classifier_dropout": spec.classifier_dropout,
        "initializer_range": 0.02,
        "id2label": id2label,
        "label2id": label2id,
        "torch_dtype": "float32",
    })
}

/// transformers' name for a parameter of taper's BERT.
fn hf_name(name: &str) -> String {
    match name.starts_with("classifier.") {
        true => name.to_string(),
        false => format!("bert.{name}"),
    }
}

/// Writes the folder `dir`. The tokenizer files, and the position
/// embeddings past the run's `context` (which it did not train, so that
/// transformers takes texts as long as the original did), come from the
/// file of `spec.from`; where it is gone, the note says so.
pub fn export(
    dir: &Path,
    spec: &Bert,
    params: &HashMap<String, Tensor>,
    classes: Option<&[String]>,
) -> Result<HfExport> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut tensors: Vec<(String, Tensor)> = params
        .iter()
        .map(|(k, t)| {
            let t = t.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
            Ok((hf_name(k), t.contiguous()?))
        })
        .collect::<Result<_>>()?;
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let mut notes = Vec::new();
    let positions = "bert.embeddings.position_embeddings.weight";
    if let Some((_, trained)) = tensors.iter_mut().find(|(k, _)| k == positions) {
        match later_positions(spec)? {
            Some(rest) => *trained = Tensor::cat(&[&*trained, &rest], 0)?,
            None => notes.push(format!(
                "max_position_embeddings is the run's context, {}: its starting weights are gone",
                spec.context
            )),
        }
    }
    let rows = tensors
        .iter()
        .find(|(k, _)| k == positions)
        .map_or(Ok(spec.context), |(_, t)| t.dim(0))?;
    let weights = dir.join("model.safetensors");
    write_f32_safetensors(&weights, &tensors)?;
    let config = dir.join("config.json");
    write_json(&config, &config_json(spec, rows, classes))?;
    let mut files = vec![weights, config];
    let (copied, note) = tokenizer_files(dir, spec)?;
    files.extend(copied);
    notes.extend(note);
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    let mut bytes = 0;
    for f in &files {
        bytes += std::fs::metadata(f).map_err(|e| Error::io(f, e))?.len();
    }
    Ok(HfExport { files, bytes, note })
}

/// The position embeddings of the starting weights past the run's
/// `context`, or None where the file is gone (or has none).
fn later_positions(spec: &Bert) -> Result<Option<Tensor>> {
    let Some(from) = spec.from.as_deref().map(Path::new).filter(|p| p.exists()) else {
        return Ok(None);
    };
    let file = unsafe { candle_core::safetensors::MmapedSafetensors::new(from) }
        .map_err(|e| Error::Data(format!("{}: {e}", from.display())))?;
    for name in [
        "embeddings.position_embeddings.weight",
        "bert.embeddings.position_embeddings.weight",
    ] {
        if let Ok(t) = file.load(name, &Device::Cpu) {
            let rows = t.dim(0)?;
            if rows <= spec.context {
                return Ok(None);
            }
            let rest = t.narrow(0, spec.context, rows - spec.context)?;
            return Ok(Some(rest.to_dtype(DType::F32)?));
        }
    }
    Ok(None)
}

/// Copies the tokenizer files beside the run's starting weights into
/// `dir`.
fn tokenizer_files(dir: &Path, spec: &Bert) -> Result<(Vec<PathBuf>, Option<String>)> {
    let Some(from) = spec.from.as_deref().map(Path::new) else {
        return Ok((
            Vec::new(),
            Some("no tokenizer files: the model did not start from a folder".into()),
        ));
    };
    let source = from.parent().unwrap_or(Path::new("."));
    let mut out = Vec::new();
    for name in TOKENIZER_FILES {
        let src = source.join(name);
        if !src.exists() {
            continue;
        }
        let dst = dir.join(name);
        crate::engine::checkpoint::write_atomically(&dst, |tmp| {
            std::fs::copy(&src, tmp)
                .map(|_| ())
                .map_err(|e| Error::io(&src, e))
        })?;
        out.push(dst);
    }
    let note = match out.is_empty() {
        true => Some(format!(
            "no tokenizer files: {} has none (copy the model's tokenizer.json there)",
            source.display()
        )),
        false => None,
    };
    Ok((out, note))
}
