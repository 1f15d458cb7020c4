//! Decoding Lua option tables into Rust structs, with errors that name the
//! key and the recipe's file and line.

use std::fmt::Display;

use mlua::{AnyUserData, Lua, Table, UserData, Value};
use serde::de::DeserializeOwned;

use crate::error::lua_err;
use crate::Error;

/// `file:line: ` of the innermost Lua function on the stack, or "": the
/// recipe's (or its module's), passing over taper's own Lua (`taper/...`).
pub(crate) fn location(lua: &Lua) -> String {
    for level in 0..32 {
        let found = lua.inspect_stack(level, |d| {
            let src = d.source();
            if src.what == "C"
                || src
                    .short_src
                    .as_deref()
                    // taper's own Lua, and mlua's (`__mlua_index`, which
                    // calls a handle's `__index` for a member it lacks).
                    .is_some_and(|s| s.starts_with("taper/") || s.starts_with("__mlua"))
            {
                return None;
            }
            let line = d.current_line()?;
            Some(format!(
                "{}:{line}: ",
                src.short_src.as_deref().unwrap_or("?")
            ))
        });
        match found {
            None => break,
            Some(Some(loc)) => return loc,
            Some(None) => continue,
        }
    }
    String::new()
}

/// `file:line` where a Lua function was defined, for errors about it
/// (policies, schedules, generators).
pub(crate) fn defined_at(f: &mlua::Function) -> String {
    let info = f.info();
    format!(
        "{}:{}",
        info.short_src.as_deref().unwrap_or("?"),
        info.line_defined.unwrap_or(0)
    )
}

/// A value's type with its article, as messages name it: `a table`,
/// `an integer`.
pub(crate) fn a_type(v: &Value) -> String {
    with_article(v.type_name())
}

/// A Lua type's name as a message says it: `a table`, `an integer`, `nil`.
pub(crate) fn with_article(t: &str) -> String {
    match t {
        "nil" => "nil".into(),
        t if t.starts_with(['a', 'e', 'i', 'o', 'u']) => format!("an {t}"),
        t => format!("a {t}"),
    }
}

/// A value as an error message names it: `-1`, `"ten"`, `a table`.
pub(crate) fn brief(v: &Value) -> String {
    match v {
        Value::Integer(n) => n.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Boolean(b) => b.to_string(),
        Value::String(s) => format!("{:?}", s.to_string_lossy()),
        v => a_type(v),
    }
}

/// A config error at the caller's location.
pub(crate) fn config_error(lua: &Lua, msg: impl Display) -> mlua::Error {
    lua_err(Error::Config(format!("{}{msg}", location(lua))))
}

/// An error of `what` (a constructor such as `taper.data.csv`) raised while
/// it ran: a config or data error gets the caller's `file:line: what: `.
pub(crate) fn at_caller(lua: &Lua, what: &str, e: Error) -> mlua::Error {
    match e {
        Error::Config(m) => config_error(lua, format!("{what}: {m}")),
        Error::Data(m) => lua_err(Error::Data(format!("{}{what}: {m}", location(lua)))),
        other => lua_err(other),
    }
}

/// Decodes an options table (or nil, meaning all defaults) into `T`.
/// `T` should use `#[serde(deny_unknown_fields)]` so that a typo is an error.
pub(crate) fn decode<T: DeserializeOwned>(lua: &Lua, what: &str, value: Value) -> mlua::Result<T> {
    decode_mixed(lua, what, value, &[])
}

