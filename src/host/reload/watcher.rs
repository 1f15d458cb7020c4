//! Watching a recipe's files: a debounced watcher over their parent folders
//! (editors save by writing a temporary file and renaming it over the old
//! one), filtered by content hash so that a save that changes nothing does
//! not count.
//!
//! The debouncer's thread only sends events into a channel. Reading files,
//! hashing and deciding happen on the run's thread, at its safe points.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use notify_debouncer_full::notify::{RecommendedWatcher, RecursiveMode};
use notify_debouncer_full::{new_debouncer, DebounceEventResult, Debouncer, RecommendedCache};

use crate::engine::checkpoint::text_hash;

/// How long the file system must be quiet before a burst of events is sent.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// What the watched files did since the last look.
#[derive(Debug, Default, Clone)]
pub struct Changes {
    /// Files whose content differs from the last version seen.
    pub changed: Vec<PathBuf>,
    /// Files that were saved with the same content (not counted).
    pub unchanged: Vec<PathBuf>,
    /// When the earliest event of `changed` happened (the save).
    pub since: Option<Instant>,
}

pub struct Watcher {
    debouncer: Debouncer<RecommendedWatcher, RecommendedCache>,
    events: Receiver<DebounceEventResult>,
    dirs: HashSet<PathBuf>,
    /// Watched file (parent folder canonicalized) -> hash of the last content seen.
    files: HashMap<PathBuf, String>,
}

impl Watcher {
    pub fn new() -> Result<Watcher, String> {
        let (tx, events) = channel();
        let debouncer =
            new_debouncer(DEBOUNCE, None, tx).map_err(|e| format!("cannot watch files: {e}"))?;
        Ok(Watcher {
            debouncer,
            events,
            dirs: HashSet::new(),
            files: HashMap::new(),
        })
    }

    /// Starts watching `path` (through its parent folder), remembering its
    /// current content. Watching a file twice is harmless.
    pub fn watch(&mut self, path: &Path) -> Result<(), String> {
        let key = key(path).ok_or_else(|| format!("cannot watch {}", path.display()))?;
        if self.files.contains_key(&key) {
            return Ok(());
        }
        let dir = key.parent().map(Path::to_path_buf).unwrap_or_default();
        if self.dirs.insert(dir.clone()) {
            self.debouncer
                .watch(&dir, RecursiveMode::NonRecursive)
                .map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
        }
        let hash = content_hash(&key).unwrap_or_default();
        self.files.insert(key, hash);
        Ok(())
    }

    /// The watched files, sorted.
    pub fn files(&self) -> Vec<PathBuf> {
        let set: BTreeSet<_> = self.files.keys().cloned().collect();
        set.into_iter().collect()
    }

    /// Collects what happened to the watched files, waiting up to `wait`
    /// for the first event when none has arrived. A file that is missing
    /// (mid-rename) is looked at again on its next event.
    pub fn poll(&mut self, wait: Duration) -> Changes {
        let mut out = Changes::default();
        let mut seen: BTreeSet<PathBuf> = BTreeSet::new();
        let first = match self.events.try_recv() {
            Ok(batch) => Some(batch),
            Err(_) if wait.is_zero() => None,
            Err(_) => self.events.recv_timeout(wait).ok(),
        };
        if let Some(batch) = first {
            self.take(batch, &mut seen, &mut out);
            while let Ok(batch) = self.events.try_recv() {
                self.take(batch, &mut seen, &mut out);
            }
        }
        out
    }

    fn take(
        &mut self,
        batch: DebounceEventResult,
        seen: &mut BTreeSet<PathBuf>,
        out: &mut Changes,
    ) {
        let Ok(events) = batch else {
            return;
        };
        for ev in events {
            // Reads (ours included, when hashing) are not saves.
            let kind = ev.event.kind;
            if !(kind.is_create() || kind.is_modify() || kind.is_remove()) {
                continue;
            }
            for p in &ev.event.paths {
                let Some(k) = key(p) else { continue };
                let Some(old) = self.files.get(&k) else {
                    continue;
                };
                let Some(new) = content_hash(&k) else {
                    continue;
                };
                if !seen.insert(k.clone()) {
                    if out.changed.contains(&k) {
                        out.since = earliest(out.since, ev.time);
                    }
                    continue;
                }
                if *old == new {
                    out.unchanged.push(k);
                } else {
                    self.files.insert(k.clone(), new);
                    out.since = earliest(out.since, ev.time);
                    out.changed.push(k);
                }
            }
        }
    }
}

fn earliest(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// A file's identity: its canonical parent folder plus its name, which stays
/// the same when an editor replaces the file by renaming another over it.
pub fn key(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Some(parent.canonicalize().ok()?.join(name))
}

/// The hash of a watched file's text. A file that became something other
/// than a regular file hashes to its error, so that the reload is tried and
/// fails with that error instead of reading it.
fn content_hash(path: &Path) -> Option<String> {
    // Plugins are watched too: bytes, and a cap that fits a shared library.
    match super::read_regular(path, 1 << 30) {
        Ok(bytes) => Some(text_hash(&String::from_utf8_lossy(&bytes))),
        Err(e) if path.exists() => Some(text_hash(&e)),
        Err(_) => None,
    }
}
