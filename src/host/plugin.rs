//! `taper.plugin.load(path, options)`: a native plugin as a Lua value that
//! fills the same slots as Lua code (`on_oom`, `schedule`, `data:map`). In a
//! slot the host calls it natively; from Lua (for example inside
//! `taper.policy.chain{...}`) its hooks are methods taking the same tables
//! a Lua policy gets.

use std::sync::Arc;

use mlua::{Lua, LuaSerdeExt, MetaMethod, Table, UserData, UserDataFields, UserDataMethods, Value};
use taper_plugin::{OomAction, OomEvent, StepInfo};

use super::oom_policy::Action;
use super::options::config_error;
use crate::error::lua_err;
use crate::memory::{OomCause, Phase};
use crate::plugins::{self, Instance};
use crate::{Error, Result};

#[derive(Clone)]
pub struct PluginHandle(pub Arc<Instance>);

/// The plugin in a Lua value, if it holds one.
pub(crate) fn of(v: &Value) -> Option<Arc<Instance>> {
    match v {
        Value::UserData(ud) => ud.borrow::<PluginHandle>().ok().map(|p| p.0.clone()),
        _ => None,
    }
}

fn load(lua: &Lua, (path, opts): (String, Value)) -> mlua::Result<PluginHandle> {
    let json: serde_json::Value = match opts {
        Value::Nil => serde_json::json!({}),
        v @ Value::Table(_) => lua
            .from_value(v)
            .map_err(|e| config_error(lua, format!("taper.plugin.load: options: {e}")))?,
        other => {
            return Err(config_error(
                lua,
                format!(
                    "taper.plugin.load: options must be a table, got a {}",
                    other.type_name()
                ),
            ))
        }
    };
    let lib = plugins::load(path.as_ref()).map_err(|e| config_error(lua, e))?;
    super::reload::watch_module(lua, &format!("plugin:{path}"), path.as_ref());
    let inst = Instance::create(lib, &json.to_string()).map_err(|e| config_error(lua, e))?;
    Ok(PluginHandle(Arc::new(inst)))
}

pub(crate) fn register(lua: &Lua, taper: &Table) -> mlua::Result<()> {
    let t = lua.create_table()?;
    t.set("load", lua.create_function(load)?)?;
    taper.set("plugin", t)
}

pub(crate) fn phase_code(p: Phase) -> u32 {
    match p {
        Phase::Forward => taper_plugin::PHASE_FORWARD,
        Phase::Backward => taper_plugin::PHASE_BACKWARD,
        Phase::Optimizer => taper_plugin::PHASE_OPTIMIZER,
    }
}

pub(crate) fn cause_code(c: OomCause) -> u32 {
    match c {
        OomCause::Device => taper_plugin::CAUSE_DEVICE,
        OomCause::Budget => taper_plugin::CAUSE_BUDGET,
        OomCause::Injected => taper_plugin::CAUSE_INJECTED,
    }
}

/// The event of `oom::event_table`, as the C struct.
pub(crate) fn event(phase: Phase, cause: OomCause, fields: &Table) -> mlua::Result<OomEvent> {
    let mem: Option<Table> = fields.get("memory")?;
    let m = |k: &str| -> mlua::Result<u64> {
        Ok(match &mem {
            Some(t) => t.get::<Option<u64>>(k)?.unwrap_or(0),
            None => 0,
        })
    };
    Ok(OomEvent {
        phase: phase_code(phase),
        cause: cause_code(cause),
        step: fields.get("step")?,
        epoch: fields.get("epoch")?,
        batch_size: fields.get("batch_size")?,
        micro_batch: fields.get("micro_batch")?,
        attempt: fields.get("attempt")?,
        _pad: 0,
        memory_used: m("used")?,
        memory_peak: m("peak")?,
        memory_limit: m("limit")?,
    })
}

