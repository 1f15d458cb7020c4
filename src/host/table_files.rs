//! Which files a table source reads: `path` as one file, a pattern
//! (`"data/train-*.parquet"`, as a Hugging Face dataset's shards are named)
//! or a list of either, read in order as one table; and whether they are
//! files that the constructor reads.

use std::path::PathBuf;

use mlua::Lua;
use serde::Deserialize;

use super::data_files::check_files;
use super::options::config_error;
use crate::data;

/// `path`: a file or pattern, or a list of them.
#[derive(Deserialize, Clone)]
#[serde(
    untagged,
    expecting = "a file, a pattern (`data/train-*.parquet`) or a list of them"
)]
pub(super) enum PathsOpt {
    One(PathBuf),
    Many(Vec<PathBuf>),
}

impl PathsOpt {
    /// The path as given, for messages about the whole table: the one
    /// file or pattern, or the first of a list.
    pub(super) fn given(&self) -> PathBuf {
        match self {
            PathsOpt::One(p) => p.clone(),
            PathsOpt::Many(ps) => ps.first().cloned().unwrap_or_default(),
        }
    }
}

/// The files `paths` names, in order: a pattern's matches sorted by name
/// (a path that exists is a file even if it holds `*`, `?` or `[`). A
/// pattern that matches nothing, a missing file and a file named twice are
/// errors naming it.
pub(super) fn expand(lua: &Lua, what: &str, paths: &PathsOpt) -> mlua::Result<Vec<PathBuf>> {
    let given = match paths {
        PathsOpt::One(p) => std::slice::from_ref(p),
        PathsOpt::Many(ps) => ps.as_slice(),
    };
    if given.is_empty() {
        return Err(config_error(lua, format!("{what}: `path` lists no files")));
    }
    let mut files: Vec<PathBuf> = Vec::new();
    for p in given {
        let text = p.to_string_lossy();
        if p.exists() || !text.contains(['*', '?', '[']) {
            check_files(lua, what, &[p])?;
            files.push(p.clone());
            continue;
        }
        let bad = |e: String| config_error(lua, format!("{what}: `path` {text:?}: {e}"));
        let matches = glob::glob(&text).map_err(|e| bad(format!("not a pattern: {e}")))?;
        let before = files.len();
        for m in matches {
            let m = m.map_err(|e| bad(e.to_string()))?;
            if m.is_file() {
                files.push(m);
            }
        }
        if files.len() == before {
            return Err(bad("matches no file".into()));
        }
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(twice) = files
        .iter()
        .find(|f| !seen.insert(f.canonicalize().unwrap_or_else(|_| f.to_path_buf())))
    {
        return Err(config_error(
            lua,
            format!(
                "{what}: {} is named twice in `path`: its rows would be read twice",
                twice.display()
            ),
        ));
    }
    Ok(files)
}

/// The kind of file `path` names by its extension: `Parquet`, `JSON`, or
/// None for a CSV file.
pub(super) fn kind(path: &std::path::Path) -> Option<&'static str> {
    match (data::is_parquet(path), data::is_json(path)) {
        (true, _) => Some("Parquet"),
        (_, true) => Some("JSON"),
        _ => None,
    }
}

/// An error unless every file of `files` is one that `what` reads:
/// `taper.data.parquet` Parquet files, `taper.data.json` JSON files, and
/// `taper.data.csv` any of them.
pub(super) fn check_kinds(lua: &Lua, what: &str, files: &[PathBuf]) -> mlua::Result<()> {
    let (want, file) = match what {
        "taper.data.parquet" => ("Parquet", "a `.parquet` file"),
        "taper.data.json" => ("JSON", "a `.jsonl`, `.ndjson` or `.json` file"),
        _ => return Ok(()),
    };
    for path in files {
        let instead = match kind(path) {
            Some(k) if k == want => continue,
            Some("Parquet") => "a Parquet file with taper.data.parquet",
            Some(_) => "a JSON file with taper.data.json",
            None => "a CSV file with taper.data.csv",
        };
        return Err(config_error(
            lua,
            format!("{what}: {}: not {file}; read {instead}", path.display()),
        ));
    }
    Ok(())
}
