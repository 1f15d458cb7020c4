//! The rows of a table as they are read: each row's features (the columns
//! of categories coded), labels or targets, or texts, and where it was (a
//! missing value's row dropped, or an error); then, once every file is
//! read, the [`Csv`] they make, with the labels settled and the reading a
//! checkpoint keeps.

use std::path::Path;

use super::categories::{categorical_coders, settle, settled_names, Coder};
use super::columns::Layout;
use super::labels::{label_ids, label_sets, target_values, Labels};
use super::parse::regression;
use super::records::{number, Files, Place};
use super::row::Row;
use super::text::{self, Cells};
use super::{Column, Csv, CsvOptions, Missing, TableInput};
use crate::data::files::data_err;
use crate::Result;

/// What the rows read so far hold.
#[derive(Default)]
pub(super) struct Rows {
    features: Vec<f32>,
    /// Each row's label cells (or target cells).
    labels: Vec<String>,
    /// With `text`: each row's text, or pair of texts.
    texts: Vec<Cells>,
    /// The file being read, among the table's.
    pub(super) file: u32,
    /// Where each row kept was read.
    places: Vec<Place>,
    /// Where the rows left out for a missing value were.
    dropped: Vec<Place>,
    /// The columns of categories' encoders, made at the first row.
    coders: Option<Vec<Option<Coder>>>,
}

/// The file read, the options, and whether the files have a header.
pub(super) type Reading<'a> = (&'a Path, &'a CsvOptions, bool);

impl Rows {
    /// Row `record` on `line`, laid out as `l`.
    pub(super) fn take(
        &mut self,
        (what, opts, header): Reading,
        l: &Layout,
        line: usize,
        record: Row,
    ) -> Result<()> {
        if self.coders.is_none() {
            self.coders = Some(categorical_coders(what, l, &opts.categorical)?);
        }
        if let Some(c) = l.missing_in(record, opts.label_sep.is_none()) {
            if opts.missing == Missing::Drop {
                self.dropped.push(Place::new(self.file, line));
                return Ok(());
            }
            return Err(data_err(
                what,
                format!(
                    "line {line}, {}: a missing value (`{}`); `missing = \"drop\"` leaves such rows out",
                    l.column(c),
                    record.text(c)
                ),
            ));
        }
        if opts.text.is_some() {
            let cells = l.features.iter().map(|&at| record.text(at).into_owned());
            self.texts.push(cells.collect());
        } else {
            if self.places.is_empty() && self.dropped.is_empty() && opts.header.is_none() && !header
            {
                names_read_as_data(what, opts, l, line, record)?;
            }
            let hint = match opts.features {
                None => "; choose the columns with `features = { ... }`",
                Some(_) => "",
            };
            l.features_into(
                (what, line),
                record,
                opts.scale,
                Some(hint),
                self.coders.as_mut().expect("made at the first row"),
                &mut self.features,
            )?;
        }
        self.labels
            .extend(l.labels.iter().map(|&c| record.text(c).into_owned()));
        self.places.push(Place::new(self.file, line));
        Ok(())
    }

    /// The source the rows make, laid out as `layout`.
    pub(super) fn into_csv(
        self,
        (files, opts, header): (Files, &CsvOptions, bool),
        layout: Layout,
    ) -> Result<Csv> {
        let what = files.given();
        let read = (&files, &self.places[..]);
        let mut coders = match self.coders {
            Some(c) => c,
            None => categorical_coders(what, &layout, &opts.categorical)?,
        };
        let features = settle(self.features, &mut coders);
        let mut label_names = Vec::new();
        let (labels, classes) = match (regression(opts), &opts.label_sep) {
            (true, _) => {
                let values = target_values(read, &layout, &self.labels)?;
                (Labels::Values(values, layout.labels.len()), None)
            }
            (false, Some(sep)) => {
                let given = (sep.as_str(), opts.classes.as_deref());
                let (values, names) = label_sets(read, &layout, &self.labels, given)?;
                let k = names.len();
                label_names = names;
                (Labels::Values(values, k), None)
            }
            (false, None) => {
                let (ids, classes) = label_ids(read, &layout, &self.labels, opts)?;
                (Labels::Classes(ids), classes)
            }
        };
        let mut input = table_input(opts, header, &layout, &coders);
        if let Some(sep) = &opts.label_sep {
            // A multi-label classifier's outputs are its labels, in order.
            input.targets = label_names.into_iter().map(Column::Name).collect();
            input.label_column = Some(match header {
                true => Column::Name(layout.names[layout.labels[0]].clone()),
                false => Column::Index(layout.labels[0] as i64),
            });
            input.label_sep = Some(sep.clone());
        }
        let (width, texts) = match &opts.text {
            Some(t) => {
                let texts = text::tokenize(read, t, self.texts)?;
                (texts.context(), Some(texts))
            }
            None => (input.width(), None),
        };
        Ok(Csv {
            name: files.describe_table(true),
            files,
            split: opts.split.clone(),
            features,
            labels,
            width,
            classes,
            dropped: self.dropped,
            input: TableInput {
                text: texts.as_ref().map(|t| t.input.clone()),
                ..input
            },
            texts,
            vectors: Vec::new(),
        })
    }
}

/// A first row of names read as data (pandas' read_csv would have taken it
/// as the header): an error that says how to read it.
fn names_read_as_data(
    what: &Path,
    opts: &CsvOptions,
    l: &Layout,
    line: usize,
    record: Row,
) -> Result<()> {
    if record
        .texts()
        .any(|c| number::<f64>(&c, opts.decimal).is_some())
    {
        return Ok(());
    }
    let names: Vec<String> = record.texts().map(|c| format!("`{c}`")).collect();
    let role = if regression(opts) { "target" } else { "label" };
    Err(data_err(
        what,
        format!(
            "line {line} looks like column names ({}), read as data: give `header = true`, or name the {role} column (`{role} = \"{}\"`), which implies it",
            names.join(", "),
            record.text(l.labels[0])
        ),
    ))
}

/// How the run read its table, for checkpoints (the texts' reading is
/// added once they are tokenized).
fn table_input(
    opts: &CsvOptions,
    header: bool,
    layout: &Layout,
    coders: &[Option<Coder>],
) -> TableInput {
    let column = |at: usize| match header {
        true => Column::Name(layout.names[at].clone()),
        false => Column::Index(at as i64),
    };
    let columns: Vec<Column> = layout.features.iter().map(|&c| column(c)).collect();
    TableInput {
        lists: Some(super::vectors::read_whole(&columns, Some(&layout.names))),
        columns,
        header,
        delimiter: (opts.delimiter as char).to_string(),
        decimal: (opts.decimal as char).to_string(),
        scale: opts.scale,
        standardize: None,
        targets: match regression(opts) {
            true => layout.labels.iter().map(|&at| column(at)).collect(),
            false => Vec::new(),
        },
        target_standardize: None,
        categories: settled_names(coders),
        text: None,
        label_column: None,
        label_sep: None,
    }
}
