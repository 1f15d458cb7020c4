//! Reading a CSV file's rows into a [`Csv`]: whether it has a header, each
//! row's features, labels or texts (a missing value dropped or an error,
//! a first row of names read as data an error), then the labels, the
//! table input checkpoints keep, and the tokenized texts.

use std::path::{Path, PathBuf};

use super::categories::{categorical_coders, settle, settled_names, Coder};
use super::columns::{named, Layout};
use super::labels::{label_ids, label_sets, target_values, Labels};
use super::records::{
    each_record, each_row, in_units, number, records_of, Files, Place, Records, Shape,
};
use super::text::{self, Cells};
use super::{Column, Csv, CsvOptions, Missing, TableInput};
use crate::data::files::{data_err, read_text};
use crate::{Error, Result};

/// Parses CSV text as [`super::csv`] reads a file; `what` names it in errors.
pub fn parse_csv(what: &Path, text: &str, opts: &CsvOptions) -> Result<Csv> {
    table(what, vec![(what, Read::Text(text))], opts)
}

/// A file as read: CSV text, a CSV file read when its turn comes (so that
/// one file's text is held at a time), or records (a Parquet file's rows,
/// a JSON file's objects) whose cells are text.
enum Read<'a> {
    Text(&'a str),
    Csv,
    Records(Records),
}

/// Reads `paths`, in order, as one table (see [`super::csv_files`]); each
/// file a CSV file, or all of them Parquet or JSON files, whose columns have
/// names (a label column of lists is then a column of label sets).
pub(super) fn parse_files(given: &Path, paths: &[PathBuf], opts: &CsvOptions) -> Result<Csv> {
    let sep = opts.label_sep.as_deref().unwrap_or("|");
    let mut files: Vec<(&Path, Read)> = Vec::with_capacity(paths.len());
    for path in paths {
        let read = match records_of(path, sep)? {
            Some(records) => Read::Records(records),
            None => Read::Csv,
        };
        if let Some((first, r)) = files.first() {
            if matches!(r, Read::Records(_)) != matches!(read, Read::Records(_)) {
                return Err(data_err(
                    path,
                    format!("not a file of the kind of {} (CSV, or Parquet and JSON files, whose columns have names): files read as one table are of one kind", first.display()),
                ));
            }
        }
        files.push((path.as_path(), read));
    }
    table(given, files, opts)
}

/// The rows of `files`, in order, as one table named `given`: each file's
/// columns must be the first's.
fn table(given: &Path, files: Vec<(&Path, Read)>, opts: &CsvOptions) -> Result<Csv> {
    let records = matches!(files.first(), Some((_, Read::Records(_))));
    let mut opts = opts.clone();
    if records && !regression(&opts) && opts.label_sep.is_none() {
        let lists = files.iter().any(|(_, r)| match r {
            Read::Records(r) => label_holds_lists(&opts, r),
            Read::Text(_) | Read::Csv => false,
        });
        if lists {
            opts.label_sep = Some("|".into());
        }
    }
    let header = records || header_of(given, &opts)?;
    let shape = Shape {
        header,
        delimiter: opts.delimiter,
        decimal: opts.decimal,
    };
    let mut places = Files::new(given);
    let mut rows = Rows::default();
    let mut first: Option<(&Path, Layout)> = None;
    // The options for the files after the first (see `pinned`).
    let mut rest: Option<CsvOptions> = None;
    for (path, read) in files {
        let o = rest.as_ref().unwrap_or(&opts);
        let layout = |n, names: Vec<String>| match &first {
            Some((a, l)) if !l.has_columns(n, &names) => Err(other_columns(a, l, path, n, &names)),
            _ => layout_of(path, o, n, names),
        };
        let laid = match &read {
            Read::Text(_) | Read::Csv => {
                let text = match &read {
                    Read::Text(text) => std::borrow::Cow::Borrowed(*text),
                    _ => std::borrow::Cow::Owned(read_text(path)?),
                };
                rows.file = places.add(path, "line");
                let take =
                    |l: &Layout, line, record: &_| rows.take((path, o, header), l, line, record);
                each_row(path, &text, shape, layout, take)?
            }
            Read::Records(r) => {
                rows.file = places.add(path, r.unit);
                let take =
                    |l: &Layout, line, record: &_| rows.take((path, o, true), l, line, record);
                each_record(r, layout, take).map_err(|e| in_units(e, r.unit))?
            }
        };
        match (laid, &first) {
            (None, _) => {}
            (Some(l), None) => {
                rest = pinned(&opts, &l, header);
                first = Some((path, l));
            }
            (Some(l), Some((a, la))) if !la.same_columns(&l) => {
                return Err(other_columns(a, la, path, l.n, &l.names));
            }
            (Some(_), Some(_)) => {}
        }
    }
    let Some((_, layout)) = first else {
        return Err(data_err(given, "no rows"));
    };
    rows.into_csv((places, &opts, header), layout)
}

/// The options for the files after a table's first, laid out as `l`: with
/// a header and no `features` given, the first file's feature columns by
/// name, so that a file with its columns in another order (a JSON file's
/// keys come in the order its rows give them) is read in the first's order,
/// as `pd.concat` aligns columns by name.
fn pinned(opts: &CsvOptions, l: &Layout, header: bool) -> Option<CsvOptions> {
    if !header || opts.features.is_some() || opts.text.is_some() {
        return None;
    }
    let mut o = opts.clone();
    let names = l.features.iter().map(|&c| Column::Name(l.names[c].clone()));
    o.features = Some(names.collect());
    Some(o)
}

/// Whether the label column of `records` holds lists (label sets).
fn label_holds_lists(opts: &CsvOptions, records: &Records) -> bool {
    let label = match &opts.label {
        Column::Name(n) => records.names.iter().position(|c| c == n),
        Column::Index(i) => {
            let n = records.names.len() as i64;
            usize::try_from(if *i < 0 { n + i } else { *i }).ok()
        }
    };
    label.is_some_and(|k| records.lists.get(k) == Some(&true))
}

/// The error for the file `b`, of `n` columns named `names`, whose columns
/// are not those of `a`, the table's first file, laid out as `la`.
fn other_columns(a: &Path, la: &Layout, b: &Path, n: usize, names: &[String]) -> Error {
    data_err(
        b,
        format!(
            "its columns ({}) are not those of {} ({}): the files read as one table have the same columns",
            Layout::describe(n, names),
            a.display(),
            Layout::describe(la.n, &la.names)
        ),
    )
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
    /// The file being read, among the table's.
    file: u32,
    /// Where each row kept was read.
    places: Vec<Place>,
    /// Where the rows left out for a missing value were.
    dropped: Vec<Place>,
    /// The columns of categories' encoders, made at the first row.
    coders: Option<Vec<Option<Coder>>>,
}

/// The file read, the options, and whether the files have a header.
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
                self.dropped.push(Place::new(self.file, line));
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
            .extend(l.labels.iter().map(|&c| record[c].to_string()));
        self.places.push(Place::new(self.file, line));
        Ok(())
    }

    /// The source the rows make, laid out as `layout`.
    fn into_csv(
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
