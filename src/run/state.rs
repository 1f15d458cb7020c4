//! A run with no Lua in it: the trainer and its slots (schedule, OOM
//! policy), its place in the data (the cursor), its counters, and the step.
//! The Lua bindings hold one per `taper.run{}`; an embedder can drive one
//! directly (`examples/run_core.rs`).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use super::checks::check;
use super::recovery::{Observer, Recovery, StepOutcome};
use super::window::Window;
use crate::data::Batch;
use crate::engine::checkpoint::EpochTrained;
use crate::engine::loss::Loss;
use crate::engine::schedule::{Schedule, StepPlan};
use crate::engine::{Eval, Trainer};
use crate::memory::HostMemory;
use crate::Result;

/// A run's place in its data: which epoch, and how far into it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cursor {
    /// The epoch in progress, or the last one started (1-based; 0 before any).
    pub epoch: u64,
    pub in_epoch: bool,
    /// Batches of this epoch taken (stepped or skipped).
    pub steps: u64,
    /// Samples of this epoch consumed (stepped or skipped).
    pub samples: u64,
    /// Resuming mid-epoch: batches (generators) and samples (native data)
    /// of the next epoch to skip.
    pub skip_batches: usize,
    pub skip_samples: usize,
    /// Resuming mid-epoch: what the epoch had trained before (its record
    /// goes on from these sums).
    pub trained: EpochTrained,
    /// Samples in the data the epoch in progress reads (native data; from
    /// the checkpoint when resumed), to notice data that changed size.
    pub data_len: Option<u64>,
}

/// What the epoch in progress has measured so far.
#[derive(Debug, Clone)]
pub struct EpochStats {
    /// Sum of batch-mean losses times batch sizes, over trained batches.
    pub loss_sum: f64,
    /// Samples trained on (skipped batches not included).
    pub samples: usize,
    /// Of `samples`, those trained before a resume (not this process's:
    /// left out of the epoch's rate).
    pub resumed_samples: usize,
    pub start: Instant,
    /// Seconds spent waiting for batches.
    pub data_wait: f64,
    /// Highest heap peak of a successful step (counting allocator).
    pub mem_peak: usize,
    /// The micro-batch of the last step trained.
    pub micro_batch: usize,
}

impl Default for EpochStats {
    fn default() -> Self {
        EpochStats {
            loss_sum: 0.0,
            samples: 0,
            resumed_samples: 0,
            start: Instant::now(),
            data_wait: 0.0,
            mem_peak: 0,
            micro_batch: 0,
        }
    }
}

/// A closed epoch, for its record.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochSummary {
    pub epoch: u64,
    pub step: u64,
    /// Mean training loss; None when no batch trained.
    pub loss: Option<f64>,
    /// Samples the epoch trained on, before a resume included.
    pub samples: usize,
    /// Of those, the ones this process trained (the epoch's rate).
    pub samples_here: usize,
    pub seconds: f64,
    pub data_wait: f64,
    pub mem_peak: usize,
    /// The micro-batch of the epoch's last step.
    pub micro_batch: usize,
    pub lr: f64,
}

