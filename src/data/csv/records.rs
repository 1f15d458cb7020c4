//! Reading a CSV text's records: the header, the delimiter (and a first
//! row that seems to use another), the decimal mark, the line of each
//! record, and rows of the wrong width.

use std::path::Path;

use super::columns::{Layout, Lines};
use super::row::{Lists, Row};
use crate::data::files::data_err;
use crate::Result;

/// How a CSV text is read: whether its first row names the columns, the
/// delimiter and the decimal mark.
#[derive(Clone, Copy)]
pub(super) struct Shape {
    pub header: bool,
    pub delimiter: u8,
    pub decimal: u8,
}

/// A cell as a number whose decimal mark is `decimal`, as pandas'
/// `read_csv(decimal=...)` reads it: with `,`, `2,5` is 2.5, and a cell
/// holding a `.` is not a number.
pub(super) fn number<T: std::str::FromStr>(cell: &str, decimal: u8) -> Option<T> {
    match decimal {
        b'.' => cell.parse().ok(),
        _ if cell.contains('.') => None,
        d => cell.replace(d as char, ".").parse().ok(),
    }
}

/// A reader of the CSV text `text`'s records, the header among them, rows
/// of any width (for an error naming one), each cell trimmed when `trim`
/// says (else the reader of the cells trims them: see [`Row::csv`]).
pub(super) fn reader(text: &str, delimiter: u8, trim: bool) -> csv::Reader<&[u8]> {
    csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(match trim {
            true => csv::Trim::All,
            false => csv::Trim::None,
        })
        .delimiter(delimiter)
        .from_reader(text.as_bytes())
}

/// Reads the records of `text`: `layout` is called with the number of
/// columns and the header's names (empty without one), then `row` with each
/// data record and its line. Returns the layout (none for a text without
/// rows).
pub(super) fn each_row(
    what: &Path,
    text: &str,
    shape: Shape,
    layout: impl FnOnce(usize, Vec<String>) -> Result<Layout>,
    mut row: impl FnMut(&Layout, usize, Row) -> Result<()>,
) -> Result<Option<Layout>> {
    let mut lines = Lines::new(text.as_bytes());
    let mut layout = Some(layout);
    let mut resolved: Option<Layout> = None;
    let mut n = 0;
    super::read_ahead::each_record_of(what, text, shape.delimiter, |record| {
        let line = lines.of(record.position().map_or(0, |p| p.byte() as usize));
        if record.len() == 1 && record[0].trim().is_empty() {
            return Ok(());
        }
        if let Some(make) = layout.take() {
            n = record.len();
            if let Some(d) = other_delimiter(record, shape.delimiter) {
                return Err(data_err(
                    what,
                    format!(
                        "line {line}, `{}`, looks {d:?}-separated: give `delimiter = {d:?}`",
                        record
                            .iter()
                            .map(str::trim)
                            .collect::<Vec<_>>()
                            .join(&(shape.delimiter as char).to_string())
                    ),
                ));
            }
            let names = match shape.header {
                true => record.iter().map(|c| c.trim().to_string()).collect(),
                false => Vec::new(),
            };
            let mut made = make(n, names)?;
            made.decimal = shape.decimal;
            resolved = Some(made);
            if shape.header {
                return Ok(());
            }
        }
        if record.len() != n {
            return Err(data_err(
                what,
                format!("line {line}: {} columns, expected {n}", record.len()),
            ));
        }
        row(
            resolved.as_ref().expect("resolved at the first row"),
            line,
            Row::csv(record),
        )
    })?;
    Ok(resolved)
}

/// Where a row was read: which of a table's files (see [`Files`]), and
/// its line there (a Parquet file's row, a JSON array's record: as its
/// file's unit says).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    file: u32,
    n: usize,
}

impl Place {
    /// Line (row, record) `n` of the table's file `file`.
    pub(super) fn new(file: u32, n: usize) -> Place {
        Place { file, n }
    }

    /// The line (row, record) in its file.
    pub fn line(&self) -> usize {
        self.n
    }

    /// The place as bytes, for a cache key.
    pub(super) fn key(&self) -> [u8; 12] {
        let mut key = [0; 12];
        key[..4].copy_from_slice(&self.file.to_le_bytes());
        key[4..].copy_from_slice(&(self.n as u64).to_le_bytes());
        key
    }
}

/// The files read as one table, in order, and what names a row in each.
#[derive(Clone, Debug)]
pub struct Files {
    /// The path as given: a file, or a pattern that matched the files.
    given: std::path::PathBuf,
    files: Vec<(std::path::PathBuf, &'static str)>,
}

impl Files {
    /// The files read as the table `given` names, none yet.
    pub(super) fn new(given: &Path) -> Files {
        Files {
            given: given.to_path_buf(),
            files: Vec::new(),
        }
    }

