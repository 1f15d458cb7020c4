//! A member a handle does not have (`run:evalute(test)`, `batch.sise`) is an
//! error at the recipe's line that names the handle and the closest members
//! it has, instead of a `nil` that fails further on ("attempt to call a nil
//! value") or, read as a field, goes on as `nil`. A recipe learns of its
//! typo where it is, and an evaluation typed wrong at the end of an epoch
//! still stops the run with its checkpoint, as any recipe error does.
//!
//! The members come from the LuaLS annotations (`docs/luals/taper.lua`),
//! which `tests/api_docs.rs` keeps equal to those registered, both ways.

use mlua::{MetaMethod, UserData, UserDataMethods, Value};

use super::options::config_error;

const ANNOTATIONS: &str = include_str!("../../docs/luals/taper.lua");

/// Makes reading a member that `class` (`Run`, `Data`, ...) lacks an error.
pub(crate) fn unknown_is_an_error<T: UserData, M: UserDataMethods<T>>(
    m: &mut M,
    class: &'static str,
) {
    m.add_meta_method(MetaMethod::Index, move |lua, _, key: Value| {
        let key = match &key {
            Value::String(s) => s.to_string_lossy(),
            other => format!("{other:?}"),
        };
        Err::<Value, _>(config_error(lua, unknown(class, &key)))
    });
}

/// "did you mean `evaluate`?" for the names closest to `key` (Jaro-Winkler,
/// as clap suggests: the closest, and any as close), if any is close.
pub(crate) fn did_you_mean(key: &str, names: &[impl AsRef<str>]) -> Option<String> {
    let mut near: Vec<(f64, &str)> = names
        .iter()
        .map(|n| (strsim::jaro_winkler(key, n.as_ref()), n.as_ref()))
        .filter(|(score, _)| *score >= 0.8)
        .collect();
    near.sort_by(|a, b| b.0.total_cmp(&a.0));
    let best = near.first()?.0;
    let near: Vec<String> = near
        .iter()
        .filter(|n| n.0 >= best - 0.05)
        .take(3)
        .map(|n| format!("`{}`", n.1))
        .collect();
    Some(format!("did you mean {}?", near.join(" or ")))
}

/// "a taper run has no `evalute`; did you mean `evaluate`? Its methods and
/// fields: ..."
fn unknown(class: &str, key: &str) -> String {
    let names = members(class);
    let hint = match did_you_mean(key, &names) {
        None => ".".to_string(),
        Some(h) => format!("; {h}"),
    };
    let lower = class.to_lowercase();
    match names.is_empty() {
        true => format!("a taper {lower} has no `{key}`: it has no methods or fields"),
        false => format!(
            "a taper {lower} has no `{key}`{hint} Its methods and fields: {}",
            names.join(", ")
        ),
    }
}

/// The methods and fields annotated for `taper.<class>`, in order.
fn members(class: &str) -> Vec<&'static str> {
    let name = format!("taper.{class}");
    let prefix = format!("function {class}:");
    let mut out = Vec::new();
    let mut in_class = false;
    for line in ANNOTATIONS.lines() {
        if let Some(rest) = line.strip_prefix("---@class ") {
            in_class = rest.split_whitespace().next() == Some(name.as_str());
        } else if let (true, Some(f)) = (in_class, line.strip_prefix("---@field ")) {
            out.push(
                f.split_whitespace()
                    .next()
                    .unwrap_or("")
                    .trim_end_matches('?'),
            );
        } else if !line.starts_with("---") {
            in_class = false;
        }
        if let Some(m) = line.strip_prefix(prefix.as_str()) {
            out.push(m.split('(').next().unwrap_or(""));
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_read_from_the_annotations() {
        let run = members("Run");
        for n in ["epochs", "step", "evaluate", "steps", "state"] {
            assert!(run.contains(&n), "{run:?}");
        }
        assert!(members("Data").contains(&"split_name"));
        assert!(members("Batch").contains(&"size"));
        let e = unknown("Run", "evalute");
        assert!(e.contains("did you mean `evaluate`?"), "{e}");
        let e = unknown("Batch", "zzzz");
        assert!(
            e.starts_with("a taper batch has no `zzzz`. Its methods and fields: size"),
            "{e}"
        );
    }
}
