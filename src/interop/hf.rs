//! Hugging Face GPT-2 weights in and out. taper's GPT is GPT-2's
//! architecture (pre-norm blocks, learned positions, a head tied to the
//! token embedding, tanh GELU, LayerNorm with eps 1e-5, heads cut from one
//! qkv projection), so each weight maps to one of transformers'
//! `GPT2LMHeadModel`; the linear layers are transposed, as GPT-2's `Conv1D`
//! stores `[in, out]`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use serde_json::{json, Value};

use super::hf_files::{folder, load_weights};
use crate::data::Vocab;
use crate::engine::checkpoint::write_atomically;
use crate::engine::Gpt;
use crate::{Error, Result};

/// One weight: taper's name, transformers' name, and whether it is a
/// linear layer's (transposed between the two).
struct Name {
    taper: String,
    hf: String,
    transpose: bool,
}

fn names(spec: &Gpt) -> Vec<Name> {
    let plain = |taper: &str, hf: &str| Name {
        taper: taper.into(),
        hf: format!("transformer.{hf}"),
        transpose: false,
    };
    let mut out = vec![
        plain("wte", "wte.weight"),
        plain("wpe", "wpe.weight"),
        plain("ln_f.weight", "ln_f.weight"),
        plain("ln_f.bias", "ln_f.bias"),
    ];
    for i in 0..spec.layers {
        for (taper, hf, linear) in [
            ("ln1", "ln_1", false),
            ("attn.qkv", "attn.c_attn", true),
            ("attn.proj", "attn.c_proj", true),
            ("ln2", "ln_2", false),
            ("mlp.fc", "mlp.c_fc", true),
            ("mlp.proj", "mlp.c_proj", true),
        ] {
            for part in ["weight", "bias"] {
                out.push(Name {
                    taper: format!("h{i}.{taper}.{part}"),
                    hf: format!("transformer.h.{i}.{hf}.{part}"),
                    transpose: linear && part == "weight",
                });
            }
        }
    }
    out
}

/// transformers' `config.json` for the GPT.
pub fn config_json(spec: &Gpt) -> Value {
    json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": spec.vocab,
        "n_positions": spec.context,
        "n_embd": spec.width,
        "n_layer": spec.layers,
        "n_head": spec.heads,
        "n_inner": spec.mlp * spec.width,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": true,
        "scale_attn_weights": true,
        "scale_attn_by_inverse_layer_idx": false,
        "reorder_and_upcast_attn": false,
        "resid_pdrop": spec.dropout, "embd_pdrop": spec.dropout, "attn_pdrop": spec.dropout,
        "bos_token_id": null, "eos_token_id": null,
        "dtype": "float32",
        "taper_model": spec_description(spec),
    })
}

fn spec_description(spec: &Gpt) -> String {
    use crate::engine::ModelSpec;
    spec.describe()
}

/// What [`export`] wrote.
#[derive(Debug, Clone)]
pub struct HfExport {
    pub files: Vec<PathBuf>,
    pub bytes: u64,
    /// Why no tokenizer.json was written, when none was.
    pub note: Option<String>,
}

/// Writes `dir/model.safetensors` (f32, transformers' names), `config.json`
/// and, for a run with a vocabulary, `tokenizer.json`. Each file is written
/// whole and renamed into place.
pub fn export(
    dir: &Path,
    spec: &Gpt,
    params: &HashMap<String, Tensor>,
    vocab: Option<&Vocab>,
) -> Result<HfExport> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut tensors = Vec::new();
    for n in names(spec) {
        let t = params.get(&n.taper).ok_or_else(|| {
            Error::Config(format!("export hf: the model has no weight `{}`", n.taper))
        })?;
        let t = t.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
        let t = if n.transpose { t.t()? } else { t }.contiguous()?;
        tensors.push((n.hf, t));
    }
    let weights = dir.join("model.safetensors");
    write_f32_safetensors(&weights, &tensors)?;
    let mut files = vec![weights];
    let config = dir.join("config.json");
    write_json(&config, &config_json(spec))?;
    files.push(config);
    let mut note = None;
    match vocab.map(tokenizer_json) {
        Some(Ok(t)) => {
            let path = dir.join("tokenizer.json");
            write_json(&path, &t)?;
            files.push(path);
        }
        Some(Err(e)) => note = Some(format!("no tokenizer.json: {e}")),
        None => note = Some("no tokenizer.json: the run's data has no vocabulary".into()),
    }
    let mut bytes = 0;
    for f in &files {
        bytes += std::fs::metadata(f).map_err(|e| Error::io(f, e))?.len();
    }
    Ok(HfExport { files, bytes, note })
}

