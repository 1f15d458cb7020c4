//! CSV files as samples: numeric feature columns and a label column (or
//! number columns to predict), read
//! with the `csv` crate (quoted fields, CRLF line ends, a byte-order mark);
//! Parquet and JSON files' rows as the same cells of text.
//! Columns are chosen by index or, with a header, by name; labels are class
//! indices or class names; a column of categories is one-hot encoded. Each
//! error names the file, the line and the column.

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

mod categories;
mod columns;
mod input;
mod json;
mod labels;
mod list_cells;
mod parquet;
mod parse;
mod read_ahead;
mod records;
mod row;
mod rows;
mod text;
mod vectors;

pub use input::{TableInput, TableRows, TextRows};
pub use json::is_json;
use labels::Labels;
pub use parquet::is_parquet;
pub use parse::parse_csv;
pub use records::{Files, Place};
pub use text::{TextInput, TextOptions};

use super::{name_list, Source};
use crate::Result;

/// A column, by its 0-based index (negative: counted from the end) or by its
/// header name.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum Column {
    Index(i64),
    Name(String),
}

impl Column {
    /// `body_mass_g`, or `column 3` (1-based, as editors count).
    pub fn name(&self) -> String {
        match self {
            Column::Name(n) => n.clone(),
            Column::Index(i) if *i >= 0 => format!("column {}", i + 1),
            Column::Index(i) => format!("column {i}"),
        }
    }

    /// Where this column is among a file's `n` columns, named `names` (empty
    /// without a header): an index counted from the end when negative.
    pub(super) fn place(&self, n: usize, names: &[String]) -> Option<usize> {
        match self {
            Column::Name(name) => names.iter().position(|h| h == name),
            Column::Index(i) => {
                let at = if *i < 0 { n as i64 + i } else { *i };
                usize::try_from(at).ok().filter(|&at| at < n)
            }
        }
    }

    /// [`Column::name`] for a message: a header name in backquotes.
    pub fn describe(&self) -> String {
        match self {
            Column::Name(n) => format!("`{n}`"),
            other => other.name(),
        }
    }
}

/// What a missing value (an empty cell, `NA`, `NaN`, `null`, ...) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// Reading stops at the first, naming its line and column.
    Error,
    /// Rows with one are left out, and counted.
    Drop,
}

/// How a CSV file becomes samples.
#[derive(Debug, Clone)]
pub struct CsvOptions {
    /// The label column, unless `targets` names any.
    pub label: Column,
    /// The number columns to predict (a regression), instead of a label:
    /// each sample's target is their values, in this order, f32 `[k]`.
    pub targets: Vec<Column>,
    /// The feature columns, in this order (default: every other column).
    pub features: Option<Vec<Column>>,
    /// Whether the first row names the columns (default: when a column is
    /// given by name).
    pub header: Option<bool>,
    pub delimiter: u8,
    /// The decimal mark of the numbers: `.`, or `,` as a European
    /// spreadsheet writes them (pandas' `decimal`).
    pub decimal: u8,
    /// Features are divided by this.
    pub scale: f32,
    pub split: String,
    /// Class names, label 0 first: label cells are these names (or their
    /// indices). Without it, labels are class indices, or, when any label is
    /// not a number, class names in sorted order.
    pub classes: Option<Vec<String>>,
    /// The label column holds each sample's set of labels, split at this
    /// (`gentoo|female`; an empty cell: none): a multi-label classifier's
    /// 0/1 targets, one per label (`classes`, or the labels the file
    /// holds, sorted).
    pub label_sep: Option<String>,
    pub missing: Missing,
    /// Feature columns of categories, each one-hot encoded in place: with
    /// the categories given, in their order, or else those the file holds,
    /// sorted (numbers by value).
    pub categorical: Vec<(Column, Option<Vec<String>>)>,
    /// A column of text, tokenized, as the only input (instead of
    /// `features`).
    pub text: Option<TextOptions>,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions {
            label: Column::Index(-1),
            targets: Vec::new(),
            features: None,
            header: None,
            delimiter: b',',
            decimal: b'.',
            scale: 1.0,
            split: "all".into(),
            classes: None,
            label_sep: None,
            missing: Missing::Error,
            categorical: Vec::new(),
            text: None,
        }
    }
}

/// The cells pandas' `read_csv` reads as missing (its default `na_values`).
pub(super) const MISSING: [&str; 19] = [
    "", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
    "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null",
];

/// Rows of numeric features and a class label or target values.
pub struct Csv {
    /// The files read, for naming a row's place.
    files: Files,
    name: String,
    split: String,
    features: Vec<f32>,
    labels: Labels,
    width: usize,
    classes: Option<Vec<String>>,
    /// Where the rows left out for a missing value were.
    dropped: Vec<Place>,
    input: TableInput,
    /// With `text`: the column's texts as ids (`features` is empty),
    /// shared with other sources of the same texts.
    texts: Option<std::sync::Arc<text::Texts>>,
    /// The list columns of numbers read as a column a number: each one's
    /// name and length.
    vectors: Vec<(String, usize)>,
}

