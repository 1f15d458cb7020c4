//! `taper.loss.cross_entropy{ weight = ... }`: the option as Lua gives it,
//! and its weights by label, resolved when `taper.run` knows the model's
//! classes and the training data.

use mlua::{Lua, Value};

use super::generator::Feed;
use super::options::config_error;
use crate::engine::loss::{ClassWeights, Loss};

const WHAT: &str = "taper.loss.cross_entropy: option `weight`";

/// The options of `taper.loss.cross_entropy` without `weight`, and its
/// class weights.
pub fn take(lua: &Lua, opts: Value) -> mlua::Result<(Value, Option<ClassWeights>)> {
    let Value::Table(t) = opts else {
        return Ok((opts, None));
    };
    let rest = lua.create_table()?;
    let mut weight = Value::Nil;
    for pair in t.pairs::<Value, Value>() {
        let (k, v) = pair?;
        match &k {
            Value::String(s) if s.as_bytes().as_ref() == b"weight" => weight = v,
            _ => rest.raw_set(k, v)?,
        }
    }
    Ok((Value::Table(rest), parse(lua, weight)?))
}

/// The option `weight`: a list of numbers (label 0 first), a table of
/// numbers by class name, or `"balanced"`.
fn parse(lua: &Lua, v: Value) -> mlua::Result<Option<ClassWeights>> {
    let must = "must be a list of numbers (one per class, label 0 first), a table of numbers by class name, or \"balanced\"";
    let number = |v: &Value, at: &str| match v {
        Value::Integer(n) => Ok(*n as f64),
        Value::Number(n) => Ok(*n),
        other => Err(config_error(
            lua,
            format!("{WHAT}: {at} is {}, not a number", other.type_name()),
        )),
    };
    match v {
        Value::Nil => Ok(None),
        Value::String(s) if s.to_str()? == "balanced" => Ok(Some(ClassWeights::Balanced)),
        Value::Table(t) => {
            let (mut by_label, mut by_name) = (Vec::new(), Vec::new());
            for pair in t.pairs::<Value, Value>() {
                let (k, v) = pair?;
                match &k {
                    Value::Integer(i) => by_label.push((*i, number(&v, &format!("[{i}]"))?)),
                    Value::String(s) => {
                        let name = s.to_str()?.to_string();
                        let w = number(&v, &format!("`{name}`"))?;
                        by_name.push((name, w));
                    }
                    _ => return Err(config_error(lua, format!("{WHAT} {must}"))),
                }
            }
            by_label.sort_by_key(|(i, _)| *i);
            let sequence = by_label
                .iter()
                .enumerate()
                .all(|(at, (i, _))| *i == at as i64 + 1);
            match (by_label.is_empty(), by_name.is_empty()) {
                (true, true) => Err(config_error(lua, format!("{WHAT} is empty: it {must}"))),
                (false, true) if sequence => Ok(Some(ClassWeights::Labels(
                    by_label.into_iter().map(|(_, w)| w).collect(),
                ))),
                (true, false) => {
                    by_name.sort_by(|a, b| a.0.cmp(&b.0));
                    Ok(Some(ClassWeights::Names(by_name)))
                }
                _ => Err(config_error(
                    lua,
                    format!("{WHAT} mixes a list and names, or has gaps: it {must}"),
                )),
            }
        }
        other => Err(config_error(
            lua,
            format!("{WHAT} {must}, not {}", describe(&other)),
        )),
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{}\"", s.to_string_lossy()),
        other => other.type_name().to_string(),
    }
}

/// `loss` with its class weights (if it asks for any) resolved against the
/// model's `classes` and the run's training `data`. The error names what is
/// wrong, at the recipe's line.
pub fn resolve(
    lua: &Lua,
    loss: Loss,
    classes: Option<usize>,
    data: Option<&Feed>,
) -> mlua::Result<Loss> {
    let Loss::CrossEntropy(mut c) = loss else {
        return Ok(loss);
    };
    let Some(asked) = c.class_weights.clone() else {
        return Ok(Loss::CrossEntropy(c));
    };
    let err = |why: String| config_error(lua, format!("taper.run: {WHAT}: {why}"));
    let Some(classes) = classes else {
        return Err(err(
            "class weights are for a classifier (a model with `outputs` classes), and this model predicts tokens or numbers".into(),
        ));
    };
    let pipeline = match data {
        Some(Feed::Pipeline(p)) => Some(p),
        _ => None,
    };
    let names = pipeline.and_then(|p| p.source().classes());
    let mut labels = || match pipeline {
        Some(p) => p
            .source()
            .labels(&p.indices(1))
            .map_err(|e| format!("reading the training data's labels: {e}")),
        None => Ok(None),
    };
    c.weights = Some(asked.resolve(classes, names, &mut labels).map_err(err)?);
    Ok(Loss::CrossEntropy(c))
}