/// Writes f32 CPU `tensors` by name as a safetensors file for PyTorch
/// (`format: pt` in its metadata), whole, then renamed into place.
pub(super) fn write_f32_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let raw: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(k, t)| {
            let v: Vec<f32> = t.flatten_all()?.to_vec1()?;
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Ok((k.clone(), t.dims().to_vec(), bytes))
        })
        .collect::<Result<_>>()?;
    let views = raw
        .iter()
        .map(|(k, shape, bytes)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|v| (k.clone(), v))
                .map_err(|e| Error::Config(format!("{}: {k}: {e}", path.display())))
        })
        .collect::<Result<Vec<_>>>()?;
    // transformers refuses a safetensors file without `format`.
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    write_atomically(path, |tmp| {
        safetensors::serialize_to_file(views, Some(meta), tmp)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    })
}

fn tokenizer_json(vocab: &Vocab) -> Result<Value> {
    match vocab.chars() {
        Some(chars) => super::bytelevel::char_tokenizer_json(chars),
        None => Ok(vocab.record()["tokenizer"].clone()),
    }
}

pub(super) fn write_json(path: &Path, value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    write_atomically(path, |tmp| {
        std::fs::write(tmp, text + "\n").map_err(|e| Error::io(tmp, e))
    })
}

/// A transformers GPT-2 (`config.json` with `model.safetensors`) as a taper
/// GPT spec whose parameters start from its weights. `path` is the model's
/// folder or its `model.safetensors`; `context`, when given, keeps only the
/// first positions.
pub fn import(path: &Path, context: Option<usize>, dropout: Option<f64>) -> Result<Gpt> {
    let (weights, config_path, c) = folder(path, "GPT-2")?;
    let mut spec = spec_of(&config_path, &c, dropout)?;
    let mut tensors = load_weights(&weights, &c)?;
    // transformers' own files say `transformer.h.0...`; OpenAI's original
    // GPT-2 upload says `h.0...` and keeps the causal-mask buffers.
    let keys: Vec<String> = tensors.keys().cloned().collect();
    for k in keys {
        let t = tensors.remove(&k).expect("listed");
        if k.ends_with(".attn.bias") && t.rank() == 4 || k.ends_with(".attn.masked_bias") {
            continue;
        }
        let name = if k.starts_with("transformer.") || k.starts_with("lm_head.") {
            k
        } else {
            format!("transformer.{k}")
        };
        tensors.insert(name, t);
    }
    tensors.remove("lm_head.weight"); // tied to wte (checked in spec_of)
    let mut initial = Vec::new();
    for n in names(&spec) {
        let t = tensors
            .remove(&n.hf)
            .ok_or_else(|| Error::Config(format!("{}: no tensor `{}`", weights.display(), n.hf)))?;
        let t = t.to_dtype(DType::F32)?;
        let t = if n.transpose { t.t()?.contiguous()? } else { t };
        initial.push((n.taper, t));
    }
    if let Some(extra) = tensors.keys().next() {
        return Err(Error::Config(format!(
            "{}: tensor `{extra}` is not part of a GPT-2 (and {} more)",
            weights.display(),
            tensors.len() - 1
        )));
    }
    check_shapes(&weights, &spec, &initial)?;
    if let Some(ctx) = context {
        if ctx > spec.context {
            return Err(Error::Config(format!(
                "{}: context {ctx} is longer than the model's {} positions",
                config_path.display(),
                spec.context
            )));
        }
        for (name, t) in initial.iter_mut() {
            if name == "wpe" {
                *t = t.narrow(0, 0, ctx)?.contiguous()?;
            }
        }
        spec.context = ctx;
    }
    spec.from = Some(weights.display().to_string());
    spec.initial = Some(Arc::new(initial));
    Ok(spec)
}

