//! A run as the Lua bindings hold it, and its handle: the run core's [`Run`] plus what only
//! Lua has (its data feed, which may be a Lua generator, and `run.state`),
//! and what ending an epoch or saving records.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use serde_json::{json, Map};

use super::generator::Feed;
use super::HostState;
use crate::engine::{checkpoint, Eval};
use crate::error::lua_err;
use crate::run::Run;
use crate::Result;

pub(crate) struct RunState {
    pub id: usize,
    /// The trainer, slots, cursor and counters: no Lua in it.
    pub core: Run,
    pub data: Option<Feed>,
    /// `run.state`: the recipe's own table, which survives reloads.
    pub state: mlua::Table,
    /// A reload happened mid-epoch: `run:epochs()` re-enters this epoch.
    pub reenter: bool,
    /// When the next periodic checkpoint is due (`--checkpoint-every`).
    pub periodic: Option<crate::run::periodic::Periodic>,
    /// How many of its checkpoints to keep in the output folder.
    pub keep: usize,
    /// How many of the checkpoints asked for by SIGUSR1 this run has
    /// written (see [`crate::run::interrupt::save_requests`]).
    pub saves_seen: u64,
    /// Whether `run:evaluate` warned of data left unstandardized (once).
    pub warned_unstandardized: bool,
    /// Whether `run:evaluate` warned of other data under the training
    /// data's split name (once).
    pub warned_same_name: bool,
    /// Whether the run's early stop was told (when it happened, or once
    /// after a resume found the run stopped).
    pub told_stopped: bool,
    /// With a memory budget: the planner's prediction, which each epoch
    /// record puts next to the measured peak.
    pub plan: Option<crate::memory::planner::Plan>,
    /// Whether its budget is the host's: the container's memory limit or
    /// the machine's memory (no `--mem-limit` or `mem_limit` gave one).
    pub under_host_limit: bool,
    /// What the recipe's latest version declared for the settings an OOM
    /// policy may also change: a reload applies a setting only when the
    /// new version declares it differently, so that a policy's choice
    /// outlives reloads that do not touch it.
    pub declared: Declared,
    /// The newest checkpoint this run wrote or resumed from, and its step:
    /// where a diverged run is told to go back to.
    pub last_good: Option<(PathBuf, u64)>,
}

/// A recipe's `precision`, `recompute` and `offload`, as declared.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Declared {
    pub precision: crate::engine::precision::Precision,
    pub recompute: usize,
    pub offload: Option<crate::engine::optim::offload::Place>,
}

/// A run as Lua holds it (`taper.run{}` returns one). Borrowed for each
/// call; a call made while the run is in its step is an error.
#[derive(Clone)]
pub(crate) struct RunHandle(pub(crate) Rc<RefCell<RunState>>);

fn busy() -> mlua::Error {
    lua_err(crate::Error::Script(
        "the run is busy: code called from inside its step (an OOM policy, schedule or generator) cannot use the run".into(),
    ))
}

pub(crate) fn read(rc: &Rc<RefCell<RunState>>) -> mlua::Result<std::cell::Ref<'_, RunState>> {
    rc.try_borrow().map_err(|_| busy())
}

pub(crate) fn write(rc: &Rc<RefCell<RunState>>) -> mlua::Result<std::cell::RefMut<'_, RunState>> {
    rc.try_borrow_mut().map_err(|_| busy())
}

impl RunHandle {
    pub(crate) fn get(&self) -> mlua::Result<std::cell::Ref<'_, RunState>> {
        read(&self.0)
    }
    pub(crate) fn get_mut(&self) -> mlua::Result<std::cell::RefMut<'_, RunState>> {
        write(&self.0)
    }
}

/// What a run reached, for embedders and tests.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub step: u64,
    pub epoch: u64,
    pub last_eval: Option<Eval>,
    /// The best evaluation, when the run kept its best model.
    pub best: Option<crate::engine::best::Best>,
}

impl RunState {
    pub fn summary(&self) -> RunSummary {
        RunSummary {
            step: self.core.trainer.step,
            epoch: self.core.cursor.epoch,
            last_eval: self.core.last_eval.clone(),
            best: self.core.best.clone(),
        }
    }

