//! Checkpoints in a run folder. Run `n` of a recipe keeps its newest
//! checkpoint under one name (`checkpoint.safetensors`, `checkpoint-2.safetensors`,
//! ...), so tools and people always find it there; the ones before it are
//! kept as `checkpoint.step<N>.safetensors` (hard links to the files that
//! were the newest), and `--resume` falls back to them when the newest one
//! is damaged.

use std::path::{Path, PathBuf};

use super::{err, read_meta, verify, with_suffix, CheckpointMeta};
use crate::{Error, Result};

/// The newest checkpoint's file name for run `id` (1-based).
pub fn file_name(id: usize) -> String {
    match id {
        1 => "checkpoint.safetensors".into(),
        n => format!("checkpoint-{n}.safetensors"),
    }
}

/// The checkpoint of run `id`'s best model (see [`crate::engine::best`]):
/// `best.safetensors`, `best-2.safetensors`, ...
pub fn best_file_name(id: usize) -> String {
    match id {
        1 => "best.safetensors".into(),
        n => format!("best-{n}.safetensors"),
    }
}

/// Whether a file in a run folder is one of taper's checkpoints (or its
/// sidecar, or a save's temporary file): the newest, the older ones kept,
/// or the best model's.
fn is_checkpoint_file(name: &str) -> bool {
    name.starts_with("checkpoint") || name.starts_with("best")
}

/// `checkpoint` for `.../checkpoint.safetensors`.
fn stem(latest: &Path) -> String {
    latest
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn archive_name(latest: &Path, step: u64) -> PathBuf {
    latest.with_file_name(format!("{}.step{step}.safetensors", stem(latest)))
}

/// The kept older checkpoints of `latest`, as (step in the name, path).
fn archives(latest: &Path) -> Vec<(u64, PathBuf)> {
    let dir = match latest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let prefix = format!("{}.step", stem(latest));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(u64, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix(&prefix)?.strip_suffix(".safetensors")?;
            Some((step.parse().ok()?, e.path()))
        })
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found
}

/// Before `latest` is replaced: keeps the file that is there now under its
/// step's name (a hard link, so no copy; a copy where links are refused).
/// A kill after this leaves two names for one checkpoint, which is harmless.
pub fn archive_latest(latest: &Path) -> Result<()> {
    let Ok(meta) = read_meta(latest) else {
        return Ok(());
    };
    let to = archive_name(latest, meta.step);
    for (from, to) in [
        (latest.to_path_buf(), to.clone()),
        (latest.with_extension("json"), to.with_extension("json")),
    ] {
        if !from.is_file() {
            continue;
        }
        let _ = std::fs::remove_file(&to);
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).map_err(|e| Error::io(&to, e))?;
        }
    }
    Ok(())
}

/// After `latest` was written: keeps it and the newest `keep - 1` older
/// checkpoints, removing the rest (and any at or after its step, left by a
/// run that was resumed from further back).
pub fn keep_newest(latest: &Path, keep: usize) -> Result<()> {
    let step = read_meta(latest)?.step;
    let older = archives(latest);
    let (newer, older): (Vec<_>, Vec<_>) = older.into_iter().partition(|(s, _)| *s >= step);
    let extra = older.into_iter().skip(keep.saturating_sub(1));
    for (_, p) in newer.into_iter().chain(extra) {
        std::fs::remove_file(&p).map_err(|e| Error::io(&p, e))?;
        let _ = std::fs::remove_file(p.with_extension("json"));
    }
    Ok(())
}

/// A save of `latest` met a full disk: removes the older checkpoints that
/// [`keep_newest`] would remove once it is written (beyond the newest
/// `keep - 1` kept ones, counting the one [`archive_latest`] just kept), so
/// that a disk holding exactly `keep` checkpoints can take the next. Never
/// `latest` itself, nor a kept one that stays. The paths removed.
pub fn make_room(latest: &Path, keep: usize) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    for (_, p) in archives(latest).into_iter().skip(keep.saturating_sub(1)) {
        std::fs::remove_file(&p).map_err(|e| Error::io(&p, e))?;
        let _ = std::fs::remove_file(p.with_extension("json"));
        removed.push(p);
    }
    Ok(removed)
}

/// Whether `e` is a full disk or an exhausted quota.
pub fn disk_full(e: &Error) -> bool {
    e.find(|e| {
        matches!(e, Error::Io { source, .. }
            if matches!(source.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded))
    })
}

