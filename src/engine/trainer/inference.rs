//! Evaluation and sampling over a trainer's (master) parameters.

use candle_core::{DType, Module, Tensor};

use super::super::loss::{self, Loss};
use super::super::rng::Rng;
use super::scores::{EvalSums, MAX_CONFUSION_CLASSES};
use super::Eval;
use super::Trainer;
use crate::data::Batch;
use crate::memory::oom::{classify, Phase};
use crate::{Error, Result};

impl Trainer {
    /// A model over detached parameters: no gradient graph is recorded, so
    /// memory does not grow with the amount evaluated.
    pub fn frozen(&self) -> Result<Box<dyn Module>> {
        Ok(self.spec.build(
            self.store
                .frozen_builder(self.opts.dtype, &self.opts.device),
        )?)
    }

    /// Cross-entropy and accuracy over `batches`, and the run's own
    /// objective when it is another loss (distillation).
    /// A frozen copy of the model as it is now: later updates do not reach
    /// it (the frozen model of [`Trainer::evaluate`] shares the weights'
    /// storage, which the optimizer updates in place).
    pub fn snapshot(&self) -> Result<Box<dyn Module>> {
        let vb = self
            .store
            .snapshot_builder(self.opts.dtype, &self.opts.device)?;
        Ok(self.spec.build(vb)?)
    }

    pub fn evaluate(&self, batches: impl Iterator<Item = Result<Batch>>) -> Result<Eval> {
        let objective = match &self.opts.loss {
            Loss::CrossEntropy(_) | Loss::Mse | Loss::Bce(_) => None,
            other => Some(other.clone()),
        };
        self.evaluate_with(batches, objective.as_ref())
    }

    /// [`Trainer::evaluate`], also averaging `objective` (for example a
    /// distillation loss against a teacher, for a run that trains without one).
    /// With no OOM recovery: `run::Recovery::evaluate` is the same
    /// evaluation with it.
    pub fn evaluate_with(
        &self,
        batches: impl Iterator<Item = Result<Batch>>,
        objective: Option<&Loss>,
    ) -> Result<Eval> {
        let model = self.frozen()?;
        let mut total = self.eval_sums();
        for batch in batches {
            let batch = batch?;
            total.add(&self.eval_batch(
                &*model,
                &batch,
                batch.len(),
                objective,
                &mut |_| Ok(()),
            )?);
        }
        total.eval(objective.is_some())
    }

    /// An evaluation's sums before its first batch: a classifier of one
    /// label per sample and at most [`MAX_CONFUSION_CLASSES`] classes keeps a
    /// confusion matrix; a sequence model (a label per position, a class per
    /// token) does not; a regression keeps sums for each of its targets
    /// (the model's outputs).
    pub fn eval_sums(&self) -> EvalSums {
        let i = self.spec.interface();
        let loss = self.opts.loss.base();
        match (i.classes, i.vocab, loss.regression(), loss.multi_label()) {
            (Some(k), None, _, true) => EvalSums::with_labels(k),
            (Some(k), None, false, _) if k <= MAX_CONFUSION_CLASSES => EvalSums::with_classes(k),
            (Some(k), None, true, _) => EvalSums::with_targets(k),
            _ => EvalSums::default(),
        }
    }

