//! Each OOM the run core recovers from, written to the run's records.

use serde_json::{json, Map};

use super::output::Output;
use crate::run::{Action, MemoryFigures, Recovered};
use crate::Result;

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
    if let Some(b) = e.requested {
        f.insert("requested".into(), json!(b));
    }
    match e.memory {
        MemoryFigures::Host { used, peak, limit } => {
            f.insert("memory_used".into(), json!(used));
            f.insert("memory_peak".into(), json!(peak));
            if let Some(l) = limit {
                f.insert("memory_limit".into(), json!(l));
            }
        }
        MemoryFigures::Device { used, free, total } => {
            f.insert("device_memory_used".into(), json!(used));
            f.insert("device_memory_free".into(), json!(free));
            f.insert("device_memory_total".into(), json!(total));
        }
    }
    f.insert("error".into(), e.error.clone().into());
    out.record("oom", e.step, e.epoch, f)?;
    let detail = match action {
        Action::Split(_) => format!(" micro-batch {} -> {}", e.micro_batch, rec.new_micro_batch),
        Action::Precision(p) => format!(" {} -> {}", e.precision.name(), p.name()),
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
