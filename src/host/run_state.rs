//! A run's state on the host side: the trainer plus its place in the epoch
//! loop, and what ending an epoch or saving records.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::time::Instant;

use serde_json::{json, Map};

use super::generator::Feed;
use super::HostState;
use crate::engine::checkpoint::{CheckpointMeta, FORMAT};
use crate::engine::schedule::Schedule;
use crate::engine::{Eval, Trainer};
use crate::Result;

pub(crate) struct RunState {
    pub id: usize,
    pub trainer: Trainer,
    pub data: Option<Feed>,
    pub seed: u64,
    /// The epoch in progress, or the last one started (1-based; 0 before any).
    pub epoch: u64,
    pub in_epoch: bool,
    pub epoch_steps: u64,
    /// Batches of the next epoch to skip (resuming mid-epoch; generators).
    pub skip_next: usize,
    /// Samples of the next epoch to skip (resuming mid-epoch; native data).
    pub skip_next_samples: usize,
    /// Samples of this epoch consumed (stepped or skipped): the data cursor.
    pub epoch_pos: u64,
    /// The schedule's plan for (step, epoch), computed before its batch was drawn.
    pub pending: Option<(u64, u64, crate::engine::schedule::StepPlan)>,
    pub epoch_loss: f64,
    pub epoch_samples: usize,
    pub epoch_start: Instant,
    /// Seconds this epoch spent waiting for batches (see `data::Epoch::wait`).
    pub epoch_data_wait: f64,
    /// Highest heap peak of a successful step this epoch (counting allocator).
    pub epoch_mem_peak: usize,
    pub total_epochs: u64,
    pub last_eval: Option<Eval>,
    /// Decides each step's learning rate and micro-batch, when given.
    pub schedule: Option<Rc<RefCell<dyn Schedule>>>,
    /// Micro-batch size when the schedule does not say (None: whole batch).
    pub micro_batch: Option<usize>,
    pub recipe_hash: String,
    /// OOM handling (the run core's recovery site): policy, injected
    /// faults, budget, learned caps.
    pub oom: crate::run::Recovery,
    /// Batches an OOM policy skipped: (epoch, batch position in the epoch).
    pub skipped: Vec<(u64, u64)>,
    /// `run.state`: the recipe's own table, which survives reloads.
    pub state: mlua::Table,
    /// A reload happened mid-epoch: `run:epochs()` re-enters this epoch.
    pub reenter: bool,
}

/// What a run reached, for embedders and tests.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub step: u64,
    pub epoch: u64,
    pub last_eval: Option<Eval>,
}

impl RunState {
    pub fn summary(&self) -> RunSummary {
        RunSummary {
            step: self.trainer.step,
            epoch: self.epoch,
            last_eval: self.last_eval,
        }
    }

    fn meta(&self) -> CheckpointMeta {
        CheckpointMeta {
            format: FORMAT.into(),
            step: self.trainer.step,
            epoch: self.epoch,
            epoch_steps: self.epoch_steps,
            epoch_samples: self.epoch_pos,
            epoch_complete: !self.in_epoch,
            model: self.trainer.spec().describe(),
            optimizer: self.trainer.optimizer_description().to_string(),
            lr: self.trainer.learning_rate(),
            seed: self.seed,
            recipe_hash: self.recipe_hash.clone(),
            skipped: self.skipped.clone(),
            // Plain values only: a table holding functions is not saved.
            state: serde_json::to_value(&self.state).ok(),
        }
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        self.trainer.save(path, &self.meta())
    }

    /// Restores from a checkpoint; returns a notice when the checkpoint was
    /// written by a different version of the recipe.
    pub fn resume(&mut self, lua: &mlua::Lua, path: &Path) -> Result<Option<String>> {
        let meta = self.trainer.load(path)?;
        let notice =
            (!meta.recipe_hash.is_empty() && meta.recipe_hash != self.recipe_hash).then(|| {
                format!(
                    "note: {} was written by a different version of this recipe",
                    path.display()
                )
            });
        if meta.epoch_complete {
            self.epoch = meta.epoch;
        } else {
            // Re-enter the interrupted epoch, after the batches already taken.
            self.epoch = meta.epoch.saturating_sub(1);
            self.skip_next = meta.epoch_steps as usize;
            self.skip_next_samples = meta.epoch_samples as usize;
        }
        self.skipped = meta.skipped.clone();
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
    if !r.in_epoch {
        return Ok(());
    }
    r.in_epoch = false;
    host.out.finish_bar();
    let secs = r.epoch_start.elapsed().as_secs_f64();
    let loss = r.epoch_loss / r.epoch_samples.max(1) as f64;
    let rate = r.epoch_samples as f64 / secs.max(1e-9);
    let mut f = Map::new();
    f.insert("run".into(), r.id.into());
    if r.epoch_samples > 0 {
        f.insert("loss".into(), json!(loss));
    }
    f.insert("samples".into(), r.epoch_samples.into());
    f.insert("seconds".into(), json!(secs));
    f.insert("samples_per_s".into(), json!(rate));
    f.insert("data_wait_s".into(), json!(r.epoch_data_wait));
    if crate::memory::HostMemory::is_counting() {
        f.insert("memory_peak".into(), json!(r.epoch_mem_peak));
    }
    if let Some(d) = crate::memory::device::info(r.trainer.device()) {
        f.insert("device_memory_used".into(), json!(d.used()));
        f.insert("device_memory_total".into(), json!(d.total));
    }
    if let Some(peak) = crate::memory::device::pool_peak(r.trainer.device()) {
        // The --mem-limit ballast lives in the pool too; the peak is the run's.
        let ballast = host.ballast.as_ref().map_or(0, |b| b.bytes);
        f.insert(
            "device_memory_peak".into(),
            json!(peak.saturating_sub(ballast)),
        );
    }
    f.insert("lr".into(), json!(r.trainer.learning_rate()));
    host.out.record("epoch", r.trainer.step, r.epoch, f)?;
    host.out.line(&format!(
        "epoch {}/{}  step {}  train loss {loss:.4}  {rate:.0} samples/s  {secs:.2}s",
        r.epoch, r.total_epochs, r.trainer.step
    ));
    Ok(())
}
