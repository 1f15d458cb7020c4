//! Training steps and evaluations through the run core's recovery site
//! (`run::Recovery`), with each OOM written to the run's records.

use serde_json::{json, Map};

use super::output::Output;
use super::run_state::RunState;
use crate::data::Batch;
use crate::engine::loss::Loss;
use crate::engine::Eval;
use crate::run::{Action, MemoryFigures, Recovered, StepOutcome};
use crate::Result;

/// One training step on `batch` with OOM recovery. Returns the loss, or
/// `None` when the policy skipped the batch (recorded in `r.skipped`).
pub fn step(out: &Output, r: &mut RunState, batch: &Batch, planned: usize) -> Result<Option<f64>> {
    let (id, epoch) = (r.id, r.epoch);
    let outcome = r
        .oom
        .train_step(&mut r.trainer, batch, planned, epoch, &mut |rec| {
            record(out, id, rec)
        })?;
    match outcome {
        StepOutcome::Trained { loss, .. } => {
            r.epoch_mem_peak = r.epoch_mem_peak.max(crate::memory::HostMemory::peak());
            Ok(Some(loss))
        }
        StepOutcome::Skipped => {
            r.skipped.push((r.epoch, r.epoch_steps));
            Ok(None)
        }
    }
}

/// An evaluation with OOM recovery (an evaluation batch that does not fit
/// is evaluated in pieces).
pub fn evaluate(
    out: &Output,
    r: &mut RunState,
    batches: impl Iterator<Item = Result<Batch>>,
    objective: Option<&Loss>,
) -> Result<Eval> {
    let (id, epoch) = (r.id, r.epoch);
    r.oom
        .evaluate(&r.trainer, batches, objective, epoch, &mut |rec| {
            record(out, id, rec)
        })
}

/// One `oom` record and a printed line.
fn record(out: &Output, run: usize, rec: &Recovered<'_>) -> Result<()> {
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
    out.line(&format!(
        "OOM at step {} ({}, {}), attempt {}: {name}{detail}",
        e.step,
        e.phase.name(),
        e.cause.name(),
        e.attempt
    ));
    Ok(())
}