    /// Sums over one evaluation batch, taken `piece` samples at a time.
    /// Device OOMs are classified as [`Phase::Eval`], and `guard` is called
    /// after each piece; any error abandons the batch with nothing kept.
    pub fn eval_batch(
        &self,
        model: &dyn Module,
        batch: &Batch,
        piece: usize,
        objective: Option<&Loss>,
        guard: &mut dyn FnMut(Phase) -> Result<()>,
    ) -> Result<EvalSums> {
        let eval = |e: candle_core::Error| classify(e.into(), Phase::Eval);
        let (bx, by) = self
            .inputs_as(batch, self.opts.dtype)
            .map_err(|e| classify(e, Phase::Eval))?;
        let n = batch.len();
        let piece = piece.clamp(1, n.max(1));
        let mut sums = self.eval_sums();
        for start in (0..n).step_by(piece) {
            let len = piece.min(n - start);
            let (x, y) = if len == n {
                (bx.clone(), by.clone())
            } else {
                (
                    bx.narrow(0, start, len).map_err(eval)?,
                    by.narrow(0, start, len).map_err(eval)?,
                )
            };
            // A sequence's ignored positions are not scored (nor counted),
            // and a causal model's last ones, when no sample labels them,
            // not computed.
            let host_y = batch.y.narrow(0, start, len).map_err(eval)?;
            let (x, y, host_y) = self.labelled_part(x, y, host_y).map_err(eval)?;
            let logits = model.forward(&x).map_err(eval)?;
            let count = match crate::engine::ignored::per_sample(&host_y).map_err(eval)? {
                Some(per) => per.iter().sum(),
                None => y.elem_count(),
            };
            let base = self.opts.loss.base();
            let l = base.loss(&x, &logits, &y).map_err(eval)?;
            sums.loss += scalar(&l).map_err(eval)? * count as f64;
            if let Some(o) = objective {
                let v = o.loss(&x, &logits, &y).map_err(eval)?;
                sums.objective += scalar(&v).map_err(eval)? * count as f64;
            }
            if base.regression() {
                sums.add_errors(&logits, &y).map_err(eval)?;
            } else if base.multi_label() {
                let c = crate::engine::bce::label_counts(&logits, &y).map_err(eval)?;
                sums.correct += c.labels.iter().map(|l| l[0] + l[3]).sum::<f64>();
                sums.labels.add(&c);
            } else {
                sums.correct += match sums.add_predictions(&logits, &y).map_err(eval)? {
                    Some(right) => right,
                    None => loss::correct(&logits, &y).map_err(eval)?,
                };
            }
            sums.count += count;
            guard(Phase::Eval)?;
        }
        Ok(sums)
    }

    /// Samples `n` tokens after `prompt` from a sequence model. `stop` is
    /// asked before each token: its error ends the sampling (a signal's stop
    /// request, from the caller; the engine knows no signals).
    pub fn generate(
        &self,
        prompt: &[u32],
        n: usize,
        temperature: f64,
        seed: u64,
        stop: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<u32>> {
        self.generate_until(prompt, n, None, temperature, seed, stop)
    }

    /// [`Trainer::generate`], ending early at `end` (a chat's end-of-reply
    /// token), which is not returned.
    pub fn generate_until(
        &self,
        prompt: &[u32],
        n: usize,
        end: Option<u32>,
        temperature: f64,
        seed: u64,
        stop: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<u32>> {
        let context = self.spec.context().ok_or_else(|| {
            Error::Config(format!(
                "generate: {} is not a sequence model",
                self.spec.describe()
            ))
        })?;
        if !self.spec.causal() {
            return Err(Error::Config(format!(
                "generate: {} does not predict the next token (generate from a language model: taper.model.gpt, taper.model.llama_gguf)",
                self.spec.describe()
            )));
        }
        if prompt.is_empty() {
            return Err(Error::Config("generate: the prompt is empty".into()));
        }
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(Error::Config(format!(
                "generate: temperature {temperature}: it must be 0 (the likeliest token) or more"
            )));
        }
        if let Some(v) = self.spec.interface().vocab {
            if let Some(id) = prompt.iter().find(|&&id| id as usize >= v) {
                return Err(Error::Config(format!(
                    "generate: prompt id {id} is out of range: the model's vocabulary has {v} ids{}",
                    crate::engine::model::from_zero(v)
                )));
            }
        }
        let model = self.frozen()?;
        let mut rng = Rng::new(seed);
        let mut ids = prompt.to_vec();
        for _ in 0..n {
            stop()?;
            let window = &ids[ids.len().saturating_sub(context)..];
            let x = Tensor::new(window, &self.opts.device)?.unsqueeze(0)?;
            let logits = model.forward(&x)?;
            let last = logits.squeeze(0)?.get(window.len() - 1)?;
            let last: Vec<f64> = last.to_dtype(DType::F64)?.to_vec1()?;
            let id = sample(&last, temperature, &mut rng);
            if Some(id) == end {
                break;
            }
            ids.push(id);
        }
        Ok(ids[prompt.len()..].to_vec())
    }
}

fn scalar(t: &Tensor) -> candle_core::Result<f64> {
    t.to_dtype(DType::F64)?.to_scalar::<f64>()
}

fn sample(logits: &[f64], temperature: f64, rng: &mut Rng) -> u32 {
    if temperature <= 0.0 {
        return argmax(logits);
    }
    let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = logits
        .iter()
        .map(|l| ((l - max) / temperature).exp())
        .collect();
    let mut r = rng.uniform() * w.iter().sum::<f64>();
    for (i, wi) in w.iter().enumerate() {
        r -= wi;
        if r <= 0.0 {
            return i as u32;
        }
    }
    (w.len() - 1) as u32
}

fn argmax(v: &[f64]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}
