//! What a run shows and keeps: `metrics.jsonl` (one JSON object per line),
//! the progress bar, and printed lines that do not tear the bar.

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value};

use super::append::{Appender, Outage, MAX_WAITING};
use super::folder_lock::FolderLock;
use super::progress::{duration, Progress, PLAIN_EVERY};
use super::tensorboard::EventWriter;
use crate::run::window::WindowSummary;
use crate::{Error, Result};

/// A line to stdout. A closed stdout (`taper train ... | head`) is not a
/// reason to stop training: the line is dropped (records still go to
/// `metrics.jsonl`), where `println!` would panic.
fn say(s: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{s}");
}

/// The `time` of the last whole record in a metrics file (0 if none): read
/// from its tail, skipping a line a kill cut short. Only a regular file is
/// read (a link to `/dev/null` or `/dev/full` would never end).
fn last_time(path: &Path) -> f64 {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = File::open(path) else {
        return 0.0;
    };
    let len = match f.metadata() {
        Ok(m) if m.is_file() => m.len(),
        _ => return 0.0,
    };
    let from = len.saturating_sub(1 << 16);
    let mut tail = String::new();
    if f.seek(SeekFrom::Start(from)).is_err()
        || f.take(len - from).read_to_string(&mut tail).is_err()
    {
        return 0.0;
    }
    tail.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|r| r["time"].as_f64())
        .unwrap_or(0.0)
}

pub(crate) struct Output {
    metrics: RefCell<Option<Appender>>,
    /// The run folder's lock (see [`FolderLock`]).
    _lock: Option<FolderLock>,
    bar: RefCell<Option<ProgressBar>>,
    quiet: bool,
    start: Instant,
    /// Seconds the folder's earlier hosts ran (a resumed run's records go
    /// on from the last `time`, not from 0).
    before: f64,
    /// What the progress line says besides the bar.
    progress: RefCell<Progress>,
    /// `--tensorboard`: the records' scalars as TensorBoard events too.
    tensorboard: RefCell<Option<EventWriter>>,
}

/// Whether the records of `path` show a run that began (`taper.run{}` made,
/// a step taken), rather than only what a recipe recorded before it: its
/// config, a data note. Only a regular file is read.
fn a_run_began(path: &Path) -> bool {
    use std::io::BufRead;
    let Ok(f) = File::open(path) else {
        return true;
    };
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return true;
    }
    std::io::BufReader::new(f).lines().any(|l| {
        let Ok(line) = l else { return true };
        // A line cut short or not JSON: not a record to judge by.
        let event = serde_json::from_str::<Value>(&line).map(|r| r["event"].clone());
        !matches!(
            event.as_ref().map(|e| e.as_str()),
            Ok(Some("config")) | Err(_)
        )
    })
}

/// Why a new run may not write into `dir`, whose `metrics.jsonl` holds an
/// earlier run's records, and what to do instead: a run that stopped before
/// its first checkpoint (a recipe error, say) has nothing to resume from.
fn held_folder(dir: &Path) -> String {
    let checkpointed = std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("checkpoint") && name.ends_with(".safetensors")
        })
    });
    let d = dir.display();
    if checkpointed {
        format!("--out {d}: the folder holds a run (metrics.jsonl); continue it with --resume {d} (or --resume auto), or choose another folder")
    } else {
        format!("--out {d}: the folder holds an earlier run's records (metrics.jsonl) but no checkpoint; choose another folder, remove this one, or add --resume auto to start over in it (the records go on after the earlier ones)")
    }
}

