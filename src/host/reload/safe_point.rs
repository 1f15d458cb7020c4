//! The Rust side of the safe points in `safe_point.lua`: the epoch loop's
//! bookkeeping, polling the watcher, and remembering required modules.

use std::time::{Duration, Instant};

use mlua::{Function, Lua, Table, UserDataRef, Value};
use serde::Deserialize;
use serde_json::Map;

use crate::error::lua_err;
use crate::host::options::{config_error, decode};
use crate::host::run_state::finish_epoch;
use crate::host::run_state::RunHandle;
use crate::host::state;

const EPOCHS: &str = "taper.safe_point.epochs";
const RELOAD_POINT: &str = "taper.safe_point.reload_point";
const PRIVATE: &str = "taper.safe_point.host";

/// Loads the safe points and replaces `require` with the watching one.
pub(crate) fn register(lua: &Lua) -> mlua::Result<()> {
    let host = lua.create_table()?;
    host.set(
        "set_epochs",
        lua.create_function(|lua, (run, n): (UserDataRef<RunHandle>, mlua::Value)| {
            let n = match n {
                mlua::Value::Integer(n) if n >= 0 => n as u64,
                mlua::Value::Number(x) if x >= 0.0 && x.fract() == 0.0 && x < 1e15 => x as u64,
                other => {
                    return Err(crate::host::options::config_error(
                        lua,
                        format!(
                            "run:epochs: the number of epochs must be a whole number, 0 or more, got {}",
                            crate::host::options::brief(&other)
                        ),
                    ))
                }
            };
            run.get_mut()?.core.total_epochs = n;
            Ok(())
        })?,
    )?;
    host.set(
        "epoch_end",
        lua.create_function(|lua, run: UserDataRef<RunHandle>| epoch_end(lua, &run))?,
    )?;
    host.set(
        "epoch_begin",
        lua.create_function(|lua, (run, n): (UserDataRef<RunHandle>, u64)| {
            epoch_begin(lua, &run, n)
        })?,
    )?;
    host.set(
        "poll",
        lua.create_function(|lua, (run, opts): (UserDataRef<RunHandle>, Value)| {
            poll(lua, &run, opts)
        })?,
    )?;
    host.set(
        "watch_module",
        lua.create_function(|lua, (name, path): (String, String)| {
            // Lua's loader would read a FIFO or /dev/zero forever.
            super::script_file::read_script(path.as_ref())
                .map_err(|e| lua_err(crate::Error::Script(format!("require '{name}': {e}"))))?;
            super::watch::watch_module(lua, &name, path.as_ref());
            Ok(())
        })?,
    )?;
    let (epochs, reload_point, require): (Function, Function, Function) = lua
        .load(include_str!("safe_point.lua"))
        .set_name("=taper/safe_point.lua")
        .call(host.clone())?;
    lua.set_named_registry_value(EPOCHS, epochs)?;
    lua.set_named_registry_value(RELOAD_POINT, reload_point)?;
    lua.set_named_registry_value(PRIVATE, host)?;
    lua.globals().set("require", require)
}

/// `run.epochs` and `run.reload_point`: Lua functions, so that they can yield.
pub(crate) fn epochs_fn(lua: &Lua) -> mlua::Result<Function> {
    lua.named_registry_value(EPOCHS)
}
pub(crate) fn reload_point_fn(lua: &Lua) -> mlua::Result<Function> {
    lua.named_registry_value(RELOAD_POINT)
}

/// Marks `thread` as the running version: only it may yield at a safe point.
pub(crate) fn set_thread(lua: &Lua, thread: &mlua::Thread) -> mlua::Result<()> {
    let host: Table = lua.named_registry_value(PRIVATE)?;
    host.set("thread", thread.clone())
}

fn epoch_end(lua: &Lua, run: &RunHandle) -> mlua::Result<()> {
    let host = state(lua);
    // A version being tried does not close the epoch it re-enters.
    if host.reload.borrow().trial.is_some() {
        return Ok(());
    }
    finish_epoch(&host, &mut *run.get_mut()?).map_err(lua_err)
}

fn epoch_begin(lua: &Lua, run: &RunHandle, n: u64) -> mlua::Result<Option<u64>> {
    let host = state(lua);
    let mut r = run.get_mut()?;
    // Stopped early (now, or before the checkpoint it resumed from).
    if !host.opts.check_only && crate::host::best::stopped(&host, &mut r) {
        r.reenter = false;
        return Ok(None);
    }
    if std::mem::take(&mut r.reenter) && r.core.cursor.in_epoch {
        // A reload in the middle of an epoch: go on from the data cursor.
        r.core.cursor.skip_batches = r.core.cursor.steps as usize;
        r.core.cursor.skip_samples = r.core.cursor.samples as usize;
        return Ok(Some(r.core.cursor.epoch));
    }
    let next = r.core.cursor.epoch + 1;
    if host.opts.check_only || next > n {
        if !host.opts.check_only && r.core.cursor.epoch > n {
            // Resumed, or reloaded, with fewer epochs than it has trained:
            // the loop ends at once, which would otherwise say nothing.
            host.out.tell(&format!(
                "note: run {} has trained {} epochs, more than the {n} this loop asks for: it trains no more",
                r.id, r.core.cursor.epoch
            ));
        }
        return Ok(None);
    }
    r.core.begin_epoch();
    // On CUDA, the pool's high-water mark restarts with the epoch (a device
    // sync, once per epoch); the epoch record reports it.
    crate::memory::device::reset_pool_peak(r.core.trainer.device())
        .map_err(mlua::Error::external)?;
    Ok(Some(next))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PointOpts {
    /// Seconds to wait for a change when there is none yet.
    #[serde(default)]
    wait: f64,
}

/// What the safe point should do: `"commit"` (the first safe point of a new
/// version), `"reload"` (the watched files changed) or nothing.
fn poll(lua: &Lua, run: &RunHandle, opts: Value) -> mlua::Result<Option<&'static str>> {
    let o: PointOpts = decode(lua, "run:reload_point", opts)?;
    if !(o.wait.is_finite() && o.wait >= 0.0) {
        return Err(config_error(
            lua,
            format!(
                "run:reload_point: `wait` must be a number of seconds >= 0, got {}",
                o.wait
            ),
        ));
    }
    let host = state(lua);
    if host.reload.borrow().trial.is_some() {
        return Ok(Some("commit"));
    }
    if host.opts.check_only {
        return Ok(None);
    }
    let deadline = Instant::now() + Duration::from_secs_f64(o.wait);
    let (step, epoch, id) = {
        let r = run.get()?;
        (r.core.trainer.step, r.core.cursor.epoch, r.id)
    };
    loop {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        let changes = {
            let mut rl = host.watch.borrow_mut();
            let Some(w) = rl.watcher.as_mut() else {
                return Ok(None);
            };
            w.poll(left)
        };
        if !changes.unchanged.is_empty() {
            let mut f = Map::new();
            f.insert("run".into(), id.into());
            f.insert(
                "unchanged".into(),
                super::watch::shown(&changes.unchanged).into(),
            );
            host.out.record("watch", step, epoch, f).map_err(lua_err)?;
        }
        if !changes.changed.is_empty() {
            let mut rl = host.watch.borrow_mut();
            rl.pending = changes;
            rl.at_run = id;
            return Ok(Some("reload"));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        // A signal stops the wait: it is polled in slices, between which the
        // stop request is checked (a `wait` of an hour must not hold Ctrl-C
        // for that long). Only while waiting: an epoch's end, which does not
        // wait, leaves the stop to the next step as before.
        crate::run::interrupt::check().map_err(lua_err)?;
    }
}
