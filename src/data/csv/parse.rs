//! Reading a table's files into a [`Csv`]: whether they have a header,
//! where the label (or targets) and the features are in each, files of
//! records' list columns (label sets, embeddings) and columns given by
//! index, and each file's columns against the first's; the rows are taken
//! by [`Rows`].

use std::path::{Path, PathBuf};

use super::columns::{named, Layout};
use super::list_cells::lists_of;
use super::records::{each_record, each_row, in_units, records_of, Files, Records, Shape};
use super::row::Row;
use super::rows::Rows;
use super::vectors;
use super::{Column, Csv, CsvOptions};
use crate::data::files::{data_err, read_text};
use crate::{Error, Result};

/// Parses CSV text as [`super::csv`] reads a file; `what` names it in errors.
pub fn parse_csv(what: &Path, text: &str, opts: &CsvOptions) -> Result<Csv> {
    table(what, vec![(what, Read::Text(text))], opts)
}

/// A file as read: CSV text (given, or the first file's, read to see
/// whether its cells hold lists), a CSV file read when its turn comes (so
/// that one file's text is held at a time), or records (a Parquet file's
/// rows, a JSON file's objects, a CSV file's rows with lists) whose cells
/// are text.
enum Read<'a> {
    Text(&'a str),
    Owned(String),
    Csv,
    Records(Box<Records>),
}