/// A plugin's answer as the host's action (None: the default).
pub(crate) fn action(p: &Instance, a: OomAction) -> Result<Option<Action>> {
    Ok(match a.action {
        taper_plugin::ACTION_DEFAULT => None,
        taper_plugin::ACTION_SPLIT => Some(Action::Split(
            (a.micro_batch > 0).then_some(a.micro_batch as usize),
        )),
        taper_plugin::ACTION_RETRY => Some(Action::Retry),
        taper_plugin::ACTION_SKIP => Some(Action::Skip),
        taper_plugin::ACTION_STOP => Some(Action::Stop(format!(
            "the OOM policy plugin {} stopped the run",
            p.lib.name
        ))),
        other => {
            return Err(Error::Script(format!(
                "plugin {} ({}): on_oom returned unknown action {other}",
                p.lib.name,
                p.lib.path.display()
            )))
        }
    })
}

/// From Lua: the action as a Lua policy returns it.
fn action_value(lua: &Lua, p: &Instance, a: OomAction) -> mlua::Result<Value> {
    let t = lua.create_table()?;
    match action(p, a).map_err(lua_err)? {
        None => return Ok(Value::Nil),
        Some(Action::Split(m)) => {
            t.set("action", "split")?;
            t.set("micro_batch", m)?;
        }
        Some(Action::Retry) => t.set("action", "retry")?,
        Some(Action::Precision(p)) => {
            t.set("action", "precision")?;
            t.set("precision", p.name())?;
        }
        Some(Action::Skip) => t.set("action", "skip")?,
        Some(Action::Stop(_)) => {
            t.set("action", "stop")?;
            t.set("reason", format!("plugin {}", p.lib.name))?;
        }
    }
    Ok(Value::Table(t))
}

fn parse_phase(lua: &Lua, s: &str) -> mlua::Result<Phase> {
    [Phase::Forward, Phase::Backward, Phase::Optimizer]
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| config_error(lua, format!("plugin on_oom: unknown phase `{s}`")))
}

fn parse_cause(lua: &Lua, s: &str) -> mlua::Result<OomCause> {
    [OomCause::Device, OomCause::Budget, OomCause::Injected]
        .into_iter()
        .find(|c| c.name() == s)
        .ok_or_else(|| config_error(lua, format!("plugin on_oom: unknown cause `{s}`")))
}

impl UserData for PluginHandle {
    fn add_fields<F: UserDataFields<Self>>(f: &mut F) {
        f.add_field_method_get("name", |_, this| Ok(this.0.lib.name.clone()));
        f.add_field_method_get("version", |_, this| Ok(this.0.lib.version.clone()));
        f.add_field_method_get("kinds", |_, this| Ok(this.0.lib.kind_names()));
    }

    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            let l = &this.0.lib;
            Ok(format!(
                "taper.plugin({} {}: {})",
                l.name,
                l.version,
                l.kind_names().join(", ")
            ))
        });
        m.add_method("on_oom", |lua, this, ev: Table| {
            let phase = parse_phase(lua, &ev.get::<String>("phase")?)?;
            let cause = parse_cause(lua, &ev.get::<String>("cause")?)?;
            let a = this.0.on_oom(&event(phase, cause, &ev)?).map_err(lua_err)?;
            action_value(lua, &this.0, a)
        });
        m.add_method("on_step", |lua, this, info: Table| {
            let info = StepInfo {
                step: info.get("step")?,
                micro_batch: info.get("micro_batch")?,
                batch_size: info.get("batch_size")?,
                clean_steps: info.get("clean_steps")?,
            };
            match this.0.on_step(&info).map_err(lua_err)? {
                Some(p) if p.micro_batch > 0 => {
                    let t = lua.create_table()?;
                    t.set("micro_batch", p.micro_batch)?;
                    Ok(Value::Table(t))
                }
                _ => Ok(Value::Nil),
            }
        });
        m.add_method("plan", |lua, this, (step, epoch): (u64, Option<u64>)| {
            let p = this.0.schedule(step, epoch.unwrap_or(1)).map_err(lua_err)?;
            let t = lua.create_table()?;
            t.set("lr", p.lr)?;
            t.set("micro_batch", p.micro_batch)?;
            t.set("batch_size", p.batch_size)?;
            Ok(t)
        });
    }
}
