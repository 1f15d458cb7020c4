//! `taper.run{...}` and the run handle: the methods a recipe's loop calls.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;

use mlua::{Function, Lua, MetaMethod, Table, UserData, UserDataFields, UserDataMethods, Value};
use serde_json::{json, Map};

use super::batch::{BatchHandle, BatchIssuer};
use super::generator::Feed;
use super::options::{config_error, decode};
use super::run_state::{finish_epoch, read, write, RunHandle, RunState};
use super::state;
use crate::engine::schedule::StepPlan;
use crate::error::lua_err;
use crate::memory::inject::Injection;

use super::generator::TRAIN_BATCH;

fn batches(lua: &Lua, run: &RunHandle, data: Value) -> mlua::Result<Function> {
    let host = state(lua);
    let given = super::data::feed_of(lua, "run:batches", &data)?;
    let mut r = run.get_mut()?;
    let Some(feed) = given.or_else(|| r.data.clone()) else {
        return Err(config_error(
            lua,
            "run:batches(): this run has no data; pass taper.run{ data = ... } or run:batches(data)",
        ));
    };
    let epoch = r.core.cursor.epoch.max(1);
    let r_total_epochs = r.core.total_epochs;
    let skip = std::mem::take(&mut r.core.cursor.skip_batches);
    let skip_samples = std::mem::take(&mut r.core.cursor.skip_samples);
    let len = match &feed {
        Feed::Pipeline(p) => Some(p.len() as u64),
        Feed::Lua(_) => None,
    };
    let was = std::mem::replace(&mut r.core.cursor.data_len, len);
    drop(r);
    if let (true, Some(was), Some(now)) = (skip_samples > 0, was, len) {
        if was != now {
            host.out.tell(&format!(
                "note: the training data has {now} samples now, and epoch {epoch} stopped after {skip_samples} of its {was}: it goes on from sample {skip_samples} of the new data's order, so this epoch may train some samples twice and others not at all (later epochs see all {now})"
            ));
        }
    }
    let it = RefCell::new(
        feed.epoch(lua, epoch, TRAIN_BATCH, skip, skip_samples)
            .map_err(lua_err)?,
    );
    let later = r_total_epochs.saturating_sub(epoch);
    host.out
        .start_bar(it.borrow().remaining(), later, format!("epoch {epoch}"));
    let run = run.0.clone();
    let waited = std::cell::Cell::new(std::time::Duration::ZERO);
    let issuer = BatchIssuer::default();
    lua.create_function(move |lua, ()| {
        // A run that stopped early (an evaluation inside the epoch used up
        // its patience) takes no more batches: the epoch closes here.
        {
            let mut r = write(&run)?;
            if super::best::stopped(&state(lua), &mut r) {
                issuer.issue(None);
                if r.core.total_epochs > 0 {
                    finish_epoch(&state(lua), &mut r).map_err(lua_err)?;
                }
                return Ok(None);
            }
        }
        // A batch-size schedule decides the size of the next batch.
        let plan = plan_next(&run)?;
        let item = match plan.batch_size {
            Some(n) => it.borrow_mut().next_sized(n),
            None => it.borrow_mut().next(),
        };
        // Releases the previous batch's tensors, whatever Lua still holds.
        issuer.issue(None);
        let total = it.borrow().wait();
        let wait = (total - waited.replace(total)).as_secs_f64();
        let mut r = write(&run)?;
        r.core.stats.data_wait += wait;
        r.core.window.data_wait += wait;
        drop(r);
        match item {
            // The epoch's data is used up: close it now, so that its summary
            // comes before any evaluation the loop body does next.
            None => {
                let mut r = write(&run)?;
                if r.core.total_epochs > 0 {
                    finish_epoch(&state(lua), &mut r).map_err(lua_err)?;
                }
                Ok(None)
            }
            Some(b) => Ok(issuer.issue(Some(b.map_err(lua_err)?))),
        }
    })
}

/// The schedule's plan for the run's next step, computed once per step (a
/// Lua schedule may keep state) and shared by `run:batches()`, which needs
/// the batch size, and `run:step()`. Keyed by step and epoch: the draw that
/// finds an epoch's data used up plans a step the next epoch takes. The
/// schedule may be Lua code that reads the run: no borrow is held while it
/// runs.
fn plan_next(run: &Rc<RefCell<RunState>>) -> mlua::Result<StepPlan> {
    let (schedule, (at_step, at_epoch)) = {
        let r = read(run)?;
        if let Some(plan) = r.core.pending_plan() {
            return Ok(plan);
        }
        (r.core.schedule.clone(), r.core.plan_key())
    };
    let plan = match schedule {
        Some(s) => s.borrow_mut().plan(at_step, at_epoch).map_err(lua_err)?,
        None => StepPlan::default(),
    };
    write(run)?.core.pending = Some((at_step, at_epoch, plan));
    Ok(plan)
}

