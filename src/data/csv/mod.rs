//! CSV files as samples: numeric feature columns and one label column, read
//! with the `csv` crate (quoted fields, CRLF line ends, a byte-order mark).
//! Columns are chosen by index or, with a header, by name; labels are class
//! indices or class names. Each error names the file, the line and the
//! column.

use std::collections::BTreeSet;
use std::path::Path;

use candle_core::{Device, Tensor};

mod columns;

use columns::{named, Layout, Lines};

use super::files::{data_err, read_maybe_gz};
use super::{name_list, Source};
use crate::{Error, Result};

/// A column, by its 0-based index (negative: counted from the end) or by its
/// header name.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    Index(i64),
    Name(String),
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
    /// The label column.
    pub label: Column,
    /// The feature columns, in this order (default: every other column).
    pub features: Option<Vec<Column>>,
    /// Whether the first row names the columns (default: when a column is
    /// given by name).
    pub header: Option<bool>,
    pub delimiter: u8,
    /// Features are divided by this.
    pub scale: f32,
    pub split: String,
    /// Class names, label 0 first: label cells are these names (or their
    /// indices). Without it, labels are class indices, or, when any label is
    /// not a number, class names in sorted order.
    pub classes: Option<Vec<String>>,
    pub missing: Missing,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions {
            label: Column::Index(-1),
            features: None,
            header: None,
            delimiter: b',',
            scale: 1.0,
            split: "all".into(),
            classes: None,
            missing: Missing::Error,
        }
    }
}

/// The cells pandas' `read_csv` reads as missing (its default `na_values`).
const MISSING: [&str; 19] = [
    "", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
    "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null",
];

/// Rows of numeric features and a class label.
pub struct Csv {
    name: String,
    split: String,
    features: Vec<f32>,
    labels: Vec<u32>,
    width: usize,
    classes: Option<Vec<String>>,
    /// Lines of the rows left out for a missing value.
    dropped: Vec<usize>,
}

/// Reads a CSV file, gzipped or plain.
pub fn csv(path: &Path, opts: &CsvOptions) -> Result<Csv> {
    let bytes = read_maybe_gz(path)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        data_err(
            path,
            format!("offset {}: not UTF-8", e.utf8_error().valid_up_to()),
        )
    })?;
    parse_csv(path, &text, opts)
}

