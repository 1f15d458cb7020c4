//! `taper report RUN_DIR [RUN_DIR...]`: one self-contained HTML file from
//! runs' `metrics.jsonl`: loss and evaluation curves, learning rate,
//! throughput, the memory timeline against the limit with OOM actions,
//! reloads, skips and checkpoints marked on it, and a table of each run's
//! config and outcome. Several runs are overlaid.
//!
//! The charts are drawn by uPlot 1.6.32 (MIT, `vendor/`), inlined into the
//! page: 51 KB, no dependencies, canvas charts that stay fast with every
//! step of a long run (hundreds of thousands of points), zoom and hover
//! values; the page needs no network, script or font from outside.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::{Error, Result};

const TEMPLATE: &str = include_str!("template.html");
const SCRIPT: &str = include_str!("report.js");
const UPLOT_JS: &str = include_str!("vendor/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("vendor/uPlot.min.css");

/// The records of one run folder.
pub struct RunFolder {
    pub dir: PathBuf,
    pub records: Vec<Value>,
}

/// Reads `dir/metrics.jsonl`; a line that is not JSON is an error naming
/// the file and line (a line cut short by a kill, the last one, is passed
/// over with a note).
pub fn load(dir: &Path) -> Result<(RunFolder, Vec<String>)> {
    let path = dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let lines: Vec<&str> = text.lines().collect();
    let mut records = Vec::new();
    let mut notes = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(line) {
            Ok(v) => records.push(v),
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => notes.push(format!(
                "{}:{}: a record cut short (a killed run?); passed over",
                path.display(),
                i + 1
            )),
            Err(e) => {
                return Err(Error::Data(format!(
                    "{}:{}: not a JSON record: {e}",
                    path.display(),
                    i + 1
                )))
            }
        }
    }
    Ok((
        RunFolder {
            dir: dir.to_path_buf(),
            records,
        },
        notes,
    ))
}

fn num(r: &Value, k: &str) -> Value {
    match r.get(k) {
        Some(v) if v.is_number() => v.clone(),
        _ => Value::Null,
    }
}

/// A regression of several targets: each target's RMSE at each evaluation
/// (null where an evaluation lacks it), in the order the records name them:
/// `[{ "target": "body_mass_g", "rmse": [...] }, ...]`.
fn per_target_rmse(evals: Vec<&Value>) -> Value {
    let mut out: Vec<(String, Vec<Value>)> = Vec::new();
    for (i, r) in evals.iter().enumerate() {
        for t in r["per_target"].as_array().into_iter().flatten() {
            let name = t["target"].as_str().unwrap_or("target").to_string();
            let at = match out.iter().position(|(n, _)| *n == name) {
                Some(at) => at,
                None => {
                    out.push((name, vec![Value::Null; evals.len()]));
                    out.len() - 1
                }
            };
            out[at].1[i] = num(t, "rmse");
        }
    }
    let columns = out
        .into_iter()
        .map(|(target, rmse)| json!({ "target": target, "rmse": rmse }));
    Value::Array(columns.collect())
}

