//! The trainer: a model's parameters, its optimizer and the training step.
//! It knows nothing about Lua; the host drives it.

mod inference;
mod regression;
mod scores;
mod state;
mod step;
mod switches;

pub use regression::{Regression, TargetScores};
pub use scores::{ClassScores, EvalSums, PerClass, MAX_CONFUSION_CLASSES};
pub use step::{Grads, LossSum, Ready};

use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};

use super::ignored;
use super::loss::Loss;
use super::model::TrainModule;
use super::optim::{OptimSpec, Optimizer};
use super::params::ParamStore;
use super::precision::Mixed;
use super::prune::Masks;
use super::ModelSpec;
use crate::data::Batch;
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
#[derive(Debug, Clone, PartialEq)]
pub struct Eval {
    pub loss: f64,
    pub accuracy: f64,
    /// Samples evaluated (sequence models: positions).
    pub samples: usize,
    /// The mean of another objective when one was asked for, or the run's
    /// training loss when it is not plain cross-entropy (distillation).
    pub objective: Option<f64>,
    /// A regression's errors and R² (its `accuracy` means nothing).
    pub regression: Option<Regression>,
    /// A classifier's confusion matrix and per-class scores (up to
    /// [`MAX_CONFUSION_CLASSES`] classes, one label per sample).
    pub per_class: Option<PerClass>,
    /// A multi-label classifier's scores (its `accuracy`: the share of
    /// label decisions right).
    pub multi_label: Option<crate::engine::bce::MultiLabel>,
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
        // The backward's gradient sums through taper's add (a faster kernel
        // on CUDA, the same values).
        crate::kernels::install_add();
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

    /// The new loss scale if the last step skipped its update (f16 with
    /// non-finite gradients); cleared by reading.
    pub fn take_overflow(&mut self) -> Option<f64> {
        self.overflow.take()
    }

    /// Whether the last step's update was skipped for non-finite
    /// gradients (f16 loss scaling), without clearing it.
    pub fn overflowed(&self) -> bool {
        self.overflow.is_some()
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
    /// `summed`: a weighted cross-entropy's numerator rather than its mean.
    /// `keep`: the labelled positions of a sequence's `y` when some are
    /// ignored ([`labelled`](Trainer::labelled)): the loss is over those
    /// rows alone, so the fused loss never sees an ignored label. `draw`:
    /// the dropout masks' source.
    fn train_loss(
        &self,
        (x, y): (&Tensor, &Tensor),
        summed: bool,
        keep: Option<&Tensor>,
        draw: crate::engine::Draw,
    ) -> candle_core::Result<Tensor> {
        let keep = match (&self.opts.loss, keep) {
            // A distillation compares each position with the teacher's,
            // and leaves the ignored ones out of both its terms itself.
            (Loss::CrossEntropy(_), Some(k)) if k.elem_count() == 0 => {
                return ignored::nothing(&self.model.forward_train(x, draw)?);
            }
            (Loss::CrossEntropy(_), keep) => keep,
            _ => None,
        };
        let mut logits = None;
        if let (Loss::CrossEntropy(c), false) = (&self.opts.loss, summed) {
            // On CUDA the fused kernels also take the unchunked loss, as one
            // chunk: candle's composed cross-entropy over GPT-2's full
            // logits cost 79 ms of a 134 ms step (`scripts/gpu-check.sh
            // bench`, H100).
            let cuda = self.opts.device.is_cuda();
            // The fused kernels take no class weights.
            if (c.chunk > 0 || cuda) && c.weights.is_none() {
                if let Some((h, head)) = self.model.hidden_and_head(x, draw)? {
                    if crate::kernels::covers(&h) {
                        let d = h.dim(candle_core::D::Minus1)?;
                        let h = h.reshape(((), d))?;
                        let (h, y) = match keep {
                            Some(k) => ignored::keep_rows(&h, &y.flatten_all()?, k)?,
                            None => (h, y.clone()),
                        };
                        return crate::kernels::chunked_cross_entropy(
                            &h,
                            &head,
                            &y,
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
            None => self.model.forward_train(x, draw)?,
        };
        let logits = match &self.mixed {
            Some(_) => logits.to_dtype(DType::F32)?,
            None => logits,
        };
        let (logits, y) = match keep {
            Some(k) => {
                let classes = logits.dim(candle_core::D::Minus1)?;
                ignored::keep_rows(&logits.reshape(((), classes))?, &y.flatten_all()?, k)?
            }
            None => (logits, y.clone()),
        };
        if summed {
            return self.opts.loss.weighted_numerator(&logits, &y);
        }
        self.opts.loss.loss(x, &logits, &y)
    }

    /// A piece of a batch (`x` and `y` on the device, `host_y` the same
    /// rows' labels on the host) cut after the last position any of its
    /// samples labels, for a causal model ([`ignored::labelled_width`]);
    /// as it is otherwise.
    fn labelled_part(
        &self,
        x: Tensor,
        y: Tensor,
        host_y: Tensor,
    ) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        if !self.spec.causal() || x.rank() != 2 || x.dims() != y.dims() {
            return Ok((x, y, host_y));
        }
        match ignored::labelled_width(&host_y)? {
            Some(w) => Ok((
                x.narrow(1, 0, w)?.contiguous()?,
                y.narrow(1, 0, w)?.contiguous()?,
                host_y.narrow(1, 0, w)?,
            )),
            None => Ok((x, y, host_y)),
        }
    }

    /// The labelled positions of `y` (a host batch's sequence labels), on
    /// the device, when some are ignored; see [`ignored`].
    fn labelled(&self, y: &Tensor) -> Result<Option<Tensor>> {
        ignored::labelled_index(y, &self.opts.device)
            .map_err(|e| Error::Data(format!("train step: {e}")))
    }

    /// The dropout masks' source for the piece of this step's batch that
    /// starts at sample `first`.
    pub(crate) fn draw(&self, first: usize) -> crate::engine::Draw {
        crate::engine::Draw {
            seed: self.opts.seed,
            step: self.step,
            first,
        }
    }

    /// Heap bytes (above the level before it) of a forward and backward pass
    /// over the first `n` samples of `batch`; no parameter changes. Needs the
    /// counting allocator. For the memory planner.
    pub fn probe_bytes(&self, batch: &Batch, n: usize) -> Result<usize> {
        let n = n.clamp(1, batch.len());
        let (x, y) = self.inputs(batch)?;
        let (x, y) = (x.narrow(0, 0, n)?, y.narrow(0, 0, n)?);
        // Every position, as the batch gives them (no `labelled_part`):
        // the plan holds for samples that label up to the last one.
        let keep = self.labelled(&batch.y.narrow(0, 0, n)?)?;
        let base = crate::memory::HostMemory::current();
        crate::memory::HostMemory::reset_peak();
        {
            let loss = self.train_loss((&x, &y), false, keep.as_ref(), self.draw(0))?;
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
