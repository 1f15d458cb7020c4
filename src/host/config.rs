//! `taper.config{ key = default, ... }`: a recipe's tunables, overridden from
//! the command line with `--set key=value`, typed by the default.

use mlua::{Lua, Table, Value};

use super::options::config_error;
use super::state;

pub(crate) fn register(lua: &Lua, taper: &Table) -> mlua::Result<()> {
    taper.set("config", lua.create_function(config)?)
}

fn config(lua: &Lua, defaults: Table) -> mlua::Result<Table> {
    let host = state(lua);
    // A reloaded version runs its top level again, taper.config{} included:
    // once per version, and the version being tried is the next generation.
    let version = {
        let rl = host.reload.borrow();
        rl.generation + u64::from(rl.trial.is_some())
    };
    if host.config_called.replace(Some(version)) == Some(version) {
        return Err(config_error(lua, "taper.config: call it once per recipe"));
    }
    let out = lua.create_table()?;
    let mut declared = Vec::new();
    for pair in defaults.pairs::<String, Value>() {
        let (k, v) = pair?;
        declared.push(k.clone());
        out.set(k, v)?;
    }
    declared.sort();
    for (key, raw) in &host.opts.overrides {
        let default: Value = defaults.get(key.as_str())?;
        let value = match default {
            Value::Nil => {
                let hint = super::members::did_you_mean(key, &declared)
                    .map_or("the".to_string(), |h| format!("{h} The"));
                return Err(config_error(
                    lua,
                    format!(
                        "--set {key}={raw}: unknown config key `{key}`; {hint} recipe declares: {}",
                        declared.join(", ")
                    ),
                ));
            }
            Value::Integer(_) => raw.parse::<i64>().map(Value::Integer).map_err(|_| {
                config_error(lua, format!("--set {key}={raw}: `{key}` is an integer"))
            })?,
            Value::Number(_) => raw.parse::<f64>().map(Value::Number).map_err(|_| {
                config_error(lua, format!("--set {key}={raw}: `{key}` is a number"))
            })?,
            Value::Boolean(_) => match raw.as_str() {
                "true" => Value::Boolean(true),
                "false" => Value::Boolean(false),
                _ => {
                    return Err(config_error(
                        lua,
                        format!("--set {key}={raw}: `{key}` is a boolean (true or false)"),
                    ))
                }
            },
            Value::String(_) => Value::String(lua.create_string(raw)?),
            other => {
                return Err(config_error(
                    lua,
                    format!(
                        "--set {key}={raw}: `{key}` has a {} default; only numbers, booleans and strings can be set",
                        other.type_name()
                    ),
                ))
            }
        };
        out.set(key.as_str(), value)?;
    }
    let record: serde_json::Value = mlua::LuaSerdeExt::from_value(lua, Value::Table(out.clone()))?;
    let mut fields = record.as_object().cloned().unwrap_or_default();
    if version > 0 {
        // A reloaded version's values, recorded once it is applied.
        fields.insert("generation".into(), version.into());
    }
    let mut rl = host.reload.borrow_mut();
    if rl.trial.is_some() {
        rl.trial_config = Some(fields);
        return Ok(out);
    }
    drop(rl);
    host.out
        .record("config", 0, 0, fields)
        .map_err(crate::error::lua_err)?;
    Ok(out)
}
