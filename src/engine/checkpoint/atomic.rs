//! Files written whole or not at all: to a temporary file beside the
//! target, synced, renamed into place, and the folder synced, so a reader
//! (or a run resumed after a crash) never sees half a file.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

pub(super) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Writes `path`'s temporary file with `write` and syncs it; returns its
/// path. A write that failed (a full disk) leaves no partial file behind.
pub(super) fn written(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<PathBuf> {
    let tmp = with_suffix(path, ".tmp");
    let synced = plain_mode(path, &tmp)
        .and_then(|mode| write(&tmp).map(|()| mode))
        .and_then(|mode| {
            let f = std::fs::File::open(&tmp).map_err(|e| Error::io(&tmp, e))?;
            f.set_permissions(mode).map_err(|e| Error::io(&tmp, e))?;
            f.sync_all().map_err(|e| Error::io(&tmp, e))
        });
    match synced {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// The permissions `path` would have if written in place with
/// `File::create`: its own when it exists, otherwise what the umask gives a
/// new file, learnt by creating `tmp` (not truncated: a leftover of a killed
/// save is removed when the next run starts in the folder). safetensors
/// writes through a temporary file of mode 0600 and renames it
/// (safetensors#782), which would leave checkpoints and exports readable by
/// their owner alone, unlike every other file a run writes.
fn plain_mode(path: &Path, tmp: &Path) -> Result<std::fs::Permissions> {
    use std::os::unix::fs::PermissionsExt;
    let bits =
        |m: std::fs::Metadata| std::fs::Permissions::from_mode(m.permissions().mode() & 0o7777);
    if let Ok(m) = std::fs::metadata(path) {
        return Ok(bits(m));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(tmp)
        .and_then(|f| f.metadata())
        .map(bits)
        .map_err(|e| Error::io(tmp, e))
}

/// Writes a file through `write(tmp)`, synced, then renamed into place: a
/// reader never sees half of it (exports use it too).
pub fn write_atomically(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let tmp = written(path, write)?;
    publish(&tmp, path)
}

/// Renames a synced temporary file into place, then syncs the folder: the
/// rename is durable once the folder is synced too.
pub(super) fn publish(tmp: &Path, path: &Path) -> Result<()> {
    std::fs::rename(tmp, path).map_err(|e| Error::io(path, e))?;
    sync_folder(path)
}

fn sync_folder(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(dir, e))
}