/// The newest checkpoint of `latest`'s run that verifies: `latest` itself,
/// else the newest kept older one, with a note for each damaged one passed
/// over. None when the run has no checkpoint; an error when it has some but
/// none verifies. With `set_aside` (the run continues in this folder), the
/// damaged ones passed over get a `.damaged` suffix.
pub fn latest_valid(latest: &Path, set_aside: bool) -> Result<Option<(PathBuf, Vec<String>)>> {
    let mut candidates: Vec<(u64, PathBuf)> = archives(latest);
    if latest.is_file() {
        let step = read_meta(latest).map_or(u64::MAX, |m| m.step);
        candidates.push((step, latest.to_path_buf()));
    }
    // Newest first; the newest name first among equal steps.
    candidates.sort_by(|a, b| b.0.cmp(&a.0).then((b.1 == latest).cmp(&(a.1 == latest))));
    let mut notes = Vec::new();
    let mut damaged: Vec<PathBuf> = Vec::new();
    for (_, p) in &candidates {
        match verify(p) {
            Ok(_) => {
                // Out of the rotation (kept for a look), when taper will
                // write in this folder: else the next save would keep it as
                // an older checkpoint.
                for d in damaged.iter().filter(|_| set_aside) {
                    let to = with_suffix(d, ".damaged");
                    if std::fs::rename(d, &to).is_ok() {
                        notes.push(format!("{} renamed to {}", d.display(), to.display()));
                    }
                }
                return Ok(Some((p.clone(), notes)));
            }
            Err(e) => {
                notes.push(format!("{e}; passed over"));
                damaged.push(p.clone());
            }
        }
    }
    if candidates.is_empty() {
        return Ok(None);
    }
    Err(err(
        latest,
        format!(
            "no checkpoint of this run verifies:\n  {}",
            notes.join("\n  ")
        ),
    ))
}

/// What `--resume ARG` means: a checkpoint file, a run folder (its newest
/// checkpoint that verifies), or `auto`: the same in `out` when it holds
/// one, else none (a fresh start, for jobs that rerun the same command).
/// Returns the checkpoint and notes on damaged ones passed over.
pub fn resolve_resume(arg: &Path, out: Option<&Path>) -> Result<Option<(PathBuf, Vec<String>)>> {
    if arg.as_os_str() == "auto" {
        let Some(out) = out else {
            return Err(Error::Config(
                "--resume auto needs --out: the run folder to continue".into(),
            ));
        };
        return latest_valid(&out.join(file_name(1)), true);
    }
    if arg.is_dir() {
        let continued = out.is_none_or(|o| same_folder(o, arg));
        return latest_valid(&arg.join(file_name(1)), continued)?
            .map(Some)
            .ok_or_else(|| {
                Error::Config(format!(
                    "--resume {}: the folder holds no checkpoint.safetensors",
                    arg.display()
                ))
            });
    }
    if !arg.exists() {
        return Err(Error::Config(format!(
            "--resume {}: no such checkpoint file or run folder",
            arg.display()
        )));
    }
    verify(arg)?;
    Ok(Some((arg.to_path_buf(), Vec::new())))
}

fn same_folder(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Readies a run folder: removes `checkpoint*.tmp` and `best*.tmp` files a killed save left
/// (never renamed into place, so nothing refers to them), and rewrites
/// sidecars that disagree with their checkpoint. Returns how many files it
/// removed or rewrote.
pub fn tidy(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let removed = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            is_checkpoint_file(name) && name.ends_with(".tmp")
        })
        .filter(|p| std::fs::remove_file(p).is_ok())
        .count();
    removed + repair_sidecars(dir)
}

/// Rewrites the `.json` sidecar of each checkpoint in `dir` whose sidecar is
/// missing or describes another state (a kill between the two renames of a
/// save). The checkpoint's header is the truth. Returns how many.
pub fn repair_sidecars(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut fixed = 0;
    for p in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !(is_checkpoint_file(name) && name.ends_with(".safetensors")) {
            continue;
        }
        let Ok(meta) = read_meta(&p) else { continue };
        let side = p.with_extension("json");
        let agrees = std::fs::read_to_string(&side)
            .ok()
            .and_then(|s| serde_json::from_str::<CheckpointMeta>(&s).ok())
            .is_some_and(|m| m == meta);
        if !agrees && write_sidecar(&side, &meta).is_ok() {
            fixed += 1;
        }
    }
    fixed
}

fn write_sidecar(side: &Path, meta: &CheckpointMeta) -> Result<()> {
    let pretty = serde_json::to_string_pretty(meta).map_err(|e| err(side, e))? + "\n";
    let tmp = with_suffix(side, ".tmp");
    std::fs::write(&tmp, pretty).map_err(|e| Error::io(&tmp, e))?;
    super::publish(&tmp, side)
}
