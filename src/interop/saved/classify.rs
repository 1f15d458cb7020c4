//! `taper classify`: a checkpoint's answers for image files, CSV rows,
//! arrays or texts, read as its run read its data: the likeliest classes,
//! a regression's values in their units, or a multi-label classifier's
//! labels.

use std::path::Path;

use candle_core::Device;

use super::{locate, open};
use crate::engine::checkpoint::CheckpointMeta;
use crate::{Error, Result};

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
        let at = |line: usize| format!("{}:{line}", f.display());
        count += emit_texts(&rows, &at, answer, emit, skip)?;
    }
    Ok(count)
}

/// The answers for `rows` of text, 64 at a time, each emitted as `at(its
/// line)`; the rows passed over told to `skip`. Returns the count answered.
fn emit_texts(
    rows: &crate::data::TextRows,
    at: &dyn Fn(usize) -> String,
    answer: &dyn Fn(candle_core::Tensor) -> Result<Vec<Answer>>,
    emit: &mut dyn FnMut(&str, &Answer),
    skip: &mut dyn FnMut(&str, &str),
) -> Result<usize> {
    let c = rows.context;
    for (ids, lines) in rows.ids.chunks(64 * c).zip(rows.lines.chunks(64)) {
        let x = candle_core::Tensor::from_vec(ids.to_vec(), (lines.len(), c), &Device::Cpu)?;
        for (&line, best) in lines.iter().zip(answer(x)?) {
            emit(&at(line), &best);
        }
    }
    for (line, why) in &rows.missing {
        skip(&at(*line), why);
    }
    Ok(rows.lines.len())
}

/// What [`answers`] names the outputs by: the classes, a regression's
/// targets (name, mean and deviation), or a multi-label classifier's labels
/// (the targets' names).
struct Outputs {
    classes: Vec<String>,
    targets: Vec<(String, f64, f64)>,
    multi_label: bool,
}

impl Outputs {
    fn of(meta: &CheckpointMeta) -> Outputs {
        Outputs {
            classes: meta.classes.clone().unwrap_or_default(),
            targets: regression_targets(meta),
            multi_label: meta.multi_label,
        }
    }
}

/// The `top` classes with their probabilities (or a regression's targets'
/// values, or a multi-label classifier's `top` likeliest labels, each a
/// sigmoid's probability) of each row of `x` through `model`. A `top` of 0
/// is one class, or every label.
fn answers(
    model: &dyn candle_core::Module,
    outputs: &Outputs,
    top: usize,
    x: candle_core::Tensor,
) -> Result<Vec<Answer>> {
    let out = model.forward(&x)?;
    let Outputs {
        classes,
        targets,
        multi_label,
    } = outputs;
    if *multi_label {
        let k = targets.len().max(1);
        let p: Vec<f32> = candle_nn::ops::sigmoid(&out.to_dtype(candle_core::DType::F32)?)?
            .flatten_all()?
            .to_vec1()?;
        let names: Vec<String> = targets.iter().map(|t| t.0.clone()).collect();
        return Ok(p
            .chunks(k)
            .map(|row| {
                ranked(
                    row.to_vec(),
                    &names,
                    if top == 0 { k } else { top },
                    "label",
                )
            })
            .collect());
    }
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
        .map(|p| ranked(p, classes, top.max(1), "class"))
        .collect())
}

/// The `top` likeliest of `probabilities`, most likely first, named by
/// `names` (else `what i`).
fn ranked(probabilities: Vec<f32>, names: &[String], top: usize, what: &str) -> Answer {
    let mut ranked: Vec<(usize, f32)> = probabilities.into_iter().enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    Answer::Classes(
        ranked
            .into_iter()
            .take(top)
            .map(|(i, probability)| Guess {
                class: names
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| format!("{what} {i}")),
                probability,
            })
            .collect(),
    )
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
    let model = saved.trainer.frozen()?;
    let outputs = Outputs::of(&saved.meta);
    let answer = |x: candle_core::Tensor| answers(&*model, &outputs, top, x);
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
    let outputs = Outputs::of(&saved.meta);
    let model = saved.trainer.frozen()?;
    let rows = table.given_texts(Path::new("--text"), texts)?;
    let answer = |x: candle_core::Tensor| answers(&*model, &outputs, top, x);
    emit_texts(&rows, &|n| format!("text {n}"), &answer, emit, skip)
}