impl Output {
    /// Writes into `out_dir`: a new run's folder, or, when `resuming`, a run
    /// folder whose `metrics.jsonl` the records are appended to. A new run
    /// never overwrites another's records.
    pub fn new(
        out_dir: Option<&Path>,
        quiet: bool,
        resuming: bool,
        tensorboard: bool,
    ) -> Result<Self> {
        let mut lock = None;
        let metrics = match out_dir {
            None => None,
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
                let path = dir.join("metrics.jsonl");
                lock = FolderLock::take(dir)?;
                let held = std::fs::metadata(&path).is_ok_and(|m| m.len() > 0);
                if held && !resuming {
                    // An attempt that stopped before its run began (a
                    // recipe error, fixed since) is no run to keep apart:
                    // this one's records follow its config.
                    if a_run_began(&path) {
                        return Err(Error::Config(held_folder(dir)));
                    }
                    crate::tell!(
                        "note: --out {}: the attempt before stopped before its run began; its records stay, this run's follow them",
                        dir.display()
                    );
                }
                Some(Appender::open(&path)?)
            }
        };
        let before = metrics.as_ref().map_or(0.0, |a| last_time(a.path()));
        let tensorboard = match out_dir.filter(|_| tensorboard) {
            Some(dir) => Some(EventWriter::create(dir)?),
            None => None,
        };
        Ok(Output {
            _lock: lock,
            tensorboard: RefCell::new(tensorboard),
            metrics: RefCell::new(metrics),
            bar: RefCell::new(None),
            quiet,
            start: Instant::now(),
            before,
            progress: RefCell::new(Progress::default()),
        })
    }

    /// Appends one record. Every record carries `event`, `step`, `epoch` and
    /// `time` (seconds since the run started, counting only the time its
    /// hosts ran: a resumed run goes on from its folder's last record).
    /// The run folder records go to (None: records are not written).
    pub fn dir(&self) -> Option<PathBuf> {
        let m = self.metrics.borrow();
        m.as_ref()
            .and_then(|a| a.path().parent().map(Path::to_path_buf))
    }

    pub fn record(
        &self,
        event: &str,
        step: u64,
        epoch: u64,
        fields: Map<String, Value>,
    ) -> Result<()> {
        let mut m = self.metrics.borrow_mut();
        let Some(records) = m.as_mut() else {
            return Ok(());
        };
        let mut rec = Map::new();
        rec.insert("event".into(), event.into());
        rec.insert("step".into(), step.into());
        rec.insert("epoch".into(), epoch.into());
        let t = ((self.before + self.start.elapsed().as_secs_f64()) * 1000.0).round() / 1000.0;
        rec.insert("time".into(), t.into());
        for (k, v) in fields {
            rec.entry(k).or_insert(v);
        }
        let events = match self.tensorboard.borrow_mut().as_mut() {
            Some(tb) => tb.record(event, step, &rec)?,
            None => Outage::None,
        };
        let mut line =
            serde_json::to_string(&Value::Object(rec)).map_err(|e| Error::Data(e.to_string()))?;
        line.push('\n');
        // One write per record (`taper bench records` measures it): a
        // crash must not lose them.
        let outage = records.append(line.into_bytes())?;
        let path = records.path().to_path_buf();
        drop(m);
        self.tell_outage("the records", &path, outage);
        if let Some(tb) = self.tensorboard.borrow().as_ref() {
            self.tell_outage("the TensorBoard events", tb.path(), events);
        }
        Ok(())
    }

    /// Warns when `what` (written to `path`) starts waiting for room on
    /// the disk, and when it is written again.
    fn tell_outage(&self, what: &str, path: &Path, outage: Outage) {
        match outage {
            Outage::None | Outage::Goes => {}
            Outage::Began(why) => self.warn(&format!(
                "{what} cannot be written to {}: {why}; training goes on, and they wait in memory (up to {} MiB) until the disk has room",
                path.display(),
                MAX_WAITING >> 20
            )),
            Outage::Ended(late) => self.warn(&format!(
                "{what} are written to {} again ({late} waited)",
                path.display()
            )),
        }
    }

    /// Writes what still waits for room on the disk (at the end of a
    /// run); an error when it cannot be written.
    pub fn finish_records(&self) -> Result<()> {
        // Both are tried; the records' error is the one told.
        let records = match self.metrics.borrow_mut().as_mut() {
            Some(records) => records.finish(),
            None => Ok(()),
        };
        let events = match self.tensorboard.borrow_mut().as_mut() {
            Some(tb) => tb.finish(),
            None => Ok(()),
        };
        records.and(events)
    }

    /// Prints a line to stdout above the progress bar.
    pub fn line(&self, s: &str) {
        if self.quiet {
            return;
        }
        match self.bar.borrow().as_ref() {
            Some(bar) if !bar.is_hidden() => bar.suspend(|| say(s)),
            _ => say(s),
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
            Some(bar) if !bar.is_hidden() => bar.suspend(|| crate::tell!("{s}")),
            _ => crate::tell!("{s}"),
        }
    }

    /// A new bar for `len` steps of an epoch with `later` epochs after it,
    /// or a spinner when the length is unknown (hidden when quiet; when
    /// stderr is no terminal, a plain line now and then instead).
    pub fn start_bar(&self, len: Option<usize>, later: u64, prefix: String) {
        self.finish_bar();
        if self.quiet {
            return;
        }
        self.progress.borrow_mut().epoch(len, later);
        let (bar, template) = match len {
            Some(n) => (
                ProgressBar::new(n as u64),
                "{prefix} [{bar:30.cyan/blue}] {pos}/{len} eta {eta} | {msg}",
            ),
            None => (
                ProgressBar::new_spinner(),
                "{prefix} {spinner} {pos} | {msg}",
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
        let Some(bar) = self.bar.borrow().clone() else {
            return;
        };
        bar.inc(1);
        let mut p = self.progress.borrow_mut();
        p.tick();
        let msg = p.message(step, loss, bar.position());
        bar.set_message(msg.clone());
        // No terminal to draw on: the same line, plainly, now and then.
        if bar.is_hidden() && p.last_plain.elapsed() >= PLAIN_EVERY {
            p.last_plain = Instant::now();
            let of = bar.length().map(|n| format!("/{n}")).unwrap_or_default();
            let eta = bar
                .length()
                .map(|_| format!(" eta {}", duration(bar.eta())))
                .unwrap_or_default();
            say(&format!(
                "{} {}{of}{eta} | {msg}",
                bar.prefix(),
                bar.position()
            ));
        }
    }

    /// A `step` record's throughput and memory, for the progress line.
    pub fn window(&self, w: &WindowSummary, host: Option<usize>, device: Option<(usize, usize)>) {
        self.progress.borrow_mut().window(w, host, device);
    }

    /// The last OOM action, for the progress line.
    pub fn oom(&self, action: String) {
        self.progress.borrow_mut().oom(action);
    }

    /// Sets or clears the note on the progress line.
    pub fn note(&self, note: Option<String>) {
        self.progress.borrow_mut().note = note;
    }

    pub fn finish_bar(&self) {
        if let Some(bar) = self.bar.borrow_mut().take() {
            bar.finish_and_clear();
        }
    }

    pub fn metrics_path(&self) -> Option<PathBuf> {
        self.metrics
            .borrow()
            .as_ref()
            .map(|a| a.path().to_path_buf())
    }
}
