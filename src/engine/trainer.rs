//! The trainer: a model's parameters, its optimizer and the training step.
//! It knows nothing about Lua; the host drives it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Module, Tensor, Var};

use super::checkpoint::{self, CheckpointMeta};
use super::loss::{self, CrossEntropy};
use super::optim::{self, OptimSpec, Optimizer};
use super::params::ParamStore;
use super::rng::Rng;
use super::ModelSpec;
use crate::data::Batch;
use crate::memory::oom::{classify, Phase};
use crate::{Error, Result};

pub struct TrainerOptions {
    pub device: Device,
    pub dtype: DType,
    pub seed: u64,
    pub loss: CrossEntropy,
}

impl Default for TrainerOptions {
    fn default() -> Self {
        TrainerOptions {
            device: Device::Cpu,
            dtype: DType::F32,
            seed: 0,
            loss: CrossEntropy::default(),
        }
    }
}

/// Mean loss and accuracy over an evaluation set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Eval {
    pub loss: f64,
    pub accuracy: f64,
    /// Samples evaluated (sequence models: positions).
    pub samples: usize,
}

pub struct Trainer {
    spec: Arc<dyn ModelSpec>,
    store: ParamStore,
    model: Box<dyn Module>,
    optim: Box<dyn Optimizer>,
    optim_spec: OptimSpec,
    optim_desc: String,
    opts: TrainerOptions,
    /// Optimizer steps taken.
    pub step: u64,
}

impl Trainer {
    pub fn new(spec: Arc<dyn ModelSpec>, optim: &OptimSpec, opts: TrainerOptions) -> Result<Self> {
        let store = ParamStore::new(opts.seed);
        let model = spec.build(store.var_builder(opts.dtype, &opts.device))?;
        Ok(Trainer {
            spec,
            store,
            model,
            optim: optim.build(),
            optim_spec: optim.clone(),
            optim_desc: optim.describe(),
            opts,
            step: 0,
        })
    }

    pub fn spec(&self) -> &Arc<dyn ModelSpec> {
        &self.spec
    }
    pub fn params(&self) -> &ParamStore {
        &self.store
    }
    pub fn device(&self) -> &Device {
        &self.opts.device
    }
    /// The optimizer as the recipe configured it.
    pub fn optim_spec(&self) -> &OptimSpec {
        &self.optim_spec
    }
    /// Records a new configuration of the same optimizer (a reload that
    /// changed its lr); the optimizer's state is untouched.
    pub fn set_optim_spec(&mut self, spec: OptimSpec) {
        self.optim_desc = spec.describe();
        self.optim_spec = spec;
    }
    /// Replaces the loss (a reload may change its options).
    pub fn set_loss(&mut self, loss: CrossEntropy) {
        self.opts.loss = loss;
    }
    pub fn loss(&self) -> CrossEntropy {
        self.opts.loss
    }
    pub fn optimizer_description(&self) -> &str {
        &self.optim_desc
    }
    pub fn learning_rate(&self) -> f64 {
        self.optim.learning_rate()
    }
    pub fn set_learning_rate(&mut self, lr: f64) {
        self.optim.set_learning_rate(lr)
    }

    fn inputs(&self, batch: &Batch) -> Result<(Tensor, Tensor)> {
        let dev = &self.opts.device;
        let mut x = batch.x.to_device(dev)?;
        if x.dtype().is_float() && x.dtype() != self.opts.dtype {
            x = x.to_dtype(self.opts.dtype)?;
        }
        Ok((x, batch.y.to_device(dev)?))
    }

    /// Forward, loss, backward and one optimizer update. Returns the loss.
    pub fn train_step(&mut self, batch: &Batch) -> Result<f64> {
        self.train_step_micro(batch, batch.len())
    }

    /// One optimizer update from `batch`, computed in micro-batches of at
    /// most `micro` samples whose gradients are accumulated. Each micro-batch's
    /// mean loss is weighted by its share of the batch, so the optimizer sees
    /// the same mean gradient as the whole batch gives (up to float rounding),
    /// whatever the split. Returns the batch's mean loss.
    pub fn train_step_micro(&mut self, batch: &Batch, micro: usize) -> Result<f64> {
        self.train_step_guarded(batch, micro, &mut |_| Ok(()))
    }

