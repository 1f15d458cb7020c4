//! One taper at a time in a run folder. A second one (a job started twice,
//! a requeued job whose first copy still runs) would append to the same
//! records and save over the same checkpoints. The lock is the kernel's
//! (`flock` on `metrics.jsonl`), so it goes when the process ends, however
//! it ends. The CLI takes it before it looks at the folder's checkpoints
//! (a resume may set a damaged one aside), and the run's output takes it
//! again: within one process, the folder's holders share one lock, which
//! goes with the last of them.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::{Error, Result};

/// The folders this process holds: the file locked, and how many holders.
static HELD: Mutex<Vec<(PathBuf, File, usize)>> = Mutex::new(Vec::new());

/// A hold on a run folder's lock; the last one dropped releases it.
pub struct FolderLock {
    key: PathBuf,
}

impl FolderLock {
    /// Takes `dir`'s lock (creating `metrics.jsonl`, empty, if missing), or
    /// joins this process's hold on it. Another process's hold is an error
    /// (exit 2). A file system that cannot lock (some network mounts) is
    /// told, not refused: then None.
    pub fn take(dir: &Path) -> Result<Option<FolderLock>> {
        let key = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = held.iter_mut().find(|h| h.0 == key) {
            h.2 += 1;
            return Ok(Some(FolderLock { key }));
        }
        let metrics = dir.join("metrics.jsonl");
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&metrics)
            .map_err(|e| Error::io(&metrics, e))?;
        match f.try_lock() {
            Ok(()) => {
                held.push((key.clone(), f, 1));
                Ok(Some(FolderLock { key }))
            }
            Err(TryLockError::WouldBlock) => Err(Error::Config(format!(
                "--out {}: another taper is running in this folder (it holds a lock on metrics.jsonl); let it end or stop it, or choose another folder",
                dir.display()
            ))),
            Err(TryLockError::Error(e)) => {
                crate::tell!(
                    "taper: warning: cannot lock {}: {e}; nothing keeps a second taper out of this folder",
                    metrics.display()
                );
                Ok(None)
            }
        }
    }
}

impl Drop for FolderLock {
    fn drop(&mut self) {
        let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = held.iter().position(|h| h.0 == self.key) {
            held[i].2 -= 1;
            if held[i].2 == 0 {
                // Closing the file releases the lock.
                held.swap_remove(i);
            }
        }
    }
}
