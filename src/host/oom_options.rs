//! `taper.run{...}`'s OOM options (`on_oom`, `mem_limit`, with the host's
//! `--mem-limit` and `--inject-oom`) as the run core's recovery, and
//! `run:inject_oom{...}`'s.

use mlua::{Lua, Table, Value};
use serde::Deserialize;

use super::oom_policy::LuaPolicy;
use super::options::config_error;
use crate::memory::inject::Injection;
use crate::plugins::PluginPolicy;
use crate::run::{OomPolicy, Recovery};

/// `on_oom = function(event) ... end | { on_oom = ..., on_step = ... }`,
/// `mem_limit = "512MiB" | bytes`, and the host's `--mem-limit`/`--inject-oom`;
/// with neither limit, the host's: the container's or the machine's (and true).
pub(super) fn run_oom(
    lua: &Lua,
    host: &super::HostState,
    opts: &Table,
) -> mlua::Result<(Recovery, bool)> {
    let policy = policy_of(lua, opts.get::<Value>("on_oom")?)
        .map_err(|e| config_error(lua, format!("taper.run: option `on_oom` {e}")))?;
    let budget = match opts.get::<Value>("mem_limit")? {
        // On a GPU, --mem-limit is the ballast's job (real device OOMs).
        Value::Nil if host.ballast.is_some() => None,
        Value::Nil => host
            .opts
            .mem_limit
            .or(host.budget.as_ref().map(|c| c.budget)),
        Value::Integer(n) if n > 0 => Some(n as usize),
        Value::String(s) => Some(
            crate::memory::inject::parse_size(&s.to_str()?)
                .map_err(|e| config_error(lua, format!("taper.run: option `mem_limit`: {e}")))?,
        ),
        other => {
            return Err(config_error(
                lua,
                format!(
                    "taper.run: option `mem_limit` must be a size like \"512MiB\", got {}",
                    super::options::brief(&other)
                ),
            ))
        }
    };
    if budget.is_some() && !crate::memory::HostMemory::is_counting() {
        return Err(config_error(
            lua,
            "taper.run: `mem_limit` needs taper::memory::CountingAlloc as the global allocator",
        ));
    }
    let injections = host
        .opts
        .inject_oom
        .iter()
        .map(|s| {
            Injection::parse(s).map_err(|e| config_error(lua, format!("--inject-oom {s}: {e}")))
        })
        .collect::<mlua::Result<Vec<_>>>()?;
    let from_host = host.budget.is_some()
        && host.opts.mem_limit.is_none()
        && opts.get::<Value>("mem_limit")?.is_nil();
    let recovery = Recovery {
        injections,
        budget,
        policy,
        ..Default::default()
    };
    Ok((recovery, from_host))
}

/// The policy in an `on_oom` option: nil, a Lua function or policy table,
/// or a plugin.
fn policy_of(lua: &Lua, v: Value) -> std::result::Result<Option<Box<dyn OomPolicy>>, String> {
    match v {
        Value::Nil => Ok(None),
        v @ (Value::Function(_) | Value::Table(_)) => Ok(Some(Box::new(LuaPolicy::new(lua, v)))),
        v => match super::plugin::of(&v) {
            Some(p) => {
                p.lib
                    .require(taper_plugin::KIND_OOM_POLICY)
                    .map_err(|e| format!(": {e}"))?;
                Ok(Some(Box::new(PluginPolicy(p))))
            }
            None => Err(format!(
                "must be a function(event), a policy table or a plugin, got {}",
                super::options::a_type(&v)
            )),
        },
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InjectOpts {
    pub step: u64,
    #[serde(default = "forward")]
    pub phase: crate::memory::Phase,
    #[serde(default = "once")]
    pub times: u32,
    /// Only this rank of a data-parallel run (None: every rank).
    #[serde(default)]
    pub rank: Option<usize>,
}

fn forward() -> crate::memory::Phase {
    crate::memory::Phase::Forward
}
fn once() -> u32 {
    1
}
