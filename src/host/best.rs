//! `run:evaluate(data, { keep_best = "loss", patience = 3 })`: the run's
//! best model kept in `OUT/best.safetensors` (written when an evaluation
//! beats every one before it), `run.best`, stopping early once `patience`
//! evaluations in a row have not done better, and `model = "best"`: the kept
//! model evaluated or exported in place of the run's own.

use std::collections::HashMap;

use candle_core::Tensor;
use mlua::{Lua, Table, Value};
use serde_json::{json, Map};

use super::options::config_error;
use super::run_state::RunState;
use super::HostState;
use crate::engine::best::{lower_is_better, Best, Candidate, Offer, SCORES};
use crate::engine::{checkpoint, Eval};

/// What an evaluation was asked to keep.
pub(super) struct KeepBest {
    metric: String,
    patience: Option<u64>,
    min_delta: f64,
}

/// Reads `keep_best`, `patience` and `min_delta` from `run:evaluate`'s
/// options.
pub(super) fn options(lua: &Lua, t: &Table) -> mlua::Result<Option<KeepBest>> {
    let what = "run:evaluate";
    let metric = match t.get::<Value>("keep_best")? {
        Value::Nil => None,
        Value::String(s) => Some(s.to_str()?.to_string()),
        other => {
            return Err(config_error(
                lua,
                format!(
                    "{what}: option `keep_best` must be the name of a score (`loss`, `accuracy`, ...), got {}",
                    super::options::a_type(&other)
                ),
            ))
        }
    };
    let patience = match t.get::<Value>("patience")? {
        Value::Nil => None,
        Value::Integer(n) if n >= 1 => Some(n as u64),
        other => {
            return Err(config_error(
                lua,
                format!(
                    "{what}: option `patience` must be a whole number of evaluations, 1 or more, got {}",
                    super::options::brief(&other)
                ),
            ))
        }
    };
    let min_delta = match t.get::<Value>("min_delta")? {
        Value::Nil => None,
        Value::Integer(n) if n >= 0 => Some(n as f64),
        Value::Number(x) if x >= 0.0 && x.is_finite() => Some(x),
        other => {
            return Err(config_error(
                lua,
                format!(
                    "{what}: option `min_delta` is how much better than the best an evaluation must be to count, a number 0 or more (in the score's units), got {}",
                    super::options::brief(&other)
                ),
            ))
        }
    };
    let Some(metric) = metric else {
        if patience.is_some() || min_delta.is_some() {
            let option = if patience.is_some() {
                "patience"
            } else {
                "min_delta"
            };
            return Err(config_error(
                lua,
                format!("{what}: option `{option}` is about evaluations that do not beat the best one: it needs `keep_best` (the score that decides, such as \"loss\")"),
            ));
        }
        return Ok(None);
    };
    if !SCORES.contains(&metric.as_str()) {
        return Err(config_error(
            lua,
            format!(
                "{what}: keep_best = \"{metric}\" is not a score; one of {}",
                SCORES.join(", ")
            ),
        ));
    }
    Ok(Some(KeepBest {
        metric,
        patience,
        min_delta: min_delta.unwrap_or(0.0),
    }))
}

/// Compares the evaluation `ev` of `split` with the run's best; a better
/// one's model is written to the run folder's best checkpoint. Returns
/// whether it was better. Prints and records what happened: a `best`
/// record for a new best, an `early_stop` record when patience ran out.
pub(super) fn offer(
    lua: &Lua,
    host: &HostState,
    r: &mut RunState,
    ev: &Eval,
    split: &str,
    k: &KeepBest,
) -> mlua::Result<bool> {
    let Some(value) = ev.score(&k.metric) else {
        let has: Vec<&str> = ev.scores().iter().map(|(n, _)| *n).collect();
        return Err(config_error(
            lua,
            format!(
                "run:evaluate: keep_best = \"{}\": this evaluation has no such score; it has {}",
                k.metric,
                has.join(", ")
            ),
        ));
    };
    let before = r.core.best.clone();
    let offer = Best::offer(
        &mut r.core.best,
        &Candidate {
            metric: &k.metric,
            split,
            value,
            step: r.core.trainer.step,
            epoch: r.core.cursor.epoch,
            patience: k.patience,
            min_delta: k.min_delta,
        },
    );
    match offer {
        Offer::NotBetter => {
            not_better(host, r, before.as_ref()).map_err(crate::error::lua_err)?;
            Ok(false)
        }
        Offer::Better | Offer::Restarted => {
            if let (Offer::Restarted, Some(b)) = (offer, &before) {
                host.out.line(&format!(
                    "  note: the best so far was by {}; from here on {} {} decides",
                    Best::describe_value(&b.metric, &b.split, b.value),
                    split,
                    k.metric
                ));
            }
            save(host, r).map_err(crate::error::lua_err)?;
            Ok(true)
        }
    }
}

