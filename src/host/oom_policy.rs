//! The Lua-backed OOM policy: a function(event) or a table with
//! `on_oom`/`on_step` methods in the `on_oom` slot, the event table it
//! receives, and the actions it may answer.

use mlua::{Lua, Table, Value, WeakLua};

use super::options::defined_at;
use crate::engine::precision::Precision;
use crate::memory::{OomCause, Phase};
use crate::run::{Action, MemoryFigures, OomEvent, OomPolicy, PoolFigures, StepInfo};
use crate::{Error, Result};

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
    let mut every: Option<i64> = None;
    let (name, micro) = match &v {
        Value::Nil => return Ok(None),
        Value::String(s) => (s.to_str()?.to_string(), None),
        Value::Table(t) => {
            for pair in t.pairs::<String, Value>() {
                let (k, _) = pair?;
                if !["action", "micro_batch", "precision", "every", "reason"].contains(&k.as_str())
                {
                    return Err(bad(format!(
                        "unknown key `{k}` in its action (action, micro_batch, precision, every, reason)"
                    )));
                }
            }
            let name: Option<String> = t.get("action")?;
            let micro: Option<i64> = t.get("micro_batch")?;
            reason = t.get("reason")?;
            precision = t.get("precision")?;
            every = t.get("every")?;
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
                "returned {}, expected an action",
                super::options::a_type(other)
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
        "recompute" => match every {
            Some(n) if n >= 1 => Ok(Some(Action::Recompute(n as usize))),
            None => Ok(Some(Action::Recompute(1))),
            Some(n) => Err(bad(format!(
                "action `recompute`: every {n} must be at least 1"
            ))),
        },
        "offload" => Ok(Some(Action::Offload)),
        other => Err(bad(format!(
            "unknown action `{other}` (split, retry, skip, precision, recompute, offload, stop)"
        ))),
    }
}

/// The event as a Lua table: the same fields as the C struct, named as in
/// `docs/reference/lua-api.md`.
pub(crate) fn event_table(lua: &Lua, e: &OomEvent) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set("phase", e.phase.name())?;
    t.set("cause", e.cause.name())?;
    t.set("step", e.step)?;
    t.set("epoch", e.epoch)?;
    t.set("batch_size", e.batch_size)?;
    t.set("micro_batch", e.micro_batch)?;
    t.set("attempt", e.attempt)?;
    t.set("precision", e.precision.name())?;
    t.set("recompute", e.recompute)?;
    t.set("offload", e.offload)?;
    t.set("requested", e.requested)?;
    t.set("error", e.error.as_str())?;
    let live = lua.create_table()?;
    for (i, l) in e.live.iter().enumerate() {
        let row = lua.create_table()?;
        row.set("name", l.name.as_str())?;
        row.set("part", l.part.as_str())?;
        row.set("bytes", l.bytes)?;
        live.set(i + 1, row)?;
    }
    t.set("live", live)?;
    t.set("live_bytes", e.live_bytes)?;
    if !e.ranks.is_empty() {
        t.set("ranks", e.ranks.clone())?;
    }
    let mem = lua.create_table()?;
    match e.memory {
        MemoryFigures::Host { used, peak, limit } => {
            mem.set("used", used)?;
            mem.set("peak", peak)?;
            mem.set("limit", limit)?;
            mem.set("free", limit.map(|l| l.saturating_sub(used)))?;
        }
        MemoryFigures::Device { used, free, total } => {
            mem.set("used", used)?;
            mem.set("free", free)?;
            mem.set("total", total)?;
        }
    }
    if let Some(p) = e.pool {
        mem.set("pool_reserved", p.reserved)?;
        mem.set("pool_used", p.used)?;
    }
    t.set("memory", mem)?;
    Ok(t)
}

