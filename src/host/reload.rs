//! Running a recipe as versions ("generations") of its scripts.
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

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use mlua::{Function, Lua, Table, Value};
use serde_json::{json, Map};

use super::adopt::Staged;
use super::run_state::RunState;
use super::{safe_point, HostState};
use crate::reload::{Changes, Watcher};
use crate::{Error, Result};

/// Reload bookkeeping, kept in [`HostState`].
#[derive(Default)]
pub(crate) struct ReloadState {
    /// The recipe file and the name errors give it.
    pub recipe: Option<(PathBuf, String)>,
    /// Modules the recipe required, as (name, file).
    pub modules: Vec<(String, PathBuf)>,
    pub watcher: Option<Watcher>,
    /// 0 for the version the run started with, +1 per applied reload.
    pub generation: u64,
    /// A new version being tried, until its first safe point.
    pub trial: Option<Vec<Staged>>,
    /// `taper.run{}` calls made by the running version so far.
    pub next_run: usize,
    /// The changes behind the current reload request, and the run that asked.
    pub pending: Changes,
    pub at_run: usize,
}

/// Remembers a module the recipe required and watches it when watching.
pub(crate) fn watch_module(lua: &Lua, name: &str, path: &Path) {
    let host = super::state(lua);
    let mut rl = host.reload.borrow_mut();
    let Some(key) = crate::reload::watcher::key(path) else {
        return;
    };
    if !rl.modules.iter().any(|(n, _)| n == name) {
        rl.modules.push((name.to_string(), key.clone()));
    }
    if let Some(w) = rl.watcher.as_mut() {
        if let Err(e) = w.watch(&key) {
            host.out.line(&format!("taper: {e}"));
        }
    }
}

/// Starts watching the recipe and its modules (once; a no-op without a
/// recipe file). A watcher that cannot start is reported, not fatal.
pub(crate) fn start_watching(host: &HostState) {
    let mut rl = host.reload.borrow_mut();
    if rl.watcher.is_some() || host.opts.check_only {
        return;
    }
    let Some((recipe, _)) = rl.recipe.clone() else {
        return;
    };
    let files = std::iter::once(recipe).chain(rl.modules.iter().map(|(_, p)| p.clone()));
    let started = Watcher::new().and_then(|mut w| {
        for f in files {
            w.watch(&f)?;
        }
        Ok(w)
    });
    match started {
        Ok(w) => {
            host.out.line(&format!(
                "watching {} for changes (applied at the next safe point)",
                shown(&w.files()).join(", ")
            ));
            rl.watcher = Some(w);
        }
        Err(e) => host.out.line(&format!("taper: not watching: {e}")),
    }
}

/// Paths as they are best shown: relative to the working folder when under it.
pub(crate) fn shown(paths: &[PathBuf]) -> Vec<String> {
    let cwd = std::env::current_dir().and_then(|d| d.canonicalize()).ok();
    paths
        .iter()
        .map(
            |p| match cwd.as_deref().and_then(|c| p.strip_prefix(c).ok()) {
                Some(rel) => rel.display().to_string(),
                None => p.display().to_string(),
            },
        )
        .collect()
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
    loop {
        let action: Option<String> = current.resume(arg)?;
        if !current.is_resumable() {
            return Ok(());
        }
        if action.as_deref() != Some("reload") {
            return Err(Error::Script(
                "the recipe yielded at its top level: coroutine.yield() belongs inside a coroutine the recipe creates".into(),
            ));
        }
        let asked = Instant::now();
        match try_version(lua, host) {
            Ok((new, env)) => {
                current = new;
                lua.set_named_registry_value(ENV, env)?;
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

/// Tries the new version up to its first safe point and commits it there.
/// On failure everything the try touched is put back.
fn try_version(
    lua: &Lua,
    host: &Rc<HostState>,
) -> std::result::Result<(mlua::Thread, Table), String> {
    let (recipe, modules, generation, next_run) = {
        let rl = host.reload.borrow();
        let Some(recipe) = rl.recipe.clone() else {
            return Err("no recipe file to reload".into());
        };
        (recipe, rl.modules.clone(), rl.generation, rl.next_run)
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
        rl.next_run = next_run;
    };
    // Every module is evaluated afresh: one that did not change may hold
    // values from one that did.
    for (n, _) in &modules {
        let _ = loaded.set(n.as_str(), Value::Nil);
    }
    {
        let mut rl = host.reload.borrow_mut();
        rl.trial = Some(Vec::new());
        rl.next_run = 0;
    }
    let _ = set_generation(lua, generation + 1);
    let result = run_trial(lua, host, &recipe).and_then(|thread| {
        let staged = host.reload.borrow_mut().trial.take().unwrap_or_default();
        super::adopt::commit(staged).map(|()| thread)
    });
    match result {
        Ok(thread) => {
            let mut rl = host.reload.borrow_mut();
            rl.generation = generation + 1;
            let hash = crate::engine::checkpoint::text_hash(&read(&recipe.0).unwrap_or_default());
            *host.recipe_hash.borrow_mut() = hash.clone();
            for r in host.runs.borrow().iter() {
                r.borrow_mut().core.recipe_hash = hash.clone();
            }
            Ok(thread)
        }
        Err(e) => {
            restore(host);
            Err(e)
        }
    }
}

fn read(path: &Path) -> std::result::Result<String, String> {
    crate::reload::read_script(path)
}

/// Runs the new version until it asks to commit at its first safe point.
fn run_trial(
    lua: &Lua,
    host: &HostState,
    (path, name): &(PathBuf, String),
) -> std::result::Result<(mlua::Thread, Table), String> {
    let src = read(path)?;
    let (thread, env) = load_generation(lua, name, &src).map_err(|e| message(&e.into()))?;
    let action: Option<String> = thread.resume(()).map_err(|e| message(&e.into()))?;
    if !thread.is_resumable() || action.as_deref() != Some("commit") {
        // It ran to its end without a safe point: whatever it did stands,
        // but there is no loop to hand the run to.
        let _ = host;
        return Err(
            "the new version reached no safe point (run:epochs or run:reload_point)".into(),
        );
    }
    Ok((thread, env))
}

/// An error as one message, without the Lua traceback.
pub(crate) fn message(e: &Error) -> String {
    let full = super::render_error(e);
    match full.find("\nstack traceback:") {
        Some(i) => full[..i].to_string(),
        None => full,
    }
}

/// One `reload` record and a printed line; a failure also shows on the
/// progress line until the next successful reload.
fn record(host: &HostState, asked: Instant, failure: Option<String>) -> Result<()> {
    let (generation, changes, at_run) = {
        let mut rl = host.reload.borrow_mut();
        (rl.generation, std::mem::take(&mut rl.pending), rl.at_run)
    };
    let run: Option<Rc<RefCell<RunState>>> =
        host.runs.borrow().get(at_run.saturating_sub(1)).cloned();
    let (step, epoch) = run
        .map(|r| {
            let r = r.borrow();
            (r.core.trainer.step, r.core.cursor.epoch)
        })
        .unwrap_or((0, 0));
    let files = shown(&changes.changed);
    let mut f = Map::new();
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