/// Writes the new best's model (when the run has a folder), a `best`
/// record and a line. A save that fails (a full disk) is a warning: the
/// run goes on, and the best so far has no file.
fn save(host: &HostState, r: &mut RunState) -> crate::Result<()> {
    let path = host
        .opts
        .out_dir
        .as_ref()
        .map(|d| d.join(checkpoint::best_file_name(r.id)));
    let step = r.core.trainer.step;
    let mut saved = None;
    if let Some(path) = &path {
        if let Some(b) = r.core.best.as_mut() {
            b.path = Some(path.display().to_string());
        }
        let state = serde_json::to_value(&r.state).ok();
        match r.core.save(path, state) {
            Ok(()) => saved = Some(path.display().to_string()),
            Err(e) if e.find(|e| matches!(e, crate::Error::Diverged(_))) => return Err(e),
            Err(e) => {
                host.out.warn(&format!(
                    "step {step}: the best model so far could not be saved, training goes on: {e}"
                ));
                if let Some(b) = r.core.best.as_mut() {
                    b.path = None;
                }
            }
        }
    }
    // Several ranks: rank 0 wrote the file; every rank learns its path
    // once it is in place (the ranks share its folder, as --resume has
    // them), so that `model = "best"` reads the same weights on each.
    if let Some(w) = crate::dist::world().filter(|w| w.size() > 1) {
        let mut shared = saved.clone().unwrap_or_default().into_bytes();
        w.broadcast_bytes(0, &mut shared)?;
        let shared = String::from_utf8_lossy(&shared).into_owned();
        if let Some(b) = r.core.best.as_mut() {
            b.path = (!shared.is_empty()).then_some(shared);
        }
    }
    let Some(b) = r.core.best.clone() else {
        return Ok(());
    };
    let mut f = Map::new();
    f.insert("run".into(), r.id.into());
    f.insert("metric".into(), b.metric.clone().into());
    f.insert("split".into(), b.split.clone().into());
    f.insert("value".into(), json!(b.value));
    if let Some(p) = &saved {
        f.insert("path".into(), p.clone().into());
    }
    host.out.record("best", step, r.core.cursor.epoch, f)?;
    host.out.line(&match &saved {
        Some(p) => format!("  best so far: saved {p}"),
        None => "  best so far".to_string(),
    });
    Ok(())
}

/// An evaluation no better than the best: a line, and the early stop when
/// this one used up the patience.
fn not_better(host: &HostState, r: &mut RunState, before: Option<&Best>) -> crate::Result<()> {
    let Some(b) = r.core.best.clone() else {
        return Ok(());
    };
    let of = match b.patience {
        Some(p) => format!(" ({} of patience {p})", b.evals_since),
        None => String::new(),
    };
    let by = match b.min_delta {
        0.0 => String::new(),
        d => format!(" by more than {d}"),
    };
    host.out
        .line(&format!("  no better{by} than {}{of}", b.describe()));
    let was_stopped = before.is_some_and(|p| p.stopped());
    if !b.stopped() || was_stopped {
        return Ok(());
    }
    r.told_stopped = true;
    let mut f = Map::new();
    f.insert("run".into(), r.id.into());
    f.insert("metric".into(), b.metric.clone().into());
    f.insert("split".into(), b.split.clone().into());
    f.insert("best".into(), json!(b.value));
    f.insert("best_step".into(), b.step.into());
    f.insert("evaluations".into(), b.evals_since.into());
    if let Some(p) = &b.path {
        f.insert("path".into(), p.clone().into());
    }
    host.out
        .record("early_stop", r.core.trainer.step, r.core.cursor.epoch, f)?;
    host.out.line(&stop_line(r.id, &b));
    Ok(())
}