    pub fn save(&mut self, path: &Path) -> Result<()> {
        // Plain values only: a table holding functions is not saved.
        self.core
            .save(path, serde_json::to_value(&self.state).ok())?;
        self.last_good = Some((path.to_path_buf(), self.core.trainer.step));
        Ok(())
    }

    /// Restores from a checkpoint; returns a notice when the checkpoint was
    /// written by a different version of the recipe.
    pub fn resume(&mut self, lua: &mlua::Lua, path: &Path) -> Result<Option<String>> {
        let (meta, notice) = self.core.resume(path)?;
        self.last_good = Some((path.to_path_buf(), meta.step));
        if let Some(state) = &meta.state {
            if let mlua::Value::Table(t) = mlua::LuaSerdeExt::to_value(lua, state)? {
                self.state = t;
            }
        }
        Ok(notice)
    }
}

/// Closes the epoch in progress: one `epoch` record and a summary line.
pub(crate) fn finish_epoch(host: &HostState, r: &mut RunState) -> Result<()> {
    let Some(s) = r.core.end_epoch() else {
        return Ok(());
    };
    host.out.finish_bar();
    let rate = s.samples_here as f64 / s.seconds.max(1e-9);
    let mut f = Map::new();
    f.insert("run".into(), r.id.into());
    if let Some(loss) = s.loss {
        f.insert("loss".into(), json!(loss));
    }
    f.insert("samples".into(), s.samples.into());
    f.insert("seconds".into(), json!(s.seconds));
    f.insert("samples_per_s".into(), json!(rate));
    f.insert("data_wait_s".into(), json!(s.data_wait));
    if crate::memory::HostMemory::is_counting() {
        f.insert("memory_peak".into(), json!(s.mem_peak));
        if let Some(plan) = r.plan.filter(|_| s.micro_batch > 0) {
            f.insert(
                "planned_peak".into(),
                json!(plan.peak(s.micro_batch, false)),
            );
        }
    }
    let device = r.core.trainer.device();
    if let Some(d) = crate::memory::device::info(device) {
        f.insert("device_memory_used".into(), json!(d.used()));
        f.insert("device_memory_total".into(), json!(d.total));
    }
    if let Some(peak) = pool_peak(host, device) {
        f.insert("device_memory_peak".into(), json!(peak));
    }
    f.insert("lr".into(), json!(s.lr));
    host.out.record("epoch", s.step, s.epoch, f)?;
    host.out.line(&format!(
        "epoch {}/{}  step {}  train loss {:.4}  {} samples/s  {:.2}s",
        s.epoch,
        r.core.total_epochs,
        s.step,
        s.loss.unwrap_or(0.0),
        super::progress::si(rate),
        s.seconds
    ));
    Ok(())
}

/// One `step` record: means over the steps since the last one (loss, step
/// time, throughput), the learning rate and micro-batch in use, and memory.
pub(crate) fn step_record(host: &HostState, r: &mut RunState) -> Result<()> {
    let w = r.core.window.take();
    let mut f = Map::new();
    f.insert("run".into(), r.id.into());
    if let Some(loss) = w.loss {
        f.insert("loss".into(), json!(loss));
    }
    f.insert("lr".into(), json!(r.core.trainer.learning_rate()));
    f.insert("steps".into(), w.steps.into());
    f.insert("batch".into(), json!(w.batch));
    f.insert("micro_batch".into(), w.micro_batch.into());
    f.insert("step_s".into(), json!(w.step_seconds));
    f.insert("data_wait_s".into(), json!(w.data_wait));
    f.insert("samples_per_s".into(), json!(w.samples_per_s));
    if let Some(t) = w.tokens_per_s {
        f.insert("tokens_per_s".into(), json!(t));
    }
    if w.skipped > 0 {
        f.insert("skipped".into(), w.skipped.into());
    }
    if crate::memory::HostMemory::is_counting() {
        f.insert("memory".into(), json!(crate::memory::HostMemory::current()));
        f.insert("memory_peak".into(), json!(w.mem_peak));
    }
    let device = r.core.trainer.device();
    let used = crate::memory::device::info(device).map(|d| {
        f.insert("device_memory_used".into(), json!(d.used()));
        f.insert("device_memory_total".into(), json!(d.total));
        d.used()
    });
    let peak = pool_peak(host, device);
    if let Some(peak) = peak {
        f.insert("device_memory_peak".into(), json!(peak));
    }
    let heap = crate::memory::HostMemory::is_counting().then(crate::memory::HostMemory::current);
    host.out.window(&w, heap, used.zip(peak));
    host.out
        .record("step", r.core.trainer.step, r.core.cursor.epoch, f)
}

