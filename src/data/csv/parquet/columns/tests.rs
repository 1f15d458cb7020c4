//! Reading Parquet files by columns: files written with the parquet
//! crate's writer, read back cell by cell.

use std::sync::Arc;

use parquet::data_type::{
    BoolType, ByteArray, ByteArrayType, DoubleType, FloatType, Int32Type, Int64Type,
};
use parquet::file::writer::{SerializedColumnWriter, SerializedFileWriter};
use parquet::schema::parser::parse_message_type;

use super::super::super::records::f32_text;
use super::*;

/// A file of `schema` with two row groups, each column `k` of group `g`
/// written by `column(k, g, writer)`, open for reading.
fn written(
    path: &Path,
    schema: &str,
    mut column: impl FnMut(usize, i32, &mut SerializedColumnWriter) -> anyhow::Result<()>,
) -> anyhow::Result<SerializedFileReader<std::fs::File>> {
    let schema = Arc::new(parse_message_type(schema)?);
    let mut writer =
        SerializedFileWriter::new(std::fs::File::create(path)?, schema, Default::default())?;
    for group in 0..2 {
        let mut rg = writer.next_row_group()?;
        let mut k = 0;
        while let Some(mut col) = rg.next_column()? {
            column(k, group, &mut col)?;
            col.close()?;
            k += 1;
        }
        rg.close()?;
    }
    writer.close()?;
    Ok(SerializedFileReader::new(std::fs::File::open(path)?)?)
}

/// `rows` with the cells of the columns kept as `numbers` (which have
/// none) written as the record API writes them, in their places.
fn as_text(rows: &mut [StringRecord], numbers: &[Option<Lists>]) {
    for (r, row) in rows.iter_mut().enumerate() {
        let mut cells = row.iter();
        let all: Vec<String> = (numbers.iter())
            .map(|n| match n {
                None => cells.next().expect("a cell").to_string(),
                Some(n) if n.flat => n.row(r).first().map_or(String::new(), |v| f32_text(*v)),
                Some(n) => n.text(r, "|"),
            })
            .collect();
        assert!(
            cells.next().is_none(),
            "a cell for each column without numbers"
        );
        *row = all.into();
    }
}

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
    let defs = [1i16, 0, 1];
    let reader = written(&path, schema, |k, group, col| {
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
        Ok(())
    })?;
    let descr = reader.metadata().file_metadata().schema_descr_ptr();
    assert!(readable(&descr, "|"));
    let (mut by_columns, lists, numbers) = by_columns(&path, &reader, "|")?;
    let (by_rows, _) = super::super::by_rows(&path, &reader, "|", 9)?;
    let kept: Vec<bool> = numbers.iter().map(Option::is_some).collect();
    // Floats, and an 8-bit integer; not i64::MIN, which f32 does not
    // hold exactly, nor unsigned 32 and 64 bits.
    assert_eq!(
        kept,
        [true, false, false, false, true, true, false, false, false]
    );
    as_text(&mut by_columns, &numbers);
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

/// Two row groups of lists of numbers as pyarrow writes them (a null
/// list, an empty one, a null item) and as a required list: their
/// cells are the record API's; a list of strings is left to it.
#[test]
fn lists_of_numbers_read_as_the_record_api_reads_them() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("lists.parquet");
    let schema = "message s {
        optional group e (LIST) { repeated group list { optional float element; } }
        required group l (LIST) { repeated group list { required int64 element; } }
        optional int32 x;
    }";
    // Rows: ([1.5, null, -2], [2, 27], 1), (null, [], null), ([], [10], 3).
    let reader = written(&path, schema, |k, group, col| {
        match k {
            0 => col.typed::<FloatType>().write_batch(
                &[1.5, -2.0 - group as f32],
                Some(&[3, 2, 3, 0, 1]),
                Some(&[0, 1, 1, 0, 0]),
            )?,
            1 => col.typed::<Int64Type>().write_batch(
                &[2, 27, 10 + i64::from(group)],
                Some(&[1, 1, 0, 1]),
                Some(&[0, 1, 0, 0]),
            )?,
            _ => col
                .typed::<Int32Type>()
                .write_batch(&[1, 3], Some(&[1, 0, 1]), None)?,
        };
        Ok(())
    })?;
    let descr = reader.metadata().file_metadata().schema_descr_ptr();
    assert!(readable(&descr, "|"));
    assert!(
        !readable(&descr, "-"),
        "a separator a number's text may hold"
    );
    let (mut by_columns, lists, numbers) = by_columns(&path, &reader, "|")?;
    let (by_rows, by_rows_lists) = super::super::by_rows(&path, &reader, "|", 3)?;
    // The lists' items are numbers, without cells; as text, the
    // record API's cells.
    // The integers too, which the statistics bound within ±2^24.
    assert!(numbers[1].is_some() && numbers[2].is_some());
    let floats = numbers[0]
        .as_ref()
        .expect("a float list's items as numbers");
    assert_eq!(floats.row(0)[0], 1.5);
    assert!(floats.row(0)[1].is_nan());
    assert_eq!(floats.row(5), &[] as &[f32]);
    as_text(&mut by_columns, &numbers);
    assert_eq!(by_columns, by_rows);
    assert_eq!(lists, [true, true, false]);
    assert_eq!(lists, by_rows_lists);
    let cells: Vec<Vec<&str>> = by_columns.iter().map(|r| r.iter().collect()).collect();
    assert_eq!(cells[0], ["1.5||-2", "2|27", "1"]);
    assert_eq!(cells[1], ["", "", ""]);
    assert_eq!(cells[2], ["", "10", "3"]);
    assert_eq!(cells[3], ["1.5||-3", "2|27", "1"]);
    assert_eq!(cells[5], ["", "11", "3"]);

    let strings = Arc::new(parse_message_type(
        "message s { optional group t (LIST) { repeated group list { optional binary element (UTF8); } } }",
    )?);
    let strings = parquet::schema::types::SchemaDescriptor::new(strings);
    assert!(!readable(&strings, "|"));
    Ok(())
}
