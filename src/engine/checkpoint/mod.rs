//! Checkpoints: one safetensors file holding the model (`model.*`) and the
//! optimizer state (`optim.*`), with run metadata in its header. Written to a
//! temporary file, synced, then renamed into place, so a checkpoint on disk is
//! never half-written; a CRC-32 of the tensors in the header is verified on
//! load, so a damaged one is never trained from. A JSON copy of the metadata
//! is written beside it for people and tools; taper itself reads the header.
//! Run folders (names, older checkpoints kept, `--resume`) are in `folder`.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

mod atomic;
mod folder;

pub use atomic::write_atomically;
use atomic::{publish, with_suffix, written};

pub use folder::{
    archive_latest, best_file_name, disk_full, file_name, keep_newest, latest_valid, make_room,
    repair_sidecars, resolve_resume, tidy,
};

pub const FORMAT: &str = "taper-checkpoint/1";

/// The part of an epoch trained before a checkpoint interrupted it.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct EpochTrained {
    /// Sum of batch-mean losses times batch sizes.
    pub loss_sum: f64,
    /// Samples trained on (skipped batches not included).
    pub samples: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CheckpointMeta {
    pub format: String,
    /// Optimizer steps taken.
    pub step: u64,
    /// The epoch in progress (1-based), or the last one finished.
    pub epoch: u64,
    /// Steps taken in `epoch` (a generator's data resumes after that many batches).
    pub epoch_steps: u64,
    /// Samples of `epoch` consumed: native data resumes at this position.
    #[serde(default)]
    pub epoch_samples: u64,
    /// Whether `epoch` was finished.
    pub epoch_complete: bool,
    /// What the unfinished `epoch` had trained: the resumed epoch's record
    /// counts it (its mean loss and samples are then a straight run's).
    /// Absent when the epoch was finished, and in older checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch_trained: Option<EpochTrained>,
    /// Samples in the data the unfinished `epoch` read (native data): a
    /// resume into data of another size says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch_data: Option<u64>,
    pub model: String,
    /// The model as structured data (`{ "gpt": { "vocab": 65, ... } }`,
    /// the options of its `taper.model` constructor): a checkpoint alone can
    /// be rebuilt, sampled and exported. Absent in older checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_config: Option<serde_json::Value>,
    /// The run's vocabulary, for text runs: `{ "chars": "..." }` or
    /// `{ "tokenizer": <tokenizer.json> }` (see `data::Vocab::record`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<serde_json::Value>,
    /// The class names of a classifier's data, label 0 first, where the
    /// data knew them (an image folder's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<Vec<String>>,
    /// How an image file becomes the model's input, for a run on an image
    /// folder: `{ "size": [h, w], "channels": c, "scale": s }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_input: Option<crate::data::ImageInput>,
    /// How a CSV row becomes the model's input, for a run on a CSV file:
    /// its feature columns, scale and standardization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_input: Option<crate::data::TableInput>,
    /// The standardization of other data's samples (a safetensors or IDX
    /// file's), for exports to apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_input: Option<crate::data::SampleInput>,
    /// How a sample of a safetensors file or NumPy arrays becomes the
    /// model's input: `{ "x": "x", "shape": [4], "dtype": "F32", "scale":
    /// 255.0 }` (and `targets`, a regression's count), for `taper classify`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_input: Option<crate::data::ArrayInput>,
    /// Whether the run trained a multi-label classifier (`taper.loss.bce`):
    /// each output a label's yes or no, its targets' names those of the
    /// input's target columns.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub multi_label: bool,
    /// The run's best evaluation so far, when it keeps its best model
    /// (`run:evaluate(data, { keep_best = ... })`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<crate::engine::best::Best>,
    pub optimizer: String,
    /// The learning rate in use (a schedule's or `run:set_lr`'s).
    pub lr: f64,
    /// The learning rate the recipe configured the optimizer with: when it
    /// differs on resume (`--set lr=...`, an edit), the new one is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configured_lr: Option<f64>,
    pub seed: u64,
    /// FNV-1a hash of the recipe's source, to notice a resume under an
    /// edited recipe (allowed, but worth saying).
    #[serde(default)]
    pub recipe_hash: String,
    /// Batches an OOM policy skipped, as (epoch, position in the epoch).
    #[serde(default)]
    pub skipped: Vec<(u64, u64)>,
    /// The recipe's `run.state` table, when it holds only plain values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<serde_json::Value>,
    /// `crc32:` and 8 hex digits over the tensors (names, dtypes, shapes and
    /// bytes, by name), filled in by [`save`]; empty in checkpoints written
    /// before taper had it (those load unverified).
    #[serde(default)]
    pub checksum: String,
}

