//! `taper.data.csv{...}`'s columns as a recipe gives them: one column (an
//! index, 0 the first and -1 the last, or a header name), or a list of them.

use serde::Deserialize;

use crate::data;

/// A CSV column: an index (0 the first, -1 the last) or a header name.
pub(super) struct ColumnOpt(pub(super) data::Column);

/// Reads a column: an index or a name.
struct ColumnVisitor;

impl serde::de::Visitor<'_> for ColumnVisitor {
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

impl<'de> Deserialize<'de> for ColumnOpt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ColumnVisitor)
    }
}

/// `target`: a column, or a list of columns (`{ "body_mass_g",
/// "flipper_length_mm" }`), each an index or a name.
pub(super) struct ColumnsOpt(pub(super) Vec<data::Column>);

impl<'de> Deserialize<'de> for ColumnsOpt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ColumnsOpt;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a column (an index, 0 the first and -1 the last, or a name), or a list of columns")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ColumnsOpt, E> {
                Ok(ColumnsOpt(vec![ColumnVisitor.visit_i64(v)?.0]))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ColumnsOpt, E> {
                Ok(ColumnsOpt(vec![ColumnVisitor.visit_u64(v)?.0]))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<ColumnsOpt, E> {
                Ok(ColumnsOpt(vec![ColumnVisitor.visit_f64(v)?.0]))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ColumnsOpt, E> {
                Ok(ColumnsOpt(vec![ColumnVisitor.visit_str(v)?.0]))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<ColumnsOpt, A::Error> {
                let mut out = Vec::new();
                while let Some(c) = seq.next_element::<ColumnOpt>()? {
                    out.push(c.0);
                }
                Ok(ColumnsOpt(out))
            }
            // An empty Lua table reads as an empty map.
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ColumnsOpt, A::Error> {
                match map.next_key::<serde::de::IgnoredAny>()? {
                    None => Ok(ColumnsOpt(Vec::new())),
                    Some(_) => Err(serde::de::Error::invalid_type(
                        serde::de::Unexpected::Map,
                        &self,
                    )),
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}