/// Parses CSV text as [`csv`] reads a file; `what` names it in errors.
pub fn parse_csv(what: &Path, text: &str, opts: &CsvOptions) -> Result<Csv> {
    let by_name = named(&opts.label) || opts.features.iter().flatten().any(named);
    let header = match opts.header {
        Some(false) if by_name => {
            return Err(Error::Config(format!(
                "{}: columns are named but `header` is false: name columns only in a file whose first row names them",
                what.display()
            )))
        }
        Some(h) => h,
        None => by_name,
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .delimiter(opts.delimiter)
        .from_reader(text.as_bytes());
    let mut layout: Option<Layout> = None;
    let mut n = 0;
    let (mut features, mut labels) = (Vec::new(), Vec::new());
    let mut label_lines = Vec::new();
    let mut dropped = Vec::new();
    let mut lines = Lines::new(text.as_bytes());
    for record in reader.records() {
        let record = record.map_err(|e| data_err(what, e))?;
        let line = lines.of(record.position().map_or(0, |p| p.byte() as usize));
        if record.len() == 1 && record[0].is_empty() {
            continue;
        }
        if layout.is_none() {
            n = record.len();
            let names = match header {
                true => record.iter().map(str::to_string).collect(),
                false => Vec::new(),
            };
            layout = Some(Layout::resolve(what, opts, n, names)?);
            if header {
                continue;
            }
        }
        let l = layout.as_ref().expect("resolved at the first row");
        if record.len() != n {
            return Err(data_err(
                what,
                format!("line {line}: {} columns, expected {n}", record.len()),
            ));
        }
        let missing = |c: usize| MISSING.contains(&&record[c]);
        if let Some(c) = std::iter::once(l.label)
            .chain(l.features.iter().copied())
            .find(|&c| missing(c))
        {
            if opts.missing == Missing::Drop {
                dropped.push(line);
                continue;
            }
            return Err(data_err(
                what,
                format!(
                    "line {line}, {}: a missing value (`{}`); `missing = \"drop\"` leaves such rows out",
                    l.column(c),
                    &record[c]
                ),
            ));
        }
        for &c in &l.features {
            let cell = &record[c];
            let v: f32 = cell.parse().map_err(|_| {
                let hint = match opts.features {
                    None => "; choose the numeric columns with `features = { ... }`",
                    Some(_) => "",
                };
                data_err(
                    what,
                    format!(
                        "line {line}, {}: `{cell}` is not a number{hint}",
                        l.column(c)
                    ),
                )
            })?;
            if !v.is_finite() {
                return Err(data_err(
                    what,
                    format!(
                        "line {line}, {}: `{cell}` is not a finite number",
                        l.column(c)
                    ),
                ));
            }
            features.push(v / opts.scale);
        }
        labels.push(record[l.label].to_string());
        label_lines.push(line);
    }
    let Some(layout) = layout else {
        return Err(data_err(what, "no rows"));
    };
    let (labels, classes) = label_ids(what, &layout, &labels, &label_lines, opts)?;
    Ok(Csv {
        name: what
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        split: opts.split.clone(),
        features,
        labels,
        width: layout.features.len(),
        classes,
        dropped,
    })
}

/// The label cells as class ids, and the class names where there are any.
fn label_ids(
    what: &Path,
    layout: &Layout,
    cells: &[String],
    lines: &[usize],
    opts: &CsvOptions,
) -> Result<(Vec<u32>, Option<Vec<String>>)> {
    let at = |k: usize| format!("line {}, {}", lines[k], layout.column(layout.label));
    if let Some(classes) = &opts.classes {
        let ids = cells
            .iter()
            .enumerate()
            .map(|(k, cell)| {
                let index = cell.parse::<usize>().ok().filter(|&i| i < classes.len());
                match classes.iter().position(|c| c == cell).or(index) {
                    Some(id) => Ok(id as u32),
                    None => Err(data_err(
                        what,
                        format!(
                            "{}: label `{cell}` is not one of the classes ({})",
                            at(k),
                            name_list(classes)
                        ),
                    )),
                }
            })
            .collect::<Result<_>>()?;
        return Ok((ids, Some(classes.clone())));
    }
    if cells.iter().all(|c| c.parse::<f64>().is_ok()) {
        let ids = cells
            .iter()
            .enumerate()
            .map(|(k, cell)| match cell.parse::<f64>() {
                Ok(v) if v >= 0.0 && v.fract() == 0.0 && v < u32::MAX as f64 => Ok(v as u32),
                _ => Err(data_err(
                    what,
                    format!("{}: label `{cell}` is not a class index", at(k)),
                )),
            })
            .collect::<Result<_>>()?;
        return Ok((ids, None));
    }
    // Class names: sorted, as scikit-learn's LabelEncoder orders them.
    let names: Vec<String> = cells
        .iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .cloned()
        .collect();
    let ids = cells
        .iter()
        .map(|c| names.binary_search(c).expect("a name of the set") as u32)
        .collect();
    Ok((ids, Some(names)))
}

impl Csv {
    /// Features per sample.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The lines of the rows left out for a missing value.
    pub fn dropped(&self) -> &[usize] {
        &self.dropped
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
        let mut s = format!(
            "csv {} ({} rows of {} features",
            self.name,
            self.labels.len(),
            self.width
        );
        if let Some(c) = &self.classes {
            s += &format!("; {} classes: {}", c.len(), name_list(c));
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
        let w = self.width;
        let mut x = Vec::with_capacity(indices.len() * w);
        let mut y = Vec::with_capacity(indices.len());
        for &i in indices {
            x.extend_from_slice(&self.features[i * w..(i + 1) * w]);
            y.push(self.labels[i]);
        }
        Ok((
            Tensor::from_vec(x, (indices.len(), w), &Device::Cpu)?,
            Tensor::from_vec(y, indices.len(), &Device::Cpu)?,
        ))
    }
    fn classes(&self) -> Option<&[String]> {
        self.classes.as_deref()
    }
}
