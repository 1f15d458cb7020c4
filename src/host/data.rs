//! `taper.data`: built-in sources and the pipeline combinators, as handles.

use std::sync::Arc;

use mlua::{Lua, MetaMethod, Table, UserData, UserDataFields, UserDataMethods, Value};
use serde::Deserialize;

use super::options::{config_error, decode};
use super::state;
use crate::data::{self, Batch, Pipeline, Source};
use crate::error::lua_err;

#[derive(Clone)]
pub struct DataHandle(pub Pipeline);

#[derive(Clone)]
pub struct BatchHandle(pub Batch);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShuffleOpts {
    seed: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchOpts {
    size: usize,
    #[serde(default)]
    drop_last: bool,
}

fn vocab_of<'a>(lua: &Lua, d: &'a DataHandle, what: &str) -> mlua::Result<&'a data::Vocab> {
    d.0.source().vocab().ok_or_else(|| {
        config_error(
            lua,
            format!("{what}: {} is not a text source", d.0.describe()),
        )
    })
}

impl UserData for DataHandle {
    fn add_fields<F: UserDataFields<Self>>(f: &mut F) {
        f.add_field_method_get("split", |_, this| Ok(this.0.source().split().to_string()));
    }

    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(format!("taper.data({})", this.0.describe()))
        });
        m.add_meta_method(MetaMethod::Len, |_, this, ()| Ok(this.0.len()));
        m.add_method("len", |_, this, ()| Ok(this.0.len()));
        m.add_method("num_batches", |_, this, ()| {
            Ok(this.0.batches_per_epoch(super::run::TRAIN_BATCH))
        });
        m.add_method("shuffle", |lua, this, opts: Value| {
            let o: ShuffleOpts = decode(lua, "data:shuffle", opts)?;
            let seed = o.seed ^ state(lua).opts.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            Ok(DataHandle(this.0.clone().shuffle(seed)))
        });
        m.add_method("batch", |lua, this, opts: Value| {
            let o = match opts {
                Value::Integer(n) if n > 0 => BatchOpts {
                    size: n as usize,
                    drop_last: false,
                },
                v @ Value::Table(_) => decode::<BatchOpts>(lua, "data:batch", v)?,
                other => {
                    return Err(config_error(
                        lua,
                        format!(
                        "data:batch: expected a positive integer or {{size = n}}, got {other:?}"
                    ),
                    ))
                }
            };
            if o.size == 0 {
                return Err(config_error(lua, "data:batch: size must be positive"));
            }
            Ok(DataHandle(this.0.clone().batch(o.size, o.drop_last)))
        });
        m.add_method("take", |lua, this, n: i64| {
            if n < 0 {
                return Err(config_error(lua, "data:take: n must not be negative"));
            }
            Ok(DataHandle(this.0.clone().take(n as usize)))
        });
        m.add_method("vocab_size", |lua, this, ()| {
            Ok(vocab_of(lua, this, "data:vocab_size")?.len())
        });
        m.add_method("encode", |lua, this, text: String| {
            vocab_of(lua, this, "data:encode")?
                .encode(&text)
                .map_err(lua_err)
        });
        m.add_method("decode", |lua, this, ids: Vec<u32>| {
            Ok(vocab_of(lua, this, "data:decode")?.decode(&ids))
        });
    }
}

impl UserData for BatchHandle {
    fn add_fields<F: UserDataFields<Self>>(f: &mut F) {
        f.add_field_method_get("size", |_, this| Ok(this.0.len()));
        f.add_field_method_get("indices", |_, this| Ok(this.0.indices.clone()));
    }
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(format!(
                "taper.batch({} samples, x {:?})",
                this.0.len(),
                this.0.x.dims()
            ))
        });
        m.add_meta_method(MetaMethod::Len, |_, this, ()| Ok(this.0.len()));
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SplitOpts {
    #[serde(default = "train")]
    split: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TextOpts {
    #[serde(default = "train")]
    split: String,
    #[serde(default = "context")]
    context: usize,
    stride: Option<usize>,
}

fn train() -> String {
    "train".into()
}
fn context() -> usize {
    64
}

pub(crate) fn register(lua: &Lua, taper: &Table) -> mlua::Result<()> {
    let t = lua.create_table()?;
    t.set(
        "digits",
        lua.create_function(|lua, opts: Value| {
            let o: SplitOpts = decode(lua, "taper.data.digits", opts)?;
            let src: Arc<dyn Source> =
                Arc::new(data::digits(&o.split).map_err(|e| config_error(lua, e))?);
            Ok(DataHandle(Pipeline::new(src)))
        })?,
    )?;
    t.set(
        "shakespeare",
        lua.create_function(|lua, opts: Value| {
            let o: TextOpts = decode(lua, "taper.data.shakespeare", opts)?;
            let src = data::shakespeare(&o.split, o.context, o.stride)
                .map_err(|e| config_error(lua, e))?;
            Ok(DataHandle(Pipeline::new(Arc::new(src))))
        })?,
    )?;
    taper.set("data", t)
}

impl mlua::FromLua for DataHandle {
    fn from_lua(value: Value, _: &Lua) -> mlua::Result<Self> {
        if let Value::UserData(ud) = &value {
            if let Ok(d) = ud.borrow::<DataHandle>() {
                return Ok(d.clone());
            }
        }
        Err(mlua::Error::FromLuaConversionError {
            from: value.type_name(),
            to: "taper.data".into(),
            message: Some("expected data from taper.data (e.g. taper.data.digits{})".into()),
        })
    }
}
