//! `run:evaluate(data [, opts])`: the run's model (or its kept best one)
//! scored on `data` with no gradient graph: the data checked against the
//! run's, the evaluation, its `eval` record and printed line, the best
//! model kept when asked, and the table the recipe gets.

use std::collections::HashMap;

use candle_core::Tensor;
use mlua::{Lua, Table, Value};
use serde_json::{json, Map};

use super::best::KeepBest;
use super::generator::Feed;
use super::options::config_error;
use super::run_state::{RunHandle, RunState};
use super::{state, HostState};
use crate::engine::best::Best;
use crate::engine::loss::Loss;
use crate::engine::Eval;
use crate::error::lua_err;

/// Batch size for evaluation data without `:batch(n)`.
const EVAL_BATCH: usize = 256;

/// `run:evaluate`'s options.
struct Opts {
    /// `loss`: another objective to average.
    objective: Option<Loss>,
    /// `keep_best` and `patience`.
    keep_best: Option<KeepBest>,
    /// `model = "best"`: the kept best model instead of the run's own.
    of_best: bool,
}

fn options(lua: &Lua, opts: Option<Table>) -> mlua::Result<Opts> {
    let Some(t) = opts else {
        return Ok(Opts {
            objective: None,
            keep_best: None,
            of_best: false,
        });
    };
    super::options::check_keys(
        lua,
        "run:evaluate",
        &t,
        &["loss", "keep_best", "patience", "min_delta", "model"],
    )?;
    let keep_best = super::best::options(lua, &t)?;
    let model = match t.get::<Value>("model")? {
        Value::Nil => None,
        Value::String(m) => Some(m.to_str()?.to_string()),
        other => {
            return Err(config_error(
                lua,
                format!(
                    "run:evaluate: option `model` must be \"best\" or \"last\", got {}",
                    super::options::a_type(&other)
                ),
            ))
        }
    };
    let of_best = super::best::wants_best(lua, "run:evaluate", model.as_deref())?;
    if of_best && keep_best.is_some() {
        return Err(config_error(
            lua,
            "run:evaluate: model = \"best\" with keep_best would compare the best model with itself: evaluate the run's own model to keep the best",
        ));
    }
    let objective = super::options::handle::<super::optim_loss::LossHandle>(
        lua,
        "run:evaluate",
        &t,
        "loss",
        "a taper.loss",
    )?
    .map(|h| h.0);
    if let Some(Loss::CrossEntropy(c)) = &objective {
        if c.class_weights.is_some() {
            return Err(config_error(
                lua,
                "run:evaluate: option `loss`: a cross-entropy with class weights; evaluation reports the unweighted cross-entropy as `loss`, and `balanced_accuracy` and `macro_f1` score the classes alike",
            ));
        }
    }
    Ok(Opts {
        objective,
        keep_best,
        of_best,
    })
}

pub(super) fn evaluate(
    lua: &Lua,
    run: &RunHandle,
    data: Value,
    opts: Option<Table>,
) -> mlua::Result<Table> {
    let host = state(lua);
    let Some(feed) = super::data::feed_of(lua, "run:evaluate", &data)? else {
        return Err(config_error(lua, "run:evaluate(data): data is required"));
    };
    let o = options(lua, opts)?;
    check_data(lua, &host, run, &feed)?;
    // A standardized regression target: errors go back to its units.
    let target_std: Option<Vec<f64>> = match &feed {
        Feed::Pipeline(p) => p
            .standardized()
            .and_then(|s| s.target())
            .map(|m| m.std.iter().map(|&s| f64::from(s)).collect()),
        Feed::Lua(_) => None,
    };
    let batches = feed.epoch(lua, 1, EVAL_BATCH, 0, 0).map_err(lua_err)?;
    let mut r = run.get_mut()?;
    // Outside an epoch, the pool's high-water mark restarts with the
    // evaluation (a device sync), so that its record tells the evaluation's
    // own peak; inside one, it belongs to the epoch's record.
    let own_peak = !r.core.cursor.in_epoch;
    if own_peak {
        crate::memory::device::reset_pool_peak(r.core.trainer.device()).map_err(lua_err)?;
    }
    let best = match o.of_best {
        true => super::best::best_weights(lua, "run:evaluate", &r)?,
        false => None,
    };
    let (ev, of_best) = scored(&host, &mut r, batches, o.objective.as_ref(), best)
        .map_err(|e| super::run::in_data(lua, "run:evaluate", Some(feed.describe()), e))?;
    let mut ev = ev;
    if let Some(std) = &target_std {
        ev.regression = ev.regression.map(|g| g.in_units(std));
        r.core.last_eval = Some(ev.clone());
    }
    let split = feed.split_name();
    let targets = record(&host, &r, &ev, &split, of_best.as_ref(), own_peak)?;
    let improved = match &o.keep_best {
        Some(k) => Some(super::best::offer(lua, &host, &mut r, &ev, &split, k)?),
        None => None,
    };
    let classes = r.core.classes.clone();
    let t = lua.create_table()?;
    t.set("loss", ev.loss)?;
    t.set("improved", improved)?;
    super::eval_scores::lua_scores(lua, &t, &ev, classes.as_deref(), &targets)?;
    t.set("samples", ev.samples)?;
    t.set("split", split)?;
    t.set("objective", ev.objective)?;
    Ok(t)
}

