//! JSON files as table rows: JSON Lines (an object a line, as pandas'
//! `to_json(orient="records", lines=True)` and Hugging Face datasets'
//! `to_json` write them) or one JSON array of such objects (`lines=False`).
//! Each object's values become text cells for the same reading as a CSV
//! file's, as [`super::parquet`]'s do: the columns are the keys in the
//! order they first appear (a row without a key has a missing value
//! there, as pandas' `read_json` reads it), a null is a missing value, a
//! boolean 0 or 1, a fraction the f32 it becomes, and a list (a sample's
//! labels, `[2, 27]`) its elements joined by a separator: a set of labels.

use std::path::Path;

use csv::StringRecord;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::records::Records;
use crate::data::files::data_err;
use crate::Result;

/// Whether `path` names a JSON file by its extension: `.jsonl`, `.ndjson`
/// or `.json`, gzipped (`.jsonl.gz`) or plain.
pub fn is_json(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let name = name.strip_suffix(".gz").unwrap_or(&name);
    [".jsonl", ".ndjson", ".json"]
        .iter()
        .any(|e| name.ends_with(e))
}

/// One row: an object's keys and values, in the file's order.
struct Object(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = Object;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object (`{\"column\": value, ...}`), one row")
            }
            fn visit_map<M: MapAccess<'de>>(
                self,
                mut m: M,
            ) -> std::result::Result<Object, M::Error> {
                let mut fields = Vec::new();
                while let Some(field) = m.next_entry::<String, Value>()? {
                    fields.push(field);
                }
                Ok(Object(fields))
            }
        }
        d.deserialize_map(Fields)
    }
}

/// Reads `path` (a JSON Lines file, or a JSON array of objects), joining a
/// list's elements with `sep`. A JSON Lines file's rows are named by their
/// lines, an array's by their place in it (1 the first). Each object
/// becomes its row's cells as it is read, so the file's objects are never
/// all held at once.
pub(super) fn read(path: &Path, sep: &str) -> Result<Records> {
    let text = crate::data::files::read_text(path)?;
    let mut table = Table::default();
    let unit = match text.trim_start().as_bytes().first() {
        Some(b'[') => array(path, &text, &mut table, sep).map(|()| "record")?,
        _ => lines(path, &text, &mut table, sep).map(|()| "line")?,
    };
    Ok(table.into_records(unit, sep))
}

/// A JSON Lines text's objects into `table`, each named by its line; blank
/// lines are passed over.
fn lines(path: &Path, text: &str, table: &mut Table, sep: &str) -> Result<()> {
    for (k, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let object = serde_json::from_str::<Object>(line).map_err(|e| {
            let whole = e.to_string();
            let said = whole
                .rsplit_once(" at line ")
                .map_or(&whole[..], |(m, _)| m);
            let column = match e.column() {
                0 => String::new(),
                c => format!(", column {c}"),
            };
            let hint = match e.is_data() {
                true => "",
                false => ": a JSON Lines file holds a JSON object a line",
            };
            data_err(path, format!("line {}{column}: {said}{hint}", k + 1))
        })?;
        table.add(path, ("line", k + 1), &object, sep)?;
    }
    Ok(())
}

/// A JSON array's objects into `table`, each named by its place in it (1
/// the first), as they are read.
fn array(path: &Path, text: &str, table: &mut Table, sep: &str) -> Result<()> {
    struct Rows<'a> {
        path: &'a Path,
        table: &'a mut Table,
        sep: &'a str,
        read: usize,
        /// Why a record is no row; serde's error only stops the reading.
        failed: Option<crate::Error>,
    }
    impl<'de> Visitor<'de> for &mut Rows<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array of objects, one a row")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
            while let Some(object) = seq.next_element::<Object>()? {
                self.read += 1;
                let at = ("record", self.read);
                if let Err(e) = self.table.add(self.path, at, &object, self.sep) {
                    self.failed = Some(e);
                    return Err(serde::de::Error::custom("a record that is no row"));
                }
            }
            Ok(())
        }
    }
    let mut rows = Rows {
        path,
        table,
        sep,
        read: 0,
        failed: None,
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let read = de.deserialize_seq(&mut rows).and_then(|()| de.end());
    if let Some(e) = rows.failed {
        return Err(e);
    }
    read.map_err(|e| {
        let after = match rows.read {
            0 => String::new(),
            n => format!(" (after record {n})"),
        };
        data_err(
            path,
            format!("not a JSON array of objects, one a row{after}: {e}"),
        )
    })
}

