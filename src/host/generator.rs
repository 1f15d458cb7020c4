//! `taper.data.generator(fn)`: batches produced by Lua. `fn(epoch)` returns an
//! iterator (a function, e.g. `coroutine.wrap(...)`) whose calls return one
//! batch table each, then nil:
//!
//! ```lua
//! { x = { {0.1, 0.2}, {0.3, 0.4} }, y = { 1, 0 } }          -- features, labels
//! { x = { {5, 9, 2} }, y = { {9, 2, 7} }, x_type = "u32" }   -- token ids
//! ```
//!
//! Every number crosses from Lua to Rust, so produce whole batches (not one
//! sample per call), and prefer native sources for large data.

use candle_core::DType;
use mlua::{Function, Lua, MetaMethod, Table, UserData, UserDataFields, UserDataMethods, Value};

use super::batch_tables::{batch_from_table, tensor_to_lua};
use super::options::defined_at;
use crate::data::{Batch, Epoch, Pipeline};
use crate::error::lua_err;
use crate::{Error, Result};

#[derive(Clone)]
pub struct GeneratorHandle {
    kind: Kind,
    place: String,
    split: String,
}

#[derive(Clone)]
enum Kind {
    /// `fn(epoch)` returns an iterator of batch tables.
    Generator(Function),
    /// Native batches passed through `fn(x, y)`, which returns a batch table.
    Map(Pipeline, Function),
}

/// `data:map(fn)`: each batch of `data` goes through `fn(x, y)` (nested
/// tables) on the main thread; `fn` returns a batch table.
pub(crate) fn map_pipeline(p: Pipeline, f: Function) -> GeneratorHandle {
    GeneratorHandle {
        place: defined_at(&f),
        split: p.split_name().to_string(),
        kind: Kind::Map(p, f),
    }
}

impl UserData for GeneratorHandle {
    fn add_fields<F: UserDataFields<Self>>(f: &mut F) {
        f.add_field_method_get("split_name", |_, this| Ok(this.split.clone()));
    }
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        super::members::unknown_is_an_error(m, "Generator");
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(match &this.kind {
                Kind::Generator(_) => format!("taper.data(generator at {})", this.place),
                Kind::Map(p, _) => format!("taper.data({} mapped by {})", p.describe(), this.place),
            })
        });
        // Iterates the batches of an epoch without a run, as native data's
        // `data:batches([epoch])` does (for looking at data).
        m.add_method("batches", |lua, this, epoch: Option<u64>| {
            let epoch = epoch.unwrap_or(1).max(1);
            let feed = Feed::Lua(this.clone());
            let batches = feed.epoch(lua, epoch, TRAIN_BATCH, 0, 0).map_err(lua_err)?;
            super::batch::iterator(lua, batches)
        });
    }
}

pub(crate) fn new_generator(
    lua: &Lua,
    (f, opts): (Function, Option<Table>),
) -> mlua::Result<GeneratorHandle> {
    let place = defined_at(&f);
    let mut split = "train".to_string();
    if let Some(o) = opts {
        super::options::check_keys(lua, "taper.data.generator", &o, &["split"])?;
        if let Some(s) = o.get::<Option<String>>("split")? {
            split = s;
        }
    }
    Ok(GeneratorHandle {
        kind: Kind::Generator(f),
        place,
        split,
    })
}

/// Batch size for training data without `:batch(n)`.
pub(crate) const TRAIN_BATCH: usize = 32;

/// Training or evaluation data: a native pipeline or a Lua generator.
#[derive(Clone)]
pub(crate) enum Feed {
    Pipeline(Pipeline),
    Lua(GeneratorHandle),
}

impl Feed {
    /// The data, as an error names it: the source, or the generator's place.
    pub fn describe(&self) -> String {
        match self {
            Feed::Pipeline(p) => p.source().describe(),
            Feed::Lua(g) => format!("the generator at {}", g.place),
        }
    }

    pub fn split_name(&self) -> String {
        match self {
            Feed::Pipeline(p) => p.split_name().to_string(),
            Feed::Lua(g) => g.split.clone(),
        }
    }