/// [`decode`], where the options named in `mixed` may hold a list with
/// named entries (read from the Lua table by the caller).
pub(crate) fn decode_mixed<T: DeserializeOwned>(
    lua: &Lua,
    what: &str,
    value: Value,
    mixed: &[&str],
) -> mlua::Result<T> {
    let value = match value {
        Value::Nil => Value::Table(lua.create_table()?),
        v => v,
    };
    if let Value::Table(t) = &value {
        if let Some((path, key)) = list_with_names(t, "", mixed, 0)? {
            let place = if path.is_empty() {
                "the options table".to_string()
            } else {
                format!("option `{path}`")
            };
            return Err(config_error(
                lua,
                format!(
                    "{what}: {place} is a list with a named entry (`{key} = ...`), which a list has no place for: close the list's braces before `{key}`"
                ),
            ));
        }
    }
    let de = mlua::serde::Deserializer::new(value);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let inner = inner.trim_start_matches("deserialize error: ");
        // serde's "missing field `outputs`" in the words of taper's own
        // checks ("option `model` is required").
        if let Some(key) = inner
            .strip_prefix("missing field `")
            .and_then(|k| k.strip_suffix('`'))
        {
            let at = if path == "." || path.is_empty() {
                String::new()
            } else {
                format!("{path}.")
            };
            return config_error(lua, format!("{what}: option `{at}{key}` is required"));
        }
        // An unknown key is already named in the message itself.
        if path == "." || path.is_empty() || inner.starts_with("unknown field") {
            config_error(lua, format!("{what}: {inner}"))
        } else {
            config_error(lua, format!("{what}: option `{path}`: {inner}"))
        }
    })
}

/// For options tables holding handles, which serde cannot decode: rejects any
/// key not in `allowed`.
pub(crate) fn check_keys(lua: &Lua, what: &str, t: &Table, allowed: &[&str]) -> mlua::Result<()> {
    for pair in t.pairs::<Value, Value>() {
        let (k, _) = pair?;
        let key = match &k {
            Value::String(s) => s.to_str()?.to_string(),
            other => format!("{other:?}"),
        };
        if !allowed.contains(&key.as_str()) {
            return Err(config_error(
                lua,
                format!(
                    "{what}: unknown option `{key}`, expected one of {}",
                    allowed.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Reads `t[key]` as the userdata `T`, cloned out. `None` when absent.
pub(crate) fn handle<T: UserData + Clone + 'static>(
    lua: &Lua,
    what: &str,
    t: &Table,
    key: &str,
    expected: &str,
) -> mlua::Result<Option<T>> {
    match t.get::<Value>(key)? {
        Value::Nil => Ok(None),
        Value::UserData(ud) => match ud.borrow::<T>() {
            Ok(h) => Ok(Some(h.clone())),
            Err(_) => Err(config_error(
                lua,
                format!(
                    "{what}: option `{key}` must be {expected}, got {}",
                    type_name(&ud)
                ),
            )),
        },
        other => Err(config_error(
            lua,
            format!(
                "{what}: option `{key}` must be {expected}, got {}",
                a_type(&other)
            ),
        )),
    }
}

fn type_name(ud: &AnyUserData) -> String {
    ud.metatable()
        .and_then(|m| m.get::<String>("__name"))
        .unwrap_or_else(|_| "userdata".to_string())
}

/// The first table under `t` (or `t` itself) that holds a list (key 1) and
/// a named key too, which serde would read as the list alone, dropping
/// the name: its path and the name. Options in `mixed` (top level) are
/// read by their callers and not looked into.
fn list_with_names(
    t: &Table,
    path: &str,
    mixed: &[&str],
    depth: usize,
) -> mlua::Result<Option<(String, String)>> {
    if depth > 16 {
        return Ok(None);
    }
    let list = t.raw_len() > 0;
    for pair in t.pairs::<Value, Value>() {
        let (k, v) = pair?;
        let name = match &k {
            Value::String(s) => Some(s.to_str()?.to_string()),
            _ => None,
        };
        if let (true, Some(name)) = (list, &name) {
            return Ok(Some((path.to_string(), name.clone())));
        }
        if let Value::Table(inner) = &v {
            let key = match (&name, &k) {
                (Some(n), _) => n.clone(),
                (None, Value::Integer(i)) => format!("[{i}]"),
                _ => continue,
            };
            if depth == 0 && mixed.contains(&key.as_str()) {
                continue;
            }
            let inner_path = match (path.is_empty(), key.starts_with('[')) {
                (true, _) => key,
                (false, true) => format!("{path}{key}"),
                (false, false) => format!("{path}.{key}"),
            };
            if let Some(found) = list_with_names(inner, &inner_path, mixed, depth + 1)? {
                return Ok(Some(found));
            }
        }
    }
    Ok(None)
}
