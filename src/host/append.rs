//! An append-only file that waits out a full disk: the run's records
//! (`metrics.jsonl`) and its TensorBoard events. An entry that cannot be
//! written (no space, an I/O error) is kept in memory, in order, with
//! whatever part of it reached the file taken back, and written before the
//! next entry once the disk has room again. Training goes on meanwhile, as
//! it does when a periodic checkpoint cannot be written.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The most bytes of entries kept waiting for room: past this the run stops
/// rather than drop any (about 200,000 records).
pub(crate) const MAX_WAITING: usize = 64 << 20;

pub(crate) struct Appender {
    path: PathBuf,
    file: File,
    /// Entries not written yet, oldest first.
    waiting: VecDeque<Vec<u8>>,
    waiting_bytes: usize,
    /// Why the oldest of them could not be written, while that lasts.
    failing: Option<String>,
}

/// What an append changed, for the warnings the caller prints.
#[derive(Debug, PartialEq)]
pub(crate) enum Outage {
    /// Written, as every entry before it.
    None,
    /// The first entry that could not be written: why.
    Began(String),
    /// Still waiting for room (told already).
    Goes,
    /// Room again: this many entries were written late.
    Ended(usize),
}

impl Appender {
    /// Opens `path` for appending, creating it.
    pub fn open(path: &Path) -> Result<Appender> {
        Ok(Appender {
            path: path.to_path_buf(),
            file: open(path).map_err(|e| Error::io(path, e))?,
            waiting: VecDeque::new(),
            waiting_bytes: 0,
            failing: None,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `entry` after the entries still waiting, if there is room;
    /// otherwise keeps it. An error only when more than [`MAX_WAITING`]
    /// bytes would wait.
    pub fn append(&mut self, entry: Vec<u8>) -> Result<Outage> {
        if self.waiting_bytes + entry.len() > MAX_WAITING {
            return Err(Error::io(
                &self.path,
                std::io::Error::other(format!(
                    "{} entries ({} MiB) waited for room on the disk and no more can wait: {}",
                    self.waiting.len(),
                    self.waiting_bytes >> 20,
                    self.failing.as_deref().unwrap_or("?")
                )),
            ));
        }
        self.waiting_bytes += entry.len();
        self.waiting.push_back(entry);
        Ok(self.drain())
    }

    /// Writes the entries still waiting; an error naming how many could
    /// not be written when the disk still has no room.
    pub fn finish(&mut self) -> Result<()> {
        self.drain();
        match &self.failing {
            None => Ok(()),
            Some(why) => Err(Error::io(
                &self.path,
                std::io::Error::other(format!(
                    "{} entries could not be written: {why}",
                    self.waiting.len()
                )),
            )),
        }
    }

    /// Writes what waits, oldest first, stopping at the first that fails.
    fn drain(&mut self) -> Outage {
        let was = self.failing.take();
        let late = self.waiting.len().saturating_sub(1);
        // After a failure the file is opened again: the failure may have
        // been the file's (it was moved or replaced), not the disk's.
        if was.is_some() {
            match open(&self.path) {
                Ok(f) => self.file = f,
                Err(e) => {
                    self.failing = Some(e.to_string());
                    return Outage::Goes;
                }
            }
        }
        while let Some(entry) = self.waiting.front() {
            if let Err(e) = write_whole(&mut self.file, entry) {
                self.failing = Some(e.to_string());
                return match was {
                    None => Outage::Began(e.to_string()),
                    Some(_) => Outage::Goes,
                };
            }
            self.waiting_bytes -= entry.len();
            self.waiting.pop_front();
        }
        match was {
            None => Outage::None,
            Some(_) => Outage::Ended(late),
        }
    }
}

fn open(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Writes all of `entry` or none of it: a write cut short (the disk filled
/// during it) is taken back, so that the file holds whole entries only.
fn write_whole(file: &mut File, entry: &[u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < entry.len() {
        let wrote = match file.write(&entry[done..]) {
            Ok(0) => Err(std::io::Error::from(ErrorKind::WriteZero)),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            other => other,
        };
        match wrote {
            Ok(n) => done += n,
            Err(e) => {
                if done > 0 {
                    let len = file.metadata()?.len();
                    file.set_len(len.saturating_sub(done as u64))?;
                }
                return Err(e);
            }
        }
    }
    Ok(())
}
