//! Creating a run (`taper.run{...}`): its trainer and core from the decoded
//! options, resuming it from its checkpoint, its periodic checkpoints and
//! memory plan, and its `run` record. The run's methods are in `run.rs`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use candle_core::DType;
use mlua::{Lua, Table};
use serde_json::Map;

use super::options::{at_caller, config_error};
use super::run_state::{RunHandle, RunState};
use super::state;
use crate::engine::checkpoint;
use crate::engine::{Trainer, TrainerOptions};
use crate::error::lua_err;

/// `taper.run{...}`: in a reloaded version of the recipe, the run the
/// previous version created in the same order; otherwise a new run.
pub(crate) fn new_run(lua: &Lua, opts: Table) -> mlua::Result<RunHandle> {
    let host = state(lua);
    let o = super::run_options::decode_run(lua, &host, &opts)?;
    if opts
        .get::<Option<bool>>("watch")
        .map_err(|_| config_error(lua, "taper.run: option `watch` must be true or false"))?
        == Some(true)
    {
        super::reload::watch::start_watching(&host);
    }
    match super::reload::adopt(lua, &host, o)? {
        Ok(existing) => Ok(existing),
        Err(o) => create(lua, &host, o),
    }
}

fn create(
    lua: &Lua,
    host: &super::HostState,
    o: super::run_options::RunOptions,
) -> mlua::Result<RunHandle> {
    let declared = super::run_state::Declared {
        precision: o.precision,
        recompute: o.recompute,
        offload: o.offload.clone(),
    };
    let trainer = trainer_of(lua, host, &o)?;
    let id = host.runs.borrow().len() + 1;
    let mut core = crate::run::Run::new(trainer, o.seed);
    core.schedule = o.schedule;
    core.micro_batch = o.micro_batch;
    core.recipe_hash = host.recipe_hash.borrow().clone();
    core.oom = o.oom;
    core.vocab = match &o.data {
        Some(super::generator::Feed::Pipeline(p)) => p.source().vocab().cloned().map(Arc::new),
        _ => None,
    };
    if let Some(super::generator::Feed::Pipeline(p)) = &o.data {
        core.classes = p.source().classes().map(<[_]>::to_vec);
        core.image_input = p.image_input();
        core.table_input = p.table_input();
        core.sample_input = p.sample_input();
        core.array_input = p.array_input();
    }
    let mut run = RunState {
        id,
        core,
        data: o.data,
        state: match o.state {
            Some(t) => t,
            None => lua.create_table()?,
        },
        reenter: false,
        periodic: None,
        keep: host
            .opts
            .keep_checkpoints
            .or(o.keep_checkpoints)
            .unwrap_or(crate::run::periodic::DEFAULT_KEEP),
        saves_seen: 0,
        warned_unstandardized: false,
        warned_same_name: false,
        told_stopped: false,
        plan: None,
        under_host_limit: o.host_budget && host.budget.is_some(),
        declared,
        last_good: None,
    };
    // Under a budget, the planner's prediction goes next to each epoch's
    // measured peak (`taper plan`'s estimate, checked as the run goes). A
    // run far under the machine's memory does without: the budget alone
    // turns a surprise into an OOM it recovers from.
    let far_under_machine = match (&host.budget, o.host_budget) {
        (Some(c), true) if c.limit.whose == crate::memory::container::Whose::Machine => {
            super::plan::plainly_fits(&run, c.budget).map_err(lua_err)?
        }
        _ => false,
    };
    if run.core.oom.budget.is_some()
        && crate::memory::HostMemory::is_counting()
        && !far_under_machine
    {
        let ceiling = host.budget.as_ref().map(|c| c.budget);
        let first = super::plan::FirstBatch::MayNotFit;
        let probed = super::plan::plan_of(&run, ceiling, first).map_err(lua_err)?;
        run.plan = (probed.plan.batch > 0).then_some(probed.plan);
        if let (true, Some(c)) = (run.under_host_limit, &host.budget) {
            super::memory_limit::start_under(&mut run, c, probed.residency, &host.out);
        }
    }
    if let Some(path) = resume_path(host, id).map_err(lua_err)? {
        // A checkpoint that does not fit the recipe (another model, other
        // classes) is the recipe's error, at its `taper.run` line.
        let resumed = run.resume(lua, &path);
        if let Some(notice) = resumed.map_err(|e| at_caller(lua, "taper.run", e))? {
            host.out.tell(&notice);
        }
        host.out.line(&format!(
            "resumed from {} at step {}",
            path.display(),
            run.core.trainer.step
        ));
    }
    run.periodic = host
        .opts
        .checkpoint_every
        .or(o.checkpoint_every)
        .unwrap_or(Some(crate::run::periodic::DEFAULT))
        .map(|every| crate::run::periodic::Periodic::new(every, run.core.trainer.step));
    record_run(host, &run, &o.model)?;
    let rc = Rc::new(RefCell::new(run));
    host.runs.borrow_mut().push(rc.clone());
    Ok(RunHandle(rc))
}