/// `run 1 stops early: val loss has not fallen below its best (1.7123 at
/// step 880, epoch 2) in 3 evaluations; the best model is in ...`.
pub(super) fn stop_line(id: usize, b: &Best) -> String {
    let (moved, side) = match lower_is_better(&b.metric) {
        true => ("fallen", "below"),
        false => ("risen", "above"),
    };
    let direction = match b.min_delta {
        0.0 => format!("{moved} {side}"),
        d => format!("{moved} more than {d} {side}"),
    };
    let kept = match &b.path {
        Some(p) => format!("; the best model is in {p}"),
        None => String::new(),
    };
    let value = Best::shown(&b.metric, b.value);
    format!(
        "run {id} stops early: {} {} has not {direction} its best ({value} at step {}, epoch {}) in {} evaluations{kept}",
        b.split, b.metric, b.step, b.epoch, b.evals_since
    )
}

/// Whether the run stopped early, so that `run:epochs()` and
/// `run:batches()` give no more. A run resumed after it stopped is told so
/// once.
pub(crate) fn stopped(host: &HostState, r: &mut RunState) -> bool {
    let Some(b) = r.core.best.as_ref().filter(|b| b.stopped()) else {
        return false;
    };
    if !std::mem::replace(&mut r.told_stopped, true) {
        host.out.tell(&format!(
            "note: {}; it trains no more (to train on from its best model, start a new run with --resume {})",
            stop_line(r.id, b).replacen(" stops early", " stopped early", 1),
            b.path.as_deref().unwrap_or("its best checkpoint")
        ));
    }
    true
}

/// `run.best`: nil before an evaluation with `keep_best`, else `{ metric,
/// split, value, step, epoch, evals_since, patience?, min_delta, path?,
/// stopped }`.
pub(super) fn lua_best(lua: &Lua, r: &RunState) -> mlua::Result<Value> {
    let Some(b) = &r.core.best else {
        return Ok(Value::Nil);
    };
    let t = lua.create_table()?;
    t.set("metric", b.metric.as_str())?;
    t.set("split", b.split.as_str())?;
    t.set("value", b.value)?;
    t.set("step", b.step)?;
    t.set("epoch", b.epoch)?;
    t.set("evals_since", b.evals_since)?;
    t.set("patience", b.patience)?;
    t.set("min_delta", b.min_delta)?;
    t.set("path", b.path.as_deref())?;
    t.set("stopped", b.stopped())?;
    Ok(Value::Table(t))
}

/// `model = "best"` (or `"last"`, the default) in `run:evaluate`'s or
/// `run:export`'s options: whether the kept best model is asked for.
pub(super) fn wants_best(lua: &Lua, what: &str, v: Option<&str>) -> mlua::Result<bool> {
    match v {
        None | Some("last") => Ok(false),
        Some("best") => Ok(true),
        Some(other) => Err(config_error(
            lua,
            format!(
                "{what}: option `model` is \"best\" (the model an evaluation with keep_best kept) or \"last\" (the run's own, the default), got \"{other}\""
            ),
        )),
    }
}

/// The kept best model's weights, on the run's device, and its best
/// state; an error when the run has not written one, except under `taper
/// check`, which trains nothing and so keeps no best: None, the run's own
/// model stands in, so that the recipe is checked to its end.
pub(super) fn best_weights(
    lua: &Lua,
    what: &str,
    r: &RunState,
) -> mlua::Result<Option<(HashMap<String, Tensor>, Best)>> {
    let Some((b, path)) = r
        .core
        .best
        .as_ref()
        .and_then(|b| Some((b, b.path.clone()?)))
    else {
        if super::state(lua).opts.check_only {
            return Ok(None);
        }
        return Err(config_error(
            lua,
            format!(
                "{what}: model = \"best\": run {} has no best model saved yet (an evaluation with `keep_best`, in a run with an output folder, saves one)",
                r.id
            ),
        ));
    };
    let (weights, _) = r
        .core
        .trainer
        .weights_of(std::path::Path::new(&path))
        .map_err(|e| config_error(lua, format!("{what}: model = \"best\": {e}")))?;
    Ok(Some((weights, b.clone())))
}