/// Reads `paths`, in order, as one table (see [`super::csv_files`]); each
/// file a CSV file, or all of them Parquet or JSON files, whose columns have
/// names (a label column of lists is then a column of label sets).
pub(super) fn parse_files(given: &Path, paths: &[PathBuf], opts: &CsvOptions) -> Result<Csv> {
    let sep = opts.label_sep.as_deref().unwrap_or("|");
    let mut files: Vec<(&Path, Read)> = Vec::with_capacity(paths.len());
    let shape = Shape {
        header: header_of(given, opts)?,
        delimiter: opts.delimiter,
        decimal: opts.decimal,
    };
    // Whether the CSV files' cells hold lists, as the first file's do.
    let mut lists = None;
    for path in paths {
        let read = match records_of(path, sep)? {
            Some(records) => Read::Records(Box::new(records)),
            None if lists == Some(false) => Read::Csv,
            None => {
                let text = read_text(path)?;
                let records = lists_of(path, &text, shape, sep)?;
                lists = Some(records.is_some());
                match records {
                    Some(records) => Read::Records(Box::new(records)),
                    None if lists == Some(true) => return Err(plain_cells(path, paths)),
                    None => Read::Owned(text),
                }
            }
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
fn table(given: &Path, mut files: Vec<(&Path, Read)>, opts: &CsvOptions) -> Result<Csv> {
    let records = matches!(files.first(), Some((_, Read::Records(_))));
    let mut opts = opts.clone();
    if records && !regression(&opts) && opts.label_sep.is_none() {
        let lists = files.iter().any(|(_, r)| match r {
            Read::Records(r) => label_holds_lists(&opts, r),
            Read::Text(_) | Read::Owned(_) | Read::Csv => false,
        });
        if lists {
            opts.label_sep = Some("|".into());
        }
    }
    let vectors = read_vectors(given, &mut files, &mut opts)?;
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
        let layout = |n, names: Vec<String>| {
            let l = match &first {
                Some((a, l)) if !l.has_columns(n, &names) => {
                    return Err(other_columns(a, l, path, n, &names))
                }
                _ => layout_of(path, o, n, names)?,
            };
            match &read {
                // (A run on texts reads a list's items joined.)
                Read::Records(r) if o.text.is_none() => whole_lists(path, r, &l).map(|()| l),
                _ => Ok(l),
            }
        };
        let laid = match &read {
            Read::Text(_) | Read::Owned(_) | Read::Csv => {
                let text = match &read {
                    Read::Text(text) => std::borrow::Cow::Borrowed(*text),
                    Read::Owned(text) => std::borrow::Cow::Borrowed(text.as_str()),
                    _ => std::borrow::Cow::Owned(read_text(path)?),
                };
                rows.file = places.add(path, "line");
                let take =
                    |l: &Layout, line, record: Row| rows.take((path, o, header), l, line, record);
                each_row(path, &text, shape, layout, take)?
            }
            Read::Records(r) => {
                rows.file = places.add(path, r.unit);
                let take =
                    |l: &Layout, line, record: Row| rows.take((path, o, true), l, line, record);
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
    let mut csv = rows.into_csv((places, &opts, header), layout)?;
    csv.vectors = vectors;
    Ok(csv)
}

/// Reads the list columns of numbers of a table of Parquet or JSON files
/// as a column a number (see [`vectors`]), the label column of a
/// classifier kept as label sets. The columns given by index are named
/// first, as the first file has them (the places move), then a list column
/// named among the features or targets stands for its columns. Returns the
/// list columns read so: each one's name and length.
fn read_vectors(
    given: &Path,
    files: &mut [(&Path, Read)],
    opts: &mut CsvOptions,
) -> Result<Vec<(String, usize)>> {
    let Some((_, Read::Records(first))) = files.first() else {
        return Ok(Vec::new());
    };
    let names = first.names.clone();
    for_each_column(opts, |c| {
        if let Some(at) = c.place(names.len(), &names) {
            *c = Column::Name(names[at].clone());
        }
    });
    let label = (!regression(opts)).then(|| opts.label.clone());
    for (_, read) in files.iter_mut() {
        if let Read::Records(r) = read {
            let keep = label
                .as_ref()
                .and_then(|l| l.place(r.names.len(), &r.names));
            vectors::expand(r, keep);
        }
    }
    let Some((_, Read::Records(first))) = files.first() else {
        unreachable!("the first file holds records");
    };
    for (name, k) in &first.vectors {
        let this = Column::Name(name.clone());
        if let Some((c, _)) = opts.categorical.iter().find(|(c, _)| *c == this) {
            return Err(data_err(
                given,
                format!(
                    "{} holds lists of {k} numbers, read as {k} features; it cannot be categorical",
                    c.describe()
                ),
            ));
        }
        let columns = (0..*k).map(|i| Column::Name(format!("{name}[{i}]")));
        for list in [opts.features.as_mut(), Some(&mut opts.targets)]
            .into_iter()
            .flatten()
        {
            if let Some(at) = list.iter().position(|c| *c == this) {
                list.splice(at..=at, columns.clone());
            }
        }
    }
    Ok(first.vectors.clone())
}

/// The error for the CSV file `path`, one of a table's `paths` whose
/// first file's cells hold lists, when its own first row holds none.
fn plain_cells(path: &Path, paths: &[PathBuf]) -> Error {
    data_err(
        path,
        format!(
            "its first row holds no list, where {}'s holds lists: the files read as one table have the same columns",
            paths[0].display()
        ),
    )
}

/// Calls `f` with each column the options name.
fn for_each_column(opts: &mut CsvOptions, mut f: impl FnMut(&mut Column)) {
    f(&mut opts.label);
    opts.targets.iter_mut().for_each(&mut f);
    opts.features.iter_mut().flatten().for_each(&mut f);
    opts.categorical.iter_mut().for_each(|(c, _)| f(c));
    if let Some(t) = &mut opts.text {
        t.columns.iter_mut().for_each(&mut f);
    }
}

/// An error when `l` reads a list column kept whole (its lists are not
/// numbers of one length) as a feature or target.
fn whole_lists(path: &Path, r: &Records, l: &Layout) -> Result<()> {
    let used = l.features.iter().map(|c| (c, "a feature")).chain(
        l.labels
            .iter()
            .filter(|_| l.role() == "target")
            .map(|c| (c, "a target")),
    );
    for (c, role) in used {
        if let Some((_, why)) = r.kept.iter().find(|(k, _)| k == c) {
            return Err(data_err(
                path,
                format!(
                    "{} is a column of lists, read as {role} per item when each row's list holds numbers, as many as every other row's: {why}",
                    l.column(*c)
                ),
            ));
        }
    }
    Ok(())
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
    opts.label
        .place(records.names.len(), &records.names)
        .is_some_and(|k| records.lists.get(k) == Some(&true))
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

pub(super) fn regression(opts: &CsvOptions) -> bool {
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
