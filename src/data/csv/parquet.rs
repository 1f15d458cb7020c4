//! Parquet files as table rows: each row's cells as text, for the same
//! reading as a CSV file's (columns by name, numbers, categories, labels,
//! texts). pandas' `to_parquet` and Hugging Face datasets write them. A
//! null is a missing value; a number is written as the f32 it becomes (so
//! the model sees the file's value cast to f32, as PyTorch casts a float64
//! column); a list (a sample's labels, `[2, 27]`) is its elements joined by
//! a separator, a set of labels.

use std::path::Path;

use csv::StringRecord;
use parquet::column::reader::{ColumnReader, ColumnReaderImpl};
use parquet::data_type::DataType;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::{Field, Row};

use super::records::Records;
use crate::data::files::data_err;
use crate::Result;

/// Whether `path` names a Parquet file (by its extension).
pub fn is_parquet(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

/// Reads `path`, joining a list's elements with `sep`: column by column
/// when every column is a flat one of numbers, booleans or strings (pandas'
/// and Hugging Face datasets' tables of features, texts and labels), else
/// row by row through the crate's record API (lists, dates, decimals).
pub(super) fn read(path: &Path, sep: &str) -> Result<Records> {
    let file = std::fs::File::open(path).map_err(|e| crate::Error::io(path, e))?;
    let reader = SerializedFileReader::new(file)
        .map_err(|e| data_err(path, format!("not a Parquet file: {e}")))?;
    let descr = reader.metadata().file_metadata().schema_descr_ptr();
    let names: Vec<String> = descr
        .root_schema()
        .get_fields()
        .iter()
        .map(|f| f.name().to_string())
        .collect();
    let flat = names.len() == descr.num_columns()
        && (0..descr.num_columns()).all(|c| Cells::of(&descr.column(c)).is_some());
    let (rows, lists) = match flat {
        true => (by_columns(path, &reader)?, vec![false; names.len()]),
        false => by_rows(path, &reader, sep, names.len())?,
    };
    Ok(Records {
        names,
        at: (1..=rows.len()).collect(),
        rows,
        lists,
        unit: "row",
    })
}

/// The rows of a file whose columns are all flat, read column by column:
/// each row group's columns decoded whole, then laid out as rows.
fn by_columns(
    path: &Path,
    reader: &SerializedFileReader<std::fs::File>,
) -> Result<Vec<StringRecord>> {
    let err = |e: parquet::errors::ParquetError| data_err(path, e);
    let mut rows = Vec::new();
    for g in 0..reader.num_row_groups() {
        let group = reader.get_row_group(g).map_err(err)?;
        let n = group.metadata().num_rows() as usize;
        let mut columns = Vec::with_capacity(group.num_columns());
        for c in 0..group.num_columns() {
            let descr = group.metadata().column(c).column_descr_ptr();
            let kind = Cells::of(&descr).expect("a flat column");
            let column = group.get_column_reader(c).map_err(err)?;
            let nullable = descr.max_def_level() == 1;
            columns.push(kind.read(column, n, nullable).map_err(err)?);
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
    Ok(rows)
}

/// The rows of `reader` through the record API (any schema): their cells,
/// and whether each of the `width` columns holds lists.
fn by_rows(
    path: &Path,
    reader: &SerializedFileReader<std::fs::File>,
    sep: &str,
    width: usize,
) -> Result<(Vec<StringRecord>, Vec<bool>)> {
    let mut lists = vec![false; width];
    let mut rows = Vec::new();
    let iter = reader.get_row_iter(None).map_err(|e| data_err(path, e))?;
    for (i, row) in iter.enumerate() {
        let row = row.map_err(|e| data_err(path, format!("row {}: {e}", i + 1)))?;
        rows.push(record(path, i + 1, &row, sep, &mut lists)?);
    }
    Ok((rows, lists))
}

/// How a flat column's values become cells, as the record API's fields
/// (see [`scalar`]) do: the converted types it reads as numbers and strings.
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

impl Cells {
    /// The reading of a column: None for one that is nested (repeated) or
    /// whose converted type is not a plain number or string (a date, a
    /// decimal, a timestamp), which the record API reads.
    fn of(descr: &parquet::schema::types::ColumnDescriptor) -> Option<Cells> {
        use parquet::basic::{ConvertedType as C, Type as T};
        if descr.max_rep_level() > 0 || descr.max_def_level() > 1 {
            return None;
        }
        Some(match (descr.physical_type(), descr.converted_type()) {
            (T::BOOLEAN, C::NONE) => Cells::Bool,
            (T::INT32, C::NONE | C::INT_8 | C::INT_16 | C::INT_32) => Cells::Int32(true),
            (T::INT32, C::UINT_8 | C::UINT_16 | C::UINT_32) => Cells::Int32(false),
            (T::INT64, C::NONE | C::INT_64) => Cells::Int64(true),
            (T::INT64, C::UINT_64) => Cells::Int64(false),
            (T::FLOAT, C::NONE) => Cells::Float,
            (T::DOUBLE, C::NONE) => Cells::Double,
            (T::BYTE_ARRAY, C::NONE | C::UTF8 | C::ENUM | C::JSON) => Cells::Bytes,
            _ => return None,
        })
    }

    /// A row group's column of `n` values, `nullable` when it is
    /// optional, decoded whole: a cursor that writes each row's cell in
    /// turn (a null: empty, a missing value).
    fn read(
        self,
        column: ColumnReader,
        n: usize,
        nullable: bool,
    ) -> parquet::errors::Result<Box<dyn Cursor>> {
        use std::fmt::Write;
        let at = (n, nullable);
        let cursor: Box<dyn Cursor> = match (self, column) {
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
                Box::new(Decoded::of(c, at, |v, o| write!(o, "{v}").unwrap_or(()))?)
            }
            // The f32 the model is given, as `scalar` writes a Double.
            (Cells::Double, ColumnReader::DoubleColumnReader(c)) => {
                Box::new(Decoded::of(c, at, |v, o| {
                    write!(o, "{}", *v as f32).unwrap_or(())
                })?)
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

/// A row group's column decoded: its non-null values, which rows hold one
/// (an optional column's definition levels), and how a value is written.
struct Decoded<T> {
    values: Vec<T>,
    defs: Vec<i16>,
    nullable: bool,
    row: usize,
    value: usize,
    text: fn(&T, &mut String),
}

impl<T> Decoded<T> {
    fn of<D: DataType<T = T>>(
        mut column: ColumnReaderImpl<D>,
        (n, nullable): (usize, bool),
        text: fn(&T, &mut String),
    ) -> parquet::errors::Result<Decoded<T>> {
        let (mut defs, mut values) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut read = 0;
        while read < n {
            let (records, _, _) =
                column.read_records(n - read, Some(&mut defs), None, &mut values)?;
            if records == 0 {
                break;
            }
            read += records;
        }
        Ok(Decoded {
            values,
            defs,
            nullable,
            row: 0,
            value: 0,
            text,
        })
    }
}

impl<T> Cursor for Decoded<T> {
    fn next_cell(&mut self, out: &mut String) {
        out.clear();
        let present = !self.nullable || self.defs.get(self.row) == Some(&1);
        self.row += 1;
        if present {
            if let Some(v) = self.values.get(self.value) {
                (self.text)(v, out);
            }
            self.value += 1;
        }
    }
}

/// Row `n`'s cells (1 the first).
fn record(path: &Path, n: usize, row: &Row, sep: &str, lists: &mut [bool]) -> Result<StringRecord> {
    let mut cells = Vec::with_capacity(lists.len());
    for (k, (name, field)) in row.get_column_iter().enumerate() {
        let at = || format!("row {n}, `{name}`");
        let cell = match field {
            Field::ListInternal(list) => {
                lists[k] = true;
                let items: Vec<String> = list
                    .elements()
                    .iter()
                    .map(|f| {
                        scalar(f).ok_or_else(|| {
                            data_err(
                                path,
                                format!("{}: a list of {f}, not of numbers or strings", at()),
                            )
                        })
                    })
                    .collect::<Result<_>>()?;
                if let Some(item) = items.iter().find(|i| i.contains(sep)) {
                    return Err(data_err(
                        path,
                        format!("{}: the label `{item}` holds {sep:?}, which joins a list's labels: give another `label_sep`", at()),
                    ));
                }
                items.join(sep)
            }
            f => scalar(f).ok_or_else(|| {
                data_err(
                    path,
                    format!(
                        "{}: {f} is a structure; taper reads numbers, strings and lists of them",
                        at()
                    ),
                )
            })?,
        };
        cells.push(cell);
    }
    Ok(StringRecord::from(cells))
}

/// A cell's text: empty for a null (a missing value).
fn scalar(f: &Field) -> Option<String> {
    Some(match f {
        Field::Null => String::new(),
        Field::Bool(b) => u8::from(*b).to_string(),
        Field::Byte(v) => v.to_string(),
        Field::Short(v) => v.to_string(),
        Field::Int(v) => v.to_string(),
        Field::Long(v) => v.to_string(),
        Field::UByte(v) => v.to_string(),
        Field::UShort(v) => v.to_string(),
        Field::UInt(v) => v.to_string(),
        Field::ULong(v) => v.to_string(),
        Field::Float16(v) => f32::from(*v).to_string(),
        Field::Float(v) => v.to_string(),
        // The f32 the model is given; its shortest text reads back as it.
        Field::Double(v) => (*v as f32).to_string(),
        Field::Str(s) => s.clone(),
        Field::Bytes(b) => String::from_utf8_lossy(b.data()).into_owned(),
        Field::Decimal(_) | Field::Date(_) | Field::TimeMillis(_) | Field::TimeMicros(_) => {
            f.to_string()
        }
        Field::TimestampMillis(_) | Field::TimestampMicros(_) => f.to_string(),
        Field::Group(_) | Field::ListInternal(_) | Field::MapInternal(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parquet::data_type::{
        BoolType, ByteArray, ByteArrayType, DoubleType, FloatType, Int32Type, Int64Type,
    };
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;

    use super::*;

    /// Two row groups of every flat column type the column reading takes,
    /// with nulls: its cells are the record API's, cell for cell.
    #[test]
    fn flat_columns_read_as_the_record_api_reads_them() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("types.parquet");
        let schema = "message s {
            required int32 a (INT_8); optional int32 b (UINT_32); optional int64 c;
            required int64 d (UINT_64); optional float e; optional double f;
            optional boolean g; optional binary h (UTF8); required binary i;
        }";
        let schema = Arc::new(parse_message_type(schema)?);
        let mut writer =
            SerializedFileWriter::new(std::fs::File::create(&path)?, schema, Default::default())?;
        for group in 0..2i32 {
            let defs = [1i16, 0, 1];
            let mut rg = writer.next_row_group()?;
            let mut k = 0;
            while let Some(mut col) = rg.next_column()? {
                let g = group * 10;
                match k {
                    0 => col
                        .typed::<Int32Type>()
                        .write_batch(&[-3 - g, 0, 7], None, None)?,
                    1 => col
                        .typed::<Int32Type>()
                        .write_batch(&[-1, 5], Some(&defs), None)?,
                    2 => col
                        .typed::<Int64Type>()
                        .write_batch(&[i64::MIN, 9], Some(&defs), None)?,
                    3 => col
                        .typed::<Int64Type>()
                        .write_batch(&[-1, 2, 3], None, None)?,
                    4 => col
                        .typed::<FloatType>()
                        .write_batch(&[0.1, 1e-7], Some(&defs), None)?,
                    5 => col
                        .typed::<DoubleType>()
                        .write_batch(&[0.1, 3e38], Some(&defs), None)?,
                    6 => col
                        .typed::<BoolType>()
                        .write_batch(&[true, false], Some(&defs), None)?,
                    7 => col.typed::<ByteArrayType>().write_batch(
                        &[ByteArray::from("Adélie"), ByteArray::from("")],
                        Some(&defs),
                        None,
                    )?,
                    _ => col.typed::<ByteArrayType>().write_batch(
                        &[
                            ByteArray::from("x"),
                            ByteArray::from(vec![0xff, b'y']),
                            ByteArray::from("z"),
                        ],
                        None,
                        None,
                    )?,
                };
                col.close()?;
                k += 1;
            }
            rg.close()?;
        }
        writer.close()?;

        let reader = SerializedFileReader::new(std::fs::File::open(&path)?)?;
        let descr = reader.metadata().file_metadata().schema_descr_ptr();
        assert!((0..9).all(|c| Cells::of(&descr.column(c)).is_some()));
        let by_columns = by_columns(&path, &reader)?;
        let (by_rows, lists) = by_rows(&path, &reader, "|", 9)?;
        assert_eq!(by_columns.len(), 6);
        assert_eq!(by_columns, by_rows);
        assert!(lists.iter().all(|l| !l));
        assert_eq!(
            by_columns[1].iter().map(str::to_string).collect::<Vec<_>>(),
            ["0", "", "", "2", "", "", "", "", "\u{fffd}y"].map(str::to_string)
        );
        assert_eq!(&by_columns[3][0], "-13");
        Ok(())
    }
}
