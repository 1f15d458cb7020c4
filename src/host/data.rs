//! `taper.data`: built-in sources and the pipeline combinators, as handles.

use std::sync::Arc;

use mlua::{Lua, MetaMethod, Table, UserData, UserDataFields, UserDataMethods, Value};
use serde::Deserialize;

use super::generator::{Feed, GeneratorHandle};
use super::options::{config_error, decode};
use super::state;
use crate::data::{self, Pipeline, Source};
use crate::error::lua_err;

#[derive(Clone)]
pub struct DataHandle(pub Pipeline);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShuffleOpts {
    /// 0 when not given (mixed with `--seed`, as every seed is).
    #[serde(default)]
    seed: u64,
    /// Batches of samples of like lengths (transformers' `group_by_length`).
    #[serde(default)]
    group_by_length: bool,
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
        f.add_field_method_get("split_name", |_, this| Ok(this.0.split_name().to_string()));
    }

    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        super::members::unknown_is_an_error(m, "Data");
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(format!("taper.data({})", this.0.describe()))
        });
        m.add_meta_method(MetaMethod::Len, |_, this, ()| Ok(this.0.len()));
        m.add_method("len", |_, this, ()| Ok(this.0.len()));
        m.add_method("num_batches", |_, this, ()| {
            Ok(this.0.batches_per_epoch(super::generator::TRAIN_BATCH))
        });
        m.add_method("shuffle", |lua, this, opts: Value| {
            let o: ShuffleOpts = decode(lua, "data:shuffle", opts)?;
            let seed = o.seed ^ state(lua).opts.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let p = this.0.clone();
            Ok(DataHandle(match o.group_by_length {
                true => p
                    .shuffle_by_length(seed)
                    .map_err(|e| config_error(lua, format!("data:shuffle: {e}")))?,
                false => p.shuffle(seed),
            }))
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
                            "data:batch: expected a positive integer or {{size = n}}, got {}",
                            super::options::brief(&other)
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
        m.add_method("skip", |lua, this, n: i64| {
            if n < 0 {
                return Err(config_error(lua, "data:skip: n must not be negative"));
            }
            Ok(DataHandle(this.0.clone().skip(n as usize)))
        });
        // data:split{ 0.8, 0.2 } (contiguous) or data:split{ 0.8, 0.2, seed = 1 }.
        m.add_method("split", |lua, this, spec: Table| {
            let mut parts = Vec::new();
            let mut seed = None;
            for pair in spec.pairs::<Value, Value>() {
                match pair? {
                    (Value::Integer(_), Value::Number(p)) => parts.push(p),
                    (Value::Integer(_), Value::Integer(p)) => parts.push(p as f64),
                    (Value::String(k), Value::Integer(s)) if k.to_str()? == "seed" && s >= 0 => {
                        seed = Some(s as u64)
                    }
                    (k, v) => {
                        return Err(config_error(
                            lua,
                            format!(
                                "data:split: expected {{p1, p2, ..., seed = n}}, got {k:?} = {v:?}"
                            ),
                        ))
                    }
                }
            }
            let seed = seed.map(|s| s ^ state(lua).opts.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let parts = this
                .0
                .split(&parts, seed)
                .map_err(|e| config_error(lua, e))?;
            Ok(mlua::MultiValue::from_iter(
                parts
                    .into_iter()
                    .map(|p| lua.create_userdata(DataHandle(p)).map(Value::UserData))
                    .collect::<mlua::Result<Vec<_>>>()?,
            ))
        });
        m.add_method("map", |lua, this, f: Value| match f {
            Value::Function(f) => Ok(Value::UserData(
                lua.create_userdata(super::generator::map_pipeline(this.0.clone(), f))?,
            )),
            v => match super::plugin::of(&v) {
                Some(p) => {
                    p.lib
                        .require(taper_plugin::KIND_TRANSFORM)
                        .map_err(|e| config_error(lua, format!("data:map: {e}")))?;
                    let t: Arc<dyn crate::data::Transform> = p;
                    Ok(Value::UserData(lua.create_userdata(DataHandle(
                        this.0.clone().transform(t),
                    ))?))
                }
                None => Err(config_error(
                    lua,
                    format!(
                        "data:map: expected a function(x, y) or a transform plugin, got {}",
                        super::options::a_type(&v)
                    ),
                )),
            },
        });
        // data:standardize(); test:standardize(train); data:standardize{ mean = ..., std = ... }.
        m.add_method("standardize", |lua, this, from: Value| {
            let like;
            let from = match &from {
                Value::Nil => crate::data::Stats::Own,
                Value::UserData(ud) if ud.is::<DataHandle>() => {
                    like = ud.borrow::<DataHandle>()?.0.clone();
                    crate::data::Stats::Like(&like)
                }
                // `{ target = false }`: this data's statistics, the
                // features alone (a multi-label classifier's 0/1 targets).
                Value::Table(t) if t.contains_key("target")? => {
                    super::options::check_keys(lua, "data:standardize", t, &["target"])?;
                    match t.get::<Value>("target")? {
                        Value::Boolean(false) => crate::data::Stats::OwnFeatures,
                        Value::Boolean(true) => crate::data::Stats::Own,
                        v => {
                            return Err(config_error(
                                lua,
                                format!(
                                    "data:standardize: `target` is true or false, got {}",
                                    super::options::a_type(&v)
                                ),
                            ))
                        }
                    }
                }
                Value::Table(_) => {
                    let m: crate::data::Moments = super::options::decode(lua, "data:standardize", from.clone())?;
                    crate::data::Stats::Given(m)
                }
                v => {
                    return Err(config_error(
                        lua,
                        format!(
                            "data:standardize: expected nothing, the data whose statistics to use (`test:standardize(train)`) or {{ mean = ..., std = ... }}, got {}",
                            super::options::a_type(v)
                        ),
                    ))
                }
            };
            // A signal stops the reading between chunks, as a stop.
            let p = this
                .0
                .clone()
                .standardize_with(from, &mut crate::run::interrupt::check)
                .map_err(|e| match e.interrupted() {
                    Some(_) => lua_err(e),
                    None => config_error(lua, format!("data:{e}")),
                })?;
            Ok(DataHandle(p))
        });
        m.add_method("named", |_, this, name: String| {
            Ok(DataHandle(this.0.clone().named(&name)))
        });
        m.add_method("prefetch", |lua, this, depth: i64| {
            if depth < 0 {
                return Err(config_error(
                    lua,
                    "data:prefetch: depth must not be negative",
                ));
            }
            Ok(DataHandle(this.0.clone().prefetch(depth as usize)))
        });
        // Iterates the batches of an epoch without a run (for looking at data).
        m.add_method("batches", |lua, this, epoch: Option<u64>| {
            let epoch = epoch.unwrap_or(1).max(1);
            super::batch::iterator(lua, this.0.epoch(epoch, super::generator::TRAIN_BATCH, 0))
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
        // Class names, label 0 first (an image folder's), or a column of
        // label sets' labels in order; nil when unknown.
        m.add_method("classes", |_, this, ()| {
            let source = this.0.source();
            Ok(source
                .classes()
                .map(<[String]>::to_vec)
                .or_else(|| source.table_input().and_then(|t| t.label_names())))
        });
        // A CSV file's model inputs by name, one per category for a column
        // of categories (`sex_female`); nil for other data.
        m.add_method("feature_names", |_, this, ()| {
            Ok(this.0.source().table_input().map(|t| t.input_names()))
        });
        // A CSV file's columns of categories and theirs, as another file's
        // `categorical` option takes them; nil when it has none.
        m.add_method("categories", |lua, this, ()| {
            let Some(t) = this.0.source().table_input() else {
                return Ok(Value::Nil);
            };
            if t.categories.is_empty() {
                return Ok(Value::Nil);
            }
            let out = lua.create_table()?;
            for (p, column) in t.columns.iter().enumerate() {
                if let Some(cats) = t.categories_of(p) {
                    match column {
                        crate::data::Column::Name(n) => out.set(n.as_str(), cats.to_vec())?,
                        crate::data::Column::Index(i) => out.set(*i, cats.to_vec())?,
                    }
                }
            }
            Ok(Value::Table(out))
        });
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
    /// A `tokenizer.json`: tokens instead of characters.
    tokenizer: Option<std::path::PathBuf>,
}

/// The data in a Lua value: a pipeline (`taper.data.*`) or a generator.
pub(crate) fn feed_of(lua: &Lua, what: &str, v: &Value) -> mlua::Result<Option<Feed>> {
    match v {
        Value::Nil => Ok(None),
        Value::UserData(ud) if ud.is::<DataHandle>() => {
            Ok(Some(Feed::Pipeline(ud.borrow::<DataHandle>()?.0.clone())))
        }
        Value::UserData(ud) if ud.is::<GeneratorHandle>() => {
            Ok(Some(Feed::Lua(ud.borrow::<GeneratorHandle>()?.clone())))
        }
        other => Err(config_error(
            lua,
            format!(
                "{what}: expected data (taper.data.*), got {}",
                super::options::a_type(other)
            ),
        )),
    }
}

pub(super) fn train() -> String {
    "train".into()
}
pub(super) fn context() -> usize {
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
            const WHAT: &str = "taper.data.shakespeare";
            let o: TextOpts = decode(lua, WHAT, opts)?;
            if let Some(t) = &o.tokenizer {
                super::data_files::check_files(lua, WHAT, &[t])?;
            }
            let src = match &o.tokenizer {
                Some(t) => data::shakespeare_tokens(&o.split, o.context, o.stride, t),
                None => data::shakespeare(&o.split, o.context, o.stride),
            }
            .map_err(|e| super::options::at_caller(lua, WHAT, e))?;
            if let Some(v) = crate::data::Source::vocab(&src) {
                for n in v.notes() {
                    super::state(lua).out.warn(n);
                }
            }
            Ok(DataHandle(Pipeline::new(Arc::new(src))))
        })?,
    )?;
    t.set(
        "generator",
        lua.create_function(super::generator::new_generator)?,
    )?;
    taper.set("data", t)
}
