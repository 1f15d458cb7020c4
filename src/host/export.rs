//! `run:export{}`: the run's model in the formats other tools read.
//!
//! - `format = "gguf"` (the default), `type = "q8_0"`: a GPT as llama.cpp's
//!   `gpt2` architecture with its tokenizer; other models as architecture
//!   `taper` (weights only, for taper and GGUF readers).
//! - `format = "hf"`: a GPT as a transformers GPT-2 folder.
//! - `format = "gguf-lora"`: a QLoRA run's adapters as a llama.cpp adapter;
//!   `merge = true` with `format = "gguf"` writes the base with the adapters
//!   merged in.
//! - `format = "peft"`: a QLoRA run's adapters as a PEFT adapter folder.
//! - `format = "onnx"`: an MLP or CNN classifier as an ONNX model.
//!
//! `format = "f32" | "f16" | "q8_0" | "q4_0"` is the older spelling of
//! `format = "gguf", type = ...`.

use std::path::PathBuf;

use mlua::{Lua, Table, Value};
use serde::Deserialize;
use serde_json::Map;

use super::options::{config_error, decode};
use super::run_state::RunHandle;
use super::state;
use crate::error::lua_err;
use crate::interop::Model;
use crate::quant::ExportFormat;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportOpts {
    path: String,
    /// gguf, hf, gguf-lora, peft or onnx (or a GGUF type, the older spelling).
    #[serde(default = "gguf")]
    format: String,
    /// GGUF weight type: f32, f16, q8_0 or q4_0.
    #[serde(rename = "type")]
    ty: Option<String>,
    /// With `format = "gguf"` on a QLoRA run: the base with the adapters
    /// merged in.
    #[serde(default)]
    merge: bool,
    /// "best": the model an evaluation with `keep_best` kept; "last" (the
    /// default): the run's own.
    model: Option<String>,
}

fn gguf() -> String {
    "gguf".into()
}

pub(super) fn export(lua: &Lua, run: &RunHandle, opts: Value) -> mlua::Result<Table> {
    let o: ExportOpts = decode(lua, "run:export", opts)?;
    let (format, ty) = match (o.format.as_str(), &o.ty) {
        (f, None) if ExportFormat::parse(f).is_some() => ("gguf", f.to_string()),
        (f, Some(_)) if ExportFormat::parse(f).is_some() => {
            return Err(config_error(
                lua,
                format!(
                    "run:export: format `{f}` is a type: say format = \"gguf\", type = \"{f}\""
                ),
            ))
        }
        (f @ ("gguf" | "hf" | "gguf-lora" | "peft" | "onnx"), t) => {
            (f, t.clone().unwrap_or_else(|| "q8_0".into()))
        }
        (f, _) => {
            return Err(config_error(
                lua,
                format!("run:export: unknown format `{f}` (gguf, hf, gguf-lora, peft, onnx)"),
            ))
        }
    };
    let Some(gguf_type) = ExportFormat::parse(&ty) else {
        return Err(config_error(
            lua,
            format!("run:export: unknown type `{ty}` ({})", ExportFormat::NAMES),
        ));
    };
    if o.ty.is_some() && matches!(format, "hf" | "peft" | "onnx") {
        return Err(config_error(
            lua,
            format!("run:export: format `{format}` writes f32 weights; `type` is for gguf"),
        ));
    }
    if o.merge && format != "gguf" {
        return Err(config_error(
            lua,
            "run:export: `merge = true` goes with format = \"gguf\"",
        ));
    }
    let r = run.get()?;
    let best = match super::best::wants_best(lua, "run:export", o.model.as_deref())? {
        true => super::best::best_weights(lua, "run:export", &r)?,
        false => None,
    };
    let of_best = best.is_some();
    let (params, step) = match best {
        Some((weights, b)) => (weights, b.step),
        None => (r.core.trainer.params().tensors(), r.core.trainer.step),
    };
    let path = PathBuf::from(&o.path);
    let model = Model {
        spec: r.core.trainer.spec().as_ref(),
        params,
        vocab: r.core.vocab.as_deref(),
        classes: r.core.classes.as_deref(),
        image_input: r.core.image_input.as_ref(),
        table_input: r.core.table_input.as_ref(),
        sample_input: r.core.sample_input.as_ref(),
        array_input: r.core.array_input.as_ref(),
        multi_label: r.core.trainer.loss().multi_label(),
        step,
    };
    let w = crate::interop::export(&model, &path, format, gguf_type, o.merge)
        .map_err(|e| config_error(lua, format!("run:export: {e}")))?;

    let host = state(lua);
    let mut f = Map::new();
    f.insert("run".into(), r.id.into());
    f.insert("path".into(), o.path.clone().into());
    f.insert("format".into(), format.into());
    if !matches!(format, "hf" | "onnx") {
        f.insert("type".into(), ty.clone().into());
    }
    if of_best {
        f.insert("model".into(), "best".into());
        f.insert("model_step".into(), step.into());
    }
    f.insert("bytes".into(), w.bytes.into());
    if let Some(b) = w.f32_bytes {
        f.insert("f32_bytes".into(), b.into());
    }
    host.out
        .record("export", r.core.trainer.step, r.core.cursor.epoch, f)
        .map_err(lua_err)?;
    host.out.line(&format!(
        "exported {} ({format}{}): {}",
        o.path, w.detail, w.bytes
    ));
    let t = lua.create_table()?;
    t.set("bytes", w.bytes)?;
    t.set("f32_bytes", w.f32_bytes)?;
    t.set("quantized", w.quantized)?;
    t.set("kept_f32", w.kept_f32)?;
    Ok(t)
}
