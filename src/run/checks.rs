//! What a run checks as it goes: that its loss and weights are finite,
//! and that a batch, or data to evaluate, fits the model and the run's
//! training data (its classes, its inputs, its targets).

use super::state::Run;
use crate::data::Batch;
use crate::engine::loss::Loss;
use crate::engine::model::{check_batch, Interface};
use crate::Result;

/// How often a run checks that its weights are finite (see `Run::step`).
pub const CHECK_WEIGHTS_EVERY: u64 = 10;

impl Run {
    /// A step whose update went in with a NaN or infinite loss has spoiled
    /// the weights (the gradients were not finite either): the run stops
    /// there instead of training on to the next checkpoint, which would
    /// refuse to save them. An f16 step that the loss scaler skipped
    /// changed nothing, and is not divergence.
    /// A NaN can also spoil weights whose outputs hide it (a ReLU maps NaN
    /// to 0, as candle's does), so every [`CHECK_WEIGHTS_EVERY`] steps the
    /// weights themselves are checked: one pass over them and one read.
    pub(super) fn check_finite(&self, loss: f64) -> Result<()> {
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
    pub(super) fn check(&self, batch: &Batch) -> Result<()> {
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
pub(super) fn check(interface: &Interface, loss: &Loss, batch: &Batch) -> Result<()> {
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
