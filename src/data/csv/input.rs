//! How a table row becomes a model's input, as a run on a CSV file read it:
//! the feature columns, the categories of those one-hot encoded, the
//! divisor and the standardization. A classifier's
//! checkpoint keeps it ([`TableInput`]), so that `taper classify` reads new
//! rows the same way and an ONNX export takes raw feature values.

use std::path::Path;

use super::categories::{one_hot, Coder};
use super::columns::Layout;
use super::records::{each_row_in, Files, Place, Shape};
use super::Column;
use crate::data::files::data_err;
use crate::data::name_list;
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
    /// The numbers' decimal mark: `.`, or `,` (checkpoints written before
    /// taper read decimal commas have none: `.`).
    #[serde(default = "dot", skip_serializing_if = "is_dot")]
    pub decimal: String,
    /// Values are divided by it...
    pub scale: f32,
    /// ...then standardized, feature by feature, when the run's data was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standardize: Option<Moments>,
    /// A regression run's target columns: the model predicts their values,
    /// output `k` the `k`th column's. Saved as `target`: one column, or a
    /// list of several.
    #[serde(
        rename = "target",
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "one_or_many"
    )]
    pub targets: Vec<Column>,
    /// The targets' standardization, when the run's data had one: the
    /// model predicts `(value - mean) / std`, a mean and deviation per
    /// target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_standardize: Option<Moments>,
    /// Each column's categories, in the order of their one-hot inputs, for
    /// a column of categories (none for a number); empty when no column
    /// has any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub categories: Vec<Option<Vec<String>>>,
    /// For a run on a column of text (`columns` is that column): how its
    /// texts became ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<super::TextInput>,
    /// For a multi-label classifier of a column of label sets: that column
    /// (`targets` are then the labels' names, in the outputs' order)...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_column: Option<Column>,
    /// ...and what its cells' labels are split at (`|`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_sep: Option<String>,
    /// The lists of numbers among `columns` read whole (`embedding`, 384
    /// numbers a row, as `embedding[0]` ... `embedding[383]`): each one's
    /// name and length, so that a file whose lists are of another length
    /// is refused. Checkpoints written before runs recorded them have
    /// none: a run of `base[0]` ... `base[k - 1]` among `columns` then
    /// counts as a list read whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lists: Option<Vec<(String, usize)>>,
}

