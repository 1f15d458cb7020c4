//! What a run shows and keeps: `metrics.jsonl` (one JSON object per line),
//! the progress bar, and printed lines that do not tear the bar.

use std::cell::RefCell;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value};

use crate::{Error, Result};

pub(crate) struct Output {
    metrics: RefCell<Option<(PathBuf, BufWriter<File>)>>,
    bar: RefCell<Option<ProgressBar>>,
    quiet: bool,
    start: Instant,
    /// Shown after the step and loss on the progress line (a failed reload).
    note: RefCell<Option<String>>,
}

impl Output {
    /// Writes into `out_dir`: a new run's folder, or, when `resuming`, a run
    /// folder whose `metrics.jsonl` the records are appended to. A new run
    /// never overwrites another's records.
    pub fn new(out_dir: Option<&Path>, quiet: bool, resuming: bool) -> Result<Self> {
        let metrics = match out_dir {
            None => None,
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
                let path = dir.join("metrics.jsonl");
                let held = std::fs::metadata(&path).is_ok_and(|m| m.len() > 0);
                if held && !resuming {
                    return Err(Error::Config(format!(
                        "--out {}: the folder holds a run (metrics.jsonl); continue it with --resume {} (or --resume auto), or choose another folder",
                        dir.display(),
                        dir.display()
                    )));
                }
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| Error::io(&path, e))?;
                Some((path, BufWriter::new(f)))
            }
        };
        Ok(Output {
            metrics: RefCell::new(metrics),
            bar: RefCell::new(None),
            quiet,
            start: Instant::now(),
            note: RefCell::new(None),
        })
    }

    /// Appends one record. Every record carries `event`, `step`, `epoch` and
    /// `time` (seconds since the host started).
    pub fn record(
        &self,
        event: &str,
        step: u64,
        epoch: u64,
        fields: Map<String, Value>,
    ) -> Result<()> {
        let mut m = self.metrics.borrow_mut();
        let Some((path, w)) = m.as_mut() else {
            return Ok(());
        };
        let mut rec = Map::new();
        rec.insert("event".into(), event.into());
        rec.insert("step".into(), step.into());
        rec.insert("epoch".into(), epoch.into());
        let t = (self.start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
        rec.insert("time".into(), t.into());
        for (k, v) in fields {
            rec.entry(k).or_insert(v);
        }
        let line =
            serde_json::to_string(&Value::Object(rec)).map_err(|e| Error::Data(e.to_string()))?;
        // Flushed per record: records are per epoch or per log call, and a
        // crash must not lose them.
        writeln!(w, "{line}")
            .and_then(|_| w.flush())
            .map_err(|e| Error::io(path.clone(), e))
    }

    /// Prints a line to stdout above the progress bar.
    pub fn line(&self, s: &str) {
        if self.quiet {
            return;
        }
        match self.bar.borrow().as_ref() {
            Some(bar) if !bar.is_hidden() => bar.suspend(|| println!("{s}")),
            _ => println!("{s}"),
        }
    }

    /// Prints a warning to stderr, above the progress bar, even when quiet:
    /// something was passed over that the user should know of.
    pub fn warn(&self, s: &str) {
        self.tell(&format!("taper: warning: {s}"));
    }

    /// Prints `s` to stderr, above the progress bar, even when quiet: a
    /// note on how the run differs from what it continues.
    pub fn tell(&self, s: &str) {
        match self.bar.borrow().as_ref() {
            Some(bar) if !bar.is_hidden() => bar.suspend(|| eprintln!("{s}")),
            _ => eprintln!("{s}"),
        }
    }

    /// A new bar for `len` steps, or a spinner when the length is unknown
    /// (hidden when quiet or stderr is no terminal).
    pub fn start_bar(&self, len: Option<usize>, prefix: String) {
        self.finish_bar();
        if self.quiet {
            return;
        }
        let (bar, template) = match len {
            Some(n) => (
                ProgressBar::new(n as u64),
                "{prefix} [{bar:30.cyan/blue}] {pos}/{len} {msg} {per_sec} eta {eta}",
            ),
            None => (
                ProgressBar::new_spinner(),
                "{prefix} {spinner} {pos} {msg} {per_sec}",
            ),
        };
        let style = ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(prefix);
        bar.enable_steady_tick(Duration::from_millis(250));
        *self.bar.borrow_mut() = Some(bar);
    }

    pub fn tick(&self, step: u64, loss: f64) {
        if let Some(bar) = self.bar.borrow().as_ref() {
            match self.note.borrow().as_deref() {
                Some(note) => bar.set_message(format!("step {step} loss {loss:.4} | {note}")),
                None => bar.set_message(format!("step {step} loss {loss:.4}")),
            }
            bar.inc(1);
        }
    }

    /// Sets or clears the note on the progress line.
    pub fn note(&self, note: Option<String>) {
        *self.note.borrow_mut() = note;
    }

    pub fn finish_bar(&self) {
        if let Some(bar) = self.bar.borrow_mut().take() {
            bar.finish_and_clear();
        }
    }

    pub fn metrics_path(&self) -> Option<PathBuf> {
        self.metrics.borrow().as_ref().map(|(p, _)| p.clone())
    }
}
