//! Asking a run's OOM policy: the event it sees, the action it answers
//! (Lua function, policy table or native plugin), and its `on_step` hook
//! after clean steps.

use mlua::{Lua, Table, Value};

use super::options::defined_at;
use super::run_state::RunState;
use crate::engine::precision::Precision;
use crate::memory::{HostMemory, OomError};
use crate::{Error, Result};

/// What a policy decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Split(Option<usize>),
    Retry,
    /// Switch forward and backward to this precision, then retry.
    Precision(Precision),
    Skip,
    Stop(String),
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
    let mut precision: Option<String> = None;
    let (name, micro) = match &v {
        Value::Nil => return Ok(None),
        Value::String(s) => (s.to_str()?.to_string(), None),
        Value::Table(t) => {
            for pair in t.pairs::<String, Value>() {
                let (k, _) = pair?;
                if !["action", "micro_batch", "precision", "reason"].contains(&k.as_str()) {
                    return Err(bad(format!(
                        "unknown key `{k}` in its action (action, micro_batch, precision, reason)"
                    )));
                }
            }
            let name: Option<String> = t.get("action")?;
            let micro: Option<i64> = t.get("micro_batch")?;
            reason = t.get("reason")?;
            precision = t.get("precision")?;
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
        "precision" => {
            let Some(p) = precision else {
                return Err(bad(format!(
                    "action `precision` needs `precision = ...` ({})",
                    Precision::NAMES
                )));
            };
            match Precision::parse(&p) {
                Some(p) => Ok(Some(Action::Precision(p))),
                None => Err(bad(format!(
                    "unknown precision `{p}` ({})",
                    Precision::NAMES
                ))),
            }
        }
        "recompute" | "offload" => Err(bad(format!(
            "action `{name}` is not available in this build yet (split, retry, skip, precision and stop are)"
        ))),
        other => Err(bad(format!(
            "unknown action `{other}` (split, retry, skip, precision, stop)"
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
    t.set("precision", r.trainer.precision().name())?;
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
pub(super) fn decide(
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

/// After a clean step: count it, and let the policy's `on_step` grow the
/// micro-batch back.
pub(super) fn after_success(lua: &Lua, r: &mut RunState, micro: usize, batch: usize) -> Result<()> {
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
        assert_eq!(
            parse_action(v("{ action = 'precision', precision = 'bf16' }"), "p.lua:1").unwrap(),
            Some(Action::Precision(Precision::Bf16))
        );
        let err = parse_action(v("{ action = 'precision' }"), "p.lua:3")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("needs `precision = ...` (f32, bf16, f16)"),
            "{err}"
        );
        let err = parse_action(v("{ action = 'precision', precision = 'fp8' }"), "p.lua:3")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown precision `fp8`"), "{err}");
        let err = parse_action(v("42"), "p.lua:3").unwrap_err().to_string();
        assert!(err.contains("returned a integer"), "{err}");
        let err = parse_action(v("{ micro_batch = 2 }"), "p.lua:3")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no `action`"), "{err}");
    }
}