    /// One file, whose rows `unit` names (`line`, `row`, `record`).
    pub(super) fn one(path: &Path, unit: &'static str) -> Files {
        let mut files = Files::new(path);
        files.add(path, unit);
        files
    }

    /// Appends a file: its index, for [`Place::new`].
    pub(super) fn add(&mut self, path: &Path, unit: &'static str) -> u32 {
        self.files.push((path.to_path_buf(), unit));
        (self.files.len() - 1) as u32
    }

    /// The path as given, for messages about the whole table.
    pub fn given(&self) -> &Path {
        &self.given
    }

    /// The table for a line about it: its one file, `parts/*.csv (3
    /// files)` for a pattern, `a.csv and 2 more files` for a list; with
    /// `name_only`, the file or pattern's last component.
    pub fn describe_table(&self, name_only: bool) -> String {
        let shown = |p: &Path| match name_only {
            true => p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            false => p.display().to_string(),
        };
        match &self.files[..] {
            [] | [_] => shown(&self.given),
            [(first, _), rest @ ..] if *first == self.given => {
                let s = if rest.len() == 1 { "" } else { "s" };
                format!("{} and {} more file{s}", shown(first), rest.len())
            }
            many => format!("{} ({} files)", shown(&self.given), many.len()),
        }
    }

    /// Every file's path, in order.
    pub(super) fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|(p, _)| p.as_path())
    }

    /// An error about the row at `p`, in its file: `say` is given the row
    /// as the file names it (`line 4`, `row 4`).
    pub(super) fn error(&self, p: Place, say: impl FnOnce(&str) -> String) -> crate::Error {
        let (path, unit) = &self.files[p.file as usize];
        data_err(path, say(&format!("{unit} {}", p.n)))
    }

    /// The row at `p` for a line about the whole table: `line 4`, or, of
    /// several files, `b.csv, line 4`.
    pub fn describe(&self, p: &Place) -> String {
        let (path, unit) = &self.files[p.file as usize];
        match self.files.len() {
            1 => format!("{unit} {}", p.n),
            _ => format!("{}, {unit} {}", path.display(), p.n),
        }
    }
}

/// A file's rows that come as records under column names (a Parquet
/// file's rows, a JSON file's objects), their cells as text, and the items
/// of a list column read as a column a number as numbers.
pub(super) struct Records {
    /// The columns' names, in the file's order (a list column read as a
    /// column a number: each of them, see `vectors`).
    pub names: Vec<String>,
    /// The file's cells, a list's items joined by `sep` in one: a cell for
    /// each column without `numbers`, in order (see `text_places`).
    pub rows: Vec<csv::StringRecord>,
    /// Whether each column holds lists.
    pub lists: Vec<bool>,
    /// What names each row in messages: its line, or its place (1 the
    /// first), as `unit` says.
    pub at: Vec<usize>,
    /// `line`, `row` or `record`.
    pub unit: &'static str,
    /// What joins a list's items in its cell.
    pub sep: String,
    /// The list columns read as a column a number (see
    /// [`super::vectors`]): each one's name and length...
    pub vectors: Vec<(String, usize)>,
    /// ...and each of the file's columns' length when it is one of them.
    pub lengths: Vec<Option<usize>>,
    /// The list columns kept whole, and why their lists are not numbers of
    /// one length.
    pub kept: Vec<(usize, String)>,
    /// The numbers of a column kept as numbers, by the file's columns (as
    /// `lengths`): a Parquet column of numbers or lists of them as read (no
    /// cell in the rows), and after [`super::vectors::expand`], each list column
    /// read as a column a number and each Parquet column of floats.
    pub numbers: Vec<Option<Lists>>,
}

