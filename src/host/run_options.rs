//! Decoding `taper.run{...}`: the model, optimizer, data, loss, seed,
//! schedule, micro-batch and OOM options of a new run (the OOM options
//! decoded in `oom_options`).

use std::cell::RefCell;
use std::rc::Rc;

use mlua::{Function, Lua, Table, Value};

use super::generator::Feed;
use super::models::ModelHandle;
use super::optim_loss::{LossHandle, OptimHandle};
use super::options::{brief, check_keys, config_error, decode, handle};
use super::schedule::{LuaSchedule, ScheduleHandle};
use crate::engine::loss::Loss;
use crate::engine::optim::{AdamWConfig, OptimSpec};
use crate::engine::precision::Precision;
use crate::engine::schedule::Schedule;
use crate::run::periodic::{parse_period, Every};
use crate::run::Recovery;

const RUN_KEYS: &[&str] = &[
    "model",
    "optim",
    "data",
    "loss",
    "seed",
    "schedule",
    "micro_batch",
    "on_oom",
    "mem_limit",
    "state",
    "on_reload",
    "watch",
    "precision",
    "checkpoint_every",
    "keep_checkpoints",
    "recompute",
    "offload",
];

/// The decoded options of `taper.run{...}`.
pub(crate) struct RunOptions {
    pub model: ModelHandle,
    pub optim: OptimSpec,
    pub data: Option<Feed>,
    pub loss: Loss,
    /// Mixed with the host's `--seed`.
    pub seed: u64,
    pub schedule: Option<Rc<RefCell<dyn Schedule>>>,
    pub micro_batch: Option<usize>,
    pub oom: Recovery,
    /// Whether `oom`'s budget is the container's (no limit was given).
    pub host_budget: bool,
    pub state: Option<Table>,
    pub on_reload: Option<Function>,
    pub precision: Precision,
    /// `checkpoint_every`: None when not given, Some(None) for `"never"`.
    pub checkpoint_every: Option<Option<Every>>,
    /// `keep_checkpoints`, when given.
    pub keep_checkpoints: Option<usize>,
    /// `recompute`: every how many blocks the backward recomputes (0: none).
    pub recompute: usize,
    /// `offload`: where AdamW's moments are kept, when offloaded.
    pub offload: Option<crate::engine::optim::offload::Place>,
}

pub(crate) fn decode_run(
    lua: &Lua,
    host: &super::HostState,
    opts: &Table,
) -> mlua::Result<RunOptions> {
    let what = "taper.run";
    check_keys(lua, what, opts, RUN_KEYS)?;
    let model: ModelHandle = handle(lua, what, opts, "model", "a taper.model")?
        .ok_or_else(|| config_error(lua, "taper.run: option `model` is required"))?;
    let optim = handle::<OptimHandle>(lua, what, opts, "optim", "a taper.optim")?
        .map(|o| o.0)
        .unwrap_or(OptimSpec::AdamW(AdamWConfig::default()));
    let data = run_data(lua, opts)?;
    let loss = handle::<LossHandle>(lua, what, opts, "loss", "a taper.loss")?
        .map(|l| l.0)
        .unwrap_or_default();
    let loss =
        super::class_weights::resolve(lua, loss, model.0.interface().classes, data.as_ref())?;
    if let (crate::engine::loss::Loss::Bce(b), Some(k)) = (&loss, model.0.interface().classes) {
        let n = b.pos_weight.as_ref().map_or(1, Vec::len);
        if n != 1 && n != k {
            return Err(config_error(
                lua,
                format!("taper.run: taper.loss.bce's `pos_weight` has {n} values, and the model gives {k} labels (its `outputs`): give one per label, or one for all"),
            ));
        }
    }
    if !loss.float_targets() {
        if let Some(outputs) = model.0.interface().classes {
            crate::engine::model::classifier_outputs(outputs)
                .map_err(|e| config_error(lua, format!("taper.run: {e}")))?;
        }
    }
    pairs_have_a_separator(lua, &model, data.as_ref())?;
    let seed = option(lua, opts, "seed", "a non-negative integer", |v| {
        Ok(match v {
            Value::Nil => Some(0),
            Value::Integer(n) if *n >= 0 => Some(*n as u64),
            _ => None,
        })
    })?;
    let schedule = run_schedule(lua, opts)?;
    let micro_batch: Option<usize> = match opts.get::<Value>("micro_batch")? {
        Value::Nil => None,
        v => Some(decode(lua, "taper.run: option `micro_batch`", v)?),
    };
    if micro_batch == Some(0) {
        return Err(config_error(
            lua,
            "taper.run: option `micro_batch` must be positive",
        ));
    }
    let (oom, host_budget) = super::oom_options::run_oom(lua, host, opts)?;
    let state = option(lua, opts, "state", "a table", |v| {
        Ok(match v {
            Value::Nil => Some(None),
            Value::Table(t) => Some(Some(t.clone())),
            _ => None,
        })
    })?;
    let on_reload = option(lua, opts, "on_reload", "a function(old_state)", |v| {
        Ok(match v {
            Value::Nil => Some(None),
            Value::Function(f) => Some(Some(f.clone())),
            _ => None,
        })
    })?;
    let precision = run_precision(lua, opts)?;
    let (checkpoint_every, keep_checkpoints) = run_checkpoints(lua, opts)?;
    let (recompute, offload) = run_memory_savers(lua, opts)?;
    Ok(RunOptions {
        host_budget,
        recompute,
        offload,
        checkpoint_every,
        keep_checkpoints,
        model,
        optim,
        precision,
        data,
        loss,
        seed: seed ^ host.opts.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        schedule,
        micro_batch,
        oom,
        state,
        on_reload,
    })
}

