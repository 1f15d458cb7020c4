//! Hot reload, as one module: running a recipe as versions ("generations")
//! of its scripts. Watching the files is `watch` (and `watcher`, which has
//! no Lua); the safe points are `safe_point`; what a reloaded `taper.run{}`
//! keeps and swaps is `adopt`.
//!
//!
//! The recipe's chunk runs as a Lua coroutine. At a safe point (the end of
//! an epoch, or `run:reload_point()`), when watched files changed, it yields
//! to [`drive`]. The driver loads the new recipe in a fresh environment and
//! runs it as a second coroutine while the old one stays suspended. In the
//! new version `taper.run{}` returns the existing runs (see `adopt.rs`),
//! with the new strategies staged. When the new version reaches its first
//! safe point it yields "commit", and the driver swaps the staged strategies
//! in, drops the old coroutine, and lets the new one go on. If anything
//! fails before that (a syntax error, an error in its top level, a change a
//! reload may not make, a failing schedule or `on_reload`), the driver drops
//! the new coroutine and resumes the old one: the run goes on as before.
//!
//! A reloaded version can still fail after its first safe point, in its own
//! code (a typo in the loop body, a bad argument to `run:evaluate`). Then
//! the driver goes back to the version it replaced: that version's recipe
//! text and module values, kept at the commit, run again from the run's
//! state as a reload would (the data cursor and `run.state` carry over), and
//! the run goes on. Stops that are not the code's (a signal, `os.exit`,
//! divergence, an OOM, data and device errors) end the run as before.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::time::Instant;

use mlua::{Function, Lua, Table, Value};
use serde_json::{json, Map};

mod adopt;
mod back;
mod safe_point;
mod script_file;
pub(crate) mod watch;
mod watcher;

pub(crate) use adopt::adopt;
pub(crate) use safe_point::{epochs_fn, register as register_safe_points, reload_point_fn};
pub use script_file::{read_regular, read_script};
pub(crate) use watcher::DEBOUNCE;

use super::run_state::RunState;
use super::HostState;
use crate::{Error, Result};
use adopt::Staged;
use back::{go_back, the_versions_own, Kept};

