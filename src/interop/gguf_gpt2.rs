//! taper's GPT as llama.cpp's `gpt2` architecture: its tensor names
//! (`blk.0.attn_qkv.weight`), its hyperparameter keys, and the tokenizer
//! (GPT-2 byte-level BPE: a character vocabulary as tokens with no merges,
//! or a BPE `tokenizer.json`'s vocabulary and merges), so that llama.cpp
//! loads and runs the file.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value as G;
use candle_core::Tensor;
use serde_json::Value;

use crate::data::Vocab;
use crate::engine::{Gpt, ModelSpec};
use crate::quant::{export_gguf, ExportFormat, ExportSummary};
use crate::{Error, Result};

/// llama.cpp's name for each of taper's GPT weights. The token embedding
/// is written twice, as `output.weight` too: llama.cpp's gpt2 graph reads
/// the head from there.
fn names(spec: &Gpt) -> Vec<(String, String)> {
    let mut out = vec![
        ("wte".into(), "token_embd.weight".into()),
        ("wte".into(), "output.weight".into()),
        ("wpe".into(), "position_embd.weight".into()),
        ("ln_f.weight".into(), "output_norm.weight".into()),
        ("ln_f.bias".into(), "output_norm.bias".into()),
    ];
    for i in 0..spec.layers {
        for (taper, gguf) in [
            ("ln1", "attn_norm"),
            ("attn.qkv", "attn_qkv"),
            ("attn.proj", "attn_output"),
            ("ln2", "ffn_norm"),
            ("mlp.fc", "ffn_up"),
            ("mlp.proj", "ffn_down"),
        ] {
            for part in ["weight", "bias"] {
                out.push((
                    format!("h{i}.{taper}.{part}"),
                    format!("blk.{i}.{gguf}.{part}"),
                ));
            }
        }
    }
    out
}