/// The inverse of [`event_table`], for a plugin called from Lua (inside
/// `taper.policy.chain{}`, for example).
pub(crate) fn event_of_table(t: &Table) -> std::result::Result<OomEvent, String> {
    let s = |k: &str| {
        t.get::<String>(k)
            .map_err(|_| format!("event field `{k}` must be a string"))
    };
    let n = |k: &str| {
        t.get::<u64>(k)
            .map_err(|_| format!("event field `{k}` must be a count"))
    };
    let phase = s("phase")?;
    let cause = s("cause")?;
    let precision = t
        .get::<Option<String>>("precision")
        .map_err(|e| e.to_string())?;
    let mem: Option<Table> = t.get("memory").map_err(|e| e.to_string())?;
    let m = |k: &str| -> u64 {
        mem.as_ref()
            .and_then(|m| m.get::<Option<u64>>(k).ok().flatten())
            .unwrap_or(0)
    };
    let memory = if mem
        .as_ref()
        .is_some_and(|m| m.contains_key("total").unwrap_or(false))
    {
        MemoryFigures::Device {
            used: m("used"),
            free: m("free"),
            total: m("total"),
        }
    } else {
        let limit = m("limit");
        MemoryFigures::Host {
            used: m("used"),
            peak: m("peak"),
            limit: (limit > 0).then_some(limit),
        }
    };
    Ok(OomEvent {
        phase: Phase::parse(&phase)
            .ok_or_else(|| format!("unknown phase `{phase}` ({})", Phase::NAMES))?,
        cause: OomCause::parse(&cause).ok_or_else(|| format!("unknown cause `{cause}`"))?,
        step: n("step")?,
        epoch: n("epoch")?,
        attempt: n("attempt")? as u32,
        batch_size: n("batch_size")? as usize,
        micro_batch: n("micro_batch")? as usize,
        requested: t.get::<Option<u64>>("requested").ok().flatten(),
        memory,
        pool: mem
            .as_ref()
            .is_some_and(|m| m.contains_key("pool_reserved").unwrap_or(false))
            .then(|| PoolFigures {
                reserved: m("pool_reserved"),
                used: m("pool_used"),
            }),
        precision: match precision {
            None => Precision::F32,
            Some(p) => Precision::parse(&p).ok_or_else(|| format!("unknown precision `{p}`"))?,
        },
        error: t
            .get::<Option<String>>("error")
            .ok()
            .flatten()
            .unwrap_or_default(),
        recompute: t
            .get::<Option<usize>>("recompute")
            .ok()
            .flatten()
            .unwrap_or(0),
        offload: t
            .get::<Option<bool>>("offload")
            .ok()
            .flatten()
            .unwrap_or(false),
        live: live_of(t),
        live_bytes: t
            .get::<Option<u64>>("live_bytes")
            .ok()
            .flatten()
            .unwrap_or(0),
        ranks: t
            .get::<Option<Vec<usize>>>("ranks")
            .ok()
            .flatten()
            .unwrap_or_default(),
    })
}

/// An event table's `live` list (absent: empty).
fn live_of(t: &Table) -> Vec<crate::run::LiveTensor> {
    let Ok(Some(list)) = t.get::<Option<Table>>("live") else {
        return Vec::new();
    };
    list.sequence_values::<Table>()
        .filter_map(|e| e.ok())
        .map(|e| crate::run::LiveTensor {
            name: e.get("name").unwrap_or_default(),
            part: e.get("part").unwrap_or_default(),
            bytes: e.get("bytes").unwrap_or_default(),
        })
        .collect()
}

/// A Lua function or policy table in the `on_oom` slot.
pub(crate) struct LuaPolicy {
    value: Value,
    lua: WeakLua,
}

impl LuaPolicy {
    pub(crate) fn new(lua: &Lua, value: Value) -> LuaPolicy {
        LuaPolicy {
            value,
            lua: lua.weak(),
        }
    }
}

impl OomPolicy for LuaPolicy {
    fn on_oom(&mut self, e: &OomEvent) -> Result<Option<Action>> {
        let lua = self.lua.upgrade();
        let (v, at) = call_hook(&self.value, "on_oom", event_table(&lua, e)?)?;
        parse_action(v, &at)
    }

    fn on_step(&mut self, s: &StepInfo) -> Result<Option<usize>> {
        let lua = self.lua.upgrade();
        let info = lua.create_table()?;
        info.set("step", s.step)?;
        info.set("micro_batch", s.micro_batch)?;
        info.set("batch_size", s.batch_size)?;
        info.set("clean_steps", s.clean_steps)?;
        info.set("peak", s.peak)?;
        info.set("limit", s.limit)?;
        let (v, at) = call_hook(&self.value, "on_step", info)?;
        match v {
            Value::Nil => Ok(None),
            Value::Table(t) => {
                let m: Option<i64> = t
                    .get("micro_batch")
                    .map_err(|e| Error::Script(format!("on_step at {at}: {e}")))?;
                match m {
                    Some(m) if m < 1 => Err(Error::Script(format!(
                        "on_step at {at}: micro_batch {m} must be at least 1"
                    ))),
                    m => Ok(m.map(|m| m as usize)),
                }
            }
            other => Err(Error::Script(format!(
                "on_step at {at}: returned {}, expected nil or {{ micro_batch = n }}",
                super::options::a_type(&other)
            ))),
        }
    }

    fn describe(&self) -> String {
        match &self.value {
            Value::Function(f) => format!("function at {}", defined_at(f)),
            _ => "policy table".into(),
        }
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
        assert_eq!(
            parse_action(v("'offload'"), "p.lua:1").unwrap(),
            Some(Action::Offload)
        );
        assert_eq!(
            parse_action(v("'recompute'"), "p.lua:1").unwrap(),
            Some(Action::Recompute(1))
        );
        assert_eq!(
            parse_action(v("{ action = 'recompute', every = 2 }"), "p.lua:1").unwrap(),
            Some(Action::Recompute(2))
        );
        let err = parse_action(v("{ action = 'recompute', every = 0 }"), "p.lua:3")
            .unwrap_err()
            .to_string();
        assert!(err.contains("every 0 must be at least 1"), "{err}");
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
        assert!(err.contains("returned an integer"), "{err}");
        let err = parse_action(v("{ micro_batch = 2 }"), "p.lua:3")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no `action`"), "{err}");
    }
}