/// Reload bookkeeping, kept in [`HostState`] (the watching is in
/// [`watch::Watching`]).
#[derive(Default)]
pub(crate) struct ReloadState {
    /// 0 for the version the run started with, +1 per applied reload.
    pub generation: u64,
    /// A new version being tried, until its first safe point.
    pub trial: Option<Vec<Staged>>,
    /// `taper.run{}` calls made by the running version so far.
    pub next_run: usize,
    /// The `config` record of the version on trial: written when it is
    /// applied, dropped when it is not (so that every `config` record with a
    /// `generation` is one that ran).
    pub trial_config: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Loads one version of the recipe as a coroutine with its own globals
/// (reading through to the shared ones, where `taper` lives).
fn load_generation(lua: &Lua, name: &str, src: &str) -> mlua::Result<(mlua::Thread, Table)> {
    let env = lua.create_table()?;
    let meta = lua.create_table()?;
    meta.set("__index", lua.globals())?;
    env.set_metatable(Some(meta))?;
    let f: Function = lua
        .load(src)
        .set_name(format!("@{name}"))
        .set_environment(env.clone())
        .into_function()?;
    let thread = lua.create_thread(f)?;
    safe_point::set_thread(lua, &thread)?;
    Ok((thread, env))
}

const ENV: &str = "taper.recipe_env";

/// The globals of the recipe version that runs (or ran last).
pub(crate) fn recipe_env(lua: &Lua) -> mlua::Result<Table> {
    lua.named_registry_value(ENV)
}

/// Which text a tried version runs.
enum Version<'a> {
    /// The recipe and its modules as saved now.
    Saved,
    /// One that ran before.
    Kept(&'a Kept),
}

/// A tried version that was committed: its coroutine and globals, its
/// recipe text, and the version it replaced.
struct Tried {
    thread: mlua::Thread,
    env: Table,
    src: String,
    replaced: Kept,
}

/// Runs a recipe to its end, applying reloads at its safe points.
pub(crate) fn drive(lua: &Lua, host: &Rc<HostState>, name: &str, src: &str) -> Result<()> {
    {
        let mut rl = host.reload.borrow_mut();
        rl.generation = 0;
        rl.next_run = host.runs.borrow().len();
    }
    set_generation(lua, 0)?;
    let (mut current, env) = load_generation(lua, name, src)?;
    lua.set_named_registry_value(ENV, env)?;
    let mut arg = Value::Nil;
    let mut running = src.to_string();
    // The version the running one replaced (none for the first, and none
    // after going back: that version ran without the failing one).
    let mut earlier: Option<Kept> = None;
    loop {
        let action: Option<String> = match current.resume(arg) {
            Ok(action) => action,
            Err(e) => {
                let e = Error::from(e);
                let Some(back) = earlier.take().filter(|_| the_versions_own(&e)) else {
                    return Err(e);
                };
                let tried = go_back(lua, host, &back, e)?;
                current = tried.thread;
                lua.set_named_registry_value(ENV, tried.env)?;
                running = tried.src;
                arg = Value::Boolean(true);
                lua.gc_collect()?;
                continue;
            }
        };
        if !current.is_resumable() {
            return Ok(());
        }
        if action.as_deref() != Some("reload") {
            return Err(Error::Script(
                "the recipe yielded at its top level: coroutine.yield() belongs inside a coroutine the recipe creates".into(),
            ));
        }
        let asked = Instant::now();
        match try_version(lua, host, Version::Saved, &running) {
            Ok(tried) => {
                current = tried.thread;
                lua.set_named_registry_value(ENV, tried.env)?;
                running = tried.src;
                earlier = Some(tried.replaced);
                arg = Value::Boolean(true);
                // The old version's iterators and batches go now.
                lua.gc_collect()?;
                record(host, asked, None)?;
            }
            Err(why) => {
                safe_point::set_thread(lua, &current)?;
                arg = Value::Boolean(false);
                record(host, asked, Some(why))?;
            }
        }
    }
}

fn set_generation(lua: &Lua, n: u64) -> mlua::Result<()> {
    let taper: Table = lua.globals().get("taper")?;
    taper.set("generation", n)
}

/// Tries a version up to its first safe point and commits it there: the
/// saved recipe (a reload), or a kept one (going back). `running` is the
/// text of the version that runs now, kept for going back to it.
/// On failure everything the try touched is put back.
fn try_version(
    lua: &Lua,
    host: &Rc<HostState>,
    version: Version,
    running: &str,
) -> std::result::Result<Tried, String> {
    let (recipe, modules) = {
        let w = host.watch.borrow();
        let Some(recipe) = w.recipe.clone() else {
            return Err("no recipe file to reload".into());
        };
        (recipe, w.modules.clone())
    };
    let (generation, next_run) = {
        let rl = host.reload.borrow();
        (rl.generation, rl.next_run)
    };
    let loaded: Table = lua
        .globals()
        .get::<Table>("package")
        .and_then(|p| p.get("loaded"))
        .map_err(|e| e.to_string())?;
    let saved: Vec<(String, Value)> = modules
        .iter()
        .map(|(n, _)| (n.clone(), loaded.get(n.as_str()).unwrap_or(Value::Nil)))
        .collect();
    let config_called = host.config_called.get();
    let restore = |host: &HostState| {
        host.config_called.set(config_called);
        for (n, v) in &saved {
            let _ = loaded.set(n.as_str(), v.clone());
        }
        let _ = set_generation(lua, generation);
        let mut rl = host.reload.borrow_mut();
        rl.trial = None;
        rl.trial_config = None;
        rl.next_run = next_run;
    };
    // Every module is evaluated afresh: one that did not change may hold
    // values from one that did. A kept version has its own values back.
    for (n, _) in &modules {
        let _ = loaded.set(n.as_str(), Value::Nil);
    }
    if let Version::Kept(kept) = &version {
        for (n, v) in &kept.loaded {
            let _ = loaded.set(n.as_str(), v.clone());
        }
    }
    {
        let mut rl = host.reload.borrow_mut();
        rl.trial = Some(Vec::new());
        rl.next_run = 0;
    }
    let _ = set_generation(lua, generation + 1);
    let src = match &version {
        Version::Saved => read(&recipe.0),
        Version::Kept(kept) => Ok(kept.src.clone()),
    };
    let result = src.and_then(|src| {
        let (thread, env) = run_trial(lua, &recipe.1, &src)?;
        let staged = host.reload.borrow_mut().trial.take().unwrap_or_default();
        let notes = adopt::commit(staged)?;
        for note in notes {
            host.out.tell(&note);
        }
        Ok((thread, env, src))
    });
    match result {
        Ok((thread, env, src)) => {
            let mut rl = host.reload.borrow_mut();
            rl.generation = generation + 1;
            if let Some(fields) = rl.trial_config.take() {
                host.out
                    .record("config", 0, 0, fields)
                    .map_err(|e| e.to_string())?;
            }
            let hash = crate::engine::checkpoint::text_hash(&src);
            *host.recipe_hash.borrow_mut() = hash.clone();
            for r in host.runs.borrow().iter() {
                r.borrow_mut().core.recipe_hash = hash.clone();
            }
            let replaced = Kept {
                generation,
                src: running.to_string(),
                loaded: saved,
            };
            Ok(Tried {
                thread,
                env,
                src,
                replaced,
            })
        }
        Err(e) => {
            restore(host);
            Err(e)
        }
    }
}

fn read(path: &Path) -> std::result::Result<String, String> {
    read_script(path)
}

/// Runs the new version until it asks to commit at its first safe point.
fn run_trial(
    lua: &Lua,
    name: &str,
    src: &str,
) -> std::result::Result<(mlua::Thread, Table), String> {
    let (thread, env) =
        load_generation(lua, name, src).map_err(|e| super::render::message(&e.into()))?;
    let action: Option<String> = thread
        .resume(())
        .map_err(|e| super::render::message(&e.into()))?;
    if !thread.is_resumable() || action.as_deref() != Some("commit") {
        // It ran to its end without a safe point: whatever it did stands,
        // but there is no loop to hand the run to.
        return Err(
            "the new version reached no safe point (run:epochs or run:reload_point)".into(),
        );
    }
    Ok((thread, env))
}

/// One `reload` record and a printed line; a failure also shows on the
/// progress line until the next successful reload.
fn record(host: &HostState, asked: Instant, failure: Option<String>) -> Result<()> {
    record_with(host, asked, failure, Map::new())
}

/// [`record`] with further fields (going back: `failed`, `back_to` and
/// `error`, printed by the caller).
fn record_with(
    host: &HostState,
    asked: Instant,
    failure: Option<String>,
    mut f: Map<String, serde_json::Value>,
) -> Result<()> {
    let back = f.contains_key("back_to");
    let generation = host.reload.borrow().generation;
    let (changes, at_run) = {
        let mut w = host.watch.borrow_mut();
        (std::mem::take(&mut w.pending), w.at_run)
    };
    let run: Option<Rc<RefCell<RunState>>> =
        host.runs.borrow().get(at_run.saturating_sub(1)).cloned();
    let (step, epoch) = run
        .map(|r| {
            let r = r.borrow();
            (r.core.trainer.step, r.core.cursor.epoch)
        })
        .unwrap_or((0, 0));
    let files = watch::shown(&changes.changed);
    f.insert("generation".into(), generation.into());
    f.insert("files".into(), files.clone().into());
    f.insert("ok".into(), failure.is_none().into());
    let pause = asked.elapsed().as_secs_f64() * 1000.0;
    f.insert("pause_ms".into(), json!((pause * 1000.0).round() / 1000.0));
    if let Some(since) = changes.since {
        let latency = since.elapsed().as_secs_f64() * 1000.0;
        f.insert(
            "latency_ms".into(),
            json!((latency * 1000.0).round() / 1000.0),
        );
    }
    match &failure {
        None if back => {}
        None => {
            host.out.note(None);
            host.out.line(&format!(
                "reloaded {} (generation {generation}, step {step}, {pause:.0} ms)",
                files.join(", ")
            ));
        }
        Some(why) => {
            f.insert("error".into(), why.clone().into());
            let head = why.lines().next().unwrap_or_default();
            host.out.note(Some(format!("reload failed: {head}")));
            host.out.line(&format!(
                "reload of {} failed, generation {generation} keeps running:\n  {why}",
                files.join(", ")
            ));
        }
    }
    host.out.record("reload", step, epoch, f)
}
