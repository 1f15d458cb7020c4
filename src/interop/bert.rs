//! A Hugging Face BERT (its folder: `config.json`, `model.safetensors`) as
//! the starting weights of `taper.model.bert`: a `BertModel` as
//! sentence-transformers saves one (MiniLM), or a
//! `BertForSequenceClassification` (names under `bert.`, and its head).

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use crate::engine::Bert;
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
    let (weights, config_path, c) = super::hf::folder(path, "BERT")?;
    let mut spec = spec_of(&config_path, &c, outputs)?;
    if let Some(ctx) = context {
        if ctx > spec.context {
            return Err(Error::Config(format!(
                "{}: context {ctx} is longer than the model's {} positions",
                config_path.display(),
                spec.context
            )));
        }
        spec.context = ctx;
    }
    let tensors = candle_core::safetensors::load(&weights, &Device::Cpu)
        .map_err(|e| Error::Config(format!("{}: {e}", weights.display())))?;
    let mut initial = Vec::new();
    let mut unused = Vec::new();
    for (name, t) in tensors {
        let name = name.strip_prefix("bert.").unwrap_or(&name).to_string();
        if name == "embeddings.position_ids" {
            continue;
        }
        if !(name.starts_with("embeddings.")
            || name.starts_with("encoder.layer.")
            || name.starts_with("pooler.")
            || name.starts_with("classifier."))
        {
            unused.push(name);
            continue;
        }
        let t = t.to_dtype(DType::F32)?;
        let t = match name.as_str() {
            "embeddings.position_embeddings.weight" => t.narrow(0, 0, spec.context)?,
            _ => t,
        };
        initial.push((name, t));
    }
    let mut notes = Vec::new();
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
                "the head (`classifier`) starts afresh with {outputs} outputs (the file's has {n})"
            ));
        }
        None => notes.push(format!(
            "the head (`classifier`, {outputs} outputs) starts afresh, as transformers' BertForSequenceClassification starts it"
        )),
    }
    if !initial.iter().any(|(n, _)| n == "pooler.dense.weight") {
        notes.push("the pooler starts afresh: the file has none".into());
    }
    if !unused.is_empty() {
        unused.sort();
        notes.push(format!(
            "{} tensors of the file are not the encoder's and are left out (such as `{}`: a pre-training head)",
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

/// The model a transformers `config.json` describes, or why it is not a
/// BERT taper computes.
fn spec_of(path: &Path, c: &Value, outputs: usize) -> Result<Bert> {
    let bad = |why: String| Error::Config(format!("{}: {why}", path.display()));
    let int = |key: &str| -> Result<usize> {
        c[key]
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| bad(format!("`{key}` is missing or not a whole number")))
    };
    let model_type = c["model_type"].as_str().unwrap_or("");
    if model_type != "bert" {
        return Err(bad(format!(
            "model_type `{model_type}` is not bert (taper.model.bert is BERT's architecture)"
        )));
    }
    let act = c["hidden_act"].as_str().unwrap_or("gelu");
    if act != "gelu" {
        return Err(bad(format!(
            "hidden_act `{act}`: taper's BERT uses the erf GELU (`gelu`)"
        )));
    }
    let position = c["position_embedding_type"].as_str().unwrap_or("absolute");
    if position != "absolute" {
        return Err(bad(format!(
            "position_embedding_type `{position}`: taper's BERT has absolute positions"
        )));
    }
    let pad = c["pad_token_id"].as_u64().unwrap_or(0);
    // transformers' defaults where the config says nothing (BertConfig).
    let rate = |key: &str| -> Result<f64> {
        match &c[key] {
            Value::Null => Ok(0.1),
            v => v
                .as_f64()
                .filter(|r| (0.0..1.0).contains(r))
                .ok_or_else(|| bad(format!("`{key}` {v} is not a rate in [0, 1)"))),
        }
    };
    let hidden = rate("hidden_dropout_prob")?;
    let classifier = match &c["classifier_dropout"] {
        Value::Null => hidden,
        _ => rate("classifier_dropout")?,
    };
    Ok(Bert {
        vocab: int("vocab_size")?,
        context: int("max_position_embeddings")?,
        width: int("hidden_size")?,
        layers: int("num_hidden_layers")?,
        heads: int("num_attention_heads")?,
        intermediate: int("intermediate_size")?,
        type_vocab: c["type_vocab_size"].as_u64().unwrap_or(2) as usize,
        eps: c["layer_norm_eps"].as_f64().unwrap_or(1e-12),
        pad: pad as u32,
        sep: separator(path, c),
        outputs,
        dropout: hidden,
        attention_dropout: rate("attention_probs_dropout_prob")?,
        classifier_dropout: classifier,
        from: None,
        initial: None,
    })
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
        (
            "embeddings.token_type_embeddings.weight".into(),
            vec![spec.type_vocab, w],
        ),
        ("embeddings.LayerNorm.weight".into(), vec![w]),
        ("embeddings.LayerNorm.bias".into(), vec![w]),
    ];
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
                    "{}: no tensor `{name}` (the config says {} layers)",
                    path.display(),
                    spec.layers
                )))
            }
            Some((_, t)) if t.dims() != shape.as_slice() => {
                return Err(Error::Config(format!(
                    "{}: tensor `{name}` is {:?}, the config makes it {shape:?}",
                    path.display(),
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
                    "{}: tensor `{name}` is {:?}, the config makes it {shape:?}",
                    path.display(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: Value) -> Value {
        let mut c = serde_json::json!({
            "model_type": "bert", "vocab_size": 10, "max_position_embeddings": 8,
            "hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 8,
        });
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        c
    }

    /// The config's dropout rates, transformers' 0.1 where it gives none,
    /// and the classifier's the hidden one's unless it has its own.
    #[test]
    fn dropout_rates_come_from_the_config() {
        let p = Path::new("config.json");
        let s = spec_of(p, &config(serde_json::json!({})), 2).unwrap();
        assert_eq!(
            (s.dropout, s.attention_dropout, s.classifier_dropout),
            (0.1, 0.1, 0.1)
        );
        let c = config(serde_json::json!({
            "hidden_dropout_prob": 0.05, "attention_probs_dropout_prob": 0.0,
            "classifier_dropout": null,
        }));
        let s = spec_of(p, &c, 2).unwrap();
        assert_eq!(
            (s.dropout, s.attention_dropout, s.classifier_dropout),
            (0.05, 0.0, 0.05)
        );
        let c = config(serde_json::json!({ "classifier_dropout": 0.3 }));
        assert_eq!(spec_of(p, &c, 2).unwrap().classifier_dropout, 0.3);
        let c = config(serde_json::json!({ "hidden_dropout_prob": 1.5 }));
        let e = spec_of(p, &c, 2).unwrap_err().to_string();
        assert!(
            e.contains("config.json: `hidden_dropout_prob` 1.5 is not a rate"),
            "{e}"
        );
    }
}