/// The GPT a transformers `config.json` describes, or why taper's GPT is
/// not that model.
/// GPT-2's dropout (transformers' 0.1 where the config gives none): taper's
/// GPT has one rate, so the config's three must agree.
fn dropout_of(c: &Value) -> std::result::Result<f64, String> {
    let mut rates = Vec::new();
    for key in ["resid_pdrop", "embd_pdrop", "attn_pdrop"] {
        let r = match &c[key] {
            Value::Null => 0.1,
            v => v
                .as_f64()
                .filter(|r| (0.0..1.0).contains(r))
                .ok_or_else(|| format!("`{key}` {v} is not a rate in [0, 1)"))?,
        };
        rates.push((key, r));
    }
    match rates[..] {
        [(_, a), (_, b), (_, c)] if a == b && b == c => Ok(a),
        _ => Err(format!(
            "dropout rates {}: taper's GPT drops out at one rate: give `dropout` to choose it",
            rates
                .iter()
                .map(|(k, r)| format!("`{k}` {r}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

fn spec_of(path: &Path, c: &Value, dropout: Option<f64>) -> Result<Gpt> {
    let bad = |why: String| Error::Config(format!("{}: {why}", path.display()));
    let int = |key: &str| -> Result<usize> {
        c[key]
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| bad(format!("`{key}` is missing or not a whole number")))
    };
    let model_type = c["model_type"].as_str().unwrap_or("");
    if model_type != "gpt2" {
        return Err(bad(format!(
            "model_type `{model_type}` is not gpt2 (taper's GPT is GPT-2's architecture)"
        )));
    }
    let act = c["activation_function"].as_str().unwrap_or("gelu_new");
    if !matches!(act, "gelu_new" | "gelu_pytorch_tanh") {
        return Err(bad(format!(
            "activation_function `{act}`: taper's GPT uses the tanh GELU (gelu_new)"
        )));
    }
    let eps = c["layer_norm_epsilon"].as_f64().unwrap_or(1e-5);
    if (eps - 1e-5).abs() > 1e-12 {
        return Err(bad(format!(
            "layer_norm_epsilon {eps}: taper's GPT uses 1e-5"
        )));
    }
    for (key, want) in [
        ("tie_word_embeddings", true),
        ("scale_attn_weights", true),
        ("scale_attn_by_inverse_layer_idx", false),
    ] {
        if c[key].as_bool().is_some_and(|v| v != want) {
            return Err(bad(format!("`{key}` must be {want} for taper's GPT")));
        }
    }
    let (width, heads) = (int("n_embd")?, int("n_head")?);
    let mlp = match c["n_inner"].as_u64() {
        None => 4,
        Some(inner) if (inner as usize).is_multiple_of(width) => inner as usize / width,
        Some(inner) => {
            return Err(bad(format!(
                "n_inner {inner} is not a multiple of n_embd {width}"
            )))
        }
    };
    Ok(Gpt {
        vocab: int("vocab_size")?,
        context: int("n_positions")?,
        width,
        layers: int("n_layer")?,
        heads,
        mlp,
        dropout: match dropout {
            Some(r) => r,
            None => dropout_of(c).map_err(bad)?,
        },
        from: None,
        initial: None,
    })
}

fn check_shapes(path: &Path, spec: &Gpt, initial: &[(String, Tensor)]) -> Result<()> {
    let (w, m) = (spec.width, spec.mlp * spec.width);
    for (name, t) in initial {
        let want: Vec<usize> = match name.as_str() {
            "wte" => vec![spec.vocab, w],
            "wpe" => vec![spec.context, w],
            n if n.ends_with("attn.qkv.weight") => vec![3 * w, w],
            n if n.ends_with("attn.qkv.bias") => vec![3 * w],
            n if n.ends_with("mlp.fc.weight") => vec![m, w],
            n if n.ends_with("mlp.fc.bias") => vec![m],
            n if n.ends_with("mlp.proj.weight") => vec![w, m],
            n if n.ends_with("proj.weight") => vec![w, w],
            _ => vec![w],
        };
        if t.dims() != want.as_slice() {
            return Err(Error::Config(format!(
                "{}: `{name}` has shape {:?}, where the config says {want:?}",
                path.display(),
                t.dims()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: Value) -> Value {
        let mut c = json!({
            "model_type": "gpt2", "vocab_size": 10, "n_positions": 8, "n_embd": 8,
            "n_layer": 1, "n_head": 2,
        });
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        c
    }

    /// GPT-2's three dropout rates become the GPT's one (transformers' 0.1
    /// where the config gives none); rates that differ are an error unless
    /// the recipe chooses the rate.
    #[test]
    fn dropout_comes_from_the_config_or_the_recipe() {
        let p = Path::new("config.json");
        assert_eq!(spec_of(p, &config(json!({})), None).unwrap().dropout, 0.1);
        let zero = json!({ "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0 });
        assert_eq!(spec_of(p, &config(zero), None).unwrap().dropout, 0.0);
        let mixed = config(json!({ "attn_pdrop": 0.2 }));
        let e = spec_of(p, &mixed, None).unwrap_err().to_string();
        assert!(
            e.contains("`resid_pdrop` 0.1, `embd_pdrop` 0.1, `attn_pdrop` 0.2")
                && e.contains("give `dropout`"),
            "{e}"
        );
        assert_eq!(spec_of(p, &mixed, Some(0.05)).unwrap().dropout, 0.05);
        let exported = config_json(&spec_of(p, &mixed, Some(0.05)).unwrap());
        assert_eq!(exported["attn_pdrop"], 0.05);
    }
}
