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

use candle_core::{DType, Device, Tensor};
use mlua::{Function, Lua, MetaMethod, Table, UserData, UserDataFields, UserDataMethods, Value};

use super::options::defined_at;
use crate::data::{Batch, Epoch, Pipeline};
use crate::engine::loss::IGNORE;
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

/// A tensor as nested Lua tables (integers for integer dtypes).
fn tensor_to_lua(lua: &Lua, t: &Tensor) -> Result<Value> {
    let dims = t.dims().to_vec();
    let ints = !t.dtype().is_float();
    let flat: Vec<f64> = t.flatten_all()?.to_dtype(DType::F64)?.to_vec1()?;
    fn build(lua: &Lua, flat: &[f64], dims: &[usize], ints: bool) -> mlua::Result<Value> {
        if dims.is_empty() {
            return Ok(if ints && flat[0] == IGNORE as f64 {
                Value::Integer(IGNORED_IN_LUA as i64)
            } else if ints {
                Value::Integer(flat[0] as i64)
            } else {
                Value::Number(flat[0])
            });
        }
        let t = lua.create_table_with_capacity(dims[0], 0)?;
        let stride: usize = dims[1..].iter().product();
        for i in 0..dims[0] {
            t.raw_push(build(
                lua,
                &flat[i * stride..(i + 1) * stride],
                &dims[1..],
                ints,
            )?)?;
        }
        Ok(Value::Table(t))
    }
    Ok(build(lua, &flat, &dims, ints)?)
}

/// How Lua writes a sequence position the loss leaves out ([`IGNORE`]).
const IGNORED_IN_LUA: f64 = -100.0;

fn batch_from_table(t: &Table, y_default: DType) -> std::result::Result<Batch, String> {
    for pair in t.pairs::<Value, Value>() {
        let (k, _) = pair.map_err(|e| e.to_string())?;
        let key = k.to_string().unwrap_or_default();
        if !["x", "y", "x_type", "y_type"].contains(&key.as_str()) {
            return Err(format!(
                "unknown batch key `{key}` (expected x, y, x_type, y_type)"
            ));
        }
    }
    let x_type: Option<String> = t.get("x_type").map_err(|e| e.to_string())?;
    let x_dtype = match x_type.as_deref() {
        None | Some("f32") => DType::F32,
        Some("u32") => DType::U32,
        Some(other) => return Err(format!("x_type `{other}`: use f32 or u32")),
    };
    let x = to_tensor(
        &t.get::<Value>("x").map_err(|e| e.to_string())?,
        x_dtype,
        "x",
    )?;
    // Class labels or token ids; or numbers to predict (a regression,
    // `taper.loss.mse{}`): one per sample is `[n, 1]`, as a model's one output.
    let y_type: Option<String> = t.get("y_type").map_err(|e| e.to_string())?;
    let y_dtype = match y_type.as_deref() {
        None => y_default,
        Some("u32") => DType::U32,
        Some("f32") => DType::F32,
        Some(other) => return Err(format!("y_type `{other}`: use u32 or f32")),
    };
    let mut y = to_tensor(
        &t.get::<Value>("y").map_err(|e| e.to_string())?,
        y_dtype,
        "y",
    )?;
    if y_dtype == DType::F32 {
        let values: Vec<f32> = y
            .flatten_all()
            .and_then(|v| v.to_vec1())
            .map_err(|e| e.to_string())?;
        if let Some(p) = values.iter().position(|v| !v.is_finite()) {
            let per = values.len() / y.dims()[0];
            return Err(format!(
                "y: {} (sample {}) is not a finite number: training on it would spoil the weights",
                values[p],
                p / per.max(1)
            ));
        }
        if y.rank() == 1 {
            y = y.unsqueeze(1).map_err(|e| e.to_string())?;
        }
    }
    let n = x.dim(0).map_err(|e| e.to_string())?;
    if y.dim(0).map_err(|e| e.to_string())? != n {
        return Err(format!("x has {n} samples, y has {}", y.dims()[0]));
    }
    Ok(Batch {
        x,
        y,
        indices: (0..n).collect(),
    })
}

/// A nested table of numbers to a tensor; every row must have the same shape.
fn to_tensor(v: &Value, dtype: DType, name: &str) -> std::result::Result<Tensor, String> {
    let mut shape = Vec::new();
    let mut probe = v.clone();
    while let Value::Table(t) = probe {
        let n = t.raw_len();
        if n == 0 {
            return Err(format!("{name}: empty table"));
        }
        shape.push(n);
        probe = t.raw_get(1).map_err(|e| e.to_string())?;
    }
    if shape.is_empty() {
        return Err(format!("{name}: expected a table of numbers"));
    }
    let mut flat = Vec::with_capacity(shape.iter().product());
    flatten(v, &shape, 0, name, &mut flat)?;
    // A sequence's labels may be -100, PyTorch's `ignore_index`: a position
    // the loss leaves out (a prompt's, padding's).
    let ignores = dtype == DType::U32 && name == "y" && shape.len() >= 2;
    if ignores {
        for e in flat.iter_mut().filter(|e| **e == IGNORED_IN_LUA) {
            *e = IGNORE as f64;
        }
    }
    // A cast would make -1 a 0 and 2.5 a 2: a wrong label, silently.
    let whole = |e: &f64| *e >= 0.0 && e.fract() == 0.0 && *e < u32::MAX as f64;
    let whole = |e: &f64| whole(e) || (ignores && *e == IGNORE as f64);
    if let (DType::U32, Some(p)) = (dtype, flat.iter().position(|e| !whole(e))) {
        let per = flat.len() / shape[0];
        return Err(format!(
            "{name}: {} (sample {}) is not a class index or token id: those are whole numbers, 0 or more{}",
            flat[p],
            p / per.max(1),
            if ignores {
                " (or -100 where the loss leaves a position out)"
            } else {
                ""
            }
        ));
    }
    let t = Tensor::from_vec(flat, shape, &Device::Cpu).map_err(|e| e.to_string())?;
    t.to_dtype(dtype).map_err(|e| e.to_string())
}

fn flatten(
    v: &Value,
    shape: &[usize],
    depth: usize,
    name: &str,
    out: &mut Vec<f64>,
) -> std::result::Result<(), String> {
    match (v, shape.get(depth)) {
        (Value::Table(t), Some(&n)) => {
            if t.raw_len() != n {
                return Err(format!(
                    "{name}: a row at depth {depth} has {} values, expected {n}",
                    t.raw_len()
                ));
            }
            for i in 1..=n {
                let item: Value = t.raw_get(i).map_err(|e| e.to_string())?;
                flatten(&item, shape, depth + 1, name, out)?;
            }
            Ok(())
        }
        (Value::Integer(i), None) => {
            out.push(*i as f64);
            Ok(())
        }
        (Value::Number(x), None) => {
            out.push(*x);
            Ok(())
        }
        (other, _) => Err(format!(
            "{name}: unexpected {} at depth {depth}",
            other.type_name()
        )),
    }
}