    /// [`Trainer::train_step_micro`] with `guard` called at each phase
    /// boundary: after each micro-batch's forward and backward, and before
    /// the optimizer changes any parameter. An error from `guard` (or a
    /// device OOM, classified here) abandons the step: every tensor of the
    /// attempt is dropped on the way out, and parameters and optimizer state
    /// are as they were, so the same batch can be retried.
    pub fn train_step_guarded(
        &mut self,
        batch: &Batch,
        micro: usize,
        guard: &mut dyn FnMut(Phase) -> Result<()>,
    ) -> Result<f64> {
        let n = batch.len();
        if n == 0 {
            return Err(Error::Data("train step: the batch is empty".into()));
        }
        let micro = micro.clamp(1, n);
        let vars = self.store.vars();
        let mut acc = GradStore::default();
        let mut loss_sum = 0f64;
        let (bx, by) = self.inputs(batch)?;
        for start in (0..n).step_by(micro) {
            let len = micro.min(n - start);
            let (x, y) = if len == n {
                (bx.clone(), by.clone())
            } else {
                (bx.narrow(0, start, len)?, by.narrow(0, start, len)?)
            };
            let weight = len as f64 / n as f64;
            let fwd = |this: &Self| -> Result<Tensor> {
                Ok(this.opts.loss.loss(&this.model.forward(&x)?, &y)?)
            };
            let loss = fwd(self).map_err(|e| classify(e, Phase::Forward))?;
            guard(Phase::Forward)?;
            let grads = (&loss * weight)
                .and_then(|l| l.backward())
                .map_err(|e| classify(e.into(), Phase::Backward))?;
            accumulate(&mut acc, &vars, grads)?;
            guard(Phase::Backward)?;
            // A CPU-GPU sync point: the progress bar wants the number.
            loss_sum += loss.to_dtype(DType::F64)?.to_scalar::<f64>()? * weight;
        }
        guard(Phase::Optimizer)?;
        if let Some(max) = self.optim.clip_grad_norm() {
            optim::clip_grad_norm(&vars, &mut acc, max)
                .map_err(|e| classify(e.into(), Phase::Optimizer))?;
        }
        // From here parameters change one by one: a failure inside the update
        // is not retryable (the run stops with what it has checkpointed).
        self.optim.step(&vars, &acc)?;
        self.step += 1;
        Ok(loss_sum)
    }

    /// Heap bytes (above the level before it) of a forward and backward pass
    /// over the first `n` samples of `batch`; no parameter changes. Needs the
    /// counting allocator. For the memory planner.
    pub fn probe_bytes(&self, batch: &Batch, n: usize) -> Result<usize> {
        let n = n.clamp(1, batch.len());
        let (x, y) = self.inputs(batch)?;
        let (x, y) = (x.narrow(0, 0, n)?, y.narrow(0, 0, n)?);
        let base = crate::memory::HostMemory::current();
        crate::memory::HostMemory::reset_peak();
        {
            let loss = self.opts.loss.loss(&self.model.forward(&x)?, &y)?;
            let _grads = loss.backward()?;
        }
        Ok(crate::memory::HostMemory::peak().saturating_sub(base))
    }

    /// Bytes of optimizer state per parameter byte (AdamW 2, SGD with momentum 1).
    pub fn optimizer_state_factor(&self) -> usize {
        self.optim.state_factor()
    }

    /// A model over detached parameters: no gradient graph is recorded, so
    /// memory does not grow with the amount evaluated.
    fn frozen(&self) -> Result<Box<dyn Module>> {
        Ok(self.spec.build(
            self.store
                .frozen_builder(self.opts.dtype, &self.opts.device),
        )?)
    }

