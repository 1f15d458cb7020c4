//! A checkpoint alone, without its recipe: its model rebuilt from the
//! structured config the checkpoint holds, its trained weights, and its
//! vocabulary. `taper export` and `taper sample` start here.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Device;

use crate::data::Vocab;
use crate::engine::checkpoint::{self, CheckpointMeta};
use crate::engine::optim::OptimSpec;
use crate::engine::{Trainer, TrainerOptions};
use crate::{Error, Result};

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
            step: self.meta.step,
        }
    }
}

/// A checkpoint file, or a run folder's newest valid checkpoint.
pub fn locate(arg: &Path) -> Result<std::path::PathBuf> {
    if !arg.is_dir() {
        return Ok(arg.to_path_buf());
    }
    let latest = arg.join(checkpoint::file_name(1));
    match checkpoint::latest_valid(&latest, false)? {
        Some((path, _)) => Ok(path),
        None => Err(Error::Config(no_checkpoint(arg))),
    }
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

/// One of a classifier's answers for an input.
pub struct Guess {
    pub class: String,
    pub probability: f32,
}

/// What a checkpoint's model says of an input: its likeliest classes, or,
/// for a regression run, the predicted value of each of its targets.
pub enum Answer {
    Classes(Vec<Guess>),
    Values(Vec<Predicted>),
}

/// A regression target's predicted value, in its units.
pub struct Predicted {
    pub target: String,
    pub value: f64,
}

/// A regression's targets, each one's name (a CSV file's column, or
/// `target[k]` for an array's), mean and deviation (0 and 1 when the
/// targets were not standardized); none for a classifier.
fn regression_targets(meta: &CheckpointMeta) -> Vec<(String, f64, f64)> {
    let (names, moments): (Vec<String>, _) = match (&meta.table_input, &meta.array_input) {
        (Some(t), _) => (
            t.targets.iter().map(|c| c.name()).collect(),
            t.target_standardize.as_ref(),
        ),
        (None, Some(a)) => (
            (0..a.targets).map(|k| format!("target[{k}]")).collect(),
            meta.sample_input
                .as_ref()
                .and_then(|s| s.target_standardize.as_ref()),
        ),
        (None, None) => (Vec::new(), None),
    };
    let stat = |v: Option<&Vec<f32>>, k: usize, or: f64| {
        v.and_then(|v| v.get(k)).map_or(or, |&x| f64::from(x))
    };
    names
        .into_iter()
        .enumerate()
        .map(|(k, name)| {
            let mean = stat(moments.map(|m| &m.mean), k, 0.0);
            let std = stat(moments.map(|m| &m.std), k, 1.0);
            (name, mean, std)
        })
        .collect()
}

/// [`classify_checkpoint`] of array files (`.npy`, `.npz`, safetensors),
/// read as the run read its inputs and standardized as its data was: an
/// answer per sample, `FILE[i]` (0 the first, as NumPy indexes).
fn classify_arrays(
    input: &crate::data::ArrayInput,
    standardize: Option<&crate::data::Moments>,
    files: &[std::path::PathBuf],
    guess: &dyn Fn(Vec<f32>, usize, usize) -> Result<Vec<Answer>>,
    emit: &mut dyn FnMut(&str, &Answer),
) -> Result<usize> {
    let width = input.width();
    let mut count = 0;
    for f in files {
        let rows = input.open(f)?;
        for start in (0..rows.len()).step_by(1024) {
            let end = (start + 1024).min(rows.len());
            let mut values = rows.values(start..end);
            if let Some(m) = standardize {
                values.chunks_mut(width).for_each(|v| m.apply(v));
            }
            for (i, answer) in (start..end).zip(guess(values, end - start, width)?) {
                emit(&format!("{}[{i}]", f.display()), &answer);
            }
        }
        count += rows.len();
    }
    Ok(count)
}

/// [`classify_checkpoint`] of CSV files for a run on a column of text:
/// each file's texts read as the run read its own (`FILE:LINE`).
fn classify_texts(
    table: &crate::data::TableInput,
    files: &[std::path::PathBuf],
    answer: &dyn Fn(candle_core::Tensor) -> Result<Vec<Answer>>,
    emit: &mut dyn FnMut(&str, &Answer),
    skip: &mut dyn FnMut(&str, &str),
) -> Result<usize> {
    let mut count = 0;
    for f in files {
        let rows = table.read_texts(f)?;
        let c = rows.context;
        for (ids, at) in rows.ids.chunks(64 * c).zip(rows.lines.chunks(64)) {
            let x = candle_core::Tensor::from_vec(ids.to_vec(), (at.len(), c), &Device::Cpu)?;
            for (line, best) in at.iter().zip(answer(x)?) {
                emit(&format!("{}:{line}", f.display()), &best);
            }
        }
        for (line, why) in &rows.missing {
            skip(&format!("{}:{line}", f.display()), why);
        }
        count += rows.lines.len();
    }
    Ok(count)
}

/// The `top` classes with their probabilities (or a regression's
/// `targets`' values: name, mean and deviation) of each row of `x` through
/// `model`, whose classes are named `classes`.
fn answers(
    model: &dyn candle_core::Module,
    classes: &[String],
    targets: &[(String, f64, f64)],
    top: usize,
    x: candle_core::Tensor,
) -> Result<Vec<Answer>> {
    let out = model.forward(&x)?;
    if !targets.is_empty() {
        let values: Vec<f64> = out
            .flatten_all()?
            .to_dtype(candle_core::DType::F64)?
            .to_vec1()?;
        return Ok(values
            .chunks(targets.len())
            .map(|row| {
                let each = row
                    .iter()
                    .zip(targets)
                    .map(|(v, (name, mean, std))| Predicted {
                        target: name.clone(),
                        value: v * std + mean,
                    });
                Answer::Values(each.collect())
            })
            .collect());
    }
    let probs = candle_nn::ops::softmax_last_dim(&out)?.to_vec2::<f32>()?;
    Ok(probs
        .into_iter()
        .map(|p| {
            let mut ranked: Vec<(usize, f32)> = p.into_iter().enumerate().collect();
            ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
            Answer::Classes(
                ranked
                    .into_iter()
                    .take(top.max(1))
                    .map(|(i, probability)| Guess {
                        class: classes
                            .get(i)
                            .cloned()
                            .unwrap_or_else(|| format!("class {i}")),
                        probability,
                    })
                    .collect(),
            )
        })
        .collect())
}

/// `taper classify CHECKPOINT FILE...`: the `top` most likely classes with
/// their probabilities, as `emit(what, guesses)`, for each image file (read
/// as the checkpoint's run read its image folder: size, channels, scale; a
/// folder stands for the images in it, in an image folder's order), or for
/// each row of a CSV file (`FILE:LINE`, read as the run read its CSV file:
/// the feature columns, scale and standardization, or its column of text
/// and tokenizer; a row with a missing value is passed to `skip(what,
/// why)`), or for each sample of array files
/// (`FILE[i]`, [`classify_arrays`]). For a regression run (a `target`), the
/// answer is each target's predicted value, in its units. Returns the count
/// classified.
pub fn classify_checkpoint(
    arg: &Path,
    files: &[std::path::PathBuf],
    top: usize,
    emit: &mut dyn FnMut(&str, &Answer),
    skip: &mut dyn FnMut(&str, &str),
) -> Result<usize> {
    let path = locate(arg)?;
    let saved = open(&path, &Device::Cpu)?;
    let classes = saved.meta.classes.clone().unwrap_or_default();
    let model = saved.trainer.frozen()?;
    let targets = regression_targets(&saved.meta);
    let answer = |x: candle_core::Tensor| answers(&*model, &classes, &targets, top, x);
    // ... of each of `n` rows of `width` inputs.
    let guess = |rows: Vec<f32>, n: usize, width: usize| -> Result<Vec<Answer>> {
        answer(candle_core::Tensor::from_vec(
            rows,
            (n, width),
            &Device::Cpu,
        )?)
    };
    let arrays = |f: &std::path::PathBuf| {
        let ext = f.extension().and_then(|e| e.to_str());
        matches!(ext, Some("npy" | "npz" | "safetensors"))
    };
    if let (Some(input), true) = (&saved.meta.array_input, files.iter().all(arrays)) {
        let standardize = saved.meta.sample_input.as_ref().map(|s| &s.standardize);
        return classify_arrays(input, standardize, files, &guess, emit);
    }
    if let Some(table) = saved.meta.table_input.as_ref().filter(|t| t.text.is_some()) {
        return classify_texts(table, files, &answer, emit, skip);
    }
    if let Some(table) = &saved.meta.table_input {
        let mut count = 0;
        for f in files {
            let rows = table.read(f)?;
            let w = table.width();
            for (values, at) in rows.values.chunks(1024 * w).zip(rows.lines.chunks(1024)) {
                for (line, best) in at.iter().zip(guess(values.to_vec(), at.len(), w)?) {
                    emit(&format!("{}:{line}", f.display()), &best);
                }
            }
            for (line, why) in &rows.missing {
                skip(&format!("{}:{line}", f.display()), why);
            }
            count += rows.lines.len();
        }
        return Ok(count);
    }
    let input = saved.meta.image_input.clone().ok_or_else(|| Error::Checkpoint {
        path: path.clone(),
        msg: match saved.meta.array_input {
            Some(_) => "its run trained on arrays (taper.data.safetensors or taper.data.numpy): give .npy, .npz or .safetensors files".into(),
            None => "its run did not train on an image folder (taper.data.images), a CSV file (taper.data.csv) or arrays (taper.data.safetensors, taper.data.numpy), so taper classify does not know how to read an input for it".into(),
        },
    })?;
    let mut images = Vec::new();
    for f in files {
        match f.is_dir() {
            true => {
                let found = crate::data::image_files(f)?;
                if let Some(why) = found.passed_over.summary() {
                    skip(&f.display().to_string(), &why);
                }
                images.extend(found.images)
            }
            false => images.push(f.clone()),
        }
    }
    let features = input.channels * (input.size[0] * input.size[1]) as usize;
    for chunk in images.chunks(64) {
        use rayon::prelude::*;
        let rows = chunk
            .par_iter()
            .map(|f| input.read(f))
            .collect::<Result<Vec<_>>>()?;
        for (file, best) in chunk
            .iter()
            .zip(guess(rows.concat(), chunk.len(), features)?)
        {
            emit(&file.display().to_string(), &best);
        }
    }
    Ok(images.len())
}

/// `taper classify CHECKPOINT --text TEXT...`: [`classify_checkpoint`] for
/// texts given as they are (each a row: its text, and its pair's second
/// for a run on pairs), read as the run read its column of text; emitted as
/// `text 1`, `text 2`, ..., an empty one passed to `skip`. Returns the count
/// classified.
pub fn classify_given_texts(
    arg: &Path,
    texts: Vec<Vec<String>>,
    top: usize,
    emit: &mut dyn FnMut(&str, &Answer),
    skip: &mut dyn FnMut(&str, &str),
) -> Result<usize> {
    let path = locate(arg)?;
    let saved = open(&path, &Device::Cpu)?;
    let Some(table) = saved.meta.table_input.as_ref().filter(|t| t.text.is_some()) else {
        return Err(Error::Checkpoint {
            path,
            msg: "its run did not train on a CSV file's texts (taper.data.csv{ text = ... }): give it files, not `--text`".into(),
        });
    };
    let classes = saved.meta.classes.clone().unwrap_or_default();
    let targets = regression_targets(&saved.meta);
    let model = saved.trainer.frozen()?;
    let rows = table.given_texts(Path::new("--text"), texts)?;
    let c = rows.context;
    for (ids, at) in rows.ids.chunks(64 * c).zip(rows.lines.chunks(64)) {
        let x = candle_core::Tensor::from_vec(ids.to_vec(), (at.len(), c), &Device::Cpu)?;
        for (n, best) in at.iter().zip(answers(&*model, &classes, &targets, top, x)?) {
            emit(&format!("text {n}"), &best);
        }
    }
    for (n, why) in &rows.missing {
        skip(&format!("text {n}"), why);
    }
    Ok(rows.lines.len())
}
