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

mod markers;
mod table;

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

pub(super) fn num(r: &Value, k: &str) -> Value {
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
    // The run's limit, else the one its first OOM under a limit records.
    let mut limit = num(&run_record, "memory_limit");
    if limit.is_null() {
        limit = of("oom")
            .map(|r| num(r, "memory_limit"))
            .find(|v| !v.is_null())
            .unwrap_or(Value::Null);
    }
    let markers = markers::markers(folder, run);
    json!({
        "name": name,
        "steps": steps,
        "epochs": epochs,
        "evals": evals,
        "markers": markers,
        "limit": limit,
        "table": table::table(folder, run, &run_record),
    })
}

/// Run `run`'s records of `event` in the folder.
pub(super) fn mine_of<'a>(
    folder: &'a RunFolder,
    run: u64,
    event: &'a str,
) -> impl DoubleEndedIterator<Item = &'a Value> {
    folder
        .records
        .iter()
        .filter(move |r| r["event"] == event && r["run"].as_u64().unwrap_or(1) == run)
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
