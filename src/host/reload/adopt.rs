//! `taper.run{}` in a reloaded version of a recipe: it returns the run the
//! previous version created in the same order, keeping the model, optimizer
//! state, data cursor, step, memory plan and `run.state`, and stages what a
//! reload may change:
//!
//! - may change: `data` (the cursor carries over), `schedule`, `on_oom`,
//!   `mem_limit`, `micro_batch`, `loss` options, the model's dropout
//!   rates, `precision`, `recompute`,
//!   `offload` (each applied only when the new version declares it
//!   differently from the previous one, so that what an OOM policy chose
//!   stays otherwise), the optimizer's `lr`, and everything the recipe's
//!   loop does from the next epoch (or safe point);
//! - may not change: the model's architecture, the optimizer's kind and its
//!   settings other than `lr`, the run's `seed`, and the inputs table data
//!   gives the model (a CSV file's columns and categories).
//!
//! The staged strategies are swapped in only when the new version reaches
//! its first safe point (`commit`).

use std::cell::RefCell;
use std::rc::Rc;

use mlua::{Function, Lua, Table, Value};

use crate::engine::loss::Loss;
use crate::engine::optim::OptimSpec;
use crate::engine::precision::Precision;
use crate::engine::schedule::{Schedule, StepPlan};
use crate::host::generator::Feed;
use crate::host::options::config_error;
use crate::host::run_options::RunOptions;
use crate::host::run_state::RunHandle;
use crate::host::run_state::{Declared, RunState};
use crate::host::HostState;

/// What a new version gives a run, applied at commit.
pub(crate) struct Staged {
    run: Rc<RefCell<RunState>>,
    data: Option<Feed>,
    loss: Loss,
    optim: OptimSpec,
    schedule: Option<Rc<RefCell<dyn Schedule>>>,
    micro_batch: Option<usize>,
    policy: Option<Box<dyn crate::run::OomPolicy>>,
    budget: Option<usize>,
    on_reload: Option<Function>,
    precision: Precision,
    recompute: usize,
    offload: Option<crate::engine::optim::offload::Place>,
    /// The model, whose dropout rates may differ from the run's.
    model: std::sync::Arc<dyn crate::engine::ModelSpec>,
}

/// In a reloaded version, the existing run for this `taper.run{}` call,
/// after checking that the new options keep what a reload must keep.
/// `Ok(Err(o))` hands the options back: create a new run.
pub(crate) fn adopt(
    lua: &Lua,
    host: &HostState,
    o: RunOptions,
) -> mlua::Result<std::result::Result<RunHandle, RunOptions>> {
    let (index, committed) = {
        let mut rl = host.reload.borrow_mut();
        let index = rl.next_run;
        rl.next_run += 1;
        if rl.generation == 0 && rl.trial.is_none() {
            return Ok(Err(o));
        }
        (index, rl.trial.is_none())
    };
    let Some(run) = host.runs.borrow().get(index).cloned() else {
        return Ok(Err(o));
    };
    check(lua, &run.borrow(), &o)?;
    let staged = Staged {
        run: run.clone(),
        data: o.data,
        loss: o.loss,
        optim: o.optim,
        schedule: o.schedule,
        micro_batch: o.micro_batch,
        policy: o.oom.policy,
        budget: o.oom.budget,
        on_reload: o.on_reload,
        precision: o.precision,
        recompute: o.recompute,
        offload: o.offload,
        model: o.model.0,
    };
    if committed {
        // A run the new version reaches after its first safe point.
        for note in commit(vec![staged]).map_err(|e| config_error(lua, e))? {
            host.out.tell(&note);
        }
    } else if let Some(trial) = host.reload.borrow_mut().trial.as_mut() {
        trial.push(staged);
    }
    Ok(Ok(RunHandle(run)))
}

fn check(lua: &Lua, r: &RunState, o: &RunOptions) -> mlua::Result<()> {
    let restart =
        "stop the run and start it again (taper train ... --resume <checkpoint>) to change it";
    let (was, now) = (r.core.trainer.spec(), &o.model.0);
    if crate::engine::dropout::rate_changes(&**was, &**now).is_none() {
        let (was, now) = (was.describe(), now.describe());
        return Err(config_error(
            lua,
            // Nor can a resume (trainer::state): a new model is a new run.
            format!("taper.run: a reload cannot change the model's architecture or options other than dropout (running: {was}; new: {now}); a changed model is a new run: stop this one and start the edited recipe with another --out"),
        ));
    }
    let old = r.core.trainer.optim_spec();
    if !old.same_but_lr(&o.optim) {
        return Err(config_error(
            lua,
            format!(
                "taper.run: a reload can change the optimizer's lr only (running: {}; new: {}); {restart}",
                old.describe(),
                o.optim.describe()
            ),
        ));
    }
    // Table rows must become the inputs the model learned: a column of
    // categories read with other categories would move them.
    if let (Some(Feed::Pipeline(p)), Some(ours)) = (&o.data, &r.core.table_input) {
        if let Some(theirs) = p.source().table_input() {
            let theirs = ("the new data's", &theirs);
            if let Some(why) = crate::data::input_difference(("the run's", ours), theirs) {
                return Err(config_error(
                    lua,
                    format!(
                        "taper.run: a reload cannot change the model's inputs: {why}; {restart}"
                    ),
                ));
            }
            if let Some(why) = crate::data::target_difference(("the run's", ours), theirs) {
                return Err(config_error(
                    lua,
                    format!(
                        "taper.run: a reload cannot change the model's targets: {why}; each output learned one of the run's targets, so other targets are a new run: start the edited recipe with another --out"
                    ),
                ));
            }
        }
    }
    if o.seed != r.core.seed {
        return Err(config_error(
            lua,
            format!("taper.run: a reload cannot change the run's seed; {restart}"),
        ));
    }
    Ok(())
}