pub struct Run {
    pub trainer: Trainer,
    /// The OOM slot and the recovery site.
    pub oom: Recovery,
    /// Decides each step's learning rate and micro-batch, when given.
    pub schedule: Option<Rc<RefCell<dyn Schedule>>>,
    /// Micro-batch size when the schedule does not say (None: whole batch).
    pub micro_batch: Option<usize>,
    pub seed: u64,
    /// Hash of the recipe version that runs (see `CheckpointMeta`).
    pub recipe_hash: String,
    pub cursor: Cursor,
    pub stats: EpochStats,
    /// The steps since the last `step` record.
    pub window: Window,
    /// Epochs the loop asked for (0: not in an epoch loop).
    pub total_epochs: u64,
    pub last_eval: Option<Eval>,
    /// The best evaluation so far of a run that keeps its best model.
    pub best: Option<crate::engine::best::Best>,
    /// Batches an OOM policy skipped: (epoch, batch position in the epoch).
    pub skipped: Vec<(u64, u64)>,
    /// The schedule's plan for (step, epoch), computed before its batch was
    /// drawn (a batch-size schedule decides the batch).
    pub pending: Option<(u64, u64, StepPlan)>,
    /// The vocabulary of a text run's data, saved with its checkpoints.
    pub vocab: Option<std::sync::Arc<crate::data::Vocab>>,
    /// The class names of a classifier's data (an image folder's), saved
    /// with its checkpoints and exports.
    pub classes: Option<Vec<String>>,
    /// How an image file becomes the model's input (an image folder's
    /// reading), saved with checkpoints and exports.
    pub image_input: Option<crate::data::ImageInput>,
    /// How a CSV row becomes the model's input, saved likewise.
    pub table_input: Option<crate::data::TableInput>,
    /// Other data's standardization, saved likewise.
    pub sample_input: Option<crate::data::SampleInput>,
    /// How a safetensors file's or NumPy array's sample becomes the
    /// model's input, saved with checkpoints.
    pub array_input: Option<crate::data::ArrayInput>,
}

impl Run {
    pub fn new(trainer: Trainer, seed: u64) -> Run {
        Run {
            trainer,
            oom: Recovery::default(),
            schedule: None,
            micro_batch: None,
            seed,
            recipe_hash: String::new(),
            cursor: Cursor::default(),
            stats: EpochStats::default(),
            window: Window::default(),
            total_epochs: 0,
            last_eval: None,
            best: None,
            skipped: Vec::new(),
            pending: None,
            vocab: None,
            classes: None,
            image_input: None,
            table_input: None,
            sample_input: None,
            array_input: None,
        }
    }

    /// Where the next step's plan is asked: (steps taken, epoch).
    pub fn plan_key(&self) -> (u64, u64) {
        (self.trainer.step, self.cursor.epoch.max(1))
    }

    /// The plan already computed for the next step, if any.
    pub fn pending_plan(&self) -> Option<StepPlan> {
        match self.pending {
            Some((step, epoch, plan)) if (step, epoch) == self.plan_key() => Some(plan),
            _ => None,
        }
    }

    /// The schedule's plan for the next step, computed once per step (a
    /// schedule may keep state). The Lua bindings compute it without
    /// holding the run (a Lua schedule may read it) and store it in
    /// `pending`.
    pub fn plan(&mut self) -> Result<StepPlan> {
        if let Some(plan) = self.pending_plan() {
            return Ok(plan);
        }
        let (step, epoch) = self.plan_key();
        let plan = match &self.schedule {
            Some(s) => s.borrow_mut().plan(step, epoch)?,
            None => StepPlan::default(),
        };
        self.pending = Some((step, epoch, plan));
        Ok(plan)
    }

