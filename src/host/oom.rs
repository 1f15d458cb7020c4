//! Each OOM the run core recovers from, written to the run's records.

use serde_json::{json, Map};

use super::output::Output;
use crate::run::{Action, MemoryFigures, OomEvent, Recovered};
use crate::Result;

/// Writes the OOM's snapshot (the record's fields, and the largest tensors
/// the run holds, by model part) as `oom/step<N>-<phase>-attempt<K>.json`
/// in the run folder; returns its path there. Written whole, then renamed.
fn snapshot(
    dir: &std::path::Path,
    run: usize,
    e: &OomEvent,
    fields: &Map<String, serde_json::Value>,
) -> Result<String> {
    let run_part = if run > 1 {
        format!("run{run}-")
    } else {
        String::new()
    };
    let name = format!(
        "oom/{run_part}step{}-{}-attempt{}.json",
        e.step,
        e.phase.name(),
        e.attempt
    );
    let mut snap = fields.clone();
    snap.insert("step".into(), e.step.into());
    snap.insert("epoch".into(), e.epoch.into());
    let live: Vec<_> = e
        .live
        .iter()
        .map(|l| json!({ "name": l.name, "part": l.part, "bytes": l.bytes }))
        .collect();
    snap.insert("live".into(), live.into());
    snap.insert("live_bytes".into(), e.live_bytes.into());
    let path = dir.join(&name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|err| crate::Error::io(parent, err))?;
    }
    let text = serde_json::to_string_pretty(&snap)
        .map_err(|err| crate::Error::Config(err.to_string()))?
        + "\n";
    crate::engine::checkpoint::write_atomically(&path, |tmp| {
        std::fs::write(tmp, text).map_err(|err| crate::Error::io(tmp, err))
    })?;
    Ok(name)
}

/// One `oom` record and a printed line.
pub fn record(out: &Output, run: usize, rec: &Recovered<'_>) -> Result<()> {
    let (e, action) = (rec.event, rec.action);
    let name = action.name();
    let mut f = Map::new();
    f.insert("run".into(), run.into());
    f.insert("phase".into(), e.phase.name().into());
    f.insert("cause".into(), e.cause.name().into());
    f.insert("attempt".into(), e.attempt.into());
    f.insert("batch_size".into(), e.batch_size.into());
    f.insert("micro_batch".into(), e.micro_batch.into());
    f.insert("action".into(), name.into());
    f.insert("new_micro_batch".into(), rec.new_micro_batch.into());
    f.insert("precision".into(), e.precision.name().into());
    if let Action::Precision(p) = action {
        f.insert("new_precision".into(), p.name().into());
    }
    f.insert("recompute".into(), e.recompute.into());
    if let Action::Recompute(n) = action {
        f.insert("new_recompute".into(), (*n).into());
    }
    f.insert("offload".into(), e.offload.into());
    if let Some(b) = e.requested {
        f.insert("requested".into(), json!(b));
    }
    match e.memory {
        MemoryFigures::Host { used, peak, limit } => {
            f.insert("memory_used".into(), json!(used));
            f.insert("memory_peak".into(), json!(peak));
            if let Some(l) = limit {
                f.insert("memory_limit".into(), json!(l));
                f.insert("memory_free".into(), json!(l.saturating_sub(used)));
            }
        }
        MemoryFigures::Device { used, free, total } => {
            f.insert("device_memory_used".into(), json!(used));
            f.insert("device_memory_free".into(), json!(free));
            f.insert("device_memory_total".into(), json!(total));
        }
    }
    if let Some(p) = e.pool {
        f.insert("pool_reserved".into(), json!(p.reserved));
        f.insert("pool_used".into(), json!(p.used));
    }
    f.insert("error".into(), e.error.clone().into());
    if !e.ranks.is_empty() {
        f.insert("ranks".into(), json!(e.ranks));
    }
    // A snapshot that cannot be written (a full disk) is not a reason to
    // give up a recovery: the record says why it is missing.
    if let Some(dir) = out.dir() {
        match snapshot(&dir, run, e, &f) {
            Ok(name) => f.insert("snapshot".into(), name.into()),
            Err(err) => {
                out.warn(&format!(
                    "step {}: the OOM's snapshot was not written: {err}",
                    e.step
                ));
                f.insert("snapshot_error".into(), err.to_string().into())
            }
        };
    }
    out.record("oom", e.step, e.epoch, f)?;
    let detail = match action {
        Action::Split(_) => format!(" micro-batch {} -> {}", e.micro_batch, rec.new_micro_batch),
        Action::Precision(p) => format!(" {} -> {}", e.precision.name(), p.name()),
        Action::Recompute(n) => format!(" every {n} blocks"),
        _ => String::new(),
    };
    out.oom(format!("{name}{detail}"));
    out.line(&format!(
        "OOM at step {} ({}, {}), attempt {}: {name}{detail}",
        e.step,
        e.phase.name(),
        e.cause.name(),
        e.attempt
    ));
    Ok(())
}
