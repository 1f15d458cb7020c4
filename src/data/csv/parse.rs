//! Reading a CSV file's rows into a [`Csv`]: whether it has a header, each
//! row's features, labels or texts (a missing value dropped or an error,
//! a first row of names read as data an error), then the labels, the
//! table input checkpoints keep, and the tokenized texts.

use std::path::Path;

use super::categories::{categorical_coders, settle, settled_names, Coder};
use super::columns::{named, Layout};
use super::labels::{label_ids, label_sets, target_values, Labels};
use super::records::{each_record, each_row, in_units, number, Records, Shape};
use super::text::{self, Cells};
use super::{Column, Csv, CsvOptions, Missing, TableInput};
use crate::data::files::data_err;
use crate::{Error, Result};

/// Parses CSV text as [`super::csv`] reads a file; `what` names it in errors.
pub fn parse_csv(what: &Path, text: &str, opts: &CsvOptions) -> Result<Csv> {
    let header = header_of(what, opts)?;
    let shape = Shape {
        header,
        delimiter: opts.delimiter,
        decimal: opts.decimal,
    };
    let mut rows = Rows::default();
    let layout = each_row(
        what,
        text,
        shape,
        |n, names| layout_of(what, opts, n, names),
        |l, line, record| rows.take((what, opts, header), l, line, record),
    )?;
    let Some(layout) = layout else {
        return Err(data_err(what, "no rows"));
    };
    rows.into_csv((what, opts, header), layout)
}

/// Reads a file of records (a Parquet file's rows, a JSON file's objects)
/// as [`super::csv`] reads a CSV file: their cells as text, their columns
/// by name, each row named as `records.unit` says (its line, or its place)
/// where a CSV file's errors name a line. A label column of lists is a
/// column of label sets (`label_sep`: `sep`).
pub(super) fn parse_records(
    what: &Path,
    opts: &CsvOptions,
    records: Records,
    sep: String,
) -> Result<Csv> {
    let unit = records.unit;
    let mut csv = records_rows(what, opts, records, sep).map_err(|e| in_units(e, unit))?;
    csv.unit = unit;
    Ok(csv)
}

fn records_rows(what: &Path, opts: &CsvOptions, records: Records, sep: String) -> Result<Csv> {
    let mut opts = opts.clone();
    let label = match &opts.label {
        Column::Name(n) => records.names.iter().position(|c| c == n),
        Column::Index(i) => {
            let n = records.names.len() as i64;
            usize::try_from(if *i < 0 { n + i } else { *i }).ok()
        }
    };
    if !regression(&opts) && label.is_some_and(|k| records.lists.get(k) == Some(&true)) {
        opts.label_sep = Some(sep);
    }
    let mut rows = Rows::default();
    let layout = each_record(
        &records,
        |n, names| layout_of(what, &opts, n, names),
        |l, line, record| rows.take((what, &opts, true), l, line, record),
    )?;
    let Some(layout) = layout else {
        return Err(data_err(what, "no rows"));
    };
    rows.into_csv((what, &opts, true), layout)
}

/// Where the label (or targets) and the features are among `n` columns
/// named `names` (none without a header).
fn layout_of(what: &Path, opts: &CsvOptions, n: usize, names: Vec<String>) -> Result<Layout> {
    let text_columns = opts.text.as_ref().map(|t| t.columns.as_slice());
    let role = if regression(opts) { "target" } else { "label" };
    Layout::resolve(
        what,
        (&labels_given(opts), role),
        text_columns.or(opts.features.as_deref()),
        n,
        names,
    )
}

fn regression(opts: &CsvOptions) -> bool {
    !opts.targets.is_empty()
}

/// The label column, or the target columns of a regression.
fn labels_given(opts: &CsvOptions) -> Vec<Column> {
    match regression(opts) {
        true => opts.targets.clone(),
        false => vec![opts.label.clone()],
    }
}