/// `data`: a feed whose training pipeline yields at least one batch.
/// Text pairs give a BERT its second texts as token type 1, after the
/// separator its tokenizer put between them: a BERT that knows no separator
/// would read them as type 0, and train on other inputs than transformers'.
fn pairs_have_a_separator(lua: &Lua, model: &ModelHandle, data: Option<&Feed>) -> mlua::Result<()> {
    let Some(Feed::Pipeline(p)) = data else {
        return Ok(());
    };
    let pairs = p
        .table_input()
        .is_some_and(|t| t.text.is_some() && t.columns.len() == 2);
    let config = model.0.config().unwrap_or_default();
    // Only a BERT has a second token type (a DistilBERT has none, a
    // RoBERTa one: their pairs are told apart by the separators alone).
    let typed = |b: &serde_json::Value| b["type_vocab"].as_u64().is_some_and(|n| n > 1);
    if pairs
        && config
            .get("bert")
            .is_some_and(|b| typed(b) && b["sep"].is_null())
    {
        return Err(config_error(
            lua,
            "taper.run: the data is text pairs, whose second texts a BERT reads as token type 1, after the separator (`[SEP]`); this BERT knows no separator id (its config has no `sep_token_id`, and its folder no tokenizer.json or vocab.txt): put the model's tokenizer.json beside its config.json",
        ));
    }
    Ok(())
}

fn run_data(lua: &Lua, opts: &Table) -> mlua::Result<Option<Feed>> {
    let data = super::data::feed_of(lua, "taper.run: option `data`", &opts.get::<Value>("data")?)?;
    if let Some(Feed::Pipeline(p)) = &data {
        if p.batches_per_epoch(super::generator::TRAIN_BATCH) == 0 {
            return Err(config_error(
                lua,
                format!(
                    "taper.run: option `data` yields no batch: {} holds {} samples{}",
                    p.source().describe(),
                    p.len(),
                    if p.is_empty() {
                        ""
                    } else {
                        " (fewer than one batch, and the last partial batch is dropped)"
                    }
                ),
            ));
        }
    }
    Ok(data)
}

/// `taper.run`'s option `key`, as `accept` reads it: None for a value it
/// does not take, which is an error saying what the option `must_be` and
/// what it got.
fn option<T>(
    lua: &Lua,
    opts: &Table,
    key: &str,
    must_be: &str,
    accept: impl FnOnce(&Value) -> mlua::Result<Option<T>>,
) -> mlua::Result<T> {
    let v = opts.get::<Value>(key)?;
    accept(&v)?.ok_or_else(|| {
        config_error(
            lua,
            format!(
                "taper.run: option `{key}` must be {must_be}, got {}",
                brief(&v)
            ),
        )
    })
}

