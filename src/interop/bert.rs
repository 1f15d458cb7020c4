//! A Hugging Face BERT (its folder: `config.json`, `model.safetensors`) as
//! the starting weights of `taper.model.bert`: a `BertModel` as
//! sentence-transformers saves one (MiniLM), or a
//! `BertForSequenceClassification` (names under `bert.`, and its head); or
//! a DistilBERT or RoBERTa (XLM-RoBERTa) model or classifier, its tensors
//! renamed to BERT's ([`super::bert_names`]).

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Tensor};
use serde_json::Value;

use super::bert_config::{position_offset, spec_of};
use super::bert_names::{head_names, to_hf, to_taper};
use crate::engine::{Bert, Family};
use crate::{Error, Result};

/// What [`import`] made: the model, and what it said about the weights.
pub struct Imported {
    pub spec: Bert,
    /// Weights that start afresh (the head, a missing pooler), and those
    /// of the file left unused (a pre-training head), for a note.
    pub notes: Vec<String>,
}

/// The BERT of the folder `path` (or of its `model.safetensors`, with
/// `config.json` beside it), with a head of `outputs`, reading at most
/// `context` positions.
pub fn import(path: &Path, outputs: usize, context: Option<usize>) -> Result<Imported> {
    let (weights, config_path, c) = super::hf_files::folder(path, "BERT")?;
    let mut spec = spec_of(&config_path, &c, outputs)?;
    if spec.family == Family::Bert {
        spec.sep = separator(&config_path, &c);
    }
    if let Some(ctx) = context {
        if ctx > spec.context {
            let offset = position_offset(&spec);
            let why = match offset {
                0 => String::new(),
                n => format!(
                    " (max_position_embeddings {}, less the {n} before a text's first: RoBERTa's positions start after its padding id)",
                    spec.context + n
                ),
            };
            return Err(Error::Config(format!(
                "{}: context {ctx} is longer than the model's {} positions{why}",
                config_path.display(),
                spec.context
            )));
        }
        spec.context = ctx;
    }
    let tensors = super::hf_files::load_weights(&weights, &c)?;
    let mut initial = Vec::new();
    let mut unused = Vec::new();
    let offset = position_offset(&spec);
    for (file_name, t) in tensors {
        let Some(name) = to_taper(spec.family, &file_name) else {
            unused.push(file_name);
            continue;
        };
        if name == "embeddings.position_ids" {
            continue;
        }
        let t = t.to_dtype(DType::F32)?;
        let t = match name.as_str() {
            // RoBERTa's first rows are the padding's and one never read.
            "embeddings.position_embeddings.weight" => {
                check_rows(&weights, &file_name, &t, offset + spec.context)?;
                t.narrow(0, offset, spec.context)?
            }
            _ => t,
        };
        initial.push((name, t));
    }
    let mut notes = Vec::new();
    let (dense, out) = head_names(spec.family);
    let head = initial
        .iter()
        .find(|(n, _)| n == "classifier.weight")
        .map(|(_, t)| t.dim(0))
        .transpose()?;
    match head {
        Some(n) if n == outputs => {}
        Some(n) => {
            initial.retain(|(n, _)| !n.starts_with("classifier."));
            notes.push(format!(
                "the head ({out}) starts afresh with {outputs} outputs (the file's has {n})"
            ));
        }
        None => notes.push(format!(
            "the head ({out}, {outputs} outputs) starts afresh, as transformers' {} starts it",
            classifier_class(spec.family)
        )),
    }
    if !initial.iter().any(|(n, _)| n == "pooler.dense.weight") {
        notes.push(format!("{dense} starts afresh: the file has none"));
    }
    if !unused.is_empty() {
        unused.sort();
        notes.push(format!(
            "{} tensors of the file are not the classifier's and are left out (such as `{}`: a pre-training head)",
            unused.len(),
            unused[0]
        ));
    }
    check_names(&weights, &spec, &mut initial)?;
    spec.from = Some(weights.display().to_string());
    spec.initial = Some(Arc::new(initial));
    Ok(Imported { spec, notes })
}

