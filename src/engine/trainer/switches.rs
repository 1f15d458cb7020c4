//! What may change between a trainer's steps, over the same weights and
//! optimizer state: the precision forward and backward run in, the model's
//! dropout rates (a reload), recomputed blocks, offloaded optimizer state
//! (an OOM policy's actions), and pruning masks.

use std::sync::Arc;

use super::Trainer;
use crate::engine::precision::{Mixed, Precision};
use crate::engine::ModelSpec;
use crate::{Error, Result};
use candle_core::DType;

impl Trainer {
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
        if p != Precision::F32 && self.opts.dtype != DType::F32 {
            return Err(Error::Config(format!(
                "precision {}: the model's weights are {:?}, mixed precision needs f32 masters",
                p.name(),
                self.opts.dtype
            )));
        }
        self.mixed = match p.low() {
            None => None,
            Some(_) => Some(Mixed::new(&self.store, p)?),
        };
        self.rebuild()
    }

    /// Trains `spec` from the next step on: the same model but for its
    /// dropout rates ([`crate::engine::dropout::rate_changes`]), over the
    /// same weights and optimizer state (a reload that changed them).
    pub fn set_spec(&mut self, spec: Arc<dyn ModelSpec>) -> Result<()> {
        if crate::engine::dropout::rate_changes(&*self.spec, &*spec).is_none() {
            return Err(Error::Config(format!(
                "the model {} cannot become {}: only its dropout rates may change",
                self.spec.describe(),
                spec.describe()
            )));
        }
        self.spec = spec;
        self.rebuild()
    }

    /// Builds the forward function again, over the working copy under mixed
    /// precision or the parameters themselves.
    fn rebuild(&mut self) -> Result<()> {
        let dev = self.opts.device.clone();
        self.model = match &self.mixed {
            Some(m) => self
                .spec
                .build_train(m.work.var_builder(m.work_dtype(), &dev))?,
            None => self
                .spec
                .build_train(self.store.var_builder(self.opts.dtype, &dev))?,
        };
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
    pub fn set_offload_place(&mut self, place: crate::engine::optim::offload::Place) {
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
}
