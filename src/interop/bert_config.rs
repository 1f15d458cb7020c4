//! transformers' `config.json` of a BERT-like classifier and taper's
//! [`Bert`] spec, both ways: [`spec_of`] reads a BERT, DistilBERT or
//! RoBERTa config (transformers' defaults where it says nothing), and
//! [`config_json`] writes the config transformers loads a trained one from.

use std::path::Path;

use serde_json::{json, Map, Value};

use crate::engine::{Bert, Family};
use crate::{Error, Result};

/// The `model_type`s taper's BERT computes, and their family
/// (XLM-RoBERTa is RoBERTa's architecture with another vocabulary).
const FAMILIES: [(&str, Family); 4] = [
    ("bert", Family::Bert),
    ("distilbert", Family::Distilbert),
    ("roberta", Family::Roberta),
    ("xlm-roberta", Family::Roberta),
];

/// The first position embedding a text's first token reads: RoBERTa's
/// positions start after its padding id (`pad + 1`), the others' at 0.
pub(super) fn position_offset(spec: &Bert) -> usize {
    match spec.family {
        Family::Roberta => spec.pad as usize + 1,
        _ => 0,
    }
}

/// The model a transformers `config.json` (at `path`) describes, with a
/// head of `outputs`, or why it is not one taper computes. Its `context`
/// is every position the embedding table offers.
pub(super) fn spec_of(path: &Path, c: &Value, outputs: usize) -> Result<Bert> {
    let bad = |why: String| Error::Config(format!("{}: {why}", path.display()));
    let model_type = c["model_type"].as_str().unwrap_or("");
    let Some(family) = FAMILIES
        .iter()
        .find(|(name, _)| *name == model_type)
        .map(|(_, f)| *f)
    else {
        let known: Vec<&str> = FAMILIES.iter().map(|(n, _)| *n).collect();
        return Err(bad(format!(
            "model_type `{model_type}` is not bert, nor one of the classifiers taper.model.bert computes like it ({})",
            known[1..].join(", ")
        )));
    };
    let int = |key: &str| -> Result<usize> {
        c[key]
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| bad(format!("`{key}` is missing or not a whole number")))
    };
    // transformers' defaults where the config says nothing.
    let rate = |key: &str, default: f64| -> Result<f64> {
        match &c[key] {
            Value::Null => Ok(default),
            v => v
                .as_f64()
                .filter(|r| (0.0..1.0).contains(r))
                .ok_or_else(|| bad(format!("`{key}` {v} is not a rate in [0, 1)"))),
        }
    };
    let (act_key, names) = match family {
        Family::Distilbert => ("activation", ["dim", "n_layers", "n_heads", "hidden_dim"]),
        _ => (
            "hidden_act",
            [
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "intermediate_size",
            ],
        ),
    };
    let act = c[act_key].as_str().unwrap_or("gelu");
    if act != "gelu" {
        return Err(bad(format!(
            "{act_key} `{act}`: taper's {} uses the erf GELU (`gelu`)",
            family.name()
        )));
    }
    let position = c["position_embedding_type"].as_str().unwrap_or("absolute");
    if position != "absolute" {
        return Err(bad(format!(
            "position_embedding_type `{position}`: taper's {} has absolute positions",
            family.name()
        )));
    }
    let [width, layers, heads, intermediate] = names.map(int);
    let positions = int("max_position_embeddings")?;
    let mut spec = Bert {
        family,
        vocab: int("vocab_size")?,
        context: positions,
        width: width?,
        layers: layers?,
        heads: heads?,
        intermediate: intermediate?,
        type_vocab: c["type_vocab_size"].as_u64().unwrap_or(2) as usize,
        eps: c["layer_norm_eps"].as_f64().unwrap_or(1e-12),
        pad: c["pad_token_id"].as_u64().unwrap_or(0) as u32,
        sep: None,
        outputs,
        dropout: 0.0,
        attention_dropout: 0.0,
        classifier_dropout: 0.0,
        from: None,
        initial: None,
    };
    match family {
        Family::Bert | Family::Roberta => {
            let hidden = rate("hidden_dropout_prob", 0.1)?;
            spec.dropout = hidden;
            spec.attention_dropout = rate("attention_probs_dropout_prob", 0.1)?;
            spec.classifier_dropout = rate("classifier_dropout", hidden)?;
        }
        Family::Distilbert => {
            // DistilBertConfig: no token types, LayerNorm's eps fixed.
            (spec.type_vocab, spec.eps) = (0, 1e-12);
            spec.dropout = rate("dropout", 0.1)?;
            spec.attention_dropout = rate("attention_dropout", 0.1)?;
            spec.classifier_dropout = rate("seq_classif_dropout", 0.2)?;
        }
    }
    if family == Family::Roberta {
        spec.pad = c["pad_token_id"].as_u64().unwrap_or(1) as u32;
        let offset = position_offset(&spec);
        spec.context = positions.checked_sub(offset).filter(|&n| n > 0).ok_or_else(|| {
            bad(format!(
                "max_position_embeddings {positions} leaves no position after the padding id's {offset}"
            ))
        })?;
    }
    Ok(spec)
}

/// transformers' config for `spec` with `positions` position embeddings
/// (RoBERTa's first `pad + 1` among them), its classes named `classes`
/// (label 0 first) or `LABEL_0`, ... as transformers names them.
pub(super) fn config_json(spec: &Bert, positions: usize, classes: Option<&[String]>) -> Value {
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
    let mut c = match spec.family {
        Family::Distilbert => json!({
            "architectures": ["DistilBertForSequenceClassification"],
            "dim": spec.width,
            "n_layers": spec.layers,
            "n_heads": spec.heads,
            "hidden_dim": spec.intermediate,
            "activation": "gelu",
            "sinusoidal_pos_embds": false,
            "dropout": spec.dropout,
            "attention_dropout": spec.attention_dropout,
            "seq_classif_dropout": spec.classifier_dropout,
        }),
        family => json!({
            "architectures": [match family {
                Family::Roberta => "RobertaForSequenceClassification",
                _ => "BertForSequenceClassification",
            }],
            "hidden_size": spec.width,
            "num_hidden_layers": spec.layers,
            "num_attention_heads": spec.heads,
            "intermediate_size": spec.intermediate,
            "hidden_act": "gelu",
            "type_vocab_size": spec.type_vocab,
            "layer_norm_eps": spec.eps,
            "position_embedding_type": "absolute",
            "hidden_dropout_prob": spec.dropout,
            "attention_probs_dropout_prob": spec.attention_dropout,
            "classifier_dropout": spec.classifier_dropout,
        }),
    };
    let common = json!({
        "model_type": spec.family.name(),
        "vocab_size": spec.vocab,
        "max_position_embeddings": positions,
        "pad_token_id": spec.pad,
        "initializer_range": 0.02,
        "id2label": id2label,
        "label2id": label2id,
        "torch_dtype": "float32",
    });
    let map = c.as_object_mut().expect("an object");
    map.extend(common.as_object().expect("an object").clone());
    if let Some(sep) = spec.sep {
        map.insert("sep_token_id".into(), json!(sep));
    }
    c
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
