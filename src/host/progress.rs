//! What the progress line says: step and loss, throughput with its unit,
//! memory, the last OOM action, and the time left in the whole run as well
//! as in the epoch. When stderr is no terminal (a log file, a batch job) the
//! same line is printed plainly every few seconds instead of drawn.

use std::time::{Duration, Instant};

use crate::memory::planner::human;
use crate::run::window::WindowSummary;

/// How often the plain line is printed when no bar can be drawn.
pub(crate) const PLAIN_EVERY: Duration = Duration::from_secs(10);

pub(crate) struct Progress {
    /// `1.23k samples/s` or `45.6k tokens/s`, from the last `step` record.
    rate: Option<String>,
    /// `mem 1.2 GiB (peak 1.5 GiB)`.
    memory: Option<String>,
    /// The last OOM action: `oom: split 32 -> 16`.
    oom: Option<String>,
    /// A failed reload, until the next one succeeds.
    pub note: Option<String>,
    /// Steps in the epoch's bar, and epochs after it.
    epoch_len: Option<usize>,
    later_epochs: u64,
    /// Steps ticked and since when, for the run's rate.
    ticks: u64,
    started: Instant,
    pub last_plain: Instant,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            rate: None,
            memory: None,
            oom: None,
            note: None,
            epoch_len: None,
            later_epochs: 0,
            ticks: 0,
            started: Instant::now(),
            last_plain: Instant::now(),
        }
    }
}

/// 1234.5 as `1.23k`, 12.3 as `12.3`.
pub(crate) fn si(x: f64) -> String {
    match x {
        x if x >= 1e6 => format!("{:.2}M", x / 1e6),
        x if x >= 1e3 => format!("{:.2}k", x / 1e3),
        x if x >= 10.0 => format!("{x:.0}"),
        x => format!("{x:.1}"),
    }
}

/// 75 s as `1m15s`, 2 h as `2h00m`.
pub(crate) fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

impl Progress {
    /// A new epoch's bar of `len` steps, with `later` epochs after it.
    pub fn epoch(&mut self, len: Option<usize>, later: u64) {
        self.epoch_len = len;
        self.later_epochs = later;
    }

    pub fn tick(&mut self) {
        self.ticks += 1;
    }

    /// From a `step` record's window: throughput, and memory (host with
    /// the counting allocator; `device` used and peak on a GPU).
    pub fn window(
        &mut self,
        w: &WindowSummary,
        host: Option<usize>,
        device: Option<(usize, usize)>,
    ) {
        self.rate = Some(match w.tokens_per_s {
            Some(t) => format!("{} tokens/s", si(t)),
            None => format!("{} samples/s", si(w.samples_per_s)),
        });
        self.memory = match (device, host) {
            (Some((used, peak)), _) => Some(format!("gpu {} (peak {})", human(used), human(peak))),
            (None, Some(now)) => Some(format!("mem {} (peak {})", human(now), human(w.mem_peak))),
            _ => None,
        };
    }

    pub fn oom(&mut self, action: String) {
        self.oom = Some(format!("oom: {action}"));
    }

    /// Time left in the run: the steps left in this epoch and the later
    /// ones, at the rate of the steps so far.
    pub fn run_eta(&self, pos: u64) -> Option<Duration> {
        let len = self.epoch_len? as u64;
        let left = len.saturating_sub(pos) + self.later_epochs * len;
        let rate = self.ticks as f64 / self.started.elapsed().as_secs_f64().max(1e-9);
        (self.ticks > 0).then(|| Duration::from_secs_f64(left as f64 / rate.max(1e-9)))
    }

    /// The message after the bar.
    pub fn message(&self, step: u64, loss: f64, pos: u64) -> String {
        let mut parts = vec![format!("step {step} loss {loss:.4}")];
        parts.extend(self.rate.clone());
        parts.extend(self.memory.clone());
        parts.extend(self.oom.clone());
        parts.extend(self.note.clone());
        if let Some(eta) = self.run_eta(pos).filter(|_| self.later_epochs > 0) {
            parts.push(format!("run eta {}", duration(eta)));
        }
        parts.join(" | ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_carries_units_memory_and_the_last_oom() {
        let mut p = Progress::default();
        p.epoch(Some(100), 2);
        let w = WindowSummary {
            steps: 10,
            skipped: 0,
            loss: Some(2.5),
            samples: 320,
            batch: 32.0,
            micro_batch: 16,
            step_seconds: 0.01,
            data_wait: 0.0,
            samples_per_s: 1234.0,
            tokens_per_s: Some(78_960.0),
            mem_peak: 3 << 20,
        };
        p.window(&w, Some(2 << 20), None);
        p.oom("split 32 -> 16".into());
        p.tick();
        let m = p.message(11, 2.5, 1);
        assert!(m.starts_with("step 11 loss 2.5000 | 78.96k tokens/s | mem 2.0 MiB (peak 3.0 MiB) | oom: split 32 -> 16 | run eta "), "{m}");
        assert_eq!(si(12.34), "12");
        assert_eq!(duration(Duration::from_secs(75)), "1m15s");
        assert_eq!(duration(Duration::from_secs(7200)), "2h00m");
    }
}
