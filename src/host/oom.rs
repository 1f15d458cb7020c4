//! The one OOM recovery site: a training step that runs out of memory is
//! cleaned up, reported to the run's policy, and retried on the same batch
//! with the policy's plan. Sources of OOM: the device, the memory budget
//! (`--mem-limit`, measured by the counting allocator at phase boundaries)
//! and injected faults (`--inject-oom`, `run:inject_oom{}`).

use mlua::{Lua, Value};
use serde_json::{json, Map};

use super::oom_policy::{after_success, decide, Action};
use super::run_state::RunState;
use super::HostState;
use crate::data::Batch;
use crate::memory::inject::Injection;
use crate::memory::{HostMemory, OomCause, OomError, Phase};
use crate::{Error, Result};

/// Attempts at one batch before the run stops.
const MAX_ATTEMPTS: u32 = 16;

/// A run's OOM handling: injected faults, budget, policy, and what it learned.
#[derive(Default)]
pub struct OomState {
    pub injections: Vec<Injection>,
    pub budget: Option<usize>,
    pub policy: Option<Value>,
    /// The largest micro-batch known to fit (lowered on OOM, raised by on_step).
    pub cap: Option<usize>,
    pub clean_steps: u64,
    pub events: u64,
}

fn check(oom: &mut OomState, step: u64, attempt: u32, phase: Phase) -> Result<()> {
    // An injection fires `times` times in all: a batch the policy skips does
    // not advance the step, and must not meet the same fault again.
    if let Some(i) = oom
        .injections
        .iter_mut()
        .find(|i| i.step == step && i.phase == phase && i.times > 0)
    {
        i.times -= 1;
        return Err(Error::Oom(OomError {
            phase,
            cause: OomCause::Injected,
            detail: format!("injected at step {step}, attempt {attempt}"),
        }));
    }
    if let Some(limit) = oom.budget {
        let peak = HostMemory::peak();
        if peak > limit {
            return Err(Error::Oom(OomError {
                phase,
                cause: OomCause::Budget,
                detail: format!("peak {peak} B exceeds the limit of {limit} B"),
            }));
        }
    }
    Ok(())
}

/// One training step on `batch` with OOM recovery. Returns the loss, or
/// `None` when the policy skipped the batch.
pub fn step(
    lua: &Lua,
    host: &HostState,
    r: &mut RunState,
    batch: &Batch,
    planned: usize,
) -> Result<Option<f64>> {
    let n = batch.len();
    let mut micro = planned
        .min(r.oom.cap.unwrap_or(usize::MAX))
        .clamp(1, n.max(1));
    let step_no = r.trainer.step + 1;
    let mut attempt = 0;
    loop {
        attempt += 1;
        HostMemory::reset_peak();
        let oom = &mut r.oom;
        let result = r.trainer.train_step_guarded(batch, micro, &mut |phase| {
            check(oom, step_no, attempt, phase)
        });
        let e = match result {
            Ok(loss) => {
                r.epoch_mem_peak = r.epoch_mem_peak.max(HostMemory::peak());
                after_success(lua, r, micro, n)?;
                return Ok(Some(loss));
            }
            Err(Error::Oom(e)) => e,
            Err(other) => return Err(other),
        };
        // The attempt's tensors were dropped when train_step_guarded returned;
        // on a GPU, hand the pool's freed blocks back before asking the policy.
        crate::memory::device::trim(r.trainer.device())?;
        let action = if attempt >= MAX_ATTEMPTS {
            Action::Stop(format!(
                "{MAX_ATTEMPTS} attempts at step {step_no} ran out of memory"
            ))
        } else {
            decide(lua, r, &e, n, micro, attempt)?
        };
        let before = micro;
        let action = match action {
            Action::Split(m) if micro <= 1 && m.is_none() => Action::Stop(format!(
                "out of memory at step {step_no} with a micro-batch of 1: nothing left to split"
            )),
            Action::Split(m) => {
                micro = m.unwrap_or(micro / 2).clamp(1, n);
                r.oom.cap = Some(micro);
                Action::Split(Some(micro))
            }
            Action::Precision(p) if p == r.trainer.precision() => Action::Stop(format!(
                "the OOM policy asked for precision {} at step {step_no}, which the run already uses",
                p.name()
            )),
            other => other,
        };
        r.oom.events += 1;
        r.oom.clean_steps = 0;
        record(host, r, &e, attempt, before, &action)?;
        if let Action::Precision(p) = action {
            r.trainer.set_precision(p)?;
        }
        match action {
            Action::Skip => {
                r.skipped.push((r.epoch, r.epoch_steps));
                return Ok(None);
            }
            Action::Stop(why) => return Err(Error::Stopped(format!("{why} ({e})"))),
            Action::Split(_) | Action::Retry | Action::Precision(_) => {}
        }
    }
}

fn record(
    host: &HostState,
    r: &RunState,
    e: &OomError,
    attempt: u32,
    before: usize,
    action: &Action,
) -> Result<()> {
    let (name, after) = match action {
        Action::Split(m) => ("split", m.unwrap_or(before)),
        Action::Retry => ("retry", before),
        Action::Precision(_) => ("precision", before),
        Action::Skip => ("skip", before),
        Action::Stop(_) => ("stop", before),
    };
    let mut f = Map::new();
    f.insert("run".into(), r.id.into());
    f.insert("phase".into(), e.phase.name().into());
    f.insert("cause".into(), e.cause.name().into());
    f.insert("attempt".into(), attempt.into());
    f.insert("micro_batch".into(), before.into());
    f.insert("action".into(), name.into());
    f.insert("new_micro_batch".into(), after.into());
    f.insert("precision".into(), r.trainer.precision().name().into());
    if let Action::Precision(p) = action {
        f.insert("new_precision".into(), p.name().into());
    }
    f.insert("memory_used".into(), json!(HostMemory::current()));
    if let Some(d) = crate::memory::device::info(r.trainer.device()) {
        f.insert("device_memory_used".into(), json!(d.used()));
        f.insert("device_memory_total".into(), json!(d.total));
    }
    f.insert("memory_peak".into(), json!(HostMemory::peak()));
    f.insert("error".into(), e.to_string().into());
    host.out.record("oom", r.trainer.step + 1, r.epoch, f)?;
    host.out.line(&format!(
        "OOM at step {} ({}, {}), attempt {attempt}: {name}{}",
        r.trainer.step + 1,
        e.phase.name(),
        e.cause.name(),
        if name == "split" {
            format!(" micro-batch {before} -> {after}")
        } else if let Action::Precision(p) = action {
            format!(" {} -> {}", r.trainer.precision().name(), p.name())
        } else {
            String::new()
        }
    ));
    Ok(())
}
