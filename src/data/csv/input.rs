//! How a table row becomes a model's input, as a run on a CSV file read it:
//! the feature columns, the divisor and the standardization. A classifier's
//! checkpoint keeps it ([`TableInput`]), so that `taper classify` reads new
//! rows the same way and an ONNX export takes raw feature values.

use std::path::Path;

use super::columns::Layout;
use super::{each_row, read_text, Column, Shape};
use crate::data::Moments;
use crate::Result;

/// The reading of a CSV run's rows, saved with its checkpoints.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TableInput {
    /// The feature columns, in order: header names, or, for a file without
    /// a header, 0-based indices.
    pub columns: Vec<Column>,
    pub header: bool,
    pub delimiter: String,
    /// Values are divided by it...
    pub scale: f32,
    /// ...then standardized, feature by feature, when the run's data was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standardize: Option<Moments>,
    /// A regression run's target column: the model predicts its value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Column>,
    /// The target's standardization, when the run's data had one: the
    /// model predicts `(value - mean) / std`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_standardize: Option<Moments>,
}

/// A CSV file's rows as a model's inputs.
#[derive(Debug, Default)]
pub struct TableRows {
    /// Row after row, [`TableInput::width`] values each.
    pub values: Vec<f32>,
    /// The line of each row.
    pub lines: Vec<usize>,
    /// The rows passed over: their line, and what is missing.
    pub missing: Vec<(usize, String)>,
}

impl TableInput {
    /// Features per row.
    pub fn width(&self) -> usize {
        self.columns.len()
    }

    /// The rows of a CSV file as the model's inputs (row after row,
    /// [`TableInput::width`] values each), with the line of each row. The
    /// file needs the feature columns (by name, or at the training file's
    /// indices); its other columns, a label among them, are not read. Rows
    /// with a missing value are passed over, each listed with its line and
    /// what is missing.
    pub fn read(&self, path: &Path) -> Result<TableRows> {
        let text = read_text(path)?;
        let shape = Shape {
            header: self.header,
            delimiter: self.delimiter.as_bytes().first().copied().unwrap_or(b','),
        };
        let mut rows = TableRows::default();
        each_row(
            path,
            &text,
            shape,
            |n, names| Layout::resolve(path, None, Some(&self.columns), n, names),
            |l, line, record| {
                if let Some(c) = l.missing(record) {
                    let why = format!("a missing value (`{}`) in {}", &record[c], l.column(c));
                    rows.missing.push((line, why));
                    return Ok(());
                }
                let start = rows.values.len();
                l.features_into((path, line), record, self.scale, "", &mut rows.values)?;
                if let Some(m) = &self.standardize {
                    m.apply(&mut rows.values[start..]);
                }
                rows.lines.push(line);
                Ok(())
            },
        )?;
        Ok(rows)
    }
}
