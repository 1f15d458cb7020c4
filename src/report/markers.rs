//! The events marked on a run's charts: OOMs and their actions, skips,
//! divergence, reloads, checkpoints, the kept best and an early stop.

use serde_json::{json, Value};

use super::table::{file_part, show};
use super::{mine_of, RunFolder};

/// Run `run`'s markers, each `{ step, kind, label }`, by kind of event.
pub(super) fn markers(folder: &RunFolder, run: u64) -> Vec<Value> {
    let mut markers: Vec<Value> = mine_of(folder, run, "oom").map(oom).collect();
    markers.extend(mine_of(folder, run, "diverged").map(diverged));
    // Reloads and checkpoints are the folder's, not one run's.
    let folder_wide =
        |event: &'static str| folder.records.iter().filter(move |r| r["event"] == event);
    markers.extend(folder_wide("reload").map(reload));
    markers.extend(folder_wide("checkpoint").filter_map(|r| checkpoint(r, run)));
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
    markers
}

/// An OOM and the action taken (a skip is marked as such).
fn oom(r: &Value) -> Value {
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
    json!({
        "step": r["step"], "kind": kind,
        "label": format!("OOM ({}): {action}{detail}", r["phase"].as_str().unwrap_or("?")),
    })
}

fn diverged(r: &Value) -> Value {
    let error = r["error"].as_str().unwrap_or("");
    let what = error.split(": the training diverged").next().unwrap_or("");
    json!({
        "step": r["step"], "kind": "diverged",
        "label": format!("diverged: {what}"),
    })
}

/// A record's error, its first line.
fn first_line(r: &Value) -> &str {
    r["error"]
        .as_str()
        .unwrap_or("")
        .lines()
        .next()
        .unwrap_or("")
}

fn reload(r: &Value) -> Value {
    let ok = r["ok"].as_bool().unwrap_or(false);
    let error = first_line(r);
    // Going back (a reloaded version failed in its loop) applies the
    // earlier version: marked as the failure it answers.
    let back = r.get("back_to").is_some();
    json!({
        "step": r["step"], "kind": if ok && !back { "reload" } else { "reload-failed" },
        "label": if back {
            format!("generation {} failed, back to generation {}'s version: {error}", r["failed"], r["back_to"])
        } else if ok {
            format!("reload: generation {}", r["generation"])
        } else {
            format!("reload failed: {error}")
        },
    })
}

/// A checkpoint of run `run`'s file (a record without a path is the first
/// run's), written or failed; None for another run's.
fn checkpoint(r: &Value, run: u64) -> Option<Value> {
    let mine = match r["path"].as_str() {
        Some(p) => crate::engine::checkpoint::file_name(run as usize) == file_part(p),
        None => run == 1,
    };
    if !mine {
        return None;
    }
    let reason = r["reason"].as_str().unwrap_or("?");
    Some(if r["ok"] == false {
        json!({
            "step": r["step"], "kind": "checkpoint-failed",
            "label": format!("checkpoint ({reason}) failed: {}", first_line(r)),
        })
    } else {
        json!({
            "step": r["step"], "kind": "checkpoint",
            "label": format!("checkpoint ({reason})"),
        })
    })
}
