//! `taper.plugin.load(path, options)`: a native plugin as a Lua value that
//! fills the same slots as Lua code (`on_oom`, `schedule`, `data:map`). In a
//! slot the host calls it natively; from Lua (for example inside
//! `taper.policy.chain{...}`) its hooks are methods taking the same tables
//! a Lua policy gets.

use std::sync::Arc;

use mlua::{Lua, LuaSerdeExt, MetaMethod, Table, UserData, UserDataFields, UserDataMethods, Value};
use taper_plugin::StepInfo;

use super::options::config_error;
use crate::error::lua_err;
use crate::plugins::{self, Instance, PluginPolicy};
use crate::run::{Action, OomPolicy};

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
                    "taper.plugin.load: options must be a table, got {}",
                    super::options::a_type(&other)
                ),
            ))
        }
    };
    let lib = plugins::load(path.as_ref()).map_err(|e| config_error(lua, e))?;
    super::reload::watch::watch_module(lua, &format!("plugin:{path}"), path.as_ref());
    let inst = Instance::create(lib, &json.to_string()).map_err(|e| config_error(lua, e))?;
    Ok(PluginHandle(Arc::new(inst)))
}

pub(crate) fn register(lua: &Lua, taper: &Table) -> mlua::Result<()> {
    let t = lua.create_table()?;
    t.set("load", lua.create_function(load)?)?;
    taper.set("plugin", t)
}

/// From Lua: the action as a Lua policy returns it.
fn action_value(lua: &Lua, p: &Instance, action: Option<Action>) -> mlua::Result<Value> {
    let t = lua.create_table()?;
    match action {
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
        Some(Action::Recompute(n)) => {
            t.set("action", "recompute")?;
            t.set("every", n)?;
        }
        Some(Action::Offload) => t.set("action", "offload")?,
        Some(Action::Skip) => t.set("action", "skip")?,
        Some(Action::Stop(_)) => {
            t.set("action", "stop")?;
            t.set("reason", format!("plugin {}", p.lib.name))?;
        }
    }
    Ok(Value::Table(t))
}

impl UserData for PluginHandle {
    fn add_fields<F: UserDataFields<Self>>(f: &mut F) {
        f.add_field_method_get("name", |_, this| Ok(this.0.lib.name.clone()));
        f.add_field_method_get("version", |_, this| Ok(this.0.lib.version.clone()));
        f.add_field_method_get("kinds", |_, this| Ok(this.0.lib.kind_names()));
    }

    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        super::members::unknown_is_an_error(m, "Plugin");
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
            let ev = super::oom_policy::event_of_table(&ev)
                .map_err(|e| config_error(lua, format!("plugin on_oom: {e}")))?;
            let a = PluginPolicy(this.0.clone()).on_oom(&ev).map_err(lua_err)?;
            action_value(lua, &this.0, a)
        });
        m.add_method("on_step", |lua, this, info: Table| {
            let info = StepInfo {
                step: info.get("step")?,
                micro_batch: info.get("micro_batch")?,
                batch_size: info.get("batch_size")?,
                clean_steps: info.get("clean_steps")?,
                peak: info.get::<Option<u64>>("peak")?.unwrap_or(0),
                limit: info.get::<Option<u64>>("limit")?.unwrap_or(0),
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
