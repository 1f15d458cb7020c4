//! Samples from arrays: one of inputs and one of targets, both with the
//! sample as their first dimension, memory-mapped and read row by row: two
//! tensors of a safetensors file, or NumPy arrays (`super::numpy`). Inputs of a float or u8 type become f32 (u8 divided by `scale`);
//! integer inputs (token ids) and class labels become u32; a regression's
//! targets (a number, or a row of `k` numbers, per sample) become f32
//! `[n, k]`.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use safetensors::{Dtype, SafeTensors};

use super::mapped::Mapped;
use super::Source;
use crate::{Error, Result};

/// One array of samples, where it lies in its mapped file.
pub(crate) struct Column {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte offset of the data in the file.
    pub start: usize,
    pub row_bytes: usize,
    pub map: Arc<Mapped>,
    /// The file its errors name (`data.npz: y.npy` for a compressed
    /// archive member, whose offsets count from the member's start).
    pub file: String,
    /// Its name in the file, and what the format calls it ("tensor",
    /// "array"), for errors.
    pub name: String,
    pub kind: &'static str,
}

impl Column {
    /// Sizes the rows of `shape`; an error when the data would run past the
    /// end of the mapping.
    pub fn new(
        dtype: Dtype,
        shape: Vec<usize>,
        start: usize,
        map: Arc<Mapped>,
        file: String,
        (kind, name): (&'static str, &str),
    ) -> Result<Column> {
        let what = format!("{kind} `{name}`");
        let size = dtype_size(dtype).ok_or_else(|| {
            Error::Data(format!("{file}: {what}: dtype {dtype:?} is not supported"))
        })?;
        if shape.is_empty() {
            return Err(Error::Data(format!(
                "{file}: {what} is a scalar; samples need a first dimension"
            )));
        }
        // Checked: a damaged header may claim an impossible shape.
        let row_bytes = shape[1..].iter().try_fold(size, |n, &d| n.checked_mul(d));
        let end = row_bytes
            .and_then(|r| r.checked_mul(shape[0]))
            .and_then(|n| n.checked_add(start));
        let (Some(row_bytes), Some(end)) = (row_bytes, end) else {
            return Err(Error::Data(format!(
                "{file}: {what}: shape {shape:?} is too large to be real: the file is damaged"
            )));
        };
        if end > map.len() {
            return Err(Error::Data(format!(
                "{file}: offset {end}: {what} runs past the end of the file ({} bytes)",
                map.len()
            )));
        }
        Ok(Column {
            dtype,
            shape,
            start,
            row_bytes,
            map,
            file,
            name: name.to_string(),
            kind,
        })
    }

    pub fn what(&self) -> String {
        format!("{} `{}`", self.kind, self.name)
    }
}

fn dtype_size(d: Dtype) -> Option<usize> {
    Some(match d {
        Dtype::U8 | Dtype::I8 => 1,
        Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::BF16 => 2,
        Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
        Dtype::I64 | Dtype::U64 | Dtype::F64 => 8,
        _ => return None,
    })
}

pub struct Samples {
    /// The format and file(s), for `describe`.
    name: String,
    split: String,
    x: Column,
    y: Column,
    /// Whether `y` is a regression target (numbers) rather than labels.
    target: bool,
    scale: f32,
}

/// Which tensor holds the targets, and what they are.
#[derive(Clone, Copy, Debug)]
pub enum Targets<'a> {
    /// Class indices (`y = "name"`).
    Labels(&'a str),
    /// Numbers to predict (`target = "name"`): one per sample, or a row
    /// of them.
    Values(&'a str),
}

fn err(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Data(format!("{}: {msg}", path.display()))
}

fn column(
    path: &Path,
    map: &Arc<Mapped>,
    header: usize,
    st: &safetensors::tensor::Metadata,
    name: &str,
) -> Result<Column> {
    let info = st.info(name).ok_or_else(|| {
        err(
            path,
            format!("no tensor named `{name}` (it has: {})", {
                let mut names: Vec<String> = st.tensors().into_keys().collect();
                names.sort();
                names.join(", ")
            }),
        )
    })?;
    let start = 8 + header + info.data_offsets.0;
    let end = 8 + header + info.data_offsets.1;
    if end > map.len() {
        return Err(err(
            path,
            format!(
                "offset {}: tensor `{name}` runs past the end of the file ({} bytes)",
                end,
                map.len()
            ),
        ));
    }
    Column::new(
        info.dtype,
        info.shape.clone(),
        start,
        map.clone(),
        path.display().to_string(),
        ("tensor", name),
    )
}

/// Tensors `names` of the safetensors file at `path`, in that order.
pub(super) fn tensors(path: &Path, names: &[&str]) -> Result<Vec<Column>> {
    let map = Arc::new(Mapped::open(path)?);
    let (header, meta) = SafeTensors::read_metadata(&map)
        .map_err(|e| err(path, format!("offset 0: not a safetensors file: {e}")))?;
    names
        .iter()
        .map(|n| column(path, &map, header, &meta, n))
        .collect()
}

pub fn samples(path: &Path, x: &str, y: Targets, scale: f32, split: &str) -> Result<Samples> {
    let (name, target) = match y {
        Targets::Labels(n) => (n, false),
        Targets::Values(n) => (n, true),
    };
    let mut columns = tensors(path, &[x, name])?.into_iter();
    let (Some(xc), Some(yc)) = (columns.next(), columns.next()) else {
        unreachable!("two names, two tensors")
    };
    Samples::new(
        format!("safetensors {}", path.display()),
        xc,
        yc,
        target,
        scale,
        split,
    )
}

impl Samples {
    /// Samples of inputs `x` and targets `y` (numbers to predict when
    /// `target`, else class labels), checked: as many of each, labels whole
    /// numbers, targets finite, integer inputs whole.
    pub(crate) fn new(
        name: String,
        x: Column,
        y: Column,
        target: bool,
        scale: f32,
        split: &str,
    ) -> Result<Samples> {
        if x.shape[0] != y.shape[0] {
            return Err(Error::Data(format!(
                "{}: {} has {} samples, {} has {}",
                x.file,
                x.what(),
                x.shape[0],
                y.what(),
                y.shape[0]
            )));
        }
        if target {
            target_values(&y)?;
        } else {
            // Labels (and integer inputs: token ids) become u32 class indices
            // and ids: a negative, fractional or NaN one would be silently wrong.
            whole_values(&y, true)?;
        }
        if !is_float(x.dtype) && x.dtype != Dtype::U8 {
            whole_values(&x, false)?;
        }
        Ok(Samples {
            name,
            split: split.into(),
            x,
            y,
            target,
            scale,
        })
    }
}

/// Checks a regression's targets: a number or a row of numbers per sample
/// (shape `[n]`, or `[n, k]` for `k` targets), every one finite; the first
/// that is not is named by sample and byte offset.
fn target_values(c: &Column) -> Result<()> {
    if c.shape.len() > 2 || c.shape.get(1) == Some(&0) {
        return Err(Error::Data(format!(
            "{}: {} has shape {:?}: a `target` is a number per sample (shape [n]) or a row of them, one per target (shape [n, k])",
            c.file,
            c.what(),
            c.shape
        )));
    }
    first_bad(c, |v| v.is_finite(), "is not a finite number")
}

/// Checks that every value of `c` is a whole number, 0 or more (a class
/// index or a token id); the first one that is not is named by sample and
/// byte offset. For `labels`, a fraction says how to give numbers to predict.
pub(super) fn whole_values(c: &Column, labels: bool) -> Result<()> {
    let mut what = "is not a class index or token id (a whole number, 0 or more)".to_string();
    if labels && is_float(c.dtype) {
        what.push_str(&format!(
            "; for numbers to predict (a regression), give it as `target = \"{}\"`",
            c.name
        ));
    }
    first_bad(
        c,
        |v| v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 4294967296.0,
        &what,
    )
}

/// The first value of `c` that `ok` refuses, as an error naming its sample
/// and byte offset; read a megabyte at a time.
fn first_bad(c: &Column, ok: impl Fn(f64) -> bool, what: &str) -> Result<()> {
    let per_row = c.shape[1..].iter().product::<usize>().max(1);
    let size = c.row_bytes / per_row;
    if c.row_bytes == 0 {
        return Ok(());
    }
    let rows_per_chunk = (1 << 20) / c.row_bytes + 1;
    let mut buf = Vec::new();
    for first in (0..c.shape[0]).step_by(rows_per_chunk) {
        let rows = rows_per_chunk.min(c.shape[0] - first);
        let start = c.start + first * c.row_bytes;
        buf.clear();
        decode(c.dtype, &c.map[start..start + rows * c.row_bytes], &mut buf);
        if let Some(k) = buf.iter().position(|v| !ok(*v)) {
            let element = first * per_row + k;
            return Err(Error::Data(format!(
                "{}: offset {}: {}, sample {}: {} {what}",
                c.file,
                c.start + element * size,
                c.what(),
                element / per_row,
                buf[k]
            )));
        }
    }
    Ok(())
}

/// Decodes little-endian elements to f64 (exact for every supported integer
/// type up to 2^53 and for the float types).
fn decode(dtype: Dtype, b: &[u8], out: &mut Vec<f64>) {
    match dtype {
        Dtype::U8 => out.extend(b.iter().map(|&v| v as f64)),
        Dtype::I8 => out.extend(b.iter().map(|&v| v as i8 as f64)),
        Dtype::U16 => out.extend(
            b.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as f64),
        ),
        Dtype::I16 => out.extend(
            b.chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]) as f64),
        ),
        Dtype::F16 => out.extend(
            b.chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()),
        ),
        Dtype::BF16 => out.extend(
            b.chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()),
        ),
        Dtype::U32 => out.extend(
            b.chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as f64),
        ),
        Dtype::I32 => out.extend(
            b.chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as f64),
        ),
        Dtype::F32 => out.extend(
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as f64),
        ),
        Dtype::I64 => out.extend(
            b.chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64),
        ),
        Dtype::U64 => out.extend(
            b.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64),
        ),
        Dtype::F64 => out.extend(
            b.chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))),
        ),
        _ => {}
    }
}

