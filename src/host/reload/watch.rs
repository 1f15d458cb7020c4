//! Watching the recipe, the modules it required and the plugins it loaded.
//! The watcher thread only sends events; the run polls them at its safe
//! points (`safe_point`).

use std::path::{Path, PathBuf};

use mlua::Lua;

use super::watcher::{Changes, Watcher};
use crate::host::{state, HostState};

/// What is watched, and the changes behind the current reload request.
#[derive(Default)]
pub(crate) struct Watching {
    /// The recipe file and the name errors give it.
    pub recipe: Option<(PathBuf, String)>,
    /// Modules the recipe required (and plugins it loaded), as (name, file).
    pub modules: Vec<(String, PathBuf)>,
    pub watcher: Option<Watcher>,
    /// The changes behind the current reload request, and the run that asked.
    pub pending: Changes,
    pub at_run: usize,
}

/// Remembers a module the recipe required and watches it when watching.
pub(crate) fn watch_module(lua: &Lua, name: &str, path: &Path) {
    let host = state(lua);
    let mut rl = host.watch.borrow_mut();
    let Some(key) = super::watcher::key(path) else {
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
    let mut rl = host.watch.borrow_mut();
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
