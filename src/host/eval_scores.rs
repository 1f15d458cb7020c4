//! A classifier's evaluation class by class, in its `eval` record and in
//! what `run:evaluate` returns: the confusion matrix, each class's
//! precision, recall, F1 and support, the macro F1 and the balanced
//! accuracy, under the class names the run's data gave.

use mlua::{Lua, Table};
use serde_json::{json, Map, Value};

use crate::engine::PerClass;

/// Class `c`'s name: the data's, or its index.
fn name(classes: Option<&[String]>, c: usize) -> String {
    classes
        .and_then(|n| n.get(c))
        .cloned()
        .unwrap_or_else(|| c.to_string())
}

/// Adds `macro_f1`, `balanced_accuracy`, `per_class` (a list of `{class,
/// precision, recall, f1, support}` for the classes that are labels or
/// predictions) and `confusion` (rows: classes, columns: predictions) to an
/// `eval` record.
pub(super) fn record(f: &mut Map<String, Value>, p: &PerClass, classes: Option<&[String]>) {
    f.insert("balanced_accuracy".into(), json!(p.balanced_accuracy()));
    f.insert("macro_f1".into(), json!(p.macro_f1()));
    let rows: Vec<Value> = p
        .scores()
        .iter()
        .map(|s| {
            json!({
                "class": name(classes, s.class),
                "precision": s.precision,
                "recall": s.recall,
                "f1": s.f1,
                "support": s.support,
            })
        })
        .collect();
    f.insert("per_class".into(), Value::Array(rows));
    f.insert("confusion".into(), json!(p.confusion));
}

/// The same in the table `run:evaluate` returns: `balanced_accuracy`,
/// `macro_f1`, `per_class` (keyed by class name, or by label, 0 the first,
/// for data without names) and `confusion` (a list of rows, label 0 first).
pub(super) fn lua_fields(
    lua: &Lua,
    t: &Table,
    p: &PerClass,
    classes: Option<&[String]>,
) -> mlua::Result<()> {
    t.set("balanced_accuracy", p.balanced_accuracy())?;
    t.set("macro_f1", p.macro_f1())?;
    let per = lua.create_table()?;
    for s in p.scores() {
        let row = lua.create_table()?;
        row.set("precision", s.precision)?;
        row.set("recall", s.recall)?;
        row.set("f1", s.f1)?;
        row.set("support", s.support)?;
        match classes.and_then(|n| n.get(s.class)) {
            Some(name) => per.set(name.as_str(), row)?,
            None => per.set(s.class, row)?,
        }
    }
    t.set("per_class", per)?;
    let confusion = lua.create_table()?;
    for row in &p.confusion {
        confusion.push(lua.create_sequence_from(row.iter().copied())?)?;
    }
    t.set("confusion", confusion)
}