fn step(lua: &Lua, run: &RunHandle, batch: &BatchHandle) -> mlua::Result<(Option<f64>, u64)> {
    let host = state(lua);
    let batch = batch.get()?;
    // The plan first, with the run free: a Lua schedule may read it.
    plan_next(&run.0)?;
    let mut r = run.get_mut()?;
    let id = r.id;
    let data = r.data.as_ref().map(Feed::describe);
    let loss = match r
        .core
        .step(&batch, &mut |rec| super::oom::record(&host.out, id, rec))
    {
        Ok(loss) => loss,
        Err(crate::Error::Diverged(why)) => return Err(diverged(lua, &host, &r, why)),
        Err(e) => return Err(in_data(lua, "run:step", data, e)),
    };
    let (step, epoch) = (r.core.trainer.step, r.core.cursor.epoch);
    if let Some(scale) = r.core.trainer.take_overflow() {
        // f16 loss scaling skipped this update (non-finite gradients).
        let mut f = Map::new();
        f.insert("run".into(), id.into());
        f.insert("loss_scale".into(), json!(scale));
        host.out
            .record("overflow", step, epoch, f)
            .map_err(lua_err)?;
    }
    // A skipped batch is recorded by the core (and in checkpoints).
    if let Some(loss) = loss {
        host.out.tick(step, loss);
    }
    let every = host.opts.log_every;
    if every > 0 && step % every == 0 {
        super::run_state::step_record(&host, &mut r).map_err(lua_err)?;
    }
    super::run_state::checkpoint_if_due(&host, &mut r).map_err(lua_err)?;
    Ok((loss, step))
}

/// A step that diverged (see `Run::step`): a `diverged` record, and the
/// error, which names the recipe line and the checkpoint to go back to.
/// The run stops there; its model is not saved.
fn diverged(lua: &Lua, host: &super::HostState, r: &RunState, why: String) -> mlua::Error {
    let (step, epoch) = (r.core.trainer.step, r.core.cursor.epoch);
    let mut f = Map::new();
    f.insert("run".into(), r.id.into());
    f.insert("batch".into(), r.core.cursor.steps.into());
    f.insert("lr".into(), json!(r.core.trainer.learning_rate()));
    f.insert("error".into(), why.clone().into());
    let back = match &r.last_good {
        Some((path, at)) => {
            f.insert("checkpoint".into(), path.display().to_string().into());
            f.insert("checkpoint_step".into(), (*at).into());
            let folder = path
                .parent()
                .filter(|d| host.opts.out_dir.as_deref() == Some(*d));
            let from = folder.unwrap_or(path).display();
            format!(
                "the last good checkpoint, {} (step {at}), is kept: continue from it with --resume {from}",
                path.display()
            )
        }
        // Rank 0 writes a data-parallel run's checkpoints, and says which.
        None if crate::dist::rank() > 0 => "rank 0 names the checkpoint to go back to".into(),
        None => "no checkpoint was written before it: start again".into(),
    };
    // The error below says what happened, whether or not the record is written.
    let _ = host.out.record("diverged", step, epoch, f);
    lua_err(crate::Error::Diverged(format!(
        "{}run:step: {why}; its model is not saved, and {back}",
        super::options::location(lua)
    )))
}

/// A data error of a step or an evaluation (a sample that does not fit the
/// model, a file that cannot be read), with the recipe line and the data.
pub(super) fn in_data(lua: &Lua, what: &str, data: Option<String>, e: crate::Error) -> mlua::Error {
    match e {
        crate::Error::Data(msg) => lua_err(crate::Error::Data(format!(
            "{}{what}: {}{msg}",
            super::options::location(lua),
            data.map(|d| format!("{d}: ")).unwrap_or_default()
        ))),
        other => lua_err(other),
    }
}