/// The separator token's id, which marks a text pair's second text: the
/// config's `sep_token_id`, else the `[SEP]` of the tokenizer beside it
/// (`tokenizer.json`, or `vocab.txt`, a line per id); None without either.
fn separator(config: &Path, c: &Value) -> Option<u32> {
    if let Some(id) = c["sep_token_id"].as_u64() {
        return Some(id as u32);
    }
    let dir = config.parent()?;
    if let Ok(t) = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")) {
        return t.token_to_id("[SEP]");
    }
    let vocab = std::fs::read_to_string(dir.join("vocab.txt")).ok()?;
    vocab
        .lines()
        .position(|l| l.trim_end() == "[SEP]")
        .map(|p| p as u32)
}

/// transformers' class of a `family` classifier.
fn classifier_class(family: Family) -> &'static str {
    match family {
        Family::Bert => "BertForSequenceClassification",
        Family::Distilbert => "DistilBertForSequenceClassification",
        Family::Roberta => "RobertaForSequenceClassification",
    }
}

/// The position table `name` of the file `path` has at least `rows` rows.
fn check_rows(path: &Path, name: &str, t: &Tensor, rows: usize) -> Result<()> {
    match t.dim(0)? >= rows {
        true => Ok(()),
        false => Err(Error::Config(format!(
            "{}: tensor `{name}` has {} positions, the config makes it {rows}",
            path.display(),
            t.dim(0)?
        ))),
    }
}

/// Every encoder weight the spec needs is in the file, in its shape; the
/// file's others (but the pooler and the head) are not the model's.
fn check_names(path: &Path, spec: &Bert, initial: &mut Vec<(String, Tensor)>) -> Result<()> {
    let (w, m) = (spec.width, spec.intermediate);
    let mut want: Vec<(String, Vec<usize>)> = vec![
        (
            "embeddings.word_embeddings.weight".into(),
            vec![spec.vocab, w],
        ),
        (
            "embeddings.position_embeddings.weight".into(),
            vec![spec.context, w],
        ),
        ("embeddings.LayerNorm.weight".into(), vec![w]),
        ("embeddings.LayerNorm.bias".into(), vec![w]),
    ];
    if spec.type_vocab > 0 {
        want.push((
            "embeddings.token_type_embeddings.weight".into(),
            vec![spec.type_vocab, w],
        ));
    }
    for i in 0..spec.layers {
        let p = format!("encoder.layer.{i}");
        for (name, shape) in [
            ("attention.self.query", [w, w]),
            ("attention.self.key", [w, w]),
            ("attention.self.value", [w, w]),
            ("attention.output.dense", [w, w]),
            ("intermediate.dense", [m, w]),
            ("output.dense", [w, m]),
        ] {
            want.push((format!("{p}.{name}.weight"), shape.to_vec()));
            want.push((format!("{p}.{name}.bias"), vec![shape[0]]));
        }
        for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
            want.push((format!("{p}.{norm}.weight"), vec![w]));
            want.push((format!("{p}.{norm}.bias"), vec![w]));
        }
    }
    for (name, shape) in &want {
        match initial.iter().find(|(n, _)| n == name) {
            None => {
                return Err(Error::Config(format!(
                    "{}: no tensor `{}` (the config says {} layers)",
                    path.display(),
                    to_hf(spec.family, name),
                    spec.layers
                )))
            }
            Some((_, t)) if t.dims() != shape.as_slice() => {
                return Err(Error::Config(format!(
                    "{}: tensor `{}` is {:?}, the config makes it {shape:?}",
                    path.display(),
                    to_hf(spec.family, name),
                    t.dims()
                )))
            }
            Some(_) => {}
        }
    }
    let (w, k) = (spec.width, spec.outputs);
    let extra: [(&str, Vec<usize>); 4] = [
        ("pooler.dense.weight", vec![w, w]),
        ("pooler.dense.bias", vec![w]),
        ("classifier.weight", vec![k, w]),
        ("classifier.bias", vec![k]),
    ];
    for (name, shape) in extra {
        if let Some((_, t)) = initial.iter().find(|(n, _)| n == name) {
            if t.dims() != shape.as_slice() {
                return Err(Error::Config(format!(
                    "{}: tensor `{}` is {:?}, the config makes it {shape:?}",
                    path.display(),
                    to_hf(spec.family, name),
                    t.dims()
                )));
            }
        }
        want.push((name.to_string(), shape));
    }
    initial.retain(|(n, _)| want.iter().any(|(w, _)| w == n));
    initial.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(())
}
