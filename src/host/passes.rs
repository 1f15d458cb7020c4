//! Model passes a recipe applies to a run: `run:prune{}` (`run:export{}` is
//! in export.rs).

use mlua::{Function, Lua, Table, Value};
use serde::Deserialize;
use serde_json::{json, Map};

use super::options::{config_error, decode};
use super::run_state::RunHandle;
use super::state;
use crate::error::lua_err;

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
