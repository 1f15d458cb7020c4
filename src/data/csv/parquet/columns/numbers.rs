//! A Parquet column of floats or of integers that f32 holds exactly (or of
//! lists of them), decoded straight into numbers ([`Lists`]), without the
//! text of its cells. An integer's f32 writes the integer's text, so a
//! label or a category reads as it did.

use parquet::column::reader::ColumnReader;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::statistics::Statistics;

use super::{Cells, Decoded, Reading};
use crate::data::csv::row::Lists;

impl Reading {
    /// Whether column `c` of the file `meta` describes keeps its values
    /// as numbers: floats, integers of 8 or 16 bits, and signed integers
    /// that every row group's statistics bound within ±2^24, which f32
    /// holds exactly (or lists of them).
    pub(super) fn numbers(&self, meta: &ParquetMetaData, c: usize) -> bool {
        match self.cells {
            Cells::Float | Cells::Double => true,
            _ if self.narrow => true,
            Cells::Int32(true) | Cells::Int64(true) => {
                (meta.row_groups().iter()).all(|g| exact_between(g.column(c).statistics()))
            }
            _ => false,
        }
    }

    /// A row group's column of `n` rows of numbers or lists of them, decoded
    /// whole: its values as the f32 the model is given.
    pub(super) fn read_numbers(
        &self,
        column: ColumnReader,
        n: usize,
    ) -> parquet::errors::Result<Lists> {
        let at = (n, self);
        match column {
            ColumnReader::FloatColumnReader(c) => {
                Ok(Decoded::of(c, at, no_text)?.numbers(n, |v| *v))
            }
            ColumnReader::DoubleColumnReader(c) => {
                Ok(Decoded::of(c, at, no_text)?.numbers(n, |v| *v as f32))
            }
            ColumnReader::Int32ColumnReader(c) => {
                let d = exact(Decoded::of(c, at, no_text)?, |v| i64::from(*v))?;
                Ok(d.numbers(n, |v| *v as f32))
            }
            ColumnReader::Int64ColumnReader(c) => {
                let d = exact(Decoded::of(c, at, no_text)?, |v| *v)?;
                Ok(d.numbers(n, |v| *v as f32))
            }
            _ => Err(parquet::errors::ParquetError::General(
                "a column's reader is not of its type".into(),
            )),
        }
    }
}

impl<T> Decoded<T> {
    /// The `n` rows of the column as `f32`: [`Decoded::lists`], or a value
    /// a row (a null's place NaN, its row among the nulls).
    fn numbers(self, n: usize, f32_of: fn(&T) -> f32) -> Lists {
        if self.list.is_some() {
            return self.lists(n, f32_of);
        }
        let mut out = Lists::flat();
        out.values.reserve(n);
        let mut values = self.values.iter();
        for r in 0..n {
            let present = !self.nullable || self.defs.get(r) == Some(&1);
            match present.then(|| values.next()).flatten() {
                Some(v) => out.values.push(f32_of(v)),
                None => {
                    out.values.push(f32::NAN);
                    out.nulls.push(r);
                }
            }
        }
        out
    }

    /// The `n` rows of a list column, their items as `f32`: each row's
    /// list as [`super::Cursor::next_cell`] writes it, a null item NaN (a list of
    /// one null item, whose cell is empty, an empty list).
    fn lists(mut self, n: usize, f32_of: fn(&T) -> f32) -> Lists {
        let list = self.list.take().expect("a list column");
        let mut out = Lists {
            values: Vec::with_capacity(self.values.len()),
            ends: Vec::with_capacity(n),
            ..Lists::default()
        };
        for _ in 0..n {
            let start = out.values.len();
            let (mut first, mut nulls) = (true, 0);
            while let Some(&def) = self.defs.get(self.entry) {
                if !first && self.reps.get(self.entry) != Some(&1) {
                    break;
                }
                self.entry += 1;
                first = false;
                if def < list.item {
                    continue;
                }
                let v = match def == list.max {
                    true => self.values.get(self.value).map_or(f32::NAN, f32_of),
                    false => f32::NAN,
                };
                self.value += usize::from(def == list.max);
                nulls += usize::from(def < list.max);
                out.values.push(v);
            }
            if out.values.len() == start + 1 && nulls == 1 {
                out.values.truncate(start);
            }
            out.ends.push(out.values.len());
        }
        out
    }
}

/// The largest integer below which f32 holds every integer exactly.
const EXACT: i64 = 1 << 24;

/// Whether a row group's statistics of an integer column bound its values
/// within ±[`EXACT`].
fn exact_between(statistics: Option<&Statistics>) -> bool {
    let within = |min: i64, max: i64| -EXACT <= min && max <= EXACT;
    match statistics {
        Some(Statistics::Int32(s)) => match (s.min_opt(), s.max_opt()) {
            (Some(&min), Some(&max)) => within(min.into(), max.into()),
            _ => false,
        },
        Some(Statistics::Int64(s)) => match (s.min_opt(), s.max_opt()) {
            (Some(&min), Some(&max)) => within(min, max),
            _ => false,
        },
        _ => false,
    }
}

/// `d`, a decoded integer column, when each of its values is within
/// ±[`EXACT`] (as its statistics said); else an error.
fn exact<T>(d: Decoded<T>, as_i64: fn(&T) -> i64) -> parquet::errors::Result<Decoded<T>> {
    match d.values.iter().map(as_i64).find(|v| v.abs() > EXACT) {
        None => Ok(d),
        Some(v) => Err(parquet::errors::ParquetError::General(format!(
            "the integer {v} is outside the range its row group's statistics give (a damaged file?)"
        ))),
    }
}

/// No text: for a column whose values are kept as numbers.
fn no_text<T>(_: &T, _: &mut String) {}
