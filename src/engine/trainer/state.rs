//! A trainer's state as named tensors: checkpoints save and restore it.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::super::checkpoint::{self, CheckpointMeta};
use super::super::optim;
use super::Trainer;
use crate::{Error, Result};

impl Trainer {
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
        if let Some(scale) = self.loss_scale() {
            if let Ok(t) = Tensor::new(scale, &Device::Cpu) {
                out.push(("amp.loss_scale".to_string(), t));
            }
        }
        out.extend(self.masks.state());
        out
    }

    pub fn save(&self, path: &Path, meta: &CheckpointMeta) -> Result<()> {
        checkpoint::save(path, self.state(), meta)
    }

    /// The model weights of another checkpoint of this run (its best
    /// model, say), by parameter name, on the run's device; an error when
    /// it holds another model.
    pub fn weights_of(&self, path: &Path) -> Result<(HashMap<String, Tensor>, CheckpointMeta)> {
        let (tensors, meta) = checkpoint::load(path, &self.opts.device)?;
        self.check_same_model(path, &meta)?;
        let model = tensors
            .into_iter()
            .filter_map(|(k, t)| Some((k.strip_prefix("model.")?.to_string(), t)))
            .collect();
        Ok((model, meta))
    }

    /// Puts `weights` (from [`Trainer::weights_of`]) in place of the
    /// model's and returns copies of the ones they replaced, to put back
    /// the same way. No step may come between: the optimizer's state
    /// belongs to the weights put back.
    pub fn swap_weights(
        &mut self,
        weights: &HashMap<String, Tensor>,
    ) -> Result<HashMap<String, Tensor>> {
        let mine = self
            .store
            .vars()
            .into_iter()
            .map(|(k, v)| Ok((k, v.as_tensor().copy()?)))
            .collect::<candle_core::Result<HashMap<_, _>>>()?;
        self.store.load(weights).map_err(Error::Config)?;
        if let Some(m) = &self.mixed {
            m.sync(&self.store.vars())?;
        }
        Ok(mine)
    }

    fn check_same_model(&self, path: &Path, meta: &CheckpointMeta) -> Result<()> {
        let same_but_rates = meta
            .model_config
            .as_ref()
            .zip(self.spec.config())
            .and_then(|(was, now)| crate::engine::dropout::config_rate_changes(was, &now));
        if meta.model != self.spec.describe() && same_but_rates.is_none() {
            // The recipe's model changed since the run: a usage error
            // (its dropout rates alone may change: `run::saving` notes it).
            return Err(Error::Config(format!(
                "resuming {}: it holds `{}`, the recipe builds `{}`; a changed \
                 model cannot continue this run: start it in another folder \
                 (--out), or resume with the model the checkpoint holds",
                path.display(),
                meta.model,
                self.spec.describe()
            )));
        }
        Ok(())
    }

    /// Restores weights and optimizer state from a checkpoint.
    pub fn load(&mut self, path: &Path) -> Result<CheckpointMeta> {
        let (tensors, meta) = checkpoint::load(path, &self.opts.device)?;
        self.check_same_model(path, &meta)?;
        let mut model = HashMap::new();
        let mut state = HashMap::new();
        self.masks
            .load(&tensors, &self.store.vars())
            .map_err(|e| Error::Checkpoint {
                path: path.to_path_buf(),
                msg: e.to_string(),
            })?;
        for (k, t) in tensors {
            if k == "amp.loss_scale" {
                if let Some(s) = self.mixed.as_mut().and_then(|m| m.scaler.as_mut()) {
                    s.scale = t.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                }
            } else if let Some(name) = k.strip_prefix("model.") {
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
        if let Some(m) = &self.mixed {
            m.sync(&self.store.vars())?;
        }
        let state = optim::place_state(state, &self.store.vars())?;
        self.optim.load_state(&state)?;
        self.optim.set_learning_rate(meta.lr);
        self.step = meta.step;
        Ok(meta)
    }
}