impl Records {
    /// The rows `rows` of columns `names` (whether each holds lists:
    /// `lists`), each named `unit` `at[r]`, a list's items joined by `sep`
    /// in its cell.
    pub(super) fn new(
        names: Vec<String>,
        (rows, lists): (Vec<csv::StringRecord>, Vec<bool>),
        (at, unit): (Vec<usize>, &'static str),
        sep: &str,
    ) -> Records {
        Records {
            numbers: vec![None; names.len()],
            names,
            rows,
            lists,
            at,
            unit,
            sep: sep.to_string(),
            vectors: Vec::new(),
            lengths: Vec::new(),
            kept: Vec::new(),
        }
    }

    /// Where each of the file's columns is in a row's text: a row holds a
    /// cell for each column without numbers, in order.
    pub(super) fn text_places(&self) -> Vec<Option<usize>> {
        let mut at = 0;
        (self.numbers.iter())
            .map(|n| {
                n.is_none().then(|| {
                    at += 1;
                    at - 1
                })
            })
            .collect()
    }
}

/// The records of `path` when it is a file of them (Parquet or JSON, by
/// its extension), a list's items joined by `sep`; None for a CSV file.
pub(super) fn records_of(path: &Path, sep: &str) -> Result<Option<Records>> {
    if super::parquet::is_parquet(path) {
        return super::parquet::read(path, sep).map(Some);
    }
    if super::json::is_json(path) {
        return super::json::read(path, sep).map(Some);
    }
    Ok(None)
}

/// [`each_row`] for rows that come as [`Records`]: `layout` with the
/// names, then `row` with each record and what names it, as its line. None
/// for a file without rows.
pub(super) fn each_record(
    records: &Records,
    layout: impl FnOnce(usize, Vec<String>) -> Result<Layout>,
    mut row: impl FnMut(&Layout, usize, Row) -> Result<()>,
) -> Result<Option<Layout>> {
    if records.rows.is_empty() {
        return Ok(None);
    }
    let layout = layout(records.names.len(), records.names.clone())?;
    if records.numbers.iter().all(Option::is_none) {
        for (record, &at) in records.rows.iter().zip(&records.at) {
            row(&layout, at, Row::plain(record))?;
        }
        return Ok(Some(layout));
    }
    let slots = super::vectors::slots(records);
    for (r, (record, &at)) in records.rows.iter().zip(&records.at).enumerate() {
        row(&layout, at, Row::laid(record, &slots, r))?;
    }
    Ok(Some(layout))
}

/// [`each_row`] of the file `path`: a Parquet or JSON file's records, or a
/// CSV file's whose cells hold lists (a list column of numbers read as a
/// column a number, as a run read it), or a CSV file's text read with
/// `shape`. Returns the layout and what names
/// the file's rows (`line`, `row`, `record`).
pub(super) fn each_row_in(
    path: &Path,
    shape: Shape,
    layout: impl FnOnce(usize, Vec<String>) -> Result<Layout>,
    row: impl FnMut(&Layout, usize, Row) -> Result<()>,
) -> Result<(Option<Layout>, &'static str)> {
    let mut records = records_of(path, "|")?;
    let mut text = String::new();
    if records.is_none() {
        text = crate::data::files::read_text(path)?;
        records = super::list_cells::lists_of(path, &text, shape, "|")?;
    }
    if let Some(mut records) = records {
        super::vectors::expand(&mut records, None);
        let layout = each_record(&records, layout, row).map_err(|e| in_units(e, records.unit))?;
        return Ok((layout, records.unit));
    }
    Ok((each_row(path, &text, shape, layout, row)?, "line"))
}

/// `e` with the row it names named as `unit` names rows: the messages,
/// shared with CSV files, say `PATH: line N, ...`.
pub(super) fn in_units(e: crate::Error, unit: &str) -> crate::Error {
    match e {
        crate::Error::Data(m) if unit != "line" => {
            crate::Error::Data(m.replacen(": line ", &format!(": {unit} "), 1))
        }
        other => other,
    }
}

/// Appends `v`'s shortest text that reads back as it: a whole number as
/// `Display` writes it (`3`, as pandas' categories of it are named), another
/// through Ryu (`0.125`, `1e-7`).
pub(super) fn push_f32(o: &mut String, v: f32) {
    use std::fmt::Write;
    match v.is_finite() && v.fract() != 0.0 {
        true => o.push_str(ryu::Buffer::new().format_finite(v)),
        false => write!(o, "{v}").unwrap_or(()),
    }
}

/// [`push_f32`]'s text of `v` alone.
pub(super) fn f32_text(v: f32) -> String {
    let mut o = String::new();
    push_f32(&mut o, v);
    o
}

/// The delimiter a first record seems to use instead of `delimiter`: one
/// that every cell holds (a European spreadsheet's `;`, whose decimal
/// commas split `1;2,5;0` into `1;2` and `5;0`; a tab; a `|`).
fn other_delimiter(record: &csv::StringRecord, delimiter: u8) -> Option<char> {
    [';', '\t', '|']
        .into_iter()
        .find(|&d| d as u8 != delimiter && record.iter().all(|c| c.contains(d)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each float's text reads back as the float (the f32s of a sweep over
    /// every exponent), and a whole number is written as `Display` does.
    #[test]
    fn a_floats_text_reads_back_as_it() {
        let mut x = 1.0e-30f32;
        while x < 1.0e30 {
            for v in [x, -x, x * 1.37, x + 0.1, 1.0 / x] {
                let back: f32 = f32_text(v).parse().unwrap();
                assert_eq!(back.to_bits(), v.to_bits(), "{v}: {}", f32_text(v));
            }
            x *= 1.9;
        }
        assert_eq!(f32_text(3.0), "3");
        assert_eq!(f32_text(-0.0), "-0");
        assert_eq!(f32_text(0.1), "0.1");
        assert_eq!(f32_text(f32::NAN), "NaN");
    }
}