/// Writes the GPT to `path` with weight matrices in `format`.
pub fn export(
    path: &Path,
    spec: &Gpt,
    params: &HashMap<String, Tensor>,
    vocab: Option<&Vocab>,
    format: ExportFormat,
    step: u64,
) -> Result<ExportSummary> {
    let vocab = vocab.ok_or_else(|| {
        Error::Config(
            "export gguf: llama.cpp needs a tokenizer, and the run's data has no vocabulary".into(),
        )
    })?;
    let (tokens, merges, types) = tokenizer(vocab)?;
    let pre = pre_tokenizer(vocab);
    if tokens.len() != spec.vocab {
        return Err(Error::Config(format!(
            "export gguf: the vocabulary has {} tokens, the model {}",
            tokens.len(),
            spec.vocab
        )));
    }
    let tensors = names(spec)
        .into_iter()
        .map(|(taper, gguf)| {
            let t = params.get(&taper).ok_or_else(|| {
                Error::Config(format!("export gguf: the model has no weight `{taper}`"))
            })?;
            Ok((gguf, t.clone()))
        })
        .collect::<Result<Vec<_>>>()?;
    let u32v = |v: usize| G::U32(v as u32);
    let strings = |v: Vec<String>| G::Array(v.into_iter().map(G::String).collect());
    let meta = vec![
        ("general.architecture".to_string(), G::String("gpt2".into())),
        ("general.name".to_string(), G::String(spec.describe())),
        ("taper.model".to_string(), G::String(spec.describe())),
        ("taper.step".to_string(), G::U64(step)),
        ("taper.format".to_string(), G::String(format.name().into())),
        ("gpt2.context_length".to_string(), u32v(spec.context)),
        ("gpt2.embedding_length".to_string(), u32v(spec.width)),
        (
            "gpt2.feed_forward_length".to_string(),
            u32v(spec.mlp * spec.width),
        ),
        ("gpt2.block_count".to_string(), u32v(spec.layers)),
        ("gpt2.attention.head_count".to_string(), u32v(spec.heads)),
        (
            "gpt2.attention.layer_norm_epsilon".to_string(),
            G::F32(1e-5),
        ),
        ("tokenizer.ggml.model".to_string(), G::String("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), G::String(pre.into())),
        ("tokenizer.ggml.tokens".to_string(), strings(tokens)),
        (
            "tokenizer.ggml.token_type".to_string(),
            G::Array(types.into_iter().map(G::I32).collect()),
        ),
        ("tokenizer.ggml.merges".to_string(), strings(merges)),
        ("tokenizer.ggml.add_bos_token".to_string(), G::Bool(false)),
        ("tokenizer.ggml.add_eos_token".to_string(), G::Bool(false)),
    ];
    export_gguf(path, &tensors, &meta, format)
}

/// A character vocabulary has no merges, but llama.cpp wants the merges
/// as an array of strings, and candle writes an empty array as integers.
/// This one never applies: tokenizing starts from single characters, and
/// no other merge makes a symbol of several.
const NO_MERGE: &str = "<taper> <no-merges>";

/// llama.cpp's name for the tokenizer's pre-tokenizer (how text is split
/// before the merges): GPT-2's byte-level split alone is `gpt-2`, with
/// digits split one by one first `smollm` (SmolLM's and others'). Others
/// get llama.cpp's `default`, which is GPT-2's split.
fn pre_tokenizer(vocab: &Vocab) -> &'static str {
    if vocab.chars().is_some() {
        return "gpt-2";
    }
    let json = &vocab.record()["tokenizer"]["pre_tokenizer"];
    let byte_level = |p: &Value| p["type"] == "ByteLevel" && p["use_regex"] != false;
    if byte_level(json) {
        return "gpt-2";
    }
    match json["pretokenizers"].as_array().map(Vec::as_slice) {
        Some([digits, bl])
            if digits["type"] == "Digits"
                && digits["individual_digits"] == true
                && byte_level(bl) =>
        {
            "smollm"
        }
        _ => "default",
    }
}

/// llama.cpp's token types: 1 a normal token, 3 a control (special) one.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;

/// (tokens in id order, merges, token types) for llama.cpp's `gpt2`
/// tokenizer.
fn tokenizer(vocab: &Vocab) -> Result<(Vec<String>, Vec<String>, Vec<i32>)> {
    if let Some(chars) = vocab.chars() {
        let tokens = super::bytelevel::char_tokens(chars)?;
        let n = tokens.len();
        return Ok((tokens, vec![NO_MERGE.to_string()], vec![NORMAL; n]));
    }
    let json = &vocab.record()["tokenizer"];
    let model = &json["model"];
    if model["type"].as_str() != Some("BPE") {
        return Err(Error::Config(format!(
            "export gguf: the tokenizer's model is {}, and llama.cpp's gpt2 tokenizer is BPE",
            model["type"]
        )));
    }
    let map = model["vocab"]
        .as_object()
        .ok_or_else(|| Error::Config("export gguf: the tokenizer has no vocab".into()))?;
    let mut by_id: Vec<(u64, String)> = map
        .iter()
        .filter_map(|(t, id)| id.as_u64().map(|i| (i, t.clone())))
        .collect();
    let mut special = std::collections::HashSet::new();
    for t in json["added_tokens"].as_array().into_iter().flatten() {
        if let (Some(id), Some(content)) = (t["id"].as_u64(), t["content"].as_str()) {
            if !map.contains_key(content) {
                by_id.push((id, content.to_string()));
            }
            if t["special"].as_bool() == Some(true) {
                special.insert(id);
            }
        }
    }
    by_id.sort_unstable();
    if by_id.iter().enumerate().any(|(i, (id, _))| *id != i as u64) {
        return Err(Error::Config(
            "export gguf: the tokenizer's ids are not 0..n without gaps".into(),
        ));
    }
    let types = by_id
        .iter()
        .map(|(id, _)| {
            if special.contains(id) {
                CONTROL
            } else {
                NORMAL
            }
        })
        .collect();
    let tokens = by_id.into_iter().map(|(_, t)| t).collect();
    let merges = model["merges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| match m {
            Value::String(s) => Ok(s.clone()),
            Value::Array(pair) if pair.len() == 2 => Ok(format!(
                "{} {}",
                pair[0].as_str().unwrap_or_default(),
                pair[1].as_str().unwrap_or_default()
            )),
            other => Err(Error::Config(format!(
                "export gguf: merge {other} is not a pair"
            ))),
        })
        .collect::<Result<_>>()?;
    Ok((tokens, merges, types))
}