    /// The batches of `epoch`, resuming after `skip` batches (generators) or
    /// `skip_samples` samples (native data).
    pub fn epoch(
        &self,
        lua: &Lua,
        epoch: u64,
        default_batch: usize,
        skip: usize,
        skip_samples: usize,
    ) -> Result<FeedEpoch> {
        match self {
            Feed::Pipeline(p) => Ok(FeedEpoch::Native(p.epoch(
                epoch,
                default_batch,
                skip_samples,
            ))),
            Feed::Lua(g) => {
                let source = match &g.kind {
                    Kind::Generator(f) => match f.call::<Value>(epoch)? {
                        Value::Function(iter) => LuaSource::Iter(iter),
                        other => {
                            return Err(Error::Config(format!(
                                "taper.data.generator: the function at {} returned {} for epoch {epoch}; it returns an iterator (a function, or coroutine.wrap(...)) whose calls give one batch each, then nil",
                                g.place,
                                super::options::a_type(&other)
                            )))
                        }
                    },
                    Kind::Map(p, f) => LuaSource::Map(
                        Box::new(p.epoch(epoch, default_batch, 0)),
                        f.clone(),
                        lua.clone(),
                    ),
                };
                let mut e = LuaEpoch {
                    source,
                    place: g.place.clone(),
                    done: false,
                    y_dtype: DType::U32,
                };
                for _ in 0..skip {
                    if e.next().transpose()?.is_none() {
                        break;
                    }
                }
                Ok(FeedEpoch::Lua(e))
            }
        }
    }
}

pub(crate) enum FeedEpoch {
    Native(Epoch),
    Lua(LuaEpoch),
}

impl FeedEpoch {
    /// Batches left, when known.
    pub fn remaining(&self) -> Option<usize> {
        match self {
            FeedEpoch::Native(e) => Some(e.remaining()),
            FeedEpoch::Lua(_) => None,
        }
    }
    /// The next batch with `n` samples (a batch-size schedule).
    pub fn next_sized(&mut self, n: usize) -> Option<Result<Batch>> {
        match self {
            FeedEpoch::Native(e) => e.next_sized(n),
            FeedEpoch::Lua(_) => Some(Err(Error::Config(
                "a schedule asked for a batch size, but generators make their own batches: \
                 use native data (taper.data.*) with a batch-size schedule"
                    .into(),
            ))),
        }
    }

    pub fn wait(&self) -> std::time::Duration {
        match self {
            FeedEpoch::Native(e) => e.wait(),
            FeedEpoch::Lua(_) => std::time::Duration::ZERO,
        }
    }
}

impl Iterator for FeedEpoch {
    type Item = Result<Batch>;
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            FeedEpoch::Native(e) => e.next(),
            FeedEpoch::Lua(e) => e.next(),
        }
    }
}

enum LuaSource {
    Iter(Function),
    Map(Box<Epoch>, Function, Lua),
}

pub(crate) struct LuaEpoch {
    source: LuaSource,
    place: String,
    done: bool,
    /// `y`'s type when a batch table does not say (`y_type`): labels, or
    /// what the native batch a `map` function was given had.
    y_dtype: DType,
}

impl LuaEpoch {
    /// The next batch table (or nil) from the Lua side.
    fn next_value(&mut self) -> Result<Value> {
        match &mut self.source {
            LuaSource::Iter(f) => Ok(f.call(())?),
            LuaSource::Map(epoch, f, lua) => match epoch.next() {
                None => Ok(Value::Nil),
                Some(b) => {
                    let b = b?;
                    self.y_dtype = b.y.dtype();
                    let (x, y) = (tensor_to_lua(lua, &b.x)?, tensor_to_lua(lua, &b.y)?);
                    Ok(f.call((x, y))?)
                }
            },
        }
    }
}

impl Iterator for LuaEpoch {
    type Item = Result<Batch>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let v = match self.next_value() {
            Ok(v) => v,
            Err(e) => return Some(Err(e)),
        };
        match v {
            Value::Nil => {
                self.done = true;
                None
            }
            Value::Table(t) => Some(
                batch_from_table(&t, self.y_dtype)
                    .map_err(|e| Error::Data(format!("generator at {}: {e}", self.place))),
            ),
            other => Some(Err(Error::Data(format!(
                "generator at {}: expected a batch table or nil, got {}",
                self.place,
                super::options::a_type(&other)
            )))),
        }
    }
}
