//! A data file mapped read-only, and what it was when mapped: a file that
//! another process writes in place while the run reads it (a data script
//! run again on the same path) is told before it is read. Truncated, a
//! mapping faults past the file's new end (SIGBUS), which ends the process
//! with nothing saved; written over, the run would mix two data sets
//! without a word. A file replaced by a rename is no concern: the mapping
//! keeps the file it opened.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use memmap2::Mmap;

use crate::{Error, Result};

pub(crate) struct Mapped {
    path: PathBuf,
    file: File,
    map: Mmap,
    modified: Option<SystemTime>,
}

impl Mapped {
    pub fn open(path: &Path) -> Result<Mapped> {
        let err = |e: &dyn std::fmt::Display| Error::Data(format!("{}: {e}", path.display()));
        let file = File::open(path).map_err(|e| err(&e))?;
        let modified = file.metadata().map_err(|e| err(&e))?.modified().ok();
        // SAFETY: a read-only mapping of a file taper does not write; one
        // written in place by another process is caught by `check` before
        // each read (a truncation between the check and the read, a matter
        // of microseconds, would still fault).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| err(&format!("mmap: {e}")))?;
        Ok(Mapped {
            path: path.to_path_buf(),
            file,
            map,
            modified,
        })
    }

    /// The mapping itself (for advice such as `MADV_DONTNEED`).
    pub fn mmap(&self) -> &Mmap {
        &self.map
    }

    /// Whether the file is still as it was mapped (one `fstat`): an error
    /// that says how it changed when not.
    pub fn check(&self) -> Result<()> {
        let meta = self
            .file
            .metadata()
            .map_err(|e| Error::Data(format!("{}: {e}", self.path.display())))?;
        let (now, was) = (meta.len(), self.map.len() as u64);
        if now == was && meta.modified().ok() == self.modified {
            return Ok(());
        }
        let how = if now == was {
            format!("{now} bytes, as before")
        } else {
            format!("{now} bytes where it had {was}")
        };
        Err(Error::Data(format!(
            "{}: the file was written while the run read it ({how}): the run stops here; rerun with --resume to go on with the file as it is now",
            self.path.display()
        )))
    }
}

impl std::ops::Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}
