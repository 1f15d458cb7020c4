//! A run with no Lua in it: the trainer and its slots (schedule, OOM
//! policy), its place in the data (the cursor), its counters, and the step.
//! The Lua bindings hold one per `taper.run{}`; an embedder can drive one
//! directly (`examples/run_core.rs`).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use super::recovery::{Observer, Recovery, StepOutcome};
use super::window::Window;
use crate::data::Batch;
use crate::engine::checkpoint::EpochTrained;
use crate::engine::loss::Loss;
use crate::engine::model::{check_batch, Interface};
use crate::engine::schedule::{Schedule, StepPlan};
use crate::engine::{Eval, Trainer};
use crate::memory::HostMemory;
use crate::Result;

/// How often a run checks that its weights are finite (see `Run::step`).
pub const CHECK_WEIGHTS_EVERY: u64 = 10;

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

    /// A step whose update went in with a NaN or infinite loss has spoiled
    /// the weights (the gradients were not finite either): the run stops
    /// there instead of training on to the next checkpoint, which would
    /// refuse to save them. An f16 step that the loss scaler skipped
    /// changed nothing, and is not divergence.
    /// A NaN can also spoil weights whose outputs hide it (a ReLU maps NaN
    /// to 0, as candle's does), so every [`CHECK_WEIGHTS_EVERY`] steps the
    /// weights themselves are checked: one pass over them and one read.
    fn check_finite(&self, loss: f64) -> Result<()> {
        let step = self.trainer.step;
        let at = format!(
            "step {step} (epoch {}, batch {})",
            self.cursor.epoch, self.cursor.steps
        );
        let what = if self.trainer.overflowed() {
            return Ok(());
        } else if !loss.is_finite() {
            format!("the loss of {at} is {loss}")
        } else if step.is_multiple_of(CHECK_WEIGHTS_EVERY) && !self.trainer.params().all_finite()? {
            format!("the weights hold NaN or infinite values after {at}, whose loss was {loss}")
        } else {
            return Ok(());
        };
        Err(crate::Error::Diverged(format!(
            "{what}: the training diverged (lower the learning rate, now {}, clip gradients with clip_grad_norm, or look for extreme values in the data)",
            short(self.trainer.learning_rate())
        )))
    }

    /// Checks `batch` against the model (see [`check_batch`]); an error
    /// says which batch of the epoch it is (a generator's samples are
    /// numbered within their batch).
    fn check(&self, batch: &Batch) -> Result<()> {
        self.fits(batch).map_err(|e| match e {
            crate::Error::Data(why) => crate::Error::Data(format!(
                "epoch {}, batch {}: {why}",
                self.cursor.epoch,
                self.cursor.steps + 1
            )),
            other => other,
        })
    }

    /// Checks `batch` against the model and loss (see [`check_batch`]): a
    /// data error naming the sample.
    pub(crate) fn fits(&self, batch: &Batch) -> Result<()> {
        check(&self.trainer.spec().interface(), self.trainer.loss(), batch)
    }

    /// Whether data whose class names are `classes` (`name` says whose, as
    /// "val's") is labelled as the run's training data: an error naming the
    /// difference when both know their classes and they differ (its labels
    /// would mean other classes).
    pub fn check_classes(&self, name: &str, classes: Option<&[String]>) -> Result<()> {
        let (Some(ours), Some(theirs)) = (&self.classes, classes) else {
            return Ok(());
        };
        match crate::data::class_difference(("the run's", ours), (name, theirs)) {
            None => Ok(()),
            Some(why) => Err(crate::Error::Data(format!(
                "{why}, so its labels would mean other classes; label it by the run's classes: taper.data.images{{ path = ..., classes = train:classes() }}"
            ))),
        }
    }

    /// Whether table data read as `input` (`name` says whose) gives the
    /// model the inputs the run's training data did: an error naming the
    /// first that differs (a column of categories read with other
    /// categories would put each in another input).
    pub fn check_inputs(&self, name: &str, input: Option<&crate::data::TableInput>) -> Result<()> {
        let (Some(ours), Some(theirs)) = (&self.table_input, input) else {
            return Ok(());
        };
        if let Some(why) = crate::data::input_difference(("the run's", ours), (name, theirs)) {
            return Err(crate::Error::Data(format!(
                "{why}; read it as the run's training data, its columns of categories with the training data's categories: taper.data.csv{{ path = ..., categorical = train:categories() }}"
            )));
        }
        match crate::data::target_difference(("the run's", ours), (name, theirs)) {
            None => Ok(()),
            Some(why) if ours.label_sep.is_some() => Err(crate::Error::Data(format!(
                "{why}: the model's outputs are the run's labels, in its order; read it with the training data's: taper.data.csv{{ path = ..., label_sep = ..., classes = train:classes() }}"
            ))),
            Some(why) => Err(crate::Error::Data(format!(
                "{why}: the model's outputs are the run's targets, in its order; read it with the run's `target`"
            ))),
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

/// A multi-label batch's targets are 0 to 1 (a no, a yes, or a soft label
/// between): else a data error naming the first sample that is not.
fn labels_are_yes_or_no(batch: &Batch) -> Result<()> {
    let y: Vec<f32> = batch
        .y
        .flatten_all()?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1()?;
    let per = (y.len() / batch.len().max(1)).max(1);
    let Some(at) = y.iter().position(|v| !(0.0..=1.0).contains(v)) else {
        return Ok(());
    };
    let row = at / per;
    let sample = batch
        .indices
        .get(row)
        .map_or(String::new(), |i| format!("sample {i} "));
    Err(crate::Error::Data(format!(
        "{sample}(row {row} of the batch): label {} is {}, and the loss (bce) takes 0 (no) to 1 (yes): {}",
        at % per,
        y[at],
        "a target standardized by data:standardize() (standardize the features alone: `train:standardize{ target = false }`), or a column that is not yes/no"
    )))
}

/// A batch that does not fit the model, or whose targets are not its
/// loss's: a data error naming the sample.
fn check(interface: &Interface, loss: &Loss, batch: &Batch) -> Result<()> {
    if let Some(why) = loss.refuses(&batch.y) {
        return Err(crate::Error::Data(why));
    }
    if let (true, Some(outputs)) = (loss.float_targets(), interface.classes) {
        let per = batch.y.elem_count() / batch.len().max(1);
        if per != outputs {
            let what = if loss.multi_label() {
                "label"
            } else {
                "target value"
            };
            return Err(crate::Error::Data(format!(
                "each sample has {per} {what}{}, and the model gives {outputs} (its `outputs`)",
                if per == 1 { "" } else { "s" }
            )));
        }
    }
    if loss.multi_label() {
        labels_are_yes_or_no(batch)?;
    }
    match check_batch(interface, &batch.x, &batch.y)? {
        Ok(()) => Ok(()),
        Err((None, why)) => Err(crate::Error::Data(why)),
        Err((Some(row), why)) => Err(crate::Error::Data(match batch.indices.get(row) {
            Some(i) => format!("sample {i} (row {row} of the batch): {why}"),
            None => format!("row {row} of the batch: {why}"),
        })),
    }
}

/// A number as a person writes it: 0.003 and 1e30, not
/// 1000000000000000000000000000000.
fn short(x: f64) -> String {
    let a = x.abs();
    if a != 0.0 && !(1e-4..1e6).contains(&a) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}
