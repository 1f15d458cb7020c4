//! Parquet columns decoded whole, a row group at a time, then laid out as
//! rows of cells: flat columns of numbers, booleans and strings (pandas'
//! and Hugging Face datasets' tables of features, texts and labels), and
//! lists of numbers (an embedding a row, a set of label ids), their items
//! joined by a separator. Their cells are the record API's (see
//! [`super::scalar`]), cell for cell, except that the values of a column
//! of numbers or lists of them are kept as numbers (no cell in the rows);
//! other columns (dates, decimals, structures, lists of strings) go
//! through it.

use std::path::Path;

use csv::StringRecord;
use parquet::column::reader::{ColumnReader, ColumnReaderImpl};
use parquet::data_type::DataType;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::{ColumnDescriptor, SchemaDescriptor};

use super::super::records::push_f32;
use super::super::row::Lists;
use crate::data::files::data_err;
use crate::Result;

mod numbers;

/// Whether every column of `schema` is read here, a list's items joined by
/// `sep`.
pub(super) fn readable(schema: &SchemaDescriptor, sep: &str) -> bool {
    schema.root_schema().get_fields().len() == schema.num_columns()
        && (0..schema.num_columns()).all(|c| Reading::of(&schema.column(c), sep).is_some())
}

/// The rows of a file whose columns are all [`readable`], whether each
/// column holds lists, and the values of each column of floats or exact
/// integers (or lists of them) as numbers (no cell in the rows: see
/// [`numbers`]).
pub(super) fn by_columns(
    path: &Path,
    reader: &SerializedFileReader<std::fs::File>,
    sep: &str,
) -> Result<Table> {
    let err = |e: parquet::errors::ParquetError| data_err(path, e);
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    let readings: Vec<Reading> = (0..schema.num_columns())
        .map(|c| Reading::of(&schema.column(c), sep).expect("a readable column"))
        .collect();
    let lists = readings.iter().map(|r| r.list.is_some()).collect();
    let mut numbers: Vec<Option<Lists>> = readings
        .iter()
        .enumerate()
        .map(|(c, r)| match r.list {
            _ if !r.numbers(reader.metadata(), c) => None,
            Some(_) => Some(Lists::default()),
            None => Some(Lists::flat()),
        })
        .collect();
    let mut rows = Vec::new();
    for g in 0..reader.num_row_groups() {
        let group = reader.get_row_group(g).map_err(err)?;
        let n = group.metadata().num_rows() as usize;
        let mut columns = Vec::with_capacity(group.num_columns());
        for (c, reading) in readings.iter().enumerate() {
            let column = group.get_column_reader(c).map_err(err)?;
            match &mut numbers[c] {
                Some(all) => all.append(reading.read_numbers(column, n).map_err(err)?),
                None => columns.push(reading.read(column, n).map_err(err)?),
            }
        }
        let mut cell = String::new();
        for _ in 0..n {
            let mut row = StringRecord::with_capacity(64, columns.len());
            for c in &mut columns {
                c.next_cell(&mut cell);
                row.push_field(&cell);
            }
            rows.push(row);
        }
    }
    Ok((rows, lists, numbers))
}

/// A file's rows of cells, whether each column holds lists, and each
/// column's list items as numbers, when they are kept so.
pub(super) type Table = (Vec<StringRecord>, Vec<bool>, Vec<Option<Lists>>);

/// How a column's values become cells, as the record API's fields do: the
/// converted types it reads as numbers and strings.
#[derive(Clone, Copy)]
enum Cells {
    Bool,
    /// Signed, or unsigned (stored in the signed type).
    Int32(bool),
    Int64(bool),
    Float,
    Double,
    /// UTF-8 text, or bytes.
    Bytes,
}

/// A list column's levels: an entry defined to `item` or more is an item
/// (a null below `max`), one defined less a row's null or empty list.
#[derive(Clone)]
struct List {
    max: i16,
    item: i16,
    sep: String,
}

/// How a column is read: its values' cells, and for a list column, its
/// levels.
struct Reading {
    cells: Cells,
    /// Whether a top-level value can be null.
    nullable: bool,
    list: Option<List>,
    /// An integer of 8 or 16 bits, which an f32 holds exactly.
    narrow: bool,
}

impl Reading {
    /// The reading of a column: None for one whose converted type is not a
    /// plain number or string (a date, a decimal, a timestamp), a list of
    /// strings or of anything nested, or a structure.
    fn of(descr: &ColumnDescriptor, sep: &str) -> Option<Reading> {
        use parquet::basic::{ConvertedType as C, Type as T};
        let cells = match (descr.physical_type(), descr.converted_type()) {
            (T::BOOLEAN, C::NONE) => Cells::Bool,
            (T::INT32, C::NONE | C::INT_8 | C::INT_16 | C::INT_32) => Cells::Int32(true),
            (T::INT32, C::UINT_8 | C::UINT_16 | C::UINT_32) => Cells::Int32(false),
            (T::INT64, C::NONE | C::INT_64) => Cells::Int64(true),
            (T::INT64, C::UINT_64) => Cells::Int64(false),
            (T::FLOAT, C::NONE) => Cells::Float,
            (T::DOUBLE, C::NONE) => Cells::Double,
            (T::BYTE_ARRAY, C::NONE | C::UTF8 | C::ENUM | C::JSON) => Cells::Bytes,
            _ => return None,
        };
        let narrow = matches!(
            descr.converted_type(),
            C::INT_8 | C::INT_16 | C::UINT_8 | C::UINT_16
        );
        let (rep, def) = (descr.max_rep_level(), descr.max_def_level());
        if rep == 0 {
            return (def <= 1).then_some(Reading {
                cells,
                nullable: def == 1,
                list: None,
                narrow,
            });
        }
        // A list of numbers: `list<element>` as pyarrow writes it (three
        // levels), or a repeated field; no list of lists or of structures.
        // Items are joined by `sep`, which no number's text may hold.
        let parts = descr.path().parts().len();
        let plain = |c: char| c.is_ascii_alphanumeric() || "+-.".contains(c);
        if rep != 1 || parts > 3 || matches!(cells, Cells::Bytes) || sep.chars().any(plain) {
            return None;
        }
        let item = def - i16::from(descr.self_type().is_optional());
        Some(Reading {
            cells,
            narrow,
            nullable: false,
            list: Some(List {
                max: def,
                item,
                sep: sep.to_string(),
            }),
        })
    }