/// FNV-1a (64-bit) of `text`, as 16 hex digits.
pub fn text_hash(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn err(path: &Path, msg: impl ToString) -> Error {
    Error::Checkpoint {
        path: path.to_path_buf(),
        msg: msg.to_string(),
    }
}

/// The CRC-32 of tensors, in name order, over each one's name, dtype, shape
/// and bytes, as `crc32:` and 8 hex digits.
fn checksum<'a, V: safetensors::View + 'a>(tensors: impl Iterator<Item = (&'a str, V)>) -> String {
    let mut sorted: Vec<_> = tensors.collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut h = crc32fast::Hasher::new();
    for (name, v) in &sorted {
        h.update(name.as_bytes());
        h.update(format!("{:?}{:?}", v.dtype(), v.shape()).as_bytes());
        h.update(&v.data());
    }
    format!("crc32:{:08x}", h.finalize())
}

/// A checkpoint's metadata, reading its header alone (a safetensors file
/// starts with the header's length, then the header).
pub fn read_meta(path: &Path) -> Result<CheckpointMeta> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|e| Error::io(path, e))?;
    let len = u64::from_le_bytes(len);
    if len > 100 << 20 {
        return Err(err(
            path,
            format!("not a safetensors file: a header of {len} bytes"),
        ));
    }
    let mut header = vec![0u8; len as usize];
    f.read_exact(&mut header).map_err(|e| Error::io(path, e))?;
    let header: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|e| err(path, format!("not a safetensors file: {e}")))?;
    let json = header["__metadata__"]["taper"]
        .as_str()
        .ok_or_else(|| err(path, "no taper metadata: not a taper checkpoint"))?;
    parse_meta(path, json)
}

fn meta_of(path: &Path, bytes: &[u8]) -> Result<CheckpointMeta> {
    let (_, header) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| {
        err(
            path,
            format!("damaged or cut short: not a whole safetensors file ({e})"),
        )
    })?;
    let json = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get("taper"))
        .ok_or_else(|| err(path, "no taper metadata: not a taper checkpoint"))?;
    parse_meta(path, json)
}

fn parse_meta(path: &Path, json: &str) -> Result<CheckpointMeta> {
    let meta: CheckpointMeta =
        serde_json::from_str(json).map_err(|e| err(path, format!("bad metadata: {e}")))?;
    if meta.format != FORMAT {
        return Err(err(path, format!("format {} is not {FORMAT}", meta.format)));
    }
    Ok(meta)
}

/// Writes `tensors` and `meta` to `path` (and `path` with `.json`) atomically.
/// Both are written to temporary files first and published in one order
/// (checkpoint, then sidecar); a kill between the two renames leaves an old
/// sidecar, which [`repair_sidecars`] rewrites from the checkpoint's header.
pub fn save(path: &Path, tensors: Vec<(String, Tensor)>, meta: &CheckpointMeta) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    // A diverged model is not saved over the last good checkpoint.
    for (k, t) in tensors.iter().filter(|(k, _)| k.starts_with("model.")) {
        if t.dtype().is_float() && !all_finite(t)? {
            return Err(Error::Diverged(format!(
                "checkpoint {}: `{k}` holds NaN or infinite values (the training diverged: lower the learning rate?); not saved, so the last good checkpoint is kept",
                path.display()
            )));
        }
    }
    let raw = tensors
        .into_iter()
        .map(|(k, t)| {
            use safetensors::View;
            let t = t.to_device(&Device::Cpu)?;
            Ok((k, View::dtype(&t), t.dims().to_vec(), t.data().into_owned()))
        })
        .collect::<Result<Vec<_>>>()?;
    let views = raw
        .iter()
        .map(|(k, dtype, shape, bytes)| {
            let v = safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes)
                .map_err(|e| err(path, e))?;
            Ok((k.clone(), v))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut meta = meta.clone();
    meta.checksum = checksum(views.iter().map(|(k, v)| (k.as_str(), v)));
    let json = serde_json::to_string(&meta).map_err(|e| err(path, e))?;
    let header = HashMap::from([("taper".to_string(), json)]);
    let side = path.with_extension("json");
    let pretty = serde_json::to_string_pretty(&meta).map_err(|e| err(path, e))? + "\n";
    let ckpt = written(path, |tmp| {
        safetensors::serialize_to_file(views, Some(header), tmp).map_err(|e| match e {
            // The kind (a full disk) stays: a save can make room and retry.
            safetensors::SafeTensorError::IoError(io) => Error::io(tmp, io),
            other => err(path, other),
        })
    })?;
    let sidecar = written(&side, |tmp| {
        std::fs::write(tmp, pretty).map_err(|e| Error::io(tmp, e))
    });
    let sidecar = match sidecar {
        Ok(t) => t,
        Err(e) => {
            let _ = std::fs::remove_file(&ckpt);
            return Err(e);
        }
    };
    publish(&ckpt, path)?;
    publish(&sidecar, &side)
}

