//! Model passes a recipe applies to a run: `run:prune{}`, `run:export{}`.

use mlua::{Function, Lua, Table, Value};
use serde::Deserialize;
use serde_json::{json, Map};

use super::options::{config_error, decode};
use super::run_state::RunHandle;
use super::state;
use crate::error::lua_err;
use crate::quant::{export_gguf, ExportFormat};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PruneOpts {
    sparsity: f64,
    /// A Lua pattern over parameter names; default: every tensor of rank 2
    /// or more (weights and embeddings, not biases or norms).
    params: Option<String>,
    /// "layer" (each tensor to the sparsity) or "global" (all together).
    #[serde(default = "layer")]
    scope: String,
}

fn layer() -> String {
    "layer".into()
}

/// `run:prune{ sparsity, params?, scope? }`: magnitude pruning with masks
/// kept through training. Returns `{ pruned, total, sparsity }`.
pub(super) fn prune(lua: &Lua, run: &RunHandle, opts: Value) -> mlua::Result<Table> {
    let o: PruneOpts = decode(lua, "run:prune", opts)?;
    if !(0.0..=1.0).contains(&o.sparsity) {
        return Err(config_error(
            lua,
            format!("run:prune: sparsity {} must be between 0 and 1", o.sparsity),
        ));
    }
    let global = match o.scope.as_str() {
        "layer" => false,
        "global" => true,
        other => {
            return Err(config_error(
                lua,
                format!("run:prune: unknown scope `{other}` (layer, global)"),
            ))
        }
    };
    let mut r = run.get_mut()?;
    let vars = r.core.trainer.params().vars();
    let find: Function = lua.globals().get::<Table>("string")?.get("find")?;
    let mut names = Vec::new();
    for (name, var) in &vars {
        let selected = match &o.params {
            Some(p) => !find.call::<Value>((name.as_str(), p.as_str()))?.is_nil(),
            None => var.rank() >= 2,
        };
        if selected {
            names.push(name.clone());
        }
    }
    if names.is_empty() {
        let all: Vec<&str> = vars.iter().map(|(k, _)| k.as_str()).collect();
        return Err(config_error(
            lua,
            format!(
                "run:prune: no parameter matches `{}`; the model has: {}",
                o.params.unwrap_or_default(),
                all.join(", ")
            ),
        ));
    }
    let (pruned, total) = r
        .core
        .trainer
        .prune(&names, o.sparsity, global)
        .map_err(lua_err)?;
    let achieved = pruned as f64 / total.max(1) as f64;
    let host = state(lua);
    let mut f = Map::new();
    f.insert("run".into(), r.id.into());
    f.insert("sparsity".into(), json!(o.sparsity));
    f.insert("scope".into(), o.scope.clone().into());
    f.insert("params".into(), json!(names));
    f.insert("pruned".into(), pruned.into());
    f.insert("total".into(), total.into());
    host.out
        .record("prune", r.core.trainer.step, r.core.cursor.epoch, f)
        .map_err(lua_err)?;
    host.out.line(&format!(
        "pruned {pruned} of {total} weights ({:.1}%) in {} tensors",
        achieved * 100.0,
        names.len()
    ));
    let t = lua.create_table()?;
    t.set("pruned", pruned)?;
    t.set("total", total)?;
    t.set("sparsity", achieved)?;
    Ok(t)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportOpts {
    path: String,
    /// f32, f16, q8_0 or q4_0.
    #[serde(default = "q8_0")]
    format: String,
}

fn q8_0() -> String {
    "q8_0".into()
}

/// `run:export{ path, format = "q8_0" }`: the model's weights as a GGUF
/// file, weight matrices quantized. Returns `{ bytes, f32_bytes, quantized, kept_f32 }`.
pub(super) fn export(lua: &Lua, run: &RunHandle, opts: Value) -> mlua::Result<Table> {
    let o: ExportOpts = decode(lua, "run:export", opts)?;
    let Some(format) = ExportFormat::parse(&o.format) else {
        return Err(config_error(
            lua,
            format!(
                "run:export: unknown format `{}` ({})",
                o.format,
                ExportFormat::NAMES
            ),
        ));
    };
    let r = run.get()?;
    let tensors: Vec<(String, candle_core::Tensor)> = r
        .core
        .trainer
        .params()
        .vars()
        .into_iter()
        .map(|(k, v)| (k, v.as_tensor().clone()))
        .collect();
    let meta = vec![
        ("general.architecture".to_string(), "taper".to_string()),
        ("general.name".to_string(), r.core.trainer.spec().describe()),
        ("taper.model".to_string(), r.core.trainer.spec().describe()),
        ("taper.step".to_string(), r.core.trainer.step.to_string()),
        ("taper.format".to_string(), o.format.clone()),
    ];
    let path = std::path::PathBuf::from(&o.path);
    let s = export_gguf(&path, &tensors, &meta, format).map_err(lua_err)?;
    let host = state(lua);
    let mut f = Map::new();
    f.insert("run".into(), r.id.into());
    f.insert("path".into(), o.path.clone().into());
    f.insert("format".into(), o.format.clone().into());
    f.insert("bytes".into(), s.bytes.into());
    f.insert("f32_bytes".into(), s.f32_bytes.into());
    host.out
        .record("export", r.core.trainer.step, r.core.cursor.epoch, f)
        .map_err(lua_err)?;
    host.out.line(&format!(
        "exported {} ({}, {} tensors quantized, {} kept f32): {} bytes, {:.2}x smaller than f32",
        o.path,
        o.format,
        s.quantized,
        s.kept_f32,
        s.bytes,
        s.f32_bytes as f64 / s.bytes.max(1) as f64
    ));
    let t = lua.create_table()?;
    t.set("bytes", s.bytes)?;
    t.set("f32_bytes", s.f32_bytes)?;
    t.set("quantized", s.quantized)?;
    t.set("kept_f32", s.kept_f32)?;
    Ok(t)
}