impl Column {
    /// The values of rows `indices`, row after row, as f64.
    pub(super) fn rows(&self, indices: &[usize]) -> Vec<f64> {
        let mut out = Vec::with_capacity(indices.len() * self.row_bytes);
        for &i in indices {
            let s = self.start + i * self.row_bytes;
            decode(self.dtype, &self.map[s..s + self.row_bytes], &mut out);
        }
        out
    }
}

pub(super) fn is_float(d: Dtype) -> bool {
    matches!(d, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64)
}

impl Source for Samples {
    fn array_input(&self) -> Option<super::ArrayInput> {
        Some(super::ArrayInput {
            x: self.x.name.clone(),
            shape: self.x.shape[1..].to_vec(),
            dtype: format!("{:?}", self.x.dtype),
            scale: self.scale,
            targets: match self.target {
                true => self.y.shape.get(1).copied().unwrap_or(1),
                false => 0,
            },
        })
    }
    fn len(&self) -> usize {
        self.x.shape[0]
    }
    fn split(&self) -> &str {
        &self.split
    }
    fn describe(&self) -> String {
        format!(
            "{} (x {:?} {:?}, {} {:?})",
            self.name,
            self.x.shape,
            self.x.dtype,
            if self.target { "target" } else { "y" },
            self.y.shape
        )
    }
    fn gather(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        self.x.map.check()?;
        if !Arc::ptr_eq(&self.x.map, &self.y.map) {
            self.y.map.check()?;
        }
        let b = indices.len();
        let mut xs = vec![b];
        xs.extend(&self.x.shape[1..]);
        let mut ys = vec![b];
        ys.extend(&self.y.shape[1..]);
        let xv = self.x.rows(indices);
        let x = if is_float(self.x.dtype) || self.x.dtype == Dtype::U8 {
            let scale = if self.x.dtype == Dtype::U8 {
                self.scale
            } else {
                1.0
            } as f64;
            Tensor::from_vec(
                xv.iter().map(|v| (v / scale) as f32).collect::<Vec<_>>(),
                xs,
                &Device::Cpu,
            )?
        } else {
            Tensor::from_vec(xv, xs, &Device::Cpu)?.to_dtype(DType::U32)?
        };
        let yv = self.y.rows(indices);
        let y = if self.target {
            let v: Vec<f32> = yv.iter().map(|v| *v as f32).collect();
            let k = self.y.shape.get(1).copied().unwrap_or(1);
            Tensor::from_vec(v, (b, k), &Device::Cpu)?
        } else {
            Tensor::from_vec(yv, ys, &Device::Cpu)?.to_dtype(DType::U32)?
        };
        Ok((x, y))
    }
}