/// Whether the first row names the columns: as given, else when a column
/// is named (or the input is text, as pandas infers: a first row of names
/// would otherwise be a sample).
fn header_of(what: &Path, opts: &CsvOptions) -> Result<bool> {
    let text_columns = opts.text.iter().flat_map(|t| &t.columns);
    let by_name = labels_given(opts).iter().any(named)
        || text_columns.clone().any(named)
        || opts.features.iter().flatten().any(named)
        || opts.categorical.iter().any(|(c, _)| named(c));
    match opts.header {
        Some(false) if by_name => Err(Error::Config(format!(
            "{}: columns are named but `header` is false: name columns only in a file whose first row names them",
            what.display()
        ))),
        Some(h) => Ok(h),
        None => Ok(by_name || opts.text.is_some()),
    }
}

/// What the rows read so far hold.
#[derive(Default)]
struct Rows {
    features: Vec<f32>,
    /// Each row's label cells (or target cells).
    labels: Vec<String>,
    /// With `text`: each row's text, or pair of texts.
    texts: Vec<Cells>,
    /// The line of each row kept.
    lines: Vec<usize>,
    /// The lines of the rows left out for a missing value.
    dropped: Vec<usize>,
    /// The columns of categories' encoders, made at the first row.
    coders: Option<Vec<Option<Coder>>>,
}

/// The file read, its options, and whether it has a header.
type Reading<'a> = (&'a Path, &'a CsvOptions, bool);

impl Rows {
    /// Row `record` on `line`, laid out as `l`.
    fn take(
        &mut self,
        (what, opts, header): Reading,
        l: &Layout,
        line: usize,
        record: &csv::StringRecord,
    ) -> Result<()> {
        if self.coders.is_none() {
            self.coders = Some(categorical_coders(what, l, &opts.categorical)?);
        }
        if let Some(c) = l.missing_in(record, opts.label_sep.is_none()) {
            if opts.missing == Missing::Drop {
                self.dropped.push(line);
                return Ok(());
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
        if opts.text.is_some() {
            let cells = l.features.iter().map(|&at| record[at].to_string());
            self.texts.push(cells.collect());
        } else {
            if self.lines.is_empty() && self.dropped.is_empty() && opts.header.is_none() && !header
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
            .extend(l.labels.iter().map(|&c| record[c].to_string()));
        self.lines.push(line);
        Ok(())
    }

    /// The source the rows make, laid out as `layout`.
    fn into_csv(self, (what, opts, header): Reading, layout: Layout) -> Result<Csv> {
        let mut coders = match self.coders {
            Some(c) => c,
            None => categorical_coders(what, &layout, &opts.categorical)?,
        };
        let features = settle(self.features, &mut coders);
        let mut label_names = Vec::new();
        let (labels, classes) = match (regression(opts), &opts.label_sep) {
            (true, _) => {
                let values = target_values(what, &layout, &self.labels, &self.lines)?;
                (Labels::Values(values, layout.labels.len()), None)
            }
            (false, Some(sep)) => {
                let given = (sep.as_str(), opts.classes.as_deref());
                let (values, names) = label_sets(what, &layout, &self.labels, &self.lines, given)?;
                let k = names.len();
                label_names = names;
                (Labels::Values(values, k), None)
            }
            (false, None) => {
                let (ids, classes) = label_ids(what, &layout, &self.labels, &self.lines, opts)?;
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
                let texts = text::tokenize(what, t, self.texts, &self.lines)?;
                (texts.context(), Some(texts))
            }
            None => (input.width(), None),
        };
        Ok(Csv {
            unit: "line",
            name: what
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
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
    record: &csv::StringRecord,
) -> Result<()> {
    if record
        .iter()
        .any(|c| number::<f64>(c, opts.decimal).is_some())
    {
        return Ok(());
    }
    let names: Vec<String> = record.iter().map(|c| format!("`{c}`")).collect();
    let role = if regression(opts) { "target" } else { "label" };
    Err(data_err(
        what,
        format!(
            "line {line} looks like column names ({}), read as data: give `header = true`, or name the {role} column (`{role} = \"{}\"`), which implies it",
            names.join(", "),
            &record[l.labels[0]]
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
    TableInput {
        columns: layout.features.iter().map(|&c| column(c)).collect(),
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