/// Whether every value of `t` is finite: 0 * x is NaN exactly for NaN and
/// infinite x, so one product and one sum tell, on the tensor's device.
fn all_finite(t: &Tensor) -> Result<bool> {
    let probe = (t.to_dtype(candle_core::DType::F32)? * 0.0)?
        .sum_all()?
        .to_scalar::<f32>()?;
    Ok(probe.is_finite())
}

/// Reads a checkpoint written by [`save`], verifying its checksum.
pub fn load(path: &Path, device: &Device) -> Result<(HashMap<String, Tensor>, CheckpointMeta)> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let meta = verified(path, &bytes)?;
    let tensors =
        candle_core::safetensors::load_buffer(&bytes, device).map_err(|e| err(path, e))?;
    Ok((tensors, meta))
}

/// Reads a whole checkpoint and verifies it, without building tensors.
pub fn verify(path: &Path) -> Result<CheckpointMeta> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    verified(path, &bytes)
}

fn verified(path: &Path, bytes: &[u8]) -> Result<CheckpointMeta> {
    let meta = meta_of(path, bytes)?;
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| err(path, format!("damaged: {e}")))?;
    if !meta.checksum.is_empty() {
        let sum = checksum(st.iter());
        if sum != meta.checksum {
            return Err(err(
                path,
                format!(
                    "damaged: its tensors' checksum is {sum}, the header says {} (the file changed after it was written)",
                    meta.checksum
                ),
            ));
        }
    }
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> CheckpointMeta {
        CheckpointMeta {
            format: FORMAT.into(),
            step: 1,
            epoch: 1,
            epoch_steps: 1,
            epoch_samples: 1,
            epoch_complete: false,
            epoch_trained: None,
            epoch_data: None,
            model: "m".into(),
            model_config: None,
            vocab: None,
            classes: None,
            image_input: None,
            table_input: None,
            sample_input: None,
            array_input: None,
            multi_label: false,
            best: None,
            optimizer: "o".into(),
            lr: 0.1,
            configured_lr: None,
            seed: 0,
            recipe_hash: String::new(),
            skipped: Vec::new(),
            state: None,
            checksum: String::new(),
        }
    }

    /// The numbers a resume goes on from (an unfinished epoch's loss sum,
    /// the learning rate, `run.state`'s values) come back from a saved
    /// checkpoint bit for bit: serde_json's default float parsing is off by
    /// one unit in the last place for some values (a mid-epoch resume's
    /// epoch record then differed from a straight run's), which its
    /// `float_roundtrip` feature corrects.
    #[test]
    fn a_checkpoints_numbers_read_back_bit_for_bit() -> Result<()> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.safetensors");
        let mut rng = crate::engine::rng::Rng::new(7);
        let values: Vec<f64> = (0..20_000)
            .map(|i| {
                let u = rng.uniform();
                // Losses, sums of thousands of them, tiny learning rates.
                u * [1.0, 1e3, 1e-4, 0.13][i % 4]
            })
            .chain([0.13108832937151338, 0.1310883293715134])
            .collect();
        let mut m = meta();
        m.epoch_trained = Some(EpochTrained {
            loss_sum: values[0],
            samples: 3,
        });
        m.lr = values[1];
        m.state = Some(serde_json::json!({ "values": values }));
        let w = Tensor::new(&[1f32], &Device::Cpu)?;
        save(&path, vec![("model.w".into(), w)], &m)?;
        let (_, back) = load(&path, &Device::Cpu)?;
        assert_eq!(
            back.epoch_trained.unwrap().loss_sum.to_bits(),
            values[0].to_bits()
        );
        assert_eq!(back.lr.to_bits(), values[1].to_bits());
        let read: Vec<f64> = serde_json::from_value(back.state.unwrap()["values"].clone()).unwrap();
        let off = values
            .iter()
            .zip(&read)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(off, 0, "{off} of {} values came back changed", values.len());
        Ok(())
    }

    #[test]
    fn non_finite_weights_are_not_saved_over_a_good_checkpoint() -> Result<()> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.safetensors");
        let good = Tensor::new(&[1f32, 2.0], &Device::Cpu)?;
        save(&path, vec![("model.w".into(), good)], &meta())?;
        let before = std::fs::read(&path).unwrap();
        for bad in [f32::NAN, f32::INFINITY] {
            let t = Tensor::new(&[1f32, bad], &Device::Cpu)?;
            let e = save(&path, vec![("model.w".into(), t)], &meta()).unwrap_err();
            assert!(
                e.to_string().contains("`model.w` holds NaN or infinite"),
                "{e}"
            );
            assert_eq!(std::fs::read(&path).unwrap(), before);
        }
        // Optimizer state is not checked (only the model's weights are).
        let t = Tensor::new(&[f32::INFINITY], &Device::Cpu)?;
        let ok = Tensor::new(&[1f32], &Device::Cpu)?;
        save(
            &path,
            vec![("model.w".into(), ok), ("optim.x".into(), t)],
            &meta(),
        )?;
        Ok(())
    }
}
