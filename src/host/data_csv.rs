//! `taper.data.csv{...}`: its options (columns by index or name, class
//! names or a numeric target, missing values, the delimiter) as the data
//! module takes them.

use mlua::{Lua, Table, Value};
use serde::Deserialize;

use super::csv_columns::{ColumnOpt, ColumnsOpt};
use super::data_files::{check_files, check_scale, source};
use super::options::{at_caller, config_error, decode_mixed};
use super::table_files::{self, PathsOpt};
use crate::data::{self, Source};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CsvOpts {
    path: PathsOpt,
    #[serde(default)]
    label: Option<ColumnOpt>,
    /// Number columns to predict (regression), instead of a label: one
    /// column, or a list of them.
    #[serde(default)]
    target: Option<ColumnsOpt>,
    #[serde(default)]
    features: Option<Vec<ColumnOpt>>,
    /// A column of text, tokenized with `tokenizer`, as the input; or two,
    /// a text pair.
    #[serde(default)]
    text: Option<ColumnsOpt>,
    #[serde(default)]
    tokenizer: Option<std::path::PathBuf>,
    /// The most ids of a text (default 128).
    #[serde(default)]
    context: Option<usize>,
    #[serde(default)]
    header: Option<bool>,
    #[serde(default)]
    delimiter: Option<String>,
    /// The numbers' decimal mark: "." or ",".
    #[serde(default)]
    decimal: Option<String>,
    #[serde(default = "one")]
    scale: f32,
    #[serde(default = "all")]
    split: String,
    #[serde(default)]
    classes: Option<Vec<String>>,
    /// The label column holds sets of labels split at this.
    #[serde(default)]
    label_sep: Option<String>,
    #[serde(default)]
    missing: MissingOpt,
    /// Read from the Lua table itself ([`categorical`]): serde would see
    /// only the list part of `{ "island", sex = { ... } }`.
    #[serde(default)]
    #[allow(dead_code)]
    categorical: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum MissingOpt {
    #[default]
    Error,
    Drop,
}

impl CsvOpts {
    fn options(mut self, lua: &Lua) -> mlua::Result<data::CsvOptions> {
        let text = self.text_options(lua)?;
        let tsv = {
            let p = self.path.given();
            let p = p.to_string_lossy();
            p.ends_with(".tsv") || p.ends_with(".tsv.gz")
        };
        let delimiter = match self.delimiter.as_deref() {
            None if tsv => b'\t',
            None => b',',
            Some(d) if d.len() == 1 && d.is_ascii() => d.as_bytes()[0],
            Some(d) => {
                return Err(config_error(
                    lua,
                    format!("taper.data.csv: option `delimiter` must be one ASCII character (\",\", \";\", \"\\t\"), got {d:?}"),
                ))
            }
        };
        let decimal = match self.decimal.as_deref() {
            None | Some(".") => b'.',
            Some(",") if delimiter == b',' => {
                return Err(config_error(
                    lua,
                    "taper.data.csv: `decimal = \",\"` needs another `delimiter` (a European spreadsheet's is `;`): a comma cannot both separate the columns and mark the decimals",
                ))
            }
            Some(",") => b',',
            Some(d) => {
                return Err(config_error(
                    lua,
                    format!("taper.data.csv: option `decimal` must be \".\" or \",\", got {d:?}"),
                ))
            }
        };
        let (label, targets) = self.label_and_targets(lua)?;
        Ok(data::CsvOptions {
            text,
            label,
            targets,
            features: self.features.map(|f| f.into_iter().map(|c| c.0).collect()),
            header: self.header,
            delimiter,
            decimal,
            scale: self.scale,
            split: self.split,
            classes: self.classes,
            label_sep: self.label_sep,
            missing: match self.missing {
                MissingOpt::Error => data::Missing::Error,
                MissingOpt::Drop => data::Missing::Drop,
            },
            categorical: Vec::new(),
        })
    }
}

impl CsvOpts {
    /// The label column, or the target columns (a regression), and
    /// `label_sep` checked against them.
    fn label_and_targets(&mut self, lua: &Lua) -> mlua::Result<(data::Column, Vec<data::Column>)> {
        let (label, targets) = match (self.label.take(), self.target.take()) {
            (Some(_), Some(_)) => {
                return Err(config_error(
                    lua,
                    "taper.data.csv: give `label` (a class column) or `target` (a numeric column to predict), not both",
                ))
            }
            (None, Some(t)) if self.classes.is_some() => {
                let _ = t;
                return Err(config_error(
                    lua,
                    "taper.data.csv: `classes` names a label's classes; a `target` is a number to predict",
                ));
            }
            (None, Some(t)) if t.0.is_empty() => {
                return Err(config_error(
                    lua,
                    "taper.data.csv: `target` names no column: give a column (`target = \"body_mass_g\"`) or a list of them",
                ));
            }
            (None, Some(t)) => (last_column().0, t.0),
            (l, None) => (l.unwrap_or_else(last_column).0, Vec::new()),
        };
        match self.label_sep.as_deref() {
            Some(_) if !targets.is_empty() => {
                return Err(config_error(
                    lua,
                    "taper.data.csv: `label_sep` splits a `label` column's cells into sets of labels; `target` columns are 0/1 (or numbers) already",
                ))
            }
            Some("") => {
                return Err(config_error(
                    lua,
                    "taper.data.csv: `label_sep` is what a cell's labels are split at (\"|\", \",\", \" \"), not an empty string",
                ))
            }
            _ => {}
        }
        Ok((label, targets))
    }

    /// `text = COLUMN, tokenizer = FILE, context = 128`, checked against
    /// the other options.
    fn text_options(&mut self, lua: &Lua) -> mlua::Result<Option<data::TextOptions>> {
        let what = "taper.data.csv";
        let Some(columns) = self.text.take() else {
            if self.tokenizer.is_some() || self.context.is_some() {
                return Err(config_error(
                    lua,
                    format!("{what}: `tokenizer` and `context` are for a column of text: name it with `text = \"...\"`"),
                ));
            }
            return Ok(None);
        };
        let Some(tokenizer) = self.tokenizer.take() else {
            return Err(config_error(
                lua,
                format!(
                    "{what}: a column of `text` needs the model's `tokenizer` (a tokenizer.json)"
                ),
            ));
        };
        if self.features.is_some() {
            return Err(config_error(
                lua,
                format!("{what}: `text` is the input; give `features` (number columns) or `text`, not both"),
            ));
        }
        let context = match self.context {
            Some(0) => {
                return Err(config_error(
                    lua,
                    format!("{what}: `context` must be at least 1"),
                ))
            }
            c => c.unwrap_or(128),
        };
        if !(1..=2).contains(&columns.0.len()) {
            return Err(config_error(
                lua,
                format!(
                    "{what}: `text` is one column, or two for text pairs (`{{ \"premise\", \"hypothesis\" }}`), not {}",
                    columns.0.len()
                ),
            ));
        }
        Ok(Some(data::TextOptions {
            columns: columns.0,
            tokenizer,
            context,
        }))
    }
}

/// `categorical = { "island", sex = { "female", "male" } }`: columns of
/// categories, each an index or a header name; an entry whose value is a
/// list gives its column's categories, its key the column.
fn categorical(lua: &Lua, v: Value) -> mlua::Result<Vec<(data::Column, Option<Vec<String>>)>> {
    let what = "taper.data.csv: `categorical`";
    let t = match v {
        Value::Nil => return Ok(Vec::new()),
        Value::Table(t) => t,
        other => {
            return Err(config_error(
                lua,
                format!(
                    "{what} is a table of columns (`{{ \"island\", \"sex\" }}`), got {}",
                    super::options::a_type(&other)
                ),
            ))
        }
    };
    let column = |v: &Value| -> Option<data::Column> {
        match v {
            Value::String(s) => Some(data::Column::Name(s.to_str().ok()?.to_string())),
            Value::Integer(i) => Some(data::Column::Index(*i)),
            Value::Number(n) if n.fract() == 0.0 && n.abs() < 1e15 => {
                Some(data::Column::Index(*n as i64))
            }
            _ => None,
        }
    };
    let mut out = Vec::new();
    for pair in t.pairs::<Value, Value>() {
        let (k, v) = pair?;
        let entry = match &v {
            Value::Table(list) => {
                let names = category_list(lua, list)?;
                column(&k).map(|c| (c, Some(names)))
            }
            _ => column(&v).map(|c| (c, None)),
        };
        out.push(entry.ok_or_else(|| {
            config_error(
                lua,
                format!(
                    "{what}: an entry is a column (an index or a header name) or, under the column's name, a list of its categories; got {}",
                    super::options::a_type(&v)
                ),
            )
        })?);
    }
    // Pairs come in no set order: the file's column order decides the
    // encoding, and this only the order of messages.
    out.sort_by_key(|(c, _)| format!("{c:?}"));
    Ok(out)
}

/// A column's given categories: strings, or numbers written as Lua
/// writes them (`2007`), as a cell holds them.
fn category_list(lua: &Lua, list: &Table) -> mlua::Result<Vec<String>> {
    let mut names = Vec::new();
    for c in list.sequence_values::<Value>() {
        names.push(match c? {
            Value::String(s) => s.to_str()?.to_string(),
            Value::Integer(i) => i.to_string(),
            Value::Number(n) => lua
                .coerce_string(Value::Number(n))?
                .map_or_else(|| n.to_string(), |s| s.to_string_lossy()),
            other => {
                return Err(config_error(
                    lua,
                    format!(
                        "taper.data.csv: `categorical`: a category is a string or a number, got {}",
                        super::options::a_type(&other)
                    ),
                ))
            }
        });
    }
    Ok(names)
}

fn last_column() -> ColumnOpt {
    ColumnOpt(data::Column::Index(-1))
}
fn one() -> f32 {
    1.0
}
fn all() -> String {
    "all".into()
}

pub(super) fn register(lua: &Lua, t: &Table) -> mlua::Result<()> {
    t.set(
        "csv",
        lua.create_function(|lua, opts: Value| table(lua, "taper.data.csv", opts))?,
    )?;
    t.set(
        "parquet",
        lua.create_function(|lua, opts: Value| table(lua, "taper.data.parquet", opts))?,
    )?;
    t.set(
        "json",
        lua.create_function(|lua, opts: Value| table(lua, "taper.data.json", opts))?,
    )?;
    Ok(())
}

/// `taper.data.csv{...}`, `taper.data.parquet{...}` or `taper.data.json{...}`
/// (`what`): the same options, but a Parquet or JSON file's columns have
/// names, so it takes no `header`, `delimiter` or `decimal`.
/// `taper.data.csv` reads those files too (by their extension), so that a
/// recipe written for CSV files takes one; `taper.data.parquet` and
/// `taper.data.json` read only their own.
fn table(lua: &Lua, what: &str, opts: Value) -> mlua::Result<super::data::DataHandle> {
    let raw = match &opts {
        Value::Table(t) => t.raw_get::<Value>("categorical")?,
        _ => Value::Nil,
    };
    let o: CsvOpts = decode_mixed(lua, what, opts, &["categorical"])?;
    check_scale(lua, what, o.scale)?;
    let path = o.path.clone();
    let csv_only = o.header.is_some() || o.delimiter.is_some() || o.decimal.is_some();
    let mut options = o.options(lua)?;
    options.categorical = categorical(lua, raw)?;
    if options.text.is_some() && !options.categorical.is_empty() {
        return Err(config_error(
            lua,
            format!("{what}: `text` is the input; give `categorical` (feature columns) or `text`, not both"),
        ));
    }
    let given = path.given();
    let paths = table_files::expand(lua, what, &path)?;
    table_files::check_kinds(lua, what, &paths)?;
    let named = paths.iter().find_map(|p| table_files::kind(p));
    if let Some(kind) = named.filter(|_| csv_only) {
        return Err(config_error(
            lua,
            format!("{what}: {}: a {kind} file's columns have names and types: it takes no `header`, `delimiter` or `decimal`", given.display()),
        ));
    }
    if let Some(t) = &options.text {
        check_files(lua, what, &[&t.tokenizer])?;
    }
    let table = data::csv_files(&given, &paths, &options).map_err(|e| at_caller(lua, what, e))?;
    let files = table.files();
    if let Some(first) = table.dropped().first() {
        super::state(lua).out.line(&format!(
            "{what}: {}: {} of {} rows have a missing value and are left out (the first on {})",
            files.describe_table(false),
            table.dropped().len(),
            table.dropped().len() + table.len(),
            files.describe(first),
        ));
    }
    if let Some(first) = table.cut().first() {
        super::state(lua).out.line(&format!(
            "{what}: {}: {} of {} texts are longer than `context` ids and are cut there (the first on {})",
            files.describe_table(false),
            table.cut().len(),
            table.len(),
            files.describe(first),
        ));
    }
    Ok(source(table))
}