fn log(lua: &Lua, run: &RunHandle, fields: Table) -> mlua::Result<()> {
    let host = state(lua);
    let r = run.get()?;
    let value: serde_json::Value = mlua::LuaSerdeExt::from_value(lua, Value::Table(fields))
        .map_err(|e| config_error(lua, format!("run:log: {e}")))?;
    let Some(mut map) = value.as_object().cloned() else {
        return Err(config_error(
            lua,
            "run:log: expected a table of key = value",
        ));
    };
    map.entry("run").or_insert(r.id.into());
    let line: Vec<String> = map
        .iter()
        .filter(|(k, _)| k.as_str() != "run")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    host.out.line(&line.join("  "));
    host.out
        .record("log", r.core.trainer.step, r.core.cursor.epoch, map)
        .map_err(lua_err)
}

impl UserData for RunHandle {
    fn add_fields<F: UserDataFields<Self>>(f: &mut F) {
        f.add_field_method_get("steps", |_, this| Ok(this.get()?.core.trainer.step));
        f.add_field_method_get("epoch", |_, this| Ok(this.get()?.core.cursor.epoch));
        f.add_field_method_get("parameters", |_, this| {
            Ok(this.get()?.core.trainer.params().num_params())
        });
        // What forward and backward run with now: the recipe's settings, or
        // what an OOM policy switched to since.
        f.add_field_method_get("precision", |_, this| {
            Ok(this.get()?.core.trainer.precision().name())
        });
        f.add_field_method_get("recompute", |_, this| {
            Ok(this.get()?.core.trainer.recompute())
        });
        f.add_field_method_get("offload", |_, this| Ok(this.get()?.core.trainer.offload()));
        // Lua functions, so that a reload can yield from them.
        f.add_field_function_get("epochs", |lua, _| super::reload::epochs_fn(lua));
        f.add_field_function_get("reload_point", |lua, _| super::reload::reload_point_fn(lua));
        f.add_field_method_get("best", |lua, this| {
            super::best::lua_best(lua, &*this.get()?)
        });
        f.add_field_method_get("state", |_, this| Ok(this.get()?.state.clone()));
        f.add_field_method_set("state", |lua, this, t: Value| match t {
            Value::Table(t) => {
                this.get_mut()?.state = t;
                Ok(())
            }
            other => Err(config_error(
                lua,
                format!(
                    "run.state must be a table, got {}",
                    super::options::a_type(&other)
                ),
            )),
        });
    }

    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        super::members::unknown_is_an_error(m, "Run");
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            let r = this.get()?;
            Ok(format!(
                "taper.run({}, step {}, epoch {})",
                r.core.trainer.spec().describe(),
                r.core.trainer.step,
                r.core.cursor.epoch
            ))
        });
        m.add_method("batches", |lua, this, d: Value| batches(lua, this, d));
        m.add_method("step", |lua, this, b: mlua::UserDataRef<BatchHandle>| {
            step(lua, this, &b)
        });
        m.add_method("evaluate", |lua, this, (d, o): (Value, Option<Table>)| {
            super::evaluate::evaluate(lua, this, d, o)
        });
        m.add_method("log", |lua, this, t: Table| log(lua, this, t));
        m.add_method("generate", |lua, this, o: Value| {
            super::generate::generate(lua, this, o)
        });
        m.add_method("inject_oom", |lua, this, o: Value| {
            let o: super::oom_options::InjectOpts = decode(lua, "run:inject_oom", o)?;
            if o.step == 0 {
                return Err(config_error(
                    lua,
                    "run:inject_oom: steps are numbered from 1",
                ));
            }
            this.get_mut()?.core.oom.injections.push(Injection {
                step: o.step,
                phase: o.phase,
                times: o.times,
                rank: o.rank,
            });
            Ok(())
        });
        m.add_method("prune", |lua, this, o: Value| {
            super::passes::prune(lua, this, o)
        });
        m.add_method("export", |lua, this, o: Value| {
            super::export::export(lua, this, o)
        });
        m.add_method("lr", |_, this, ()| {
            Ok(this.get()?.core.trainer.learning_rate())
        });
        m.add_method("set_lr", |lua, this, lr: f64| {
            if let Err(why) = crate::run::check_lr(lr) {
                return Err(config_error(lua, format!("run:set_lr: {why}")));
            }
            this.get_mut()?.core.trainer.set_learning_rate(lr);
            Ok(())
        });
        m.add_method("save", |lua, this, path: String| {
            let mut r = this.get_mut()?;
            r.save(&PathBuf::from(&path)).map_err(lua_err)?;
            state(lua).out.line(&format!("saved {path}"));
            Ok(())
        });
    }
}

pub(crate) fn register(lua: &Lua, taper: &Table) -> mlua::Result<()> {
    taper.set("run", lua.create_function(super::run_create::new_run)?)
}
