//! The report's table of a run: its config and outcome, as (key, value) rows.

use std::path::Path;

use serde_json::Value;

use super::{mine_of, RunFolder};

pub(super) fn file_part(p: &str) -> String {
    Path::new(p)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The run's config and outcome, as (key, value) rows.
pub(super) fn table(folder: &RunFolder, run: u64, run_record: &Value) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    for key in [
        "model",
        "parameters",
        "optimizer",
        "device",
        "precision",
        "memory_limit",
    ] {
        if let Some(v) = run_record.get(key) {
            rows.push((key.to_string(), show(v)));
        }
    }
    if let Some(Value::Object(cfg)) = folder.records.iter().find(|r| r["event"] == "config") {
        for (k, v) in cfg {
            if !["event", "step", "epoch", "time"].contains(&k.as_str()) {
                rows.push((format!("config {k}"), show(v)));
            }
        }
    }
    let mine = |event: &'static str| mine_of(folder, run, event);
    if let Some(last) = mine("epoch").next_back() {
        rows.push(("epochs".into(), show(&last["epoch"])));
        rows.push(("steps".into(), show(&last["step"])));
        rows.push(("last train loss".into(), show(&last["loss"])));
    }
    if let Some(ev) = mine("eval").next_back() {
        rows.push(("last eval loss".into(), show(&ev["loss"])));
        let per_target = ev["per_target"].as_array().filter(|t| !t.is_empty());
        match (ev.get("rmse"), per_target) {
            // A regression of several targets: each one's errors in its
            // units, and R²; the mean R².
            (Some(_), Some(targets)) => {
                for t in targets {
                    let name = t["target"].as_str().unwrap_or("target");
                    rows.push((format!("last eval RMSE ({name})"), show(&t["rmse"])));
                    rows.push((format!("last eval R² ({name})"), show(&t["r2"])));
                }
                rows.push((
                    format!("last eval R² (the mean of {} targets)", targets.len()),
                    show(&ev["r2"]),
                ));
            }
            // A regression: its errors in the target's units, and R².
            (Some(rmse), None) => {
                rows.push(("last eval RMSE".into(), show(rmse)));
                rows.push(("last eval R²".into(), show(&ev["r2"])));
            }
            (None, _) => {
                rows.push(("last eval accuracy".into(), show(&ev["accuracy"])));
                rows.extend(class_rows(ev));
            }
        }
    }
    if let Some(b) = mine("best").next_back() {
        let at = format!("{} (step {})", show(&b["value"]), show(&b["step"]));
        let key = format!("best {} {}", show(&b["split"]), show(&b["metric"]));
        rows.push((key, at));
        if let Some(p) = b["path"].as_str() {
            rows.push(("best model".into(), p.to_string()));
        }
    }
    if let Some(s) = mine("early_stop").next_back() {
        rows.push(("stopped early at step".into(), show(&s["step"])));
    }
    rows.push(("OOMs recovered".into(), mine("oom").count().to_string()));
    let reloads = folder.records.iter().filter(|r| r["event"] == "reload");
    rows.push(("reloads".into(), reloads.count().to_string()));
    if let Some(t) = folder
        .records
        .iter()
        .filter_map(|r| r["time"].as_f64())
        .reduce(f64::max)
    {
        rows.push(("seconds".into(), format!("{t:.1}")));
    }
    rows
}

/// A record's value for the summary: numbers to six decimals.
pub(super) fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(x) if n.is_f64() => format!("{}", (x * 1e6).round() / 1e6),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// A classifier's last evaluation class by class (an `eval` record with
/// `per_class`): balanced accuracy, macro F1, and each class's F1 and
/// recall, up to 20 classes (more are in the record).
fn class_rows(ev: &Value) -> Vec<(String, String)> {
    let Some(classes) = ev["per_class"].as_array() else {
        return Vec::new();
    };
    let mut rows = vec![
        (
            "last eval balanced accuracy".into(),
            show(&ev["balanced_accuracy"]),
        ),
        ("last eval macro F1".into(), show(&ev["macro_f1"])),
    ];
    let each = match classes.len() {
        n if n > 20 => format!("{n} classes: see the eval record's per_class"),
        _ => classes
            .iter()
            .map(|c| {
                let name = c["class"]
                    .as_str()
                    .map_or_else(|| c["class"].to_string(), String::from);
                format!(
                    "{name} F1 {} recall {} ({} samples)",
                    show(&c["f1"]),
                    show(&c["recall"]),
                    c["support"]
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    };
    rows.push(("last eval by class".into(), each));
    rows
}
