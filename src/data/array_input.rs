//! How a sample of a safetensors file or of NumPy arrays becomes a model's
//! input: the inputs' name, a sample's shape, their element type and the
//! divisor of u8 values. A checkpoint keeps it ([`ArrayInput`]), so that
//! `taper classify` reads new arrays as the run read its data.

use std::path::Path;

use safetensors::Dtype;

use super::samples::{is_float, Column};
use crate::{Error, Result};

/// The reading of a run's array inputs, saved with its checkpoints.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ArrayInput {
    /// The inputs' tensor or array name in the file (`x`).
    pub x: String,
    /// A sample's shape: `[4]` for rows of 4 features, `[28, 28]` for
    /// images.
    pub shape: Vec<usize>,
    /// The inputs' element type, as the file held it (`U8`, `F32`, ...).
    pub dtype: String,
    /// u8 inputs are divided by it.
    pub scale: f32,
    /// A regression's targets per sample; 0 for class labels.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub targets: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The inputs of an array file, read as a run's [`ArrayInput`] says.
pub struct ArrayRows {
    column: Column,
    scale: f32,
}

/// What kind of values an element type holds, as a run reads them.
fn kind(d: Dtype) -> &'static str {
    match d {
        Dtype::U8 => "bytes (u8, divided by the scale)",
        d if is_float(d) => "floats",
        _ => "integers (token ids)",
    }
}

impl ArrayInput {
    /// A sample's values.
    pub fn width(&self) -> usize {
        self.shape.iter().product()
    }

    /// The inputs of `path`: an `.npy` file (the array itself), an `.npz`
    /// archive or a safetensors file (its array or tensor named as the
    /// run's inputs were). Their samples must have the run's shape and
    /// their values its kind (bytes, floats); token ids are refused.
    pub fn open(&self, path: &Path) -> Result<ArrayRows> {
        let ours = kind(self.dtype());
        if self.dtype() == Dtype::I64 {
            return Err(Error::Data(format!(
                "the run's inputs ({} `{}`) are {ours}: only samples of bytes or floats are read as inputs",
                self.dtype, self.x
            )));
        }
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        let column = match ext {
            "npy" => super::numpy::npy_file(path)?,
            "npz" => super::numpy::archive_arrays(path, &[&self.x])?.remove(0),
            "safetensors" => super::samples::tensors(path, &[&self.x])?.remove(0),
            _ => {
                return Err(Error::Data(format!(
                    "{}: not an .npy, .npz or .safetensors file, which the run's inputs ({} `{}`) came from",
                    path.display(),
                    kind(self.dtype()),
                    self.x
                )))
            }
        };
        if column.shape[1..] != self.shape[..] {
            return Err(Error::Data(format!(
                "{}: {} holds samples of shape {:?}; the run trained on samples of shape {:?}",
                column.file,
                column.what(),
                &column.shape[1..],
                self.shape
            )));
        }
        let theirs = kind(column.dtype);
        if ours != theirs {
            return Err(Error::Data(format!(
                "{}: {} holds {theirs} ({:?}); the run trained on {ours} ({})",
                column.file,
                column.what(),
                column.dtype,
                self.dtype
            )));
        }
        Ok(ArrayRows {
            column,
            scale: self.scale,
        })
    }

    fn dtype(&self) -> Dtype {
        match self.dtype.as_str() {
            "U8" => Dtype::U8,
            "F16" => Dtype::F16,
            "BF16" => Dtype::BF16,
            "F32" => Dtype::F32,
            "F64" => Dtype::F64,
            _ => Dtype::I64,
        }
    }
}

impl ArrayRows {
    /// The samples in the file.
    pub fn len(&self) -> usize {
        self.column.shape[0]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Samples `range` as f32 values, sample after sample (u8 divided by
    /// the scale).
    pub fn values(&self, range: std::ops::Range<usize>) -> Vec<f32> {
        let indices: Vec<usize> = range.collect();
        let scale = match self.column.dtype {
            Dtype::U8 => self.scale as f64,
            _ => 1.0,
        };
        self.column
            .rows(&indices)
            .into_iter()
            .map(|v| (v / scale) as f32)
            .collect()
    }
}