/// Applies a new version's staged strategies: first everything that runs
/// the new code (the schedule's plan for the next step, `on_reload`), and
/// only when all of it succeeded, the swap. Returns notes for the user on
/// what changed that the records do not show (a model's dropout).
pub(crate) fn commit(staged: Vec<Staged>) -> std::result::Result<Vec<String>, String> {
    let mut ready = Vec::with_capacity(staged.len());
    for s in staged {
        let (step, epoch, old_state) = {
            let r = s.run.borrow();
            let next_epoch = if r.core.cursor.in_epoch {
                r.core.cursor.epoch
            } else {
                r.core.cursor.epoch + 1
            };
            (r.core.trainer.step, next_epoch.max(1), r.state.clone())
        };
        let plan = match &s.schedule {
            Some(sch) => Some((
                step,
                epoch,
                sch.borrow_mut()
                    .plan(step, epoch)
                    .map_err(|e| crate::host::render::message(&e))?,
            )),
            None => None,
        };
        let new_state = match &s.on_reload {
            None => old_state,
            Some(f) => match f.call::<Value>(old_state.clone()) {
                Ok(Value::Nil) => old_state,
                Ok(Value::Table(t)) => t,
                Ok(other) => {
                    return Err(format!(
                        "on_reload must return the new state table (or nil), got {}",
                        crate::host::options::a_type(&other)
                    ))
                }
                Err(e) => return Err(crate::host::render::message(&e.into())),
            },
        };
        ready.push((s, plan, new_state));
    }
    let mut notes = Vec::new();
    for (s, plan, new_state) in ready {
        notes.extend(apply(s, plan, new_state)?);
    }
    Ok(notes)
}

fn apply(
    s: Staged,
    plan: Option<(u64, u64, StepPlan)>,
    state: Table,
) -> std::result::Result<Option<String>, String> {
    let mut r = s.run.borrow_mut();
    // Only what the new version declares differently: an OOM policy's
    // precision, recompute or offload stays through a reload that leaves
    // the recipe's value as it was.
    let now = Declared {
        precision: s.precision,
        recompute: s.recompute,
        offload: s.offload.clone(),
    };
    let was = std::mem::replace(&mut r.declared, now.clone());
    let trainer = &mut r.core.trainer;
    if now.precision != was.precision {
        trainer
            .set_precision(now.precision)
            .map_err(|e| e.to_string())?;
    }
    if now.recompute != was.recompute {
        trainer
            .set_recompute(now.recompute)
            .map_err(|e| e.to_string())?;
    }
    if now.offload != was.offload {
        if let Some(place) = &now.offload {
            trainer.set_offload_place(place.clone());
        }
        trainer
            .set_offload(now.offload.is_some())
            .map_err(|e| e.to_string())?;
    }
    let rates = crate::engine::dropout::rate_changes(&**r.core.trainer.spec(), &*s.model)
        .unwrap_or_default();
    let mut note = None;
    if !rates.is_empty() {
        r.core
            .trainer
            .set_spec(s.model)
            .map_err(|e| e.to_string())?;
        note = Some(format!(
            "note: {} from step {} on, over the same weights",
            crate::engine::dropout::describe_changes(&rates),
            r.core.trainer.step + 1
        ));
    }
    if s.optim.lr() != r.core.trainer.optim_spec().lr() {
        r.core.trainer.set_learning_rate(s.optim.lr());
    }
    r.core.trainer.set_optim_spec(s.optim);
    r.core.trainer.set_loss(s.loss);
    r.data = s.data;
    r.core.schedule = s.schedule;
    r.core.micro_batch = s.micro_batch;
    r.core.oom.policy = s.policy;
    r.core.oom.budget = s.budget;
    r.state = state;
    r.core.pending = plan;
    r.reenter = r.core.cursor.in_epoch;
    Ok(note)
}
