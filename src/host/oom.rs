//! The one OOM recovery site: a training step that runs out of memory is
//! cleaned up, reported to the run's policy, and retried on the same batch
//! with the policy's plan. Sources of OOM: the device, the memory budget
//! (`--mem-limit`, measured by the counting allocator at phase boundaries)
//! and injected faults (`--inject-oom`, `run:inject_oom{}`).

use mlua::{Lua, Table, Value};
use serde_json::{json, Map};

use super::options::defined_at;
use super::run_state::RunState;
use super::HostState;
use crate::data::Batch;
use crate::memory::inject::Injection;
use crate::memory::{HostMemory, OomCause, OomError, Phase};
use crate::{Error, Result};

/// Attempts at one batch before the run stops.
const MAX_ATTEMPTS: u32 = 16;

/// What a policy decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Split(Option<usize>),
    Retry,
    Skip,
    Stop(String),
}

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

/// Calls `policy.name(policy, arg)` (a table with methods) or `policy(arg)`
/// (a function, for `on_oom` only). Returns nil when there is no such hook.
fn call_hook(policy: &Value, name: &str, arg: Table) -> Result<(Value, String)> {
    match policy {
        Value::Function(f) if name == "on_oom" => Ok((f.call(arg)?, defined_at(f))),
        Value::Table(t) => match t.get::<Value>(name)? {
            Value::Function(f) => Ok((f.call((t.clone(), arg))?, defined_at(&f))),
            _ => Ok((Value::Nil, String::new())),
        },
        _ => Ok((Value::Nil, String::new())),
    }
}

pub(crate) fn parse_action(v: Value, at: &str) -> Result<Option<Action>> {
    let bad = |what: String| Error::Script(format!("OOM policy at {at}: {what}"));
    let mut reason: Option<String> = None;
    let (name, micro) = match &v {
        Value::Nil => return Ok(None),
        Value::String(s) => (s.to_str()?.to_string(), None),
        Value::Table(t) => {
            for pair in t.pairs::<String, Value>() {
                let (k, _) = pair?;
                if !["action", "micro_batch", "reason"].contains(&k.as_str()) {
                    return Err(bad(format!(
                        "unknown key `{k}` in its action (action, micro_batch, reason)"
                    )));
                }
            }
            let name: Option<String> = t.get("action")?;
            let micro: Option<i64> = t.get("micro_batch")?;
            reason = t.get("reason")?;
            if let Some(m) = micro.filter(|m| *m < 1) {
                return Err(bad(format!("micro_batch {m} must be at least 1")));
            }
            (
                name.ok_or_else(|| bad("its action table has no `action`".into()))?,
                micro.map(|m| m as usize),
            )
        }
        other => {
            return Err(bad(format!(
                "returned a {}, expected an action",
                other.type_name()
            )))
        }
    };
    match name.as_str() {
        "split" => Ok(Some(Action::Split(micro))),
        "retry" => Ok(Some(Action::Retry)),
        "skip" => Ok(Some(Action::Skip)),
        "stop" => Ok(Some(Action::Stop(format!(
            "the OOM policy at {at} stopped the run{}",
            reason.map(|r| format!(": {r}")).unwrap_or_default()
        )))),
        "precision" | "recompute" | "offload" => Err(bad(format!(
            "action `{name}` is not available in this build yet (split, retry, skip and stop are)"
        ))),
        other => Err(bad(format!(
            "unknown action `{other}` (split, retry, skip, stop)"
        ))),
    }
}

fn event_table(
    lua: &Lua,
    r: &RunState,
    e: &OomError,
    batch: usize,
    micro: usize,
    attempt: u32,
) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set("phase", e.phase.name())?;
    t.set("cause", e.cause.name())?;
    t.set("step", r.trainer.step + 1)?;
    t.set("epoch", r.epoch)?;
    t.set("batch_size", batch)?;
    t.set("micro_batch", micro)?;
    t.set("attempt", attempt)?;
    t.set("error", e.to_string())?;
    let mem = lua.create_table()?;
    match crate::memory::device::info(r.trainer.device()) {
        // On a GPU: the driver's figures (the limit is the ballast's doing).
        Some(d) => {
            mem.set("used", d.used())?;
            mem.set("free", d.free)?;
            mem.set("total", d.total)?;
        }
        None => {
            mem.set("used", HostMemory::current())?;
            mem.set("peak", HostMemory::peak())?;
            mem.set("limit", r.oom.budget)?;
        }
    }
    t.set("memory", mem)?;
    Ok(t)
}

