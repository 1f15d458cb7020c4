//! A checkpoint alone, without its recipe: its model rebuilt from the
//! structured config the checkpoint holds, its trained weights, and its
//! vocabulary. `taper export` and `taper sample` start here, and
//! `taper classify` ([`classify`]).

use std::collections::HashMap;
use std::path::Path;

use candle_core::Device;

use crate::data::Vocab;
use crate::engine::checkpoint::{self, CheckpointMeta};

mod classify;
use crate::engine::optim::OptimSpec;
use crate::engine::{Trainer, TrainerOptions};
use crate::{Error, Result};
pub use classify::{classify_checkpoint, classify_given_texts, Answer, Guess, Predicted};

pub struct Saved {
    pub trainer: Trainer,
    pub vocab: Option<Vocab>,
    pub meta: CheckpointMeta,
}

/// Opens a checkpoint written by a run (verified as a resume is).
pub fn open(path: &Path, device: &Device) -> Result<Saved> {
    let (tensors, meta) = checkpoint::load(path, device)?;
    let config = meta.model_config.as_ref().ok_or_else(|| Error::Checkpoint {
        path: path.to_path_buf(),
        msg: format!(
            "it names its model only as `{}` (written before checkpoints held the model's config): open it with its recipe",
            meta.model
        ),
    })?;
    let spec = super::spec_from_config(config)?;
    let opts = TrainerOptions {
        device: device.clone(),
        ..TrainerOptions::default()
    };
    let trainer = Trainer::new(spec, &OptimSpec::AdamW(Default::default()), opts)?;
    let weights: HashMap<String, candle_core::Tensor> = tensors
        .into_iter()
        .filter_map(|(k, t)| k.strip_prefix("model.").map(|k| (k.to_string(), t)))
        .collect();
    trainer
        .params()
        .load(&weights)
        .map_err(|msg| Error::Checkpoint {
            path: path.to_path_buf(),
            msg,
        })?;
    let vocab = meta.vocab.as_ref().map(Vocab::from_record).transpose()?;
    Ok(Saved {
        trainer,
        vocab,
        meta,
    })
}

impl Saved {
    /// The model to write with [`super::export`].
    pub fn model(&self) -> super::Model<'_> {
        super::Model {
            spec: self.trainer.spec().as_ref(),
            params: self.trainer.params().tensors(),
            vocab: self.vocab.as_ref(),
            classes: self.meta.classes.as_deref(),
            image_input: self.meta.image_input.as_ref(),
            table_input: self.meta.table_input.as_ref(),
            sample_input: self.meta.sample_input.as_ref(),
            array_input: self.meta.array_input.as_ref(),
            multi_label: self.meta.multi_label,
            step: self.meta.step,
        }
    }
}

/// A checkpoint file, or a run folder's newest valid checkpoint. A folder
/// that also holds its run's best model is noted, naming that file.
pub fn locate(arg: &Path) -> Result<std::path::PathBuf> {
    if !arg.is_dir() {
        return Ok(arg.to_path_buf());
    }
    let latest = arg.join(checkpoint::file_name(1));
    match checkpoint::latest_valid(&latest, false)? {
        Some((path, _)) => {
            if let Some(note) = best_note(arg, &path) {
                crate::tell!("{note}");
            }
            Ok(path)
        }
        None => Err(Error::Config(no_checkpoint(arg))),
    }
}

/// "note: RUN also holds the run's best model ...", when it does and it is
/// not the newest checkpoint's.
fn best_note(dir: &Path, newest: &Path) -> Option<String> {
    let best = dir.join(checkpoint::best_file_name(1));
    let b = checkpoint::read_meta(&best).ok()?.best?;
    let step = checkpoint::read_meta(newest).ok()?.step;
    (b.step != step).then(|| {
        format!(
            "note: {} is the newest checkpoint (step {step}); the run's best model ({}) is {}: give that file for it",
            newest.display(),
            b.describe(),
            best.display()
        )
    })
}

/// Why a folder gives no checkpoint: a run in it has not saved one yet,
/// or it is not a run folder.
fn no_checkpoint(dir: &Path) -> String {
    let records = std::fs::metadata(dir.join("metrics.jsonl")).is_ok_and(|m| m.len() > 0);
    if records {
        format!(
            "{}: no checkpoint yet: the run in this folder writes one every `checkpoint_every` (5 minutes unless its recipe or --checkpoint-every says otherwise), when it is stopped and when it ends; a run that ended before its first step wrote none",
            dir.display()
        )
    } else {
        format!(
            "{}: not a run folder: it holds no checkpoint and no records (give a run's --out folder or a checkpoint file)",
            dir.display()
        )
    }
}

/// `taper export CHECKPOINT`: the checkpoint's model written as `format`.
pub fn export_checkpoint(
    arg: &Path,
    out: &Path,
    format: &str,
    ty: Option<&str>,
    merge: bool,
) -> Result<super::Written> {
    if let (Some(_), "hf" | "peft" | "onnx") = (ty, format) {
        return Err(Error::Config(format!(
            "format {format} writes f32 weights; --type is for gguf"
        )));
    }
    let ty = ty.unwrap_or("q8_0");
    let ty = crate::quant::ExportFormat::parse(ty).ok_or_else(|| {
        Error::Config(format!(
            "unknown type `{ty}` ({})",
            crate::quant::ExportFormat::NAMES
        ))
    })?;
    let saved = open(&locate(arg)?, &Device::Cpu)?;
    super::export(&saved.model(), out, format, ty, merge)
}

/// What `taper sample` continues.
pub enum Prompt<'a> {
    /// Text, printed with what follows it.
    Text(&'a str),
    /// A user's message to a chat model: its reply alone is printed.
    Chat(&'a str),
}

/// `taper sample CHECKPOINT`: the prompt and the text the checkpoint's
/// model generates after it; or a chat model's reply to a message.
pub fn sample_checkpoint(
    arg: &Path,
    prompt: Prompt,
    tokens: usize,
    temperature: f64,
    seed: u64,
) -> Result<String> {
    let path = locate(arg)?;
    let saved = open(&path, &Device::Cpu)?;
    let vocab = saved.vocab.as_ref().ok_or_else(|| Error::Checkpoint {
        path: path.clone(),
        msg: "it holds no vocabulary (its run's data was not text)".into(),
    })?;
    let (ids, end, shown) = match prompt {
        Prompt::Text(text) => (vocab.encode(text)?, None, text),
        Prompt::Chat(message) => {
            let messages = [serde_json::json!({ "role": "user", "content": message })];
            let (ids, end) = vocab.chat_prompt(&messages).ok_or_else(|| Error::Checkpoint {
                path: path.clone(),
                msg: "it holds no chat template (its run's data was not conversations, taper.data.chat): give --prompt".into(),
            })??;
            (ids, end, "")
        }
    };
    let out = saved
        .trainer
        .generate_until(&ids, tokens, end, temperature, seed, &mut || Ok(()))?;
    Ok(format!("{shown}{}", vocab.decode(&out)))
}
