//! Batches between Lua and Rust: a batch table's `x` and `y` (nested
//! lists of numbers, with `x_type` / `y_type`) as tensors, and tensors back
//! as nested tables, for `taper.data.generator` (`generator.rs`).

use candle_core::{DType, Device, Tensor};
use mlua::{Lua, Table, Value};

use crate::data::Batch;
use crate::engine::loss::IGNORE;
use crate::Result;

/// A tensor as nested Lua tables (integers for integer dtypes).
pub(super) fn tensor_to_lua(lua: &Lua, t: &Tensor) -> Result<Value> {
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

pub(super) fn batch_from_table(t: &Table, y_default: DType) -> std::result::Result<Batch, String> {
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