    /// One training step on `batch` with the next step's plan: learning
    /// rate, micro-batch, OOM recovery, and the cursor and counters. After a
    /// stop was asked for (a signal), an `Error::Interrupted` instead.
    /// Returns the batch's mean loss, or `None` when the policy skipped it.
    pub fn step(&mut self, batch: &Batch, observe: &mut Observer<'_>) -> Result<Option<f64>> {
        // A signal asked for a stop: the last step is the run's last.
        super::interrupt::check()?;
        let plan = self.plan()?;
        if let Some(lr) = plan.lr {
            super::check_lr(lr).map_err(|why| {
                let schedule = self.schedule.as_ref().map(|s| s.borrow().describe());
                crate::Error::Script(format!(
                    "the schedule ({}) planned step {}: {why}",
                    schedule.unwrap_or_default(),
                    self.trainer.step + 1
                ))
            })?;
            self.trainer.set_learning_rate(lr);
        }
        self.check(batch)?;
        let micro = plan.micro_batch.or(self.micro_batch).unwrap_or(batch.len());
        let epoch = self.cursor.epoch;
        let started = Instant::now();
        let outcome = self
            .oom
            .train_step(&mut self.trainer, batch, micro, epoch, observe)?;
        self.window.step_seconds += started.elapsed().as_secs_f64();
        let n = batch.len();
        self.cursor.steps += 1;
        self.cursor.samples += n as u64;
        match outcome {
            StepOutcome::Trained { loss, micro_batch } => {
                let peak = HostMemory::peak();
                self.stats.mem_peak = self.stats.mem_peak.max(peak);
                self.stats.loss_sum += loss * n as f64;
                self.stats.samples += n;
                self.stats.micro_batch = micro_batch;
                let w = &mut self.window;
                w.steps += 1;
                w.loss_sum += loss * n as f64;
                w.samples += n as u64;
                // Positions of a sequence model's labels, up to each
                // sample's last labelled one (not a conversation's
                // padding); a regression's several targets per sample are
                // not tokens.
                w.tokens += match batch.y.dtype().is_float() {
                    true => n as u64,
                    false => crate::engine::ignored::tokens(&batch.y)
                        .unwrap_or_else(|_| batch.y.elem_count())
                        as u64,
                };
                w.mem_peak = w.mem_peak.max(peak);
                w.micro_batch = micro_batch;
                self.check_finite(loss)?;
                Ok(Some(loss))
            }
            StepOutcome::Skipped => {
                self.window.skipped += 1;
                // Recorded where the cursor was: in checkpoints too.
                self.skipped.push((epoch, self.cursor.steps - 1));
                Ok(None)
            }
        }
    }

    /// Mean loss and accuracy over `batches` with OOM recovery; `objective`
    /// defaults to the run's own loss when that is not plain cross-entropy.
    pub fn evaluate(
        &mut self,
        batches: impl Iterator<Item = Result<Batch>>,
        objective: Option<&Loss>,
        observe: &mut Observer<'_>,
    ) -> Result<Eval> {
        let own = match self.trainer.loss() {
            Loss::CrossEntropy(_) | Loss::Mse | Loss::Bce(_) => None,
            other => Some(other.clone()),
        };
        let objective = objective.or(own.as_ref());
        let epoch = self.cursor.epoch;
        let interface = self.trainer.spec().interface();
        let loss = self.trainer.loss().base();
        // A signal stops a long evaluation between its batches: its result
        // would be partial, and the run's state is at a step boundary.
        let batches = batches.map(|b| {
            super::interrupt::check()?;
            let b = b?;
            check(&interface, &loss, &b)?;
            Ok(b)
        });
        let ev = self
            .oom
            .evaluate(&self.trainer, batches, objective, epoch, observe)?;
        self.last_eval = Some(ev.clone());
        Ok(ev)
    }

    /// Starts the next epoch, counting the batches a resume skips as taken
    /// (the data feed consumes `skip_batches`/`skip_samples` when it starts).
    pub fn begin_epoch(&mut self) -> u64 {
        let c = &mut self.cursor;
        c.epoch += 1;
        c.in_epoch = true;
        c.steps = c.skip_batches as u64;
        c.samples = c.skip_samples as u64;
        let before = std::mem::take(&mut c.trained);
        self.stats = EpochStats {
            loss_sum: before.loss_sum,
            samples: before.samples as usize,
            resumed_samples: before.samples as usize,
            ..EpochStats::default()
        };
        c.epoch
    }

    /// Closes the epoch in progress; None when none is.
    pub fn end_epoch(&mut self) -> Option<EpochSummary> {
        if !self.cursor.in_epoch {
            return None;
        }
        self.cursor.in_epoch = false;
        let s = &self.stats;
        Some(EpochSummary {
            epoch: self.cursor.epoch,
            step: self.trainer.step,
            loss: (s.samples > 0).then(|| s.loss_sum / s.samples as f64),
            samples: s.samples,
            samples_here: s.samples - s.resumed_samples,
            seconds: s.start.elapsed().as_secs_f64(),
            data_wait: s.data_wait,
            mem_peak: s.mem_peak,
            micro_batch: s.micro_batch,
            lr: self.trainer.learning_rate(),
        })
    }
}
