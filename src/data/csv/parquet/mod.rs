//! Parquet files as table rows: each row's cells as text, for the same
//! reading as a CSV file's (columns by name, numbers, categories, labels,
//! texts). pandas' `to_parquet` and Hugging Face datasets write them. A
//! null is a missing value; a number is written as the f32 it becomes (so
//! the model sees the file's value cast to f32, as PyTorch casts a float64
//! column); a list (a sample's labels, `[2, 27]`) is its elements joined by
//! a separator, a set of labels. A column of floats, or of lists of floats
//! (an embedding), keeps its values as the f32 numbers they become.

use std::path::Path;

use csv::StringRecord;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::{Field, Row};

use super::records::{f32_text, Records};
use crate::data::files::data_err;
use crate::Result;

mod columns;

/// Whether `path` names a Parquet file (by its extension).
pub fn is_parquet(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

/// Reads `path`, joining a list's elements with `sep`: column by column
/// when every column is one of numbers, booleans or strings, or lists of
/// numbers (see [`columns`]), else row by row through the crate's record
/// API (lists of strings, dates, decimals).
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
    let (rows, lists, numbers) = match columns::readable(&descr, sep) {
        true => {
            let (rows, lists, numbers) = columns::by_columns(path, &reader, sep)?;
            (rows, lists, Some(numbers))
        }
        false => {
            let (rows, lists) = by_rows(path, &reader, sep, names.len())?;
            (rows, lists, None)
        }
    };
    let at = (1..=rows.len()).collect();
    let mut records = Records::new(names, (rows, lists), (at, "row"), sep);
    if let Some(numbers) = numbers {
        records.numbers = numbers;
    }
    Ok(records)
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
        Field::Float16(v) => f32_text(f32::from(*v)),
        Field::Float(v) => f32_text(*v),
        // The f32 the model is given; its shortest text reads back as it.
        Field::Double(v) => f32_text(*v as f32),
        Field::Str(s) => s.clone(),
        Field::Bytes(b) => String::from_utf8_lossy(b.data()).into_owned(),
        Field::Decimal(_) | Field::Date(_) | Field::TimeMillis(_) | Field::TimeMicros(_) => {
            f.to_string()
        }
        Field::TimestampMillis(_) | Field::TimestampMicros(_) => f.to_string(),
        Field::Group(_) | Field::ListInternal(_) | Field::MapInternal(_) => return None,
    })
}