    /// A row group's column of `n` rows, decoded whole: a cursor that
    /// writes each row's cell in turn (a null: empty, a missing value).
    fn read(&self, column: ColumnReader, n: usize) -> parquet::errors::Result<Box<dyn Cursor>> {
        use std::fmt::Write;
        let at = (n, self);
        let cursor: Box<dyn Cursor> = match (self.cells, column) {
            (Cells::Bool, ColumnReader::BoolColumnReader(c)) => {
                Box::new(Decoded::of(c, at, |b, o| {
                    o.push(if *b { '1' } else { '0' })
                })?)
            }
            (Cells::Int32(signed), ColumnReader::Int32ColumnReader(c)) => match signed {
                true => Box::new(Decoded::of(c, at, |v, o| write!(o, "{v}").unwrap_or(()))?),
                false => Box::new(Decoded::of(c, at, |v, o| {
                    write!(o, "{}", *v as u32).unwrap_or(())
                })?),
            },
            (Cells::Int64(signed), ColumnReader::Int64ColumnReader(c)) => match signed {
                true => Box::new(Decoded::of(c, at, |v, o| write!(o, "{v}").unwrap_or(()))?),
                false => Box::new(Decoded::of(c, at, |v, o| {
                    write!(o, "{}", *v as u64).unwrap_or(())
                })?),
            },
            (Cells::Float, ColumnReader::FloatColumnReader(c)) => {
                Box::new(Decoded::of(c, at, |v, o| push_f32(o, *v))?)
            }
            // The f32 the model is given, as `scalar` writes a Double.
            (Cells::Double, ColumnReader::DoubleColumnReader(c)) => {
                Box::new(Decoded::of(c, at, |v, o| push_f32(o, *v as f32))?)
            }
            (Cells::Bytes, ColumnReader::ByteArrayColumnReader(c)) => {
                Box::new(Decoded::of(c, at, |b, o| {
                    o.push_str(&String::from_utf8_lossy(b.data()))
                })?)
            }
            _ => {
                return Err(parquet::errors::ParquetError::General(
                    "a column's reader is not of its type".into(),
                ))
            }
        };
        Ok(cursor)
    }
}

/// A decoded column's cells, one row after another.
trait Cursor {
    /// Writes the next row's cell into `out` (cleared first).
    fn next_cell(&mut self, out: &mut String);
}

/// A row group's column decoded: its non-null values, their definition
/// levels (which rows, or a list's items, hold one) and repetition levels
/// (where a row's list ends), and how a value is written.
struct Decoded<T> {
    values: Vec<T>,
    defs: Vec<i16>,
    reps: Vec<i16>,
    nullable: bool,
    list: Option<List>,
    /// The next entry of `defs`, and of `values`.
    entry: usize,
    value: usize,
    text: fn(&T, &mut String),
}

impl<T> Decoded<T> {
    fn of<D: DataType<T = T>>(
        mut column: ColumnReaderImpl<D>,
        (n, reading): (usize, &Reading),
        text: fn(&T, &mut String),
    ) -> parquet::errors::Result<Decoded<T>> {
        let (mut defs, mut reps, mut values) = (Vec::new(), Vec::new(), Vec::with_capacity(n));
        let levels = reading.nullable || reading.list.is_some();
        let mut read = 0;
        while read < n {
            let (records, _, _) = column.read_records(
                n - read,
                levels.then_some(&mut defs),
                reading.list.is_some().then_some(&mut reps),
                &mut values,
            )?;
            if records == 0 {
                break;
            }
            read += records;
        }
        Ok(Decoded {
            values,
            defs,
            reps,
            nullable: reading.nullable,
            list: reading.list.clone(),
            entry: 0,
            value: 0,
            text,
        })
    }

    /// Writes the next value into `out`.
    fn write_value(&mut self, out: &mut String) {
        if let Some(v) = self.values.get(self.value) {
            (self.text)(v, out);
        }
        self.value += 1;
    }
}

impl<T> Cursor for Decoded<T> {
    fn next_cell(&mut self, out: &mut String) {
        out.clear();
        let Some(list) = self.list.take() else {
            let present = !self.nullable || self.defs.get(self.entry) == Some(&1);
            self.entry += 1;
            if present {
                self.write_value(out);
            }
            return;
        };
        // A row's entries: the first, then those that repeat its list.
        let mut first = true;
        while let Some(&def) = self.defs.get(self.entry) {
            if !first && self.reps.get(self.entry) != Some(&1) {
                break;
            }
            self.entry += 1;
            if def >= list.item {
                if !first {
                    out.push_str(&list.sep);
                }
                if def == list.max {
                    self.write_value(out);
                }
            }
            first = false;
        }
        self.list = Some(list);
    }
}

#[cfg(test)]
mod tests;
