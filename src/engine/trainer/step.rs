//! One training step: the upload, forward, backward and accumulation over
//! micro-batches (`local_grads`), everything of the update that may
//! allocate (`prepare_update`: an OOM there can be retried), the update
//! itself (`commit_update`), and the step's loss, read once at the end.

use std::collections::HashSet;

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};

use super::Trainer;
use crate::data::Batch;
use crate::engine::optim;
use crate::memory::oom::{classify, is_device_oom, Phase};
use crate::{Error, Result};

impl Trainer {
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
        // With class weights each piece adds its share of the batch's
        // weighted sum, divided by the whole batch's weight (every rank
        // holds the whole batch): the same gradient, whatever the split.
        let weight_sum = self
            .opts
            .loss
            .weight_sum(&batch.y)
            .map_err(|e| Error::Data(format!("train step: {e}")))?;
        // A sequence with ignored positions: each piece's mean is over its
        // labelled positions, weighted by its share of the whole batch's.
        let labelled = crate::engine::ignored::per_sample(&batch.y)
            .map_err(|e| Error::Data(format!("train step: {e}")))?;
        let (bx, by) = self.inputs(batch).map_err(|e| classify(e, Phase::Upload))?;
        guard(Phase::Upload)?;
        for from in (start..start + len).step_by(micro) {
            let m = micro.min(start + len - from);
            let (x, y, keep) = self.piece((&bx, &by), batch, (from, m), labelled.is_some())?;
            let (weight, summed) = match (weight_sum, &labelled) {
                // A batch of weight 0 only: no gradient, as no sample counts.
                (Some(w), _) if w > 0.0 => (1.0 / w, true),
                (Some(_), _) => (0.0, true),
                (None, Some(per)) => (share(per, from, m), false),
                (None, None) => (m as f64 / total as f64, false),
            };
            let loss = self
                .train_loss((&x, &y), summed, keep.as_ref(), self.draw(from))
                .map_err(|e| classify(e.into(), Phase::Forward))?;
            guard(Phase::Forward)?;
            let g = (&loss * (weight * scale))
                .and_then(|l| l.backward())
                .and_then(|mut g| {
                    crate::engine::recompute::merge_parameter_grads(&mut g).map(|()| g)
                })
                .map_err(|e| {
                    crate::engine::recompute::discard_parameter_grads();
                    classify(e.into(), Phase::Backward)
                })?;
            guard(Phase::Backward)?;
            let more = from + m < start + len;
            accumulate(&mut grads.acc, &vars, g, more)
                .map_err(|e| classify(e, Phase::Accumulate))?;
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

    /// Rows `[from, from + m)` of a step's batch (`bx`, `by`: on the
    /// device), and with ignored positions (`ignoring`) cut after the last
    /// labelled one, with the labelled positions' index
    /// ([`Trainer::labelled_part`], [`Trainer::labelled`]).
    fn piece(
        &self,
        (bx, by): (&Tensor, &Tensor),
        batch: &Batch,
        (from, m): (usize, usize),
        ignoring: bool,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let (x, y) = if m == bx.dim(0)? {
            (bx.clone(), by.clone())
        } else {
            (bx.narrow(0, from, m)?, by.narrow(0, from, m)?)
        };
        if !ignoring {
            return Ok((x, y, None));
        }
        let (x, y, host_y) = self
            .labelled_part(x, y, batch.y.narrow(0, from, m)?)
            .map_err(|e| classify(e.into(), Phase::Forward))?;
        let keep = self.labelled(&host_y)?;
        Ok((x, y, keep))
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
        // "The last step skipped its update" is this step's to say.
        self.overflow = None;
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
        let mut scale = optim::ClipScale::ONE;
        if let Some(max) = self.optim.clip_grad_norm() {
            // On CUDA the factor stays on the device: no wait here.
            let on_device = self.opts.device.is_cuda();
            let clipped = optim::clip_scale(&masters, &acc, max, on_device).and_then(|s| {
                scale = s;
                match one_pass {
                    true => Ok(()),
                    false => optim::scale_grads(&masters, &mut acc, &scale),
                }
            });
            clipped.map_err(|e| classify(e.into(), Phase::Optimizer))?;
        }
        if let (true, Some(m)) = (one_pass, &self.mixed) {
            // f32 copies for what the optimizer does not take in one pass.
            acc = optim::mixed_grads(self.optim.as_ref(), &masters, acc, &scale, &m.work_vars())
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
            (Some(scale), Some(m)) => self.optim.step_mixed(&vars, &acc, &scale, &m.work_vars())?,
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
    mixed_scale: Option<optim::ClipScale>,
}

fn is_oom(e: &Error) -> bool {
    matches!(e, Error::Candle(c) if is_device_oom(c))
}

/// The labelled positions of samples `[from, from + m)` over the whole
/// batch's (`per`: each sample's); 0 when the batch has none.
fn share(per: &[usize], from: usize, m: usize) -> f64 {
    let all: usize = per.iter().sum();
    match all {
        0 => 0.0,
        _ => per[from..from + m].iter().sum::<usize>() as f64 / all as f64,
    }
}

/// Adds the variables' gradients from `grads` into `acc`. Gradients of
/// intermediate tensors are dropped here, so they do not stay alive while
/// the next micro-batch runs. When `more` micro-batches follow, a first
/// gradient is written into storage of its own: some of candle's are views
/// into a larger tensor of the backward, which they would keep alive
/// through the next micro-batch (on the Shakespeare GPT, 85 KB per sample:
/// 8% of a micro-batch's peak, which `taper plan` did not expect).
fn accumulate(
    acc: &mut GradStore,
    vars: &[(String, Var)],
    mut grads: GradStore,
    more: bool,
) -> Result<()> {
    for (_, v) in vars {
        if let Some(g) = grads.remove(v) {
            let sum = match acc.remove(v) {
                Some(prev) => (prev + g)?,
                // `copy` would clone the whole storage under a view.
                None if more => g.detach().affine(1.0, 0.0)?,
                None => g,
            };
            acc.insert(v, sum);
        }
    }
    Ok(())
}