/// The device pool's high-water mark since its last reset, net of the
/// `--mem-limit` ballast (which lives in the pool too); None on the CPU.
pub(crate) fn pool_peak(host: &HostState, device: &candle_core::Device) -> Option<usize> {
    let ballast = host.ballast.as_ref().map_or(0, |b| b.bytes);
    crate::memory::device::pool_peak(device).map(|p| p.saturating_sub(ballast))
}

/// Writes the run's checkpoint into the output folder (`checkpoint.safetensors`
/// for the first run, `checkpoint-2.safetensors`, ...) with a `checkpoint`
/// record; nothing without a folder or before the first step.
pub(crate) fn checkpoint(host: &HostState, r: &mut RunState, why: &str) -> Result<Option<PathBuf>> {
    let Some(dir) = host.opts.out_dir.as_ref() else {
        return Ok(None);
    };
    if r.core.trainer.step == 0 {
        return Ok(None);
    }
    let path = dir.join(checkpoint::file_name(r.id));
    if r.keep > 1 {
        checkpoint::archive_latest(&path)?;
    }
    match r.save(&path) {
        // A disk that holds exactly the checkpoints kept: the older ones
        // this save would remove go first, and the save is tried again.
        Err(e) if checkpoint::disk_full(&e) => {
            let removed = checkpoint::make_room(&path, r.keep)?;
            if removed.is_empty() {
                return Err(e);
            }
            let names: Vec<String> = removed.iter().map(|p| p.display().to_string()).collect();
            host.out.warn(&format!(
                "step {}: the disk is full ({e}): removed {}, the oldest checkpoint kept, to make room for this one",
                r.core.trainer.step,
                names.join(", ")
            ));
            r.save(&path)?;
        }
        other => other?,
    }
    checkpoint::keep_newest(&path, r.keep)?;
    let mut f = Map::new();
    f.insert("path".into(), path.display().to_string().into());
    f.insert("reason".into(), why.into());
    host.out
        .record("checkpoint", r.core.trainer.step, r.core.cursor.epoch, f)?;
    Ok(Some(path))
}

/// After a step: the periodic checkpoint, when one is due, or the one a
/// SIGUSR1 asked for (whatever the period, `never` included). One that
/// cannot be written (a full disk, an I/O error) does not end a healthy
/// run: it is a warning and a `checkpoint` record with `ok: false`, the
/// checkpoints before it stay, and the next period tries again. A diverged
/// model still stops the run.
pub(crate) fn checkpoint_if_due(host: &HostState, r: &mut RunState) -> Result<()> {
    let step = r.core.trainer.step;
    let asked = crate::run::interrupt::save_requests();
    let signalled = asked > r.saves_seen;
    if !signalled && !r.periodic.is_some_and(|p| p.due(step)) {
        return Ok(());
    }
    r.saves_seen = asked;
    let why = if signalled { "SIGUSR1" } else { "periodic" };
    match checkpoint(host, r, why) {
        Ok(Some(path)) if signalled => host.out.tell(&format!(
            "taper: SIGUSR1: step {step}: saved {}; training goes on",
            path.display()
        )),
        Err(e) if !e.find(|e| matches!(e, crate::Error::Diverged(_))) => {
            host.out.warn(&format!(
                "step {step}: the {why} checkpoint failed, training goes on and tries again at the next period: {e}"
            ));
            let mut f = Map::new();
            if let Some(dir) = host.opts.out_dir.as_ref() {
                let path = dir.join(checkpoint::file_name(r.id));
                f.insert("path".into(), path.display().to_string().into());
            }
            f.insert("reason".into(), why.into());
            f.insert("ok".into(), false.into());
            f.insert("error".into(), e.to_string().into());
            // The records may share the full disk: the warning said it.
            let _ = host.out.record("checkpoint", step, r.core.cursor.epoch, f);
        }
        other => {
            other?;
        }
    }
    if let Some(p) = r.periodic.as_mut() {
        p.done(step);
    }
    Ok(())
}
