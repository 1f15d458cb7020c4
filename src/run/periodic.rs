//! Periodic checkpoints: how often a run saves while it trains, so that a
//! killed run (SIGKILL, a lost machine) loses at most that much.

use std::time::{Duration, Instant};

/// Every so many steps, or every so much time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Every {
    Steps(u64),
    Time(Duration),
}

/// How often a run saves when neither `--checkpoint-every` nor the
/// recipe's `checkpoint_every` says: cheap (see `taper bench checkpoint`),
/// and at most five minutes of work lost to a kill.
pub const DEFAULT: Every = Every::Time(Duration::from_secs(300));

/// How many checkpoints of a run are kept (the newest and the one before,
/// which `--resume` falls back to when the newest is damaged).
pub const DEFAULT_KEEP: usize = 2;

/// `never`, or a period as [`Every::parse`] reads it.
pub fn parse_period(s: &str) -> Result<Option<Every>, String> {
    match s.trim() {
        "never" => Ok(None),
        s => Every::parse(s).map(Some),
    }
}

impl Every {
    /// `500` (steps), `90s`, `10m`, `1h`.
    pub fn parse(s: &str) -> Result<Every, String> {
        let s = s.trim();
        let bad = || format!("`{s}`: expected a number of steps (500) or a time (90s, 10m, 1h)");
        let (num, unit) = s.split_at(
            s.find(|c: char| !c.is_ascii_digit() && c != '.')
                .unwrap_or(s.len()),
        );
        let n: f64 = num.parse().map_err(|_| bad())?;
        if !(n.is_finite() && n > 0.0) {
            return Err(format!("`{s}`: must be positive"));
        }
        let secs = match unit {
            "" if n.fract() == 0.0 => return Ok(Every::Steps(n as u64)),
            "s" => n,
            "m" => n * 60.0,
            "h" => n * 3600.0,
            _ => return Err(bad()),
        };
        Ok(Every::Time(Duration::from_secs_f64(secs)))
    }
}

/// When the last periodic checkpoint was written.
#[derive(Debug, Clone, Copy)]
pub struct Periodic {
    pub every: Every,
    step: u64,
    at: Instant,
}

impl Periodic {
    /// Counting from now, at `step`.
    pub fn new(every: Every, step: u64) -> Periodic {
        Periodic {
            every,
            step,
            at: Instant::now(),
        }
    }

    /// Whether a checkpoint is due after step `step`.
    pub fn due(&self, step: u64) -> bool {
        match self.every {
            Every::Steps(n) => step >= self.step + n,
            Every::Time(d) => step > self.step && self.at.elapsed() >= d,
        }
    }

    /// A checkpoint was written at `step`.
    pub fn done(&mut self, step: u64) {
        self.step = step;
        self.at = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_steps_and_times_and_counts_from_the_last_save() {
        assert_eq!(Every::parse("500"), Ok(Every::Steps(500)));
        assert_eq!(
            Every::parse("90s"),
            Ok(Every::Time(Duration::from_secs(90)))
        );
        assert_eq!(
            Every::parse("1.5m"),
            Ok(Every::Time(Duration::from_secs(90)))
        );
        assert!(Every::parse("0").is_err());
        assert!(Every::parse("10 parsecs").is_err());
        assert!(Every::parse("2.5").is_err());
        let mut p = Periodic::new(Every::Steps(3), 10);
        assert!(!p.due(12));
        assert!(p.due(13));
        p.done(13);
        assert!(!p.due(15));
        let t = Periodic::new(Every::Time(Duration::ZERO), 4);
        assert!(!t.due(4), "no new step, nothing to save");
        assert!(t.due(5));
    }
}
