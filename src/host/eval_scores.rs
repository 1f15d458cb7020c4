//! An evaluation's scores in its `eval` record, its printed line and what
//! `run:evaluate` returns: a classifier's accuracy and, class by class, the
//! confusion matrix, each class's precision, recall, F1 and support, the
//! macro F1 and the balanced accuracy, under the class names the run's data
//! gave; a regression's RMSE, MAE and R², target by target when there are
//! several, under the target columns' names; a multi-label classifier's
//! share of label decisions right, exact matches, micro and macro F1, and
//! each label's precision, recall and F1, under its column's name.

use mlua::{Lua, Table};
use serde_json::{json, Map, Value};

use crate::data::TableInput;
use crate::engine::{Eval, PerClass, Regression};

/// The name of each of a regression's (or multi-label classifier's) `k`
/// targets: the CSV file's target columns (`body_mass_g`, or `column 3`
/// without a header), else `target[0]`, `target[1]`, ... (the targets
/// tensor's columns).
pub(super) fn target_names(table: Option<&TableInput>, k: usize) -> Vec<String> {
    match table {
        Some(t) if t.targets.len() == k => t.targets.iter().map(|c| c.name()).collect(),
        _ => (0..k).map(|i| format!("target[{i}]")).collect(),
    }
}

/// Adds the scores to an `eval` record: a classifier's `accuracy` (and,
/// with a confusion matrix, [`record`]'s fields); a regression's `rmse`,
/// `mae` and `r2` (means over its targets) and, with several targets,
/// `per_target`, a list of `{target, rmse, mae, r2}`.
pub(super) fn record_scores(
    f: &mut Map<String, Value>,
    ev: &Eval,
    classes: Option<&[String]>,
    targets: &[String],
) {
    let Some(g) = &ev.regression else {
        f.insert("accuracy".into(), json!(ev.accuracy));
        if let Some(p) = &ev.per_class {
            record(f, p, classes);
        }
        if let Some(m) = &ev.multi_label {
            f.insert("exact_match".into(), json!(m.exact_match));
            f.insert("f1_micro".into(), json!(m.f1_micro));
            f.insert("f1_macro".into(), json!(m.f1_macro));
            let rows = m.labels.iter().zip(targets).map(|(l, name)| {
                json!({ "label": name, "precision": l.precision, "recall": l.recall,
                        "f1": l.f1, "support": l.support })
            });
            f.insert("per_label".into(), Value::Array(rows.collect()));
        }
        return;
    };
    f.insert("rmse".into(), json!(g.rmse()));
    f.insert("mae".into(), json!(g.mae()));
    f.insert("r2".into(), json!(g.r2()));
    if g.targets.len() > 1 {
        let rows =
            g.targets.iter().zip(targets).map(
                |(t, name)| json!({ "target": name, "rmse": t.rmse, "mae": t.mae, "r2": t.r2 }),
            );
        f.insert("per_target".into(), Value::Array(rows.collect()));
    }
}

/// The scores on the evaluation's printed line: `accuracy 93.10%` (with
/// the balanced accuracy and macro F1 when there are per-class scores), or
/// `rmse 310.2  mae 245.1  R² 0.8512`; with several targets, the mean R²,
/// and each target's scores on lines of their own, to follow the line (the
/// second string, empty otherwise).
pub(super) fn score_line(ev: &Eval, targets: &[String]) -> (String, String) {
    if let Some(m) = &ev.multi_label {
        let line = format!(
            "accuracy {:.2}% (of the labels)  exact {:.2}%  micro F1 {:.4}  macro F1 {:.4}",
            ev.accuracy * 100.0,
            m.exact_match * 100.0,
            m.f1_micro,
            m.f1_macro
        );
        return (line, String::new());
    }
    let Some(g) = &ev.regression else {
        let per_class = ev.per_class.as_ref().map(|p| {
            format!(
                "  balanced {:.2}%  macro F1 {:.4}",
                p.balanced_accuracy() * 100.0,
                p.macro_f1()
            )
        });
        let line = format!(
            "accuracy {:.2}%{}",
            ev.accuracy * 100.0,
            per_class.unwrap_or_default()
        );
        return (line, String::new());
    };
    if g.targets.len() == 1 {
        let line = format!("rmse {:.4}  mae {:.4}  R² {:.4}", g.rmse(), g.mae(), g.r2());
        return (line, String::new());
    }
    let line = format!("R² {:.4} (the mean of {} targets)", g.r2(), g.targets.len());
    (line, per_target_lines(g, targets))
}

/// A line per target, each starting with a line break.
fn per_target_lines(g: &Regression, targets: &[String]) -> String {
    let mut s = String::new();
    for (t, name) in g.targets.iter().zip(targets) {
        s += &format!(
            "\n    {name}: rmse {:.4}  mae {:.4}  R² {:.4}",
            t.rmse, t.mae, t.r2
        );
    }
    s
}

/// The scores in the table `run:evaluate` returns: as in the record
/// ([`record_scores`]), with a classifier's [`lua_fields`], and a
/// regression's `per_target` keyed by target name.
pub(super) fn lua_scores(
    lua: &Lua,
    t: &Table,
    ev: &Eval,
    classes: Option<&[String]>,
    targets: &[String],
) -> mlua::Result<()> {
    let Some(g) = &ev.regression else {
        t.set("accuracy", ev.accuracy)?;
        if let Some(p) = &ev.per_class {
            lua_fields(lua, t, p, classes)?;
        }
        if let Some(m) = &ev.multi_label {
            t.set("exact_match", m.exact_match)?;
            t.set("f1_micro", m.f1_micro)?;
            t.set("f1_macro", m.f1_macro)?;
            let per = lua.create_table()?;
            for (l, name) in m.labels.iter().zip(targets) {
                let row = lua.create_table()?;
                row.set("precision", l.precision)?;
                row.set("recall", l.recall)?;
                row.set("f1", l.f1)?;
                row.set("support", l.support)?;
                per.set(name.as_str(), row)?;
            }
            t.set("per_label", per)?;
        }
        return Ok(());
    };
    t.set("rmse", g.rmse())?;
    t.set("mae", g.mae())?;
    t.set("r2", g.r2())?;
    if g.targets.len() > 1 {
        let per = lua.create_table()?;
        for (s, name) in g.targets.iter().zip(targets) {
            let row = lua.create_table()?;
            row.set("rmse", s.rmse)?;
            row.set("mae", s.mae)?;
            row.set("r2", s.r2)?;
            per.set(name.as_str(), row)?;
        }
        t.set("per_target", per)?;
    }
    Ok(())
}

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
fn record(f: &mut Map<String, Value>, p: &PerClass, classes: Option<&[String]>) {
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
fn lua_fields(lua: &Lua, t: &Table, p: &PerClass, classes: Option<&[String]>) -> mlua::Result<()> {
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