/// Reads a CSV file, gzipped or plain, or a Parquet or JSON file (by its
/// extension: their columns have names, so `header`, `delimiter` and
/// `decimal` do not apply).
pub fn csv(path: &Path, opts: &CsvOptions) -> Result<Csv> {
    csv_files(path, &[path.to_path_buf()], opts)
}

/// Reads `paths`, in order, as one table, as `pd.concat` of each file's
/// `read_csv` (or Hugging Face datasets' `data_files` list) gives it: the
/// rows of each file after the previous file's, the labels, classes and
/// categories the files' together. Every file has the first's columns, and
/// all are CSV files or all Parquet and JSON files. `given` (a pattern,
/// say) names the table in messages about it as a whole; a row's messages
/// name its own file.
pub fn csv_files(given: &Path, paths: &[PathBuf], opts: &CsvOptions) -> Result<Csv> {
    parse::parse_files(given, paths, opts)
}

impl Csv {
    /// The files read, which name a row's [`Place`]
    /// ([`Files::describe`]).
    pub fn files(&self) -> &Files {
        &self.files
    }

    /// Features per sample.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Where the rows left out for a missing value were.
    pub fn dropped(&self) -> &[Place] {
        &self.dropped
    }

    /// Whether both sources hold one tokenization of their texts (a
    /// reloaded recipe's source finds the running one's).
    pub fn shares_texts_with(&self, other: &Csv) -> bool {
        match (&self.texts, &other.texts) {
            (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// With `text`: where the texts cut at `context` ids were.
    pub fn cut(&self) -> &[Place] {
        self.texts.as_ref().map_or(&[], |t| &t.cut)
    }
}

impl Source for Csv {
    fn len(&self) -> usize {
        self.labels.len()
    }
    fn split(&self) -> &str {
        &self.split
    }
    fn describe(&self) -> String {
        let mut s = match &self.texts {
            Some(t) => format!(
                "csv {} ({} rows of text {}, up to {} ids of {}",
                self.name,
                self.labels.len(),
                text::describe_columns(&self.input.columns),
                self.width,
                t.tokenizer
            ),
            None => format!(
                "csv {} ({} rows of {} features",
                self.name,
                self.labels.len(),
                self.width
            ),
        };
        for (name, k) in &self.vectors {
            s += &format!("; `{name}` a list of {k} numbers, {k} features");
        }
        let categorical = self.input.categories.iter().flatten().count();
        if categorical > 0 {
            s += &format!("; {categorical} columns of categories, one-hot encoded");
        }
        if let Some(c) = &self.classes {
            s += &format!("; {} classes: {}", c.len(), name_list(c));
        }
        let sets = self
            .input
            .label_column
            .as_ref()
            .zip(self.input.label_sep.as_ref());
        match &self.input.targets[..] {
            [] => {}
            labels if sets.is_some() => {
                let (column, sep) = sets.expect("a column of label sets");
                let names: Vec<String> = labels.iter().map(Column::name).collect();
                s += &format!(
                    "; {} labels of {} split at {sep:?}: {}",
                    names.len(),
                    column.describe(),
                    name_list(&names)
                );
            }
            [t] => s += &format!("; target {}", t.describe()),
            many => {
                let names: Vec<String> = many.iter().map(Column::describe).collect();
                s += &format!("; targets {}", names.join(", "));
            }
        }
        if !self.dropped.is_empty() {
            s += &format!(
                "; {} rows with a missing value left out",
                self.dropped.len()
            );
        }
        s + ")"
    }
    fn gather(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        let x = match &self.texts {
            Some(t) => t.gather(indices)?,
            None => {
                let w = self.width;
                let mut x = Vec::with_capacity(indices.len() * w);
                for &i in indices {
                    x.extend_from_slice(&self.features[i * w..(i + 1) * w]);
                }
                Tensor::from_vec(x, (indices.len(), w), &Device::Cpu)?
            }
        };
        let y = match &self.labels {
            Labels::Classes(l) => {
                let y: Vec<u32> = indices.iter().map(|&i| l[i]).collect();
                Tensor::from_vec(y, indices.len(), &Device::Cpu)?
            }
            Labels::Values(v, k) => {
                let mut y = Vec::with_capacity(indices.len() * k);
                for &i in indices {
                    y.extend_from_slice(&v[i * k..(i + 1) * k]);
                }
                Tensor::from_vec(y, (indices.len(), *k), &Device::Cpu)?
            }
        };
        Ok((x, y))
    }
    fn classes(&self) -> Option<&[String]> {
        self.classes.as_deref()
    }
    fn table_input(&self) -> Option<TableInput> {
        Some(self.input.clone())
    }
    fn lengths(&self) -> Option<Vec<usize>> {
        self.texts.as_ref().map(|t| t.lengths())
    }
}