/// The rows read so far: the columns in the order their keys came, each
/// row's cells (as many as the columns known when it was read) and what
/// names it.
#[derive(Default)]
struct Table {
    names: Vec<String>,
    index: std::collections::HashMap<String, usize>,
    rows: Vec<StringRecord>,
    at: Vec<usize>,
    lists: Vec<bool>,
}

impl Table {
    /// The row `object`, named `unit` `at` in errors, a list's items joined
    /// by `sep`.
    fn add(
        &mut self,
        path: &Path,
        (unit, at): (&str, usize),
        object: &Object,
        sep: &str,
    ) -> Result<()> {
        let mut cells: Vec<Option<String>> = vec![None; self.names.len()];
        for (name, value) in &object.0 {
            let k = *self.index.entry(name.clone()).or_insert_with(|| {
                self.names.push(name.clone());
                self.lists.push(false);
                self.names.len() - 1
            });
            if cells.len() <= k {
                cells.resize(k + 1, None);
            }
            let fail = |what: String| data_err(path, format!("{unit} {at}, `{name}`: {what}"));
            if cells[k].is_some() {
                return Err(fail("the key comes twice in one object".into()));
            }
            let text = match value {
                Value::Array(items) => {
                    self.lists[k] = true;
                    list(items, sep).map_err(fail)?
                }
                v => scalar(v).ok_or_else(|| fail(not_a_cell(v)))?,
            };
            cells[k] = Some(text);
        }
        self.rows
            .push(cells.into_iter().map(Option::unwrap_or_default).collect());
        self.at.push(at);
        Ok(())
    }

    /// The rows, one cell a column: a key a row lacks is a missing value,
    /// as pandas' `read_json` reads it.
    fn into_records(mut self, unit: &'static str, sep: &str) -> Records {
        let width = self.names.len();
        for row in &mut self.rows {
            for _ in row.len()..width {
                row.push_field("");
            }
        }
        Records::new(self.names, (self.rows, self.lists), (self.at, unit), sep)
    }
}

/// A list's items (a set of labels) joined by `sep`, which none may hold.
fn list(items: &[Value], sep: &str) -> std::result::Result<String, String> {
    let items: Vec<String> = items
        .iter()
        .map(|v| scalar(v).ok_or_else(|| format!("a list holding {}", not_a_cell(v))))
        .collect::<std::result::Result<_, _>>()?;
    if let Some(item) = items.iter().find(|i| i.contains(sep)) {
        return Err(format!(
            "the label `{item}` holds {sep:?}, which joins a list's labels: give another `label_sep`"
        ));
    }
    Ok(items.join(sep))
}

/// A scalar's text: empty for a null (a missing value); a number as the
/// f32 the model is given (its shortest text reads back as it), as for a
/// Parquet file's float64s.
fn scalar(value: &Value) -> Option<String> {
    Some(match value {
        Value::Null => String::new(),
        Value::Bool(b) => u8::from(*b).to_string(),
        Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
        Value::Number(n) => super::records::f32_text(n.as_f64()? as f32),
        Value::String(s) => s.clone(),
        Value::Array(_) | Value::Object(_) => return None,
    })
}

/// What a value that is no cell is, and what taper reads instead.
fn not_a_cell(value: &Value) -> String {
    let what = match value {
        Value::Object(_) => "an object",
        _ => "a list",
    };
    format!("{what}; taper reads numbers, strings, booleans and lists of them, a row an object (pandas: `to_json(orient=\"records\", lines=True)`)")
}
