//! A `taper.model.bert` run written for transformers: a
//! `BertForSequenceClassification` folder (`model.safetensors` with the
//! encoder under `bert.`, `config.json` naming the classes), or the
//! DistilBERT or RoBERTa classifier it started from, with the tokenizer
//! files of the folder the run started from, so that
//! `pipeline("text-classification", model=DIR)` answers with the classes'
//! names.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::bert_config::{config_json, position_offset};
use super::bert_names::to_hf;
use super::hf::{write_f32_safetensors, write_json, HfExport};
use crate::engine::Bert;
use crate::{Error, Result};

/// The tokenizer files transformers' `AutoTokenizer` reads: a BERT's
/// WordPiece (`vocab.txt`), a RoBERTa's BPE (`vocab.json`, `merges.txt`), an
/// XLM-RoBERTa's SentencePiece model.
const TOKENIZER_FILES: [&str; 7] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "sentencepiece.bpe.model",
];

/// The classifier's output names (label 0 first), and whether each output
/// is a label's yes or no (`problem_type` multi-label, which transformers'
/// pipeline scores with a sigmoid) rather than a class.
pub struct Labels<'a> {
    pub names: Option<&'a [String]>,
    pub multi_label: bool,
}

/// Writes the folder `dir`. The tokenizer files, and the position
/// embeddings the run did not train (past its `context`, so that
/// transformers takes texts as long as the original did; RoBERTa's first
/// `pad + 1`), come from the file of `spec.from`; where it is gone, the
/// note says so.
pub fn export(
    dir: &Path,
    spec: &Bert,
    params: &HashMap<String, Tensor>,
    labels: Labels<'_>,
) -> Result<HfExport> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut tensors: Vec<(String, Tensor)> = params
        .iter()
        .map(|(k, t)| {
            let t = t.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
            Ok((to_hf(spec.family, k), t.contiguous()?))
        })
        .collect::<Result<_>>()?;
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let mut notes = Vec::new();
    let positions = to_hf(spec.family, "embeddings.position_embeddings.weight");
    let mut rows = spec.context;
    if let Some((_, trained)) = tensors.iter_mut().find(|(k, _)| *k == positions) {
        let (table, note) = whole_positions(spec, trained)?;
        rows = table.dim(0)?;
        *trained = table;
        notes.extend(note);
    }
    let weights = dir.join("model.safetensors");
    write_f32_safetensors(&weights, &tensors)?;
    let config = dir.join("config.json");
    let mut c = config_json(spec, rows, labels.names);
    if labels.multi_label {
        c["problem_type"] = "multi_label_classification".into();
    }
    write_json(&config, &c)?;
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

/// The position table transformers reads: the `trained` rows, the
/// starting weights' before them (RoBERTa's `pad + 1`) and past them; and
/// a note where the file of the starting weights is gone (the rows before
/// are then zeros: the padding's, and one never read).
fn whole_positions(spec: &Bert, trained: &Tensor) -> Result<(Tensor, Option<String>)> {
    let offset = position_offset(spec);
    let end = offset + spec.context;
    let Some(file) = starting_positions(spec)?.filter(|t| t.dim(0).is_ok_and(|n| n >= end)) else {
        let note = format!(
            "max_position_embeddings is the run's context, {}: its starting weights are gone",
            spec.context
        );
        let table = match offset {
            0 => trained.clone(),
            _ => {
                let before = Tensor::zeros((offset, spec.width), DType::F32, &Device::Cpu)?;
                Tensor::cat(&[&before, trained], 0)?
            }
        };
        return Ok((table, Some(note)));
    };
    let rows = file.dim(0)?;
    let parts = [
        file.narrow(0, 0, offset)?,
        trained.clone(),
        file.narrow(0, end, rows - end)?,
    ];
    let parts: Vec<&Tensor> = parts
        .iter()
        .filter(|t| t.dim(0).is_ok_and(|n| n > 0))
        .collect();
    Ok((Tensor::cat(&parts, 0)?, None))
}

/// The position table of the starting weights, or None where the file is
/// gone (or has none).
fn starting_positions(spec: &Bert) -> Result<Option<Tensor>> {
    let Some(from) = spec.from.as_deref().map(Path::new).filter(|p| p.exists()) else {
        return Ok(None);
    };
    // The file, or the shards its index lists.
    let files = super::hf_files::weight_files(from)?;
    let file = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files) }
        .map_err(|e| Error::Data(format!("{}: {e}", from.display())))?;
    let name = "embeddings.position_embeddings.weight";
    for name in [name.to_string(), to_hf(spec.family, name)] {
        if let Ok(t) = file.load(&name, &Device::Cpu) {
            return Ok(Some(t.to_dtype(DType::F32)?));
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
