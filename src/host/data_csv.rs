//! `taper.data.csv{...}`: its options (columns by index or name, class
//! names, missing values, the delimiter) as the data module takes them.

use mlua::{Lua, Table, Value};
use serde::Deserialize;

use super::data_files::{check_files, check_scale, source};
use super::options::{at_caller, config_error, decode};
use crate::data::{self, Source};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CsvOpts {
    path: std::path::PathBuf,
    #[serde(default = "last_column")]
    label: ColumnOpt,
    #[serde(default)]
    features: Option<Vec<ColumnOpt>>,
    #[serde(default)]
    header: Option<bool>,
    #[serde(default)]
    delimiter: Option<String>,
    #[serde(default = "one")]
    scale: f32,
    #[serde(default = "all")]
    split: String,
    #[serde(default)]
    classes: Option<Vec<String>>,
    #[serde(default)]
    missing: MissingOpt,
}

/// A CSV column: an index (0 the first, -1 the last) or a header name.
struct ColumnOpt(data::Column);

impl<'de> Deserialize<'de> for ColumnOpt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ColumnOpt;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a column index (0 the first, -1 the last) or a column name")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ColumnOpt, E> {
                Ok(ColumnOpt(data::Column::Index(v)))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ColumnOpt, E> {
                let v = i64::try_from(v).map_err(|_| E::custom("column index too large"))?;
                Ok(ColumnOpt(data::Column::Index(v)))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<ColumnOpt, E> {
                match v.fract() == 0.0 && v.abs() < 1e15 {
                    true => Ok(ColumnOpt(data::Column::Index(v as i64))),
                    false => Err(E::invalid_value(serde::de::Unexpected::Float(v), &self)),
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ColumnOpt, E> {
                Ok(ColumnOpt(data::Column::Name(v.to_string())))
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum MissingOpt {
    #[default]
    Error,
    Drop,
}

impl CsvOpts {
    fn options(self, lua: &Lua) -> mlua::Result<data::CsvOptions> {
        let tsv = {
            let p = self.path.to_string_lossy();
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
        Ok(data::CsvOptions {
            label: self.label.0,
            features: self.features.map(|f| f.into_iter().map(|c| c.0).collect()),
            header: self.header,
            delimiter,
            scale: self.scale,
            split: self.split,
            classes: self.classes,
            missing: match self.missing {
                MissingOpt::Error => data::Missing::Error,
                MissingOpt::Drop => data::Missing::Drop,
            },
        })
    }
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
        lua.create_function(|lua, opts: Value| {
            let o: CsvOpts = decode(lua, "taper.data.csv", opts)?;
            check_scale(lua, "taper.data.csv", o.scale)?;
            check_files(lua, "taper.data.csv", &[&o.path])?;
            let path = o.path.clone();
            let table = data::csv(&path, &o.options(lua)?)
                .map_err(|e| at_caller(lua, "taper.data.csv", e))?;
            if let Some(first) = table.dropped().first() {
                super::state(lua).out.line(&format!(
                    "taper.data.csv: {}: {} of {} rows have a missing value and are left out (the first on line {first})",
                    path.display(),
                    table.dropped().len(),
                    table.dropped().len() + table.len(),
                ));
            }
            Ok(source(table))
        })?,
    )?;
    Ok(())
}