/// `checkpoint_every = steps | "10m" | "never"` (None when not given,
/// Some(None) for never) and `keep_checkpoints = k`.
fn run_checkpoints(
    lua: &Lua,
    opts: &Table,
) -> mlua::Result<(Option<Option<Every>>, Option<usize>)> {
    let every = option(
        lua,
        opts,
        "checkpoint_every",
        "a positive number of steps, a time (\"10m\") or \"never\"",
        |v| match v {
            Value::Nil => Ok(Some(None)),
            Value::Integer(n) if *n > 0 => Ok(Some(Some(Some(Every::Steps(*n as u64))))),
            Value::String(s) => parse_period(&s.to_str()?)
                .map(|p| Some(Some(p)))
                .map_err(|e| {
                    config_error(lua, format!("taper.run: option `checkpoint_every`: {e}"))
                }),
            _ => Ok(None),
        },
    )?;
    let keep = option(lua, opts, "keep_checkpoints", "a positive integer", |v| {
        Ok(match v {
            Value::Nil => Some(None),
            Value::Integer(n) if *n > 0 => Some(Some(*n as usize)),
            _ => None,
        })
    })?;
    Ok((every, keep))
}

/// `recompute = true` (every block), a number n (every n-th block), or
/// false / 0 (none); `offload = true` (host memory: pinned on CUDA) or a
/// folder.
fn run_memory_savers(
    lua: &Lua,
    opts: &Table,
) -> mlua::Result<(usize, Option<crate::engine::optim::offload::Place>)> {
    use crate::engine::optim::offload::Place;
    let recompute = option(
        lua,
        opts,
        "recompute",
        "true, false or a number of blocks (every n-th is recomputed)",
        |v| {
            Ok(match v {
                Value::Nil | Value::Boolean(false) => Some(0),
                Value::Boolean(true) => Some(1),
                Value::Integer(n) if *n >= 0 => Some(*n as usize),
                _ => None,
            })
        },
    )?;
    let offload = option(lua, opts, "offload", "true, false or a folder", |v| {
        Ok(match v {
            Value::Nil | Value::Boolean(false) => Some(None),
            Value::Boolean(true) => Some(Some(Place::Host)),
            Value::String(s) => Some(Some(Place::Dir(s.to_str()?.to_string().into()))),
            _ => None,
        })
    })?;
    if let Some(Place::Dir(d)) = &offload {
        if !d.is_dir() {
            return Err(config_error(
                lua,
                format!(
                    "taper.run: option `offload`: {} is not a folder (true keeps the moments in host memory; a string names the folder for their file)",
                    d.display()
                ),
            ));
        }
    }
    Ok((recompute, offload))
}

/// `precision = "f32" | "bf16" | "f16"`.
fn run_precision(lua: &Lua, opts: &Table) -> mlua::Result<Precision> {
    match opts.get::<Value>("precision")? {
        Value::Nil => Ok(Precision::F32),
        Value::String(s) => {
            let s = s.to_str()?.to_string();
            Precision::parse(&s).ok_or_else(|| {
                config_error(
                    lua,
                    format!(
                        "taper.run: option `precision`: unknown precision `{s}` ({})",
                        Precision::NAMES
                    ),
                )
            })
        }
        other => Err(config_error(
            lua,
            format!(
                "taper.run: option `precision` must be a string ({}), got {}",
                Precision::NAMES,
                super::options::a_type(&other)
            ),
        )),
    }
}

/// `schedule = taper.schedule.x{...}` or `schedule = function(step, epoch, state) ... end`.
fn run_schedule(lua: &Lua, opts: &Table) -> mlua::Result<Option<Rc<RefCell<dyn Schedule>>>> {
    match opts.get::<Value>("schedule")? {
        Value::Nil => Ok(None),
        Value::Function(f) => Ok(Some(Rc::new(RefCell::new(LuaSchedule::new(lua, f)?)))),
        Value::UserData(ud) if ud.is::<ScheduleHandle>() => Ok(Some(ud.borrow::<ScheduleHandle>()?.0.clone())),
        v if super::plugin::of(&v).is_some() => {
            let p = super::plugin::of(&v).expect("checked");
            p.lib
                .require(taper_plugin::KIND_SCHEDULE)
                .map_err(|e| config_error(lua, format!("taper.run: option `schedule`: {e}")))?;
            Ok(Some(Rc::new(RefCell::new(crate::plugins::PluginSchedule(p)))))
        }
        other => Err(config_error(
            lua,
            format!(
                "taper.run: option `schedule` must be a taper.schedule, a function(step, epoch, state) or a plugin, got {}",
                super::options::a_type(&other)
            ),
        )),
    }
}