/// A list of columns saved as one column when it holds one, as checkpoints
/// written before runs took several targets hold it.
mod one_or_many {
    use super::Column;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(Column),
        Many(Vec<Column>),
    }

    pub fn serialize<S: Serializer>(columns: &[Column], s: S) -> Result<S::Ok, S::Error> {
        match columns {
            [one] => one.serialize(s),
            many => many.serialize(s),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Column>, D::Error> {
        Ok(match OneOrMany::deserialize(d)? {
            OneOrMany::One(c) => vec![c],
            OneOrMany::Many(v) => v,
        })
    }
}

fn dot() -> String {
    ".".into()
}

fn is_dot(d: &String) -> bool {
    d == "."
}

/// A CSV file's rows as a model's inputs.
#[derive(Debug, Default)]
pub struct TableRows {
    /// Row after row, [`TableInput::width`] values each.
    pub values: Vec<f32>,
    /// The line of each row.
    pub lines: Vec<usize>,
    /// The rows passed over: their line, and why (a missing value, a
    /// category the run did not train on).
    pub missing: Vec<(usize, String)>,
}

/// A CSV file's texts as a model's inputs.
#[derive(Debug, Default)]
pub struct TextRows {
    /// Row after row, `context` ids each (padded).
    pub ids: Vec<u32>,
    pub context: usize,
    /// The line of each row.
    pub lines: Vec<usize>,
    /// The rows passed over: their line, and why (an empty text).
    pub missing: Vec<(usize, String)>,
}

impl TableInput {
    /// The texts of a CSV file's text column (by name, or at the training
    /// file's index) as a run on texts read its own: ids of its tokenizer,
    /// cut at its context and padded. Rows with an empty text are passed
    /// over, each listed with its line. An error for a run on numbers.
    pub fn read_texts(&self, path: &Path) -> Result<TextRows> {
        if self.text.is_none() || !(1..=2).contains(&self.columns.len()) {
            return Err(crate::Error::Config(
                "the run read numbers, not texts, from its CSV file".into(),
            ));
        }
        let shape = Shape {
            header: self.header,
            delimiter: self.delimiter.as_bytes().first().copied().unwrap_or(b','),
            decimal: b'.',
        };
        let (mut cells, mut lines, mut missing) = (Vec::new(), Vec::new(), Vec::new());
        let (_, unit) = each_row_in(
            path,
            shape,
            |n, names| Layout::resolve(path, (&[], "label"), Some(&self.columns), n, names),
            |l, line, record| {
                if let Some(c) = l.missing(record) {
                    let why = format!("a missing value (`{}`) in {}", record.text(c), l.column(c));
                    missing.push((line, why));
                } else {
                    cells.push(
                        l.features
                            .iter()
                            .map(|&at| record.text(at).into_owned())
                            .collect(),
                    );
                    lines.push(line);
                }
                Ok(())
            },
        )?;
        self.texts_as_rows(Files::one(path, unit), cells, lines, missing)
    }

    /// `texts` given as they are (`taper classify --text`), a row each
    /// (with its pair's second text, for a run on pairs): read as the run
    /// read its column of text, their "lines" numbered from 1, an empty one
    /// passed over; `what` names them in errors.
    pub fn given_texts(&self, what: &Path, texts: Vec<Vec<String>>) -> Result<TextRows> {
        if self.text.is_none() || texts.iter().any(|t| t.len() != self.columns.len()) {
            return Err(crate::Error::Config(
                match (&self.text, self.columns.len()) {
                    (None, _) => "the run read numbers, not texts, from its CSV file".into(),
                    (_, 2) => {
                        "the run read text pairs: give each text's second one (`--pair`)".into()
                    }
                    _ => "the run read single texts, not pairs: give no `--pair`".into(),
                },
            ));
        }
        let (mut cells, mut lines, mut missing) = (Vec::new(), Vec::new(), Vec::new());
        for (n, row) in (1..).zip(texts) {
            match row.iter().any(|t| t.trim().is_empty()) {
                true => missing.push((n, "an empty text".to_string())),
                false => {
                    cells.push(row);
                    lines.push(n);
                }
            }
        }
        self.texts_as_rows(Files::one(what, "line"), cells, lines, missing)
    }

    /// The `cells` read on `lines` of the one file of `files` as ids.
    fn texts_as_rows(
        &self,
        files: Files,
        cells: Vec<Vec<String>>,
        lines: Vec<usize>,
        missing: Vec<(usize, String)>,
    ) -> Result<TextRows> {
        let text = self.text.as_ref().expect("a run on texts");
        let places: Vec<Place> = lines.iter().map(|&n| Place::new(0, n)).collect();
        let texts = super::text::tokenize_as((&files, &places), text, &self.columns, cells)?;
        let all: Vec<usize> = (0..texts.len()).collect();
        Ok(TextRows {
            ids: texts.padded(&all),
            context: text.context,
            lines,
            missing,
        })
    }

    /// The model's inputs per row: one per column of numbers, one per
    /// category for a column of categories.
    pub fn width(&self) -> usize {
        (0..self.columns.len())
            .map(|p| self.categories_of(p).map_or(1, <[String]>::len))
            .sum()
    }

    /// The categories of the `p`th column, when it holds categories.
    pub fn categories_of(&self, p: usize) -> Option<&[String]> {
        self.categories.get(p)?.as_deref()
    }

    /// A multi-label classifier's labels, in its outputs' order, when they
    /// came from a column of label sets (`label_sep`).
    pub fn label_names(&self) -> Option<Vec<String>> {
        self.label_sep
            .as_ref()
            .map(|_| self.targets.iter().map(Column::name).collect())
    }

    /// The name of each of the model's inputs: the column's (its header
    /// name, or `column 3` without one), and for a column of categories,
    /// `name_category` for each, as pandas' `get_dummies` names them.
    pub fn input_names(&self) -> Vec<String> {
        let mut names = Vec::with_capacity(self.width());
        for (p, c) in self.columns.iter().enumerate() {
            match self.categories_of(p) {
                None => names.push(c.name()),
                Some(cats) => names.extend(cats.iter().map(|k| format!("{}_{k}", c.name()))),
            }
        }
        names
    }

    /// Whether each of the model's inputs is a one-hot category (0 or 1,
    /// neither scaled nor standardized).
    pub fn one_hot_inputs(&self) -> Vec<bool> {
        (0..self.columns.len())
            .flat_map(|p| match self.categories_of(p) {
                None => vec![false],
                Some(cats) => vec![true; cats.len()],
            })
            .collect()
    }

    /// The rows of a CSV file as the model's inputs (row after row,
    /// [`TableInput::width`] values each), with the line of each row. The
    /// file needs the feature columns (by name, or at the training file's
    /// indices); its other columns, a label among them, are not read. Rows
    /// with a missing value, or a category the run did not train on, are
    /// passed over, each listed with its line and why.
    pub fn read(&self, path: &Path) -> Result<TableRows> {
        let shape = Shape {
            header: self.header,
            delimiter: self.delimiter.as_bytes().first().copied().unwrap_or(b','),
            decimal: self.decimal.as_bytes().first().copied().unwrap_or(b'.'),
        };
        let mut rows = TableRows::default();
        let mut coders: Vec<Option<Coder>> = (0..self.columns.len())
            .map(|p| self.categories_of(p).map(Coder::given))
            .collect();
        let places: Vec<Vec<u32>> = coders
            .iter()
            .map(|c| {
                c.as_ref()
                    .map_or(Vec::new(), |c| (0..c.names().len() as u32).collect())
            })
            .collect();
        let kinds: Vec<Option<(usize, &[u32])>> = coders
            .iter()
            .zip(&places)
            .map(|(c, p)| c.as_ref().map(|_| (p.len(), &p[..])))
            .collect();
        let mut codes = Vec::with_capacity(self.columns.len());
        let lists = match &self.lists {
            Some(lists) => lists.clone(),
            None => super::vectors::read_whole(&self.columns, None),
        };
        each_row_in(
            path,
            shape,
            |n, names| {
                if let Some((list, k, held)) = super::vectors::other_length(&lists, &names) {
                    return Err(data_err(
                        path,
                        format!("`{list}` holds lists of {held} numbers, where the run read lists of {k} (`{list}[0..{k}]`)"),
                    ));
                }
                Layout::resolve(path, (&[], "label"), Some(&self.columns), n, names)
            },
            |l, line, record| {
                if let Some(c) = l.missing(record) {
                    let why = format!("a missing value (`{}`) in {}", record.text(c), l.column(c));
                    rows.missing.push((line, why));
                    return Ok(());
                }
                if let Some((c, cell)) = l.unknown_category(record, &mut coders) {
                    let p = l.features.iter().position(|&f| f == c).unwrap_or(0);
                    let why = format!(
                        "`{cell}` in {} is not a category the run trained on ({})",
                        l.column(c),
                        name_list(self.categories_of(p).unwrap_or_default())
                    );
                    rows.missing.push((line, why));
                    return Ok(());
                }
                codes.clear();
                l.features_into(
                    (path, line),
                    record,
                    self.scale,
                    None,
                    &mut coders,
                    &mut codes,
                )?;
                let start = rows.values.len();
                rows.values.extend(one_hot(&codes, &kinds));
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