/// One run's series, for the page: a folder may hold several runs (a
/// distillation's teacher and students), told apart by `run`.
fn series(folder: &RunFolder, run: u64, name: String) -> Value {
    let of = |event: &'static str| {
        folder
            .records
            .iter()
            .filter(move |r| r["event"] == event && r["run"].as_u64().unwrap_or(1) == run)
    };
    let column =
        |event: &'static str, key: &str| -> Vec<Value> { of(event).map(|r| num(r, key)).collect() };
    let steps = json!({
        "step": column("step", "step"),
        "loss": column("step", "loss"),
        "lr": column("step", "lr"),
        "samples_per_s": column("step", "samples_per_s"),
        "tokens_per_s": column("step", "tokens_per_s"),
        "memory": column("step", "memory"),
        "memory_peak": column("step", "memory_peak"),
        "device_used": column("step", "device_memory_used"),
        "device_peak": column("step", "device_memory_peak"),
    });
    let epochs = json!({
        "step": column("epoch", "step"),
        "loss": column("epoch", "loss"),
        "lr": column("epoch", "lr"),
        "samples_per_s": column("epoch", "samples_per_s"),
        "memory_peak": column("epoch", "memory_peak"),
        "device_peak": column("epoch", "device_memory_peak"),
    });
    let evals = json!({
        "step": column("eval", "step"),
        "loss": column("eval", "loss"),
        "accuracy": column("eval", "accuracy"),
        "rmse": column("eval", "rmse"),
        "per_target": per_target_rmse(of("eval").collect()),
    });
    let run_record = of("run").next().cloned().unwrap_or(Value::Null);
    let mut limit = num(&run_record, "memory_limit");
    let mut markers = Vec::new();
    for r in of("oom") {
        let action = r["action"].as_str().unwrap_or("?");
        let detail = match action {
            "split" => format!(
                " {} -> {}",
                r["micro_batch"].as_u64().unwrap_or(0),
                r["new_micro_batch"].as_u64().unwrap_or(0)
            ),
            "precision" => format!(" -> {}", r["new_precision"].as_str().unwrap_or("?")),
            _ => String::new(),
        };
        let kind = if action == "skip" { "skip" } else { "oom" };
        markers.push(json!({
            "step": r["step"], "kind": kind,
            "label": format!("OOM ({}): {action}{detail}", r["phase"].as_str().unwrap_or("?")),
        }));
        if limit.is_null() {
            limit = num(r, "memory_limit");
        }
    }
    for r in of("diverged") {
        let error = r["error"].as_str().unwrap_or("");
        let what = error.split(": the training diverged").next().unwrap_or("");
        markers.push(json!({
            "step": r["step"], "kind": "diverged",
            "label": format!("diverged: {what}"),
        }));
    }
    // Reloads and checkpoints are the folder's, not one run's.
    let folder_wide =
        |event: &'static str| folder.records.iter().filter(move |r| r["event"] == event);
    for r in folder_wide("reload") {
        let ok = r["ok"].as_bool().unwrap_or(false);
        let error = r["error"]
            .as_str()
            .unwrap_or("")
            .lines()
            .next()
            .unwrap_or("");
        // Going back (a reloaded version failed in its loop) applies the
        // earlier version: marked as the failure it answers.
        let back = r.get("back_to").is_some();
        markers.push(json!({
            "step": r["step"], "kind": if ok && !back { "reload" } else { "reload-failed" },
            "label": if back {
                format!("generation {} failed, back to generation {}'s version: {error}", r["failed"], r["back_to"])
            } else if ok {
                format!("reload: generation {}", r["generation"])
            } else {
                format!("reload failed: {error}")
            },
        }));
    }
    for r in folder_wide("checkpoint") {
        let mine = match r["path"].as_str() {
            Some(p) => crate::engine::checkpoint::file_name(run as usize) == file_part(p),
            None => run == 1,
        };
        let reason = r["reason"].as_str().unwrap_or("?");
        if mine && r["ok"] == false {
            let why = r["error"]
                .as_str()
                .unwrap_or("")
                .lines()
                .next()
                .unwrap_or("");
            markers.push(json!({
                "step": r["step"], "kind": "checkpoint-failed",
                "label": format!("checkpoint ({reason}) failed: {why}"),
            }));
        } else if mine {
            markers.push(json!({
                "step": r["step"], "kind": "checkpoint",
                "label": format!("checkpoint ({reason})"),
            }));
        }
    }
    // The kept best only: a marker per improvement would crowd the chart.
    if let Some(r) = mine_of(folder, run, "best").next_back() {
        markers.push(json!({
            "step": r["step"], "kind": "best",
            "label": format!("best {} {} {} (the model kept)", show(&r["split"]), show(&r["metric"]), show(&r["value"])),
        }));
    }
    for r in mine_of(folder, run, "early_stop") {
        markers.push(json!({
            "step": r["step"], "kind": "early-stop",
            "label": format!("stopped early: {} evaluations since the best", show(&r["evaluations"])),
        }));
    }
    json!({
        "name": name,
        "steps": steps,
        "epochs": epochs,
        "evals": evals,
        "markers": markers,
        "limit": limit,
        "table": table(folder, run, &run_record),
    })
}

/// Run `run`'s records of `event` in the folder.
fn mine_of<'a>(
    folder: &'a RunFolder,
    run: u64,
    event: &'a str,
) -> impl DoubleEndedIterator<Item = &'a Value> {
    folder
        .records
        .iter()
        .filter(move |r| r["event"] == event && r["run"].as_u64().unwrap_or(1) == run)
}

fn file_part(p: &str) -> String {
    Path::new(p)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The run's config and outcome, as (key, value) rows.
fn table(folder: &RunFolder, run: u64, run_record: &Value) -> Vec<(String, String)> {
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
fn show(v: &Value) -> String {
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

/// The page's data: every run of every folder.
pub fn data(folders: &[RunFolder]) -> Value {
    let mut runs = Vec::new();
    for f in folders {
        let base = f
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| f.dir.display().to_string());
        let mut ids: Vec<u64> = f
            .records
            .iter()
            .filter(|r| r["event"] == "run")
            .filter_map(|r| r["run"].as_u64())
            .collect();
        ids.dedup();
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            ids.push(1);
        }
        for &id in &ids {
            let name = if ids.len() > 1 {
                format!("{base} #{id}")
            } else {
                base.clone()
            };
            runs.push(series(f, id, name));
        }
    }
    let mut m = Map::new();
    m.insert("runs".into(), Value::Array(runs));
    Value::Object(m)
}

/// The whole page for `folders`.
pub fn html(folders: &[RunFolder]) -> String {
    let names: Vec<String> = folders
        .iter()
        .map(|f| f.dir.display().to_string())
        .collect();
    // `</` cannot appear inside a script element.
    let data = data(folders).to_string().replace("</", "<\\/");
    TEMPLATE
        .replace("{{TITLE}}", &escape(&names.join(", ")))
        .replace("{{UPLOT_CSS}}", UPLOT_CSS)
        .replace("{{UPLOT_JS}}", UPLOT_JS)
        .replace("{{SCRIPT}}", SCRIPT)
        .replace("{{DATA}}", &data)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Writes the report of `dirs` to `out`; returns notes on what was passed over.
pub fn write(dirs: &[PathBuf], out: &Path) -> Result<Vec<String>> {
    let mut folders = Vec::new();
    let mut notes = Vec::new();
    for d in dirs {
        let (f, n) = load(d)?;
        folders.push(f);
        notes.extend(n);
    }
    std::fs::write(out, html(&folders)).map_err(|e| Error::io(out, e))?;
    Ok(notes)
}