/// The evaluation itself, of the run's model or, with `model = "best"`,
/// of the kept best one put in its place and taken out again after (also
/// when the evaluation fails). Returns the best's state when it was that.
fn scored(
    host: &HostState,
    r: &mut RunState,
    batches: impl Iterator<Item = crate::Result<crate::data::Batch>>,
    objective: Option<&Loss>,
    best: Option<(HashMap<String, Tensor>, Best)>,
) -> crate::Result<(Eval, Option<Best>)> {
    let id = r.id;
    let swapped = match best {
        Some((weights, b)) => Some((r.core.trainer.swap_weights(&weights)?, b)),
        None => None,
    };
    let ev = r.core.evaluate(batches, objective, &mut |rec| {
        super::oom::record(&host.out, id, rec)
    });
    if let Some((mine, _)) = &swapped {
        r.core.trainer.swap_weights(mine)?;
    }
    Ok((ev?, swapped.map(|(_, b)| b)))
}

/// The `eval` record and the printed line; returns the names of the
/// targets (a regression's or multi-label classifier's).
fn record(
    host: &HostState,
    r: &RunState,
    ev: &Eval,
    split: &str,
    of_best: Option<&Best>,
    own_peak: bool,
) -> mlua::Result<Vec<String>> {
    let targets = super::eval_scores::target_names(
        r.core.table_input.as_ref(),
        ev.regression
            .as_ref()
            .map(|g| g.targets.len())
            .or(ev.multi_label.as_ref().map(|m| m.labels.len()))
            .unwrap_or(0),
    );
    let classes = r.core.classes.as_deref();
    let mut f = Map::new();
    f.insert("run".into(), r.id.into());
    f.insert("split".into(), split.into());
    f.insert("loss".into(), json!(ev.loss));
    super::eval_scores::record_scores(&mut f, ev, classes, &targets);
    f.insert("samples".into(), ev.samples.into());
    if let Some(b) = of_best {
        f.insert("model".into(), "best".into());
        f.insert("model_step".into(), b.step.into());
    }
    if let Some(o) = ev.objective {
        f.insert("objective".into(), json!(o));
    }
    if let Some(peak) = super::run_state::pool_peak(host, r.core.trainer.device()) {
        if own_peak {
            f.insert("device_memory_peak".into(), json!(peak));
        }
    }
    let (step, epoch) = (r.core.trainer.step, r.core.cursor.epoch);
    host.out.record("eval", step, epoch, f).map_err(lua_err)?;
    let (score, per_target) = super::eval_scores::score_line(ev, &targets);
    let objective = ev
        .objective
        .map(|o| format!("  objective {o:.4}"))
        .unwrap_or_default();
    let whose = match of_best {
        Some(b) => format!(" (the best model, step {})", b.step),
        None => String::new(),
    };
    host.out.line(&format!(
        "  {split}{whose}: loss {:.4}  {score}{objective}{per_target}",
        ev.loss
    ));
    Ok(targets)
}

/// The data checked against the run's training data: the same classes and
/// inputs (an error), and warnings, once per run, of data named as the
/// training data but holding other samples, and of data left
/// unstandardized while the training data was standardized.
fn check_data(lua: &Lua, host: &HostState, run: &RunHandle, feed: &Feed) -> mlua::Result<()> {
    let Feed::Pipeline(p) = feed else {
        return Ok(());
    };
    let whose = format!("{}'s", feed.split_name());
    let mut r = run.get_mut()?;
    r.core
        .check_classes(&whose, p.source().classes())
        .and_then(|()| {
            r.core
                .check_inputs(&whose, p.source().table_input().as_ref())
        })
        .map_err(|e| super::run::in_data(lua, "run:evaluate", Some(feed.describe()), e))?;
    if let (false, Some(Feed::Pipeline(train))) = (r.warned_same_name, &r.data) {
        let name = p.split_name();
        if train.split_name() == name && !train.overlaps(p) {
            r.warned_same_name = true;
            host.out.warn(&format!(
                "{}run:evaluate on data named `{name}`, as the run's training data is, but other samples: its eval records would read as the training data's; name the parts, e.g. `train:named(\"train\")`, `test:named(\"test\")`, or give each file's `split`",
                super::options::location(lua)
            ));
        }
    }
    if !r.warned_unstandardized && unstandardized(&r.core, p) {
        r.warned_unstandardized = true;
        host.out.warn(&format!(
            "{}run:evaluate on {} data that is not standardized, while the run trained on standardized data: its model takes standardized values; standardize it with the training data's statistics (`test = test:standardize(train)`)",
            super::options::location(lua),
            feed.split_name()
        ));
    }
    Ok(())
}

/// Whether the run trained on standardized table rows or images and `data`
/// (of the same kind) is not standardized: evaluated, its raw values would
/// meet a model that takes standardized ones.
fn unstandardized(core: &crate::run::Run, data: &crate::data::Pipeline) -> bool {
    let table = match (&core.table_input, data.table_input()) {
        (Some(ours), Some(theirs)) => ours.standardize.is_some() && theirs.standardize.is_none(),
        _ => false,
    };
    let image = match (&core.image_input, data.image_input()) {
        (Some(ours), Some(theirs)) => ours.standardize.is_some() && theirs.standardize.is_none(),
        _ => false,
    };
    table || image
}