    pub fn evaluate(&self, batches: impl Iterator<Item = Result<Batch>>) -> Result<Eval> {
        let model = self.frozen()?;
        let (mut loss_sum, mut correct, mut count) = (0f64, 0f64, 0usize);
        for batch in batches {
            let batch = batch?;
            let (x, y) = self.inputs(&batch)?;
            let logits = model.forward(&x)?;
            let n = y.elem_count();
            let l = self.opts.loss.loss(&logits, &y)?;
            loss_sum += l.to_dtype(DType::F64)?.to_scalar::<f64>()? * n as f64;
            correct += loss::correct(&logits, &y)?;
            count += n;
        }
        if count == 0 {
            return Err(Error::Data("evaluate: the data set is empty".into()));
        }
        Ok(Eval {
            loss: loss_sum / count as f64,
            accuracy: correct / count as f64,
            samples: count,
        })
    }

    /// Samples `n` tokens after `prompt` from a sequence model.
    pub fn generate(
        &self,
        prompt: &[u32],
        n: usize,
        temperature: f64,
        seed: u64,
    ) -> Result<Vec<u32>> {
        let context = self.spec.context().ok_or_else(|| {
            Error::Config(format!(
                "generate: {} is not a sequence model",
                self.spec.describe()
            ))
        })?;
        if prompt.is_empty() {
            return Err(Error::Config("generate: the prompt is empty".into()));
        }
        let model = self.frozen()?;
        let mut rng = Rng::new(seed);
        let mut ids = prompt.to_vec();
        for _ in 0..n {
            let window = &ids[ids.len().saturating_sub(context)..];
            let x = Tensor::new(window, &self.opts.device)?.unsqueeze(0)?;
            let logits = model.forward(&x)?;
            let last = logits.squeeze(0)?.get(window.len() - 1)?;
            let last: Vec<f64> = last.to_dtype(DType::F64)?.to_vec1()?;
            ids.push(sample(&last, temperature, &mut rng));
        }
        Ok(ids[prompt.len()..].to_vec())
    }

    /// Model and optimizer state, named `model.*` and `optim.*`.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = self
            .store
            .vars()
            .into_iter()
            .map(|(k, v)| (format!("model.{k}"), v.as_tensor().clone()))
            .collect();
        out.extend(
            self.optim
                .state()
                .into_iter()
                .map(|(k, t)| (format!("optim.{k}"), t)),
        );
        out
    }

    pub fn save(&self, path: &Path, meta: &CheckpointMeta) -> Result<()> {
        checkpoint::save(path, self.state(), meta)
    }

    /// Restores weights and optimizer state from a checkpoint.
    pub fn load(&mut self, path: &Path) -> Result<CheckpointMeta> {
        let (tensors, meta) = checkpoint::load(path, &self.opts.device)?;
        if meta.model != self.spec.describe() {
            return Err(Error::Checkpoint {
                path: path.to_path_buf(),
                msg: format!(
                    "it holds `{}`, the recipe builds `{}`",
                    meta.model,
                    self.spec.describe()
                ),
            });
        }
        let mut model = HashMap::new();
        let mut state = HashMap::new();
        for (k, t) in tensors {
            if let Some(name) = k.strip_prefix("model.") {
                model.insert(name.to_string(), t);
            } else if let Some(name) = k.strip_prefix("optim.") {
                state.insert(name.to_string(), t);
            }
        }
        let cerr = |msg: String| Error::Checkpoint {
            path: path.to_path_buf(),
            msg,
        };
        self.store.load(&model).map_err(cerr)?;
        let state = optim::place_state(state, &self.store.vars())?;
        self.optim.load_state(&state)?;
        self.optim.set_learning_rate(meta.lr);
        self.step = meta.step;
        Ok(meta)
    }
}

/// Adds the variables' gradients from `grads` into `acc`. Gradients of
/// intermediate tensors are dropped here, so they do not stay alive while
/// the next micro-batch runs.
fn accumulate(acc: &mut GradStore, vars: &[(String, Var)], mut grads: GradStore) -> Result<()> {
    for (_, v) in vars {
        if let Some(g) = grads.remove(v) {
            let sum = match acc.remove(v) {
                Some(prev) => (prev + g)?,
                None => g,
            };
            acc.insert(v, sum);
        }
    }
    Ok(())
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