/// Asks the policy (or the default: halve the micro-batch) what to do.
fn decide(
    lua: &Lua,
    r: &RunState,
    e: &OomError,
    batch: usize,
    micro: usize,
    attempt: u32,
) -> Result<Action> {
    let action = match &r.oom.policy {
        None => None,
        Some(v) if super::plugin::of(v).is_some() => {
            // A plugin in the slot: called natively, no Lua table.
            let p = super::plugin::of(v).expect("checked");
            let ev = taper_plugin::OomEvent {
                phase: super::plugin::phase_code(e.phase),
                cause: super::plugin::cause_code(e.cause),
                step: r.trainer.step + 1,
                epoch: r.epoch,
                batch_size: batch as u64,
                micro_batch: micro as u64,
                attempt,
                _pad: 0,
                memory_used: HostMemory::current() as u64,
                memory_peak: HostMemory::peak() as u64,
                memory_limit: r.oom.budget.unwrap_or(0) as u64,
            };
            super::plugin::action(&p, p.on_oom(&ev)?)?
        }
        Some(p) => {
            let (v, at) = call_hook(p, "on_oom", event_table(lua, r, e, batch, micro, attempt)?)?;
            parse_action(v, &at)?
        }
    };
    Ok(action.unwrap_or(Action::Split(None)))
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
            other => other,
        };
        r.oom.events += 1;
        r.oom.clean_steps = 0;
        record(host, r, &e, attempt, before, &action)?;
        match action {
            Action::Skip => {
                r.skipped.push((r.epoch, r.epoch_steps));
                return Ok(None);
            }
            Action::Stop(why) => return Err(Error::Stopped(format!("{why} ({e})"))),
            Action::Split(_) | Action::Retry => {}
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
        } else {
            String::new()
        }
    ));
    Ok(())
}

/// After a clean step: count it, and let the policy's `on_step` grow the
/// micro-batch back.
fn after_success(lua: &Lua, r: &mut RunState, micro: usize, batch: usize) -> Result<()> {
    r.oom.clean_steps += 1;
    let Some(p) = r.oom.policy.clone() else {
        return Ok(());
    };
    if let Some(plugin) = super::plugin::of(&p) {
        let info = taper_plugin::StepInfo {
            step: r.trainer.step,
            micro_batch: micro as u64,
            batch_size: batch as u64,
            clean_steps: r.oom.clean_steps,
        };
        if let Some(plan) = plugin.on_step(&info)? {
            if plan.micro_batch > 0 {
                r.oom.cap = Some(plan.micro_batch as usize);
            }
        }
        return Ok(());
    }
    let info = lua.create_table()?;
    info.set("step", r.trainer.step)?;
    info.set("micro_batch", micro)?;
    info.set("batch_size", batch)?;
    info.set("clean_steps", r.oom.clean_steps)?;
    let (v, at) = call_hook(&p, "on_step", info)?;
    match v {
        Value::Nil => Ok(()),
        Value::Table(t) => {
            let m: Option<i64> = t
                .get("micro_batch")
                .map_err(|e| Error::Script(format!("on_step at {at}: {e}")))?;
            if let Some(m) = m {
                if m < 1 {
                    return Err(Error::Script(format!(
                        "on_step at {at}: micro_batch {m} must be at least 1"
                    )));
                }
                r.oom.cap = Some(m as usize);
            }
            Ok(())
        }
        other => Err(Error::Script(format!(
            "on_step at {at}: returned a {}, expected nil or {{ micro_batch = n }}",
            other.type_name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_decode_or_name_the_policy() {
        let lua = Lua::new();
        let v = |src: &str| lua.load(src).eval::<Value>().unwrap();
        assert_eq!(
            parse_action(v("'split'"), "p.lua:1").unwrap(),
            Some(Action::Split(None))
        );
        assert_eq!(
            parse_action(v("{ action = 'split', micro_batch = 8 }"), "p.lua:1").unwrap(),
            Some(Action::Split(Some(8)))
        );
        assert_eq!(parse_action(Value::Nil, "p.lua:1").unwrap(), None);
        let err = parse_action(v("'explode'"), "p.lua:3")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("OOM policy at p.lua:3: unknown action `explode`"),
            "{err}"
        );
        let err = parse_action(v("'offload'"), "p.lua:3")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not available in this build yet"), "{err}");
        let err = parse_action(v("42"), "p.lua:3").unwrap_err().to_string();
        assert!(err.contains("returned a integer"), "{err}");
        let err = parse_action(v("{ micro_batch = 2 }"), "p.lua:3")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no `action`"), "{err}");
    }
}
