//! The trainer: a model's parameters, its optimizer and the training step.
//! It knows nothing about Lua; the host drives it.

mod inference;
mod state;

pub use inference::EvalSums;

use std::collections::HashSet;
use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};

use super::loss::Loss;
use super::model::TrainModule;
use super::optim::{self, OptimSpec, Optimizer};
use super::params::ParamStore;
use super::precision::{Mixed, Precision};
use super::prune::Masks;
use super::ModelSpec;
use crate::data::Batch;
use crate::memory::oom::{classify, is_device_oom, Phase};
use crate::{Error, Result};

pub struct TrainerOptions {
    pub device: Device,
    pub dtype: DType,
    pub seed: u64,
    pub loss: Loss,
}

impl Default for TrainerOptions {
    fn default() -> Self {
        TrainerOptions {
            device: Device::Cpu,
            dtype: DType::F32,
            seed: 0,
            loss: Loss::default(),
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
    /// The mean of another objective when one was asked for, or the run's
    /// training loss when it is not plain cross-entropy (distillation).
    pub objective: Option<f64>,
}

pub struct Trainer {
    spec: Arc<dyn ModelSpec>,
    store: ParamStore,
    model: Box<dyn TrainModule>,
    optim: Box<dyn Optimizer>,
    optim_spec: OptimSpec,
    optim_desc: String,
    opts: TrainerOptions,
    /// The low-precision working copy, when forward and backward run in
    /// bf16 or f16 (`store` then holds the f32 masters).
    mixed: Option<Mixed>,
    /// Set when the last step's update was skipped for non-finite
    /// gradients (f16 loss scaling): the new loss scale.
    overflow: Option<f64>,
    /// Pruning masks, applied after every update.
    masks: Masks,
    /// Recompute every n-th block in the backward (0: none).
    recompute: usize,
    /// Where the optimizer's state goes when it is offloaded.
    offload_place: super::optim::offload::Place,
    /// Optimizer steps taken.
    pub step: u64,
}

impl Trainer {
    pub fn new(spec: Arc<dyn ModelSpec>, optim: &OptimSpec, opts: TrainerOptions) -> Result<Self> {
        let store = ParamStore::new(opts.seed);
        store.insert_initial(spec.initial_params()?, opts.dtype, &opts.device)?;
        let model = spec.build_train(store.var_builder(opts.dtype, &opts.device))?;
        Ok(Trainer {
            spec,
            store,
            model,
            optim: optim.build(),
            optim_spec: optim.clone(),
            optim_desc: optim.describe(),
            opts,
            mixed: None,
            overflow: None,
            masks: Masks::default(),
            recompute: 0,
            offload_place: super::optim::offload::Place::Host,
            step: 0,
        })
    }

    /// The type forward and backward run in.
    pub fn precision(&self) -> Precision {
        self.mixed.as_ref().map_or(Precision::F32, |m| m.precision)
    }

    /// Switches forward and backward to `p` (from the next step on; an OOM
    /// policy may do it between attempts at a batch). The master weights and
    /// the optimizer state stay as they are.
    pub fn set_precision(&mut self, p: Precision) -> Result<()> {
        if p == self.precision() {
            return Ok(());
        }
        let dev = self.opts.device.clone();
        if p != Precision::F32 && self.opts.dtype != DType::F32 {
            return Err(Error::Config(format!(
                "precision {}: the model's weights are {:?}, mixed precision needs f32 masters",
                p.name(),
                self.opts.dtype
            )));
        }
        let mixed = match p.low() {
            None => None,
            Some(_) => Some(Mixed::new(&self.store, p)?),
        };
        self.model = match &mixed {
            Some(m) => self
                .spec
                .build_train(m.work.var_builder(m.work_dtype(), &dev))?,
            None => self
                .spec
                .build_train(self.store.var_builder(self.opts.dtype, &dev))?,
        };
        self.mixed = mixed;
        self.model.set_recompute(self.recompute);
        Ok(())
    }

    /// Recompute every `every`-th repeated block (a GPT's transformer
    /// blocks) in the backward instead of keeping its activations; 0 keeps
    /// them all. From the next attempt on; the gradients are the same.
    pub fn set_recompute(&mut self, every: usize) -> Result<()> {
        if !self.model.set_recompute(every) && every > 0 {
            return Err(Error::Config(format!(
                "recompute: {} has no repeated blocks to recompute",
                self.spec.describe()
            )));
        }
        self.recompute = every;
        Ok(())
    }

    /// Every how many blocks the backward recomputes (0: none).
    pub fn recompute(&self) -> usize {
        self.recompute
    }

    /// Keeps the optimizer's state (AdamW's f32 moments) out of the memory
    /// that runs out (pinned host memory for a CUDA model, a file for a CPU
    /// one or in a folder given), or brings it back; what exists moves now.
    /// The updates are the same, bitwise on the CPU.
    pub fn set_offload(&mut self, on: bool) -> Result<()> {
        if on == self.offload() {
            return Ok(());
        }
        let place = on.then(|| self.offload_place.clone());
        if !self.optim.set_offload(place)? && on {
            return Err(Error::Config(format!(
                "offload: {} keeps its state in memory only (AdamW's moments can be offloaded)",
                self.optim.kind()
            )));
        }
        Ok(())
    }

    /// Where offloaded state goes (host memory unless set).
    pub fn set_offload_place(&mut self, place: super::optim::offload::Place) {
        self.offload_place = place;
    }

    /// Whether the optimizer's state is offloaded.
    pub fn offload(&self) -> bool {
        self.optim.offload().is_some()
    }

    /// Magnitude-prunes the named parameters to `sparsity` (per tensor, or
    /// over all of them at once if `global`); the masks stay through
    /// training and in checkpoints. Returns (pruned, total) weights.
    pub fn prune(
        &mut self,
        names: &[String],
        sparsity: f64,
        global: bool,
    ) -> Result<(usize, usize)> {
        let vars: Vec<_> = self
            .store
            .vars()
            .into_iter()
            .filter(|(k, _)| names.contains(k))
            .collect();
        let counts = self.masks.prune(&vars, sparsity, global)?;
        if let Some(m) = &self.mixed {
            m.sync(&self.store.vars())?;
        }
        Ok(counts)
    }

    /// The new loss scale if the last step skipped its update (f16 with
    /// non-finite gradients); cleared by reading.
    pub fn take_overflow(&mut self) -> Option<f64> {
        self.overflow.take()
    }

    /// The current f16 loss scale, if any.
    pub fn loss_scale(&self) -> Option<f64> {
        self.mixed.as_ref()?.scaler.as_ref().map(|s| s.scale)
    }

    /// The variables forward and backward differentiate: the working copy
    /// under mixed precision, else the parameters themselves.
    fn work_vars(&self) -> Vec<(String, Var)> {
        match &self.mixed {
            Some(m) => m.work.vars(),
            None => self.store.vars(),
        }
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
    pub fn set_loss(&mut self, loss: Loss) {
        self.opts.loss = loss;
    }
    pub fn loss(&self) -> &Loss {
        &self.opts.loss
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

    /// A batch on the device, float inputs in the training model's dtype.
    fn inputs(&self, batch: &Batch) -> Result<(Tensor, Tensor)> {
        let dtype = self
            .mixed
            .as_ref()
            .map_or(self.opts.dtype, |m| m.work_dtype());
        self.inputs_as(batch, dtype)
    }

    fn inputs_as(&self, batch: &Batch, dtype: DType) -> Result<(Tensor, Tensor)> {
        let dev = &self.opts.device;
        let mut x = batch.x.to_device(dev)?;
        if x.dtype().is_float() && x.dtype() != dtype {
            x = x.to_dtype(dtype)?;
        }
        Ok((x, batch.y.to_device(dev)?))
    }

    /// The loss of the training model on `x`; in f32 under mixed precision.
    fn train_loss(&self, x: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
        let mut logits = None;
        if let Loss::CrossEntropy(c) = &self.opts.loss {
            // On CUDA the fused kernels also take the unchunked loss, as one
            // chunk: candle's composed cross-entropy over GPT-2's full
            // logits cost 79 ms of a 134 ms step (`scripts/gpu-check.sh
            // bench`, H100).
            let cuda = self.opts.device.is_cuda();
            if c.chunk > 0 || cuda {
                if let Some((h, head)) = self.model.hidden_and_head(x)? {
                    if crate::kernels::covers(&h) {
                        let d = h.dim(candle_core::D::Minus1)?;
                        let h = h.reshape(((), d))?;
                        return crate::kernels::chunked_cross_entropy(
                            &h,
                            &head,
                            y,
                            if c.chunk > 0 { c.chunk } else { usize::MAX },
                            c.label_smoothing,
                        );
                    }
                    // No fused path: the full logits from the same hidden
                    // states, rather than a second forward pass.
                    logits = Some(h.broadcast_matmul(&head.t()?)?);
                }
            }
        }
        let logits = match logits {
            Some(l) => l,
            None => self.model.forward(x)?,
        };
        let logits = match &self.mixed {
            Some(_) => logits.to_dtype(DType::F32)?,
            None => logits,
        };
        self.opts.loss.loss(x, &logits, y)
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
    /// boundary: after the upload, after each micro-batch's forward,
    /// backward and accumulation, and before the optimizer changes any
    /// parameter. An error from `guard` (or a device OOM, classified here
    /// by phase) abandons the step: every tensor of the attempt is dropped
    /// on the way out, and parameters and optimizer state are as they were,
    /// so the same batch can be retried.
    pub fn train_step_guarded(
        &mut self,
        batch: &Batch,
        micro: usize,
        guard: &mut dyn FnMut(Phase) -> Result<()>,
    ) -> Result<f64> {
        let n = batch.len();
        let grads = self.local_grads(batch, (0, n), n, micro, guard)?;
        let ready = self.prepare_update(grads)?;
        guard(Phase::Optimizer)?;
        self.commit_update(ready)
    }

    /// The upload, forward, backward and accumulation of a step over the
    /// rows `[start, start + len)` of `batch`, in micro-batches of at most
    /// `micro`, each weighted by its share of `total` samples (the global
    /// batch: ranks of a data-parallel run sum their shares). No parameter
    /// changes; `guard` is called at each phase boundary.
    pub fn local_grads(
        &self,
        batch: &Batch,
        (start, len): (usize, usize),
        total: usize,
        micro: usize,
        guard: &mut dyn FnMut(Phase) -> Result<()>,
    ) -> Result<Grads> {
        if batch.is_empty() || total == 0 {
            return Err(Error::Data("train step: the batch is empty".into()));
        }
        let mut grads = Grads {
            acc: GradStore::default(),
            loss_sum: LossSum::default(),
        };
        if len == 0 {
            // A rank whose shard of a small batch is empty adds nothing.
            return Ok(grads);
        }
        let micro = micro.clamp(1, len);
        let vars = self.work_vars();
        let scale = self.mixed.as_ref().map_or(1.0, |m| m.loss_scale());
        let (bx, by) = self.inputs(batch).map_err(|e| classify(e, Phase::Upload))?;
        guard(Phase::Upload)?;
        for from in (start..start + len).step_by(micro) {
            let m = micro.min(start + len - from);
            let (x, y) = if m == bx.dim(0)? {
                (bx.clone(), by.clone())
            } else {
                (bx.narrow(0, from, m)?, by.narrow(0, from, m)?)
            };
            let weight = m as f64 / total as f64;
            let loss = self
                .train_loss(&x, &y)
                .map_err(|e| classify(e.into(), Phase::Forward))?;
            guard(Phase::Forward)?;
            let g = (&loss * (weight * scale))
                .and_then(|l| l.backward())
                .and_then(|mut g| super::recompute::merge_parameter_grads(&mut g).map(|()| g))
                .map_err(|e| {
                    super::recompute::discard_parameter_grads();
                    classify(e.into(), Phase::Backward)
                })?;
            guard(Phase::Backward)?;
            accumulate(&mut grads.acc, &vars, g).map_err(|e| classify(e, Phase::Accumulate))?;
            // Summed on the device: reading it is a CPU-GPU sync point,
            // which waits until the update is queued (`commit_update`).
            grads
                .loss_sum
                .add(&loss, weight)
                .map_err(|e| classify(e.into(), Phase::Accumulate))?;
            guard(Phase::Accumulate)?;
        }
        Ok(grads)
    }

    /// The variables the step's gradients are for, in a fixed order (the
    /// same on every rank).
    pub fn grad_vars(&self) -> Vec<(String, Var)> {
        self.work_vars()
    }

    /// Everything of the update that may allocate, before any parameter
    /// changes: master gradients under mixed precision, clipping, the
    /// optimizer's state for this step. An OOM here leaves the step
    /// retryable.
    pub fn prepare_update(&mut self, grads: Grads) -> Result<Ready> {
        let Grads { acc, loss_sum } = grads;
        let masters = self.store.vars();
        // Without loss scaling or masks, the optimizer reads the working
        // copy's gradients as they are and may write the working copy in
        // the same pass (`Optimizer::step_mixed`): no f32 copy of them.
        let one_pass = self
            .mixed
            .as_ref()
            .is_some_and(|m| m.scaler.is_none() && self.masks.is_empty());
        let mut acc = match &mut self.mixed {
            None => acc,
            Some(m) if one_pass => m.low_grads(&masters, acc),
            Some(m) => {
                let (acc, finite) = m
                    .master_grads(&masters, acc)
                    .map_err(|e| classify(e.into(), Phase::Optimizer))?;
                if let Some(s) = m.scaler.as_mut() {
                    if !s.update(finite) {
                        // GradScaler: no update this step; the scale halved.
                        self.overflow = Some(s.scale);
                        return Ok(Ready {
                            acc: None,
                            loss_sum,
                            mixed_scale: None,
                        });
                    }
                }
                acc
            }
        };
        let mut scale = 1.0;
        if let Some(max) = self.optim.clip_grad_norm() {
            let clipped = if one_pass {
                optim::clip_factor(&masters, &acc, max).map(|(s, _)| scale = s)
            } else {
                optim::clip_grad_norm(&masters, &mut acc, max).map(|_| ())
            };
            clipped.map_err(|e| classify(e.into(), Phase::Optimizer))?;
        }
        if let (true, Some(m)) = (one_pass, &self.mixed) {
            // f32 copies for what the optimizer does not take in one pass.
            acc = optim::mixed_grads(self.optim.as_ref(), &masters, acc, scale, &m.work_vars())
                .map_err(|e| classify(e.into(), Phase::Optimizer))?;
        }
        // The optimizer's state for this step (the first step's moments) is
        // allocated before any parameter changes, so an OOM here leaves
        // the step retryable.
        self.optim
            .prepare(&masters, &acc)
            .map_err(|e| classify(e.into(), Phase::Optimizer))?;
        Ok(Ready {
            acc: Some(acc),
            loss_sum,
            mixed_scale: one_pass.then_some(scale),
        })
    }

    /// The update itself; returns the batch's mean loss.
    pub fn commit_update(&mut self, ready: Ready) -> Result<f64> {
        let Ready {
            acc,
            loss_sum,
            mixed_scale,
        } = ready;
        let Some(acc) = acc else {
            // Skipped for non-finite f16 gradients: the step still counts.
            self.step += 1;
            return Ok(loss_sum.value()?);
        };
        let vars = self.store.vars();
        // From here parameters change one by one. The update paths in use
        // (fused AdamW on the CPU and on CUDA, 8-bit included) work in place
        // on state allocated by `prepare_update`, so nothing here waits on
        // an allocation; a failure inside the update is not retryable (the
        // run stops with what it has checkpointed).
        let written = match (mixed_scale, &self.mixed) {
            (Some(scale), Some(m)) => self.optim.step_mixed(&vars, &acc, scale, &m.work_vars())?,
            _ => {
                self.optim.step(&vars, &acc)?;
                HashSet::new()
            }
        };
        self.step += 1;
        // The update is made. What follows re-derives tensors from the
        // masters (masks, the low-precision working copy): it may allocate,
        // so the step's gradients go first, and an OOM there is met by
        // trimming the pool and deriving them again, not by a retry of the
        // step, which would apply the update twice.
        drop(acc);
        if let Err(e) = self.derive_from_masters(&vars, &written) {
            if !is_oom(&e) {
                return Err(e);
            }
            crate::memory::device::trim(&self.opts.device)?;
            self.derive_from_masters(&vars, &written)?;
        }
        // The one read of the loss, with the update already queued (as
        // PyTorch's loss.item() after opt.step()).
        Ok(loss_sum.value()?)
    }

    /// Applies the pruning masks and refreshes the working copy from the
    /// master weights, but for the parameters in `written`, whose copies
    /// the update wrote: idempotent, so it can be done again after a
    /// failure.
    fn derive_from_masters(&self, vars: &[(String, Var)], written: &HashSet<String>) -> Result<()> {
        if !self.masks.is_empty() {
            self.masks.apply(vars)?;
        }
        if let Some(m) = &self.mixed {
            m.sync_except(vars, written)?;
        }
        Ok(())
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
            let loss = self.train_loss(&x, &y)?;
            let mut grads = loss.backward()?;
            super::recompute::merge_parameter_grads(&mut grads)?;
        }
        Ok(crate::memory::HostMemory::peak().saturating_sub(base))
    }

    /// Bytes of optimizer state for the model's parameters.
    pub fn optimizer_state_bytes(&self) -> usize {
        self.optim.state_bytes(&self.store.vars())
    }
}

/// A step's gradients before the update: summed over its micro-batches
/// (and, once reduced, over the ranks), and the weighted loss.
pub struct Grads {
    pub acc: GradStore,
    /// The micro-batches' mean losses times their shares of the batch.
    pub loss_sum: LossSum,
}

/// A sum of losses times weights, kept where the losses are until read:
/// reading a device's value waits for everything queued before it.
#[derive(Clone, Default)]
pub struct LossSum {
    host: f64,
    device: Option<Tensor>,
}

impl LossSum {
    /// `loss` (a scalar tensor) times `weight`, added on its device in f64
    /// (the same products and sums as on the host). Detached: the sum must
    /// not keep the forward's graph, and with it every activation, alive.
    pub fn add(&mut self, loss: &Tensor, weight: f64) -> candle_core::Result<()> {
        let l = (loss.detach().to_dtype(DType::F64)? * weight)?;
        self.device = Some(match self.device.take() {
            Some(d) => (d + l)?,
            None => l,
        });
        Ok(())
    }

    /// The value (a device sync if it is on a device).
    pub fn value(&self) -> candle_core::Result<f64> {
        Ok(match &self.device {
            Some(d) => self.host + d.to_scalar::<f64>()?,
            None => self.host,
        })
    }
}

impl From<f64> for LossSum {
    fn from(host: f64) -> Self {
        LossSum { host, device: None }
    }
}

/// A step ready to update the parameters (see [`Trainer::prepare_update`]);
/// no gradients when an f16 overflow skips the update.
pub struct Ready {
    acc: Option<GradStore>,
    loss_sum: LossSum,
    /// Mixed precision in one pass: the gradients are the working copy's,
    /// to be scaled by this factor (gradient clipping's, or 1).
    mixed_scale: Option<f64>,
}

fn is_oom(e: &Error) -> bool {
    matches!(e, Error::Candle(c) if is_device_oom(c))
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