/// The run's trainer, as its options declare: model, optimizer, seed and
/// loss, precision, recomputation and offloaded optimizer state.
fn trainer_of(
    lua: &Lua,
    host: &super::HostState,
    o: &super::run_options::RunOptions,
) -> mlua::Result<Trainer> {
    let topts = TrainerOptions {
        device: host.device.clone(),
        dtype: DType::F32,
        seed: o.seed,
        loss: o.loss.clone(),
    };
    let mut trainer = Trainer::new(Arc::clone(&o.model.0), &o.optim, topts).map_err(lua_err)?;
    trainer.set_precision(o.precision).map_err(lua_err)?;
    trainer
        .set_recompute(o.recompute)
        .map_err(|e| config_error(lua, format!("taper.run: {e}")))?;
    if let Some(place) = &o.offload {
        trainer.set_offload_place(place.clone());
    }
    trainer
        .set_offload(o.offload.is_some())
        .map_err(|e| config_error(lua, format!("taper.run: {e}")))?;
    Ok(trainer)
}

/// The `run` record: what trains, where, and how (and in a data-parallel
/// run, the ranks, also said on each rank's terminal or log).
fn record_run(
    host: &super::HostState,
    run: &RunState,
    model: &super::models::ModelHandle,
) -> mlua::Result<()> {
    let (id, declared) = (run.id, &run.declared);
    let mut f = Map::new();
    f.insert("run".into(), id.into());
    f.insert("model".into(), model.0.describe().into());
    f.insert(
        "parameters".into(),
        run.core.trainer.params().num_params().into(),
    );
    f.insert(
        "optimizer".into(),
        run.core.trainer.optimizer_description().into(),
    );
    let loss = run.core.trainer.loss();
    f.insert("loss".into(), loss.describe().into());
    if let crate::engine::loss::Loss::CrossEntropy(c) = loss {
        if let Some(w) = &c.weights {
            // As f32 prints them (0.74863386, not 0.748633861541748).
            let w: Vec<f64> = w
                .iter()
                .map(|v| v.to_string().parse().unwrap_or(0.0))
                .collect();
            f.insert("class_weights".into(), w.into());
        }
    }
    f.insert(
        "device".into(),
        crate::engine::describe_device(&host.device).into(),
    );
    f.insert("precision".into(), declared.precision.name().into());
    f.insert("recompute".into(), declared.recompute.into());
    f.insert("offload".into(), declared.offload.is_some().into());
    if let Some(limit) = run.core.oom.budget {
        f.insert("memory_limit".into(), limit.into());
    }
    if let Some(c) = &host.budget {
        let key = match c.limit.whose {
            crate::memory::container::Whose::Container => "container_limit",
            crate::memory::container::Whose::Machine => "machine_memory",
        };
        f.insert(key.into(), c.limit.limit.into());
    }
    if let Some(m) = run.core.oom.ceiling {
        f.insert("micro_batch_ceiling".into(), m.into());
    }
    if let Some(w) = crate::dist::world() {
        // Data-parallel: each rank trains its shard of every batch.
        f.insert("ranks".into(), w.size().into());
        f.insert("collective".into(), w.describe().into());
        host.out.line(&format!(
            "rank {} of {} (pid {}): {}",
            w.rank(),
            w.size(),
            std::process::id(),
            w.describe()
        ));
    }
    host.out
        .record("run", run.core.trainer.step, run.core.cursor.epoch, f)
        .map_err(lua_err)?;
    Ok(())
}

/// The checkpoint run `id` resumes from: the first run, the one `--resume`
/// named; a later run (a distilled student), its own newest checkpoint in the
/// run folder being continued, if it got as far as one.
fn resume_path(host: &super::HostState, id: usize) -> crate::Result<Option<std::path::PathBuf>> {
    if let Some(path) = host.resume.borrow_mut().take() {
        return Ok(Some(path));
    }
    let Some(dir) = host.opts.resume_folder.as_ref().filter(|_| id > 1) else {
        return Ok(None);
    };
    let Some((path, notes)) =
        checkpoint::latest_valid(&dir.join(checkpoint::file_name(id)), same_as_out(host, dir))?
    else {
        return Ok(None);
    };
    for n in notes {
        host.out.warn(&n);
    }
    Ok(Some(path))
}

fn same_as_out(host: &super::HostState, dir: &std::path::Path) -> bool {
    host.opts
        .out_dir
        .as_deref()
        .is_some_and(|o| o == dir || o.canonicalize().ok() == dir.canonicalize().ok())
}
