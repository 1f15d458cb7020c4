//! Saving a run and resuming it: the checkpoint's metadata (the run's
//! place, its model and data records), and the cursor placed back after the
//! batches an interrupted epoch had taken.

use std::path::Path;

use super::Run;
use crate::engine::checkpoint::{CheckpointMeta, EpochTrained, FORMAT};
use crate::Result;

impl Run {
    /// The checkpoint's metadata; `state` is the recipe's own (plain) state.
    pub fn meta(&self, state: Option<serde_json::Value>) -> CheckpointMeta {
        let c = &self.cursor;
        // Resumed into the middle of an epoch, but stopped before the
        // recipe's loop re-entered it (a signal during the recipe's setup):
        // the place it was resumed from, which the cursor holds as the
        // batches to skip, is the place to save. Saved as "epoch before,
        // complete", a second resume would train the epoch's first batches
        // again.
        let pending = !c.in_epoch && (c.skip_batches > 0 || c.skip_samples > 0);
        let (epoch, steps, samples, trained) = if pending {
            (
                c.epoch + 1,
                c.skip_batches as u64,
                c.skip_samples as u64,
                Some(c.trained),
            )
        } else {
            (
                c.epoch,
                c.steps,
                c.samples,
                c.in_epoch.then_some(EpochTrained {
                    loss_sum: self.stats.loss_sum,
                    samples: self.stats.samples as u64,
                }),
            )
        };
        CheckpointMeta {
            format: FORMAT.into(),
            step: self.trainer.step,
            epoch,
            epoch_steps: steps,
            epoch_samples: samples,
            epoch_complete: !(c.in_epoch || pending),
            epoch_trained: trained,
            epoch_data: c.data_len.filter(|_| c.in_epoch || pending),
            model: self.trainer.spec().describe(),
            model_config: self.trainer.spec().config(),
            vocab: self.vocab.as_ref().map(|v| v.record()),
            classes: self.classes.clone(),
            image_input: self.image_input.clone(),
            table_input: self.table_input.clone(),
            sample_input: self.sample_input.clone(),
            array_input: self.array_input.clone(),
            multi_label: self.trainer.loss().multi_label(),
            best: self.best.clone(),
            optimizer: self.trainer.optimizer_description().to_string(),
            lr: self.trainer.learning_rate(),
            configured_lr: Some(self.trainer.optim_spec().lr()),
            seed: self.seed,
            recipe_hash: self.recipe_hash.clone(),
            skipped: self.skipped.clone(),
            state,
            checksum: String::new(),
        }
    }

    pub fn save(&self, path: &Path, state: Option<serde_json::Value>) -> Result<()> {
        self.trainer.save(path, &self.meta(state))
    }

    /// Restores from a checkpoint, placing the cursor after the batches the
    /// interrupted epoch had taken. Returns the metadata and a notice when
    /// the checkpoint was written by another version of the recipe.
    pub fn resume(&mut self, path: &Path) -> Result<(CheckpointMeta, Option<String>)> {
        let meta = self.trainer.load(path)?;
        super::resume_notes::same_classes(path, meta.classes.as_deref(), self.classes.as_deref())?;
        super::resume_notes::same_inputs(
            path,
            meta.table_input.as_ref(),
            self.table_input.as_ref(),
        )?;
        let mut notes = Vec::new();
        if !meta.recipe_hash.is_empty() && meta.recipe_hash != self.recipe_hash {
            notes.push(format!(
                "note: {} was written by a different version of this recipe",
                path.display()
            ));
        }
        // The checkpoint's lr is the one in use (a schedule may have set it);
        // an lr configured differently since (`--set lr=`, an edit) wins.
        let configured = self.trainer.optim_spec().lr();
        if meta.configured_lr.is_some_and(|c| c != configured) {
            self.trainer.set_learning_rate(configured);
            notes.push(format!(
                "note: learning rate {configured} (configured since the checkpoint) replaces its {}",
                meta.lr
            ));
        }
        let rates = meta
            .model_config
            .as_ref()
            .zip(self.trainer.spec().config())
            .and_then(|(was, now)| crate::engine::dropout::config_rate_changes(was, &now))
            .unwrap_or_default();
        if !rates.is_empty() {
            notes.push(format!(
                "note: dropout as the recipe declares it ({}) from here on; the weights are {}'s",
                crate::engine::dropout::describe_changes(&rates),
                path.display()
            ));
        }
        if meta.seed != self.seed {
            notes.push(format!(
                "note: the run's seed differs from the one {} was trained with (--seed or the recipe's seed changed): what it seeds follows the new one from here on, and a changed --seed reorders the data's shuffles too{}",
                path.display(),
                if meta.epoch_complete {
                    ""
                } else {
                    ", so the epoch in progress may then train some samples twice and others not at all"
                }
            ));
        }
        notes.extend(super::resume_notes::optimizer_note(
            &meta.optimizer,
            self.trainer.optimizer_description(),
        ));
        let notice = (!notes.is_empty()).then(|| notes.join("\n"));
        if meta.epoch_complete {
            self.cursor.epoch = meta.epoch;
        } else {
            // Re-enter the interrupted epoch, after the batches already taken.
            self.cursor.epoch = meta.epoch.saturating_sub(1);
            self.cursor.skip_batches = meta.epoch_steps as usize;
            self.cursor.skip_samples = meta.epoch_samples as usize;
            self.cursor.trained = meta.epoch_trained.unwrap_or_default();
            self.cursor.data_len = meta.epoch_data;
        }
        self.skipped = meta.skipped.clone();
        self.best = meta.best.clone();
        Ok((meta, notice))
    }
}
