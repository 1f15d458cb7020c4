//! What the steps since the last `step` record measured: the per-step
//! records are means over this window (every `--log-every` steps).

use std::time::Instant;

#[derive(Debug, Clone)]
pub struct Window {
    /// Steps trained, and batches an OOM policy skipped.
    pub steps: u64,
    pub skipped: u64,
    /// Sum of batch-mean losses times batch sizes.
    pub loss_sum: f64,
    pub samples: u64,
    /// Target elements: tokens, for sequence models (else one per sample).
    pub tokens: u64,
    /// Seconds in the training step itself (forward, backward, update,
    /// recovery), and waiting for batches.
    pub step_seconds: f64,
    pub data_wait: f64,
    /// Highest heap peak of a step (counting allocator).
    pub mem_peak: usize,
    /// The micro-batch the last step ran with.
    pub micro_batch: usize,
    /// When the window opened: rates are over wall-clock time.
    pub since: Instant,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            steps: 0,
            skipped: 0,
            loss_sum: 0.0,
            samples: 0,
            tokens: 0,
            step_seconds: 0.0,
            data_wait: 0.0,
            mem_peak: 0,
            micro_batch: 0,
            since: Instant::now(),
        }
    }
}

/// A closed window, for a record.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowSummary {
    pub steps: u64,
    pub skipped: u64,
    /// Mean loss per sample; None when every batch was skipped.
    pub loss: Option<f64>,
    pub samples: u64,
    /// Mean samples per step.
    pub batch: f64,
    pub micro_batch: usize,
    pub step_seconds: f64,
    pub data_wait: f64,
    pub samples_per_s: f64,
    /// Tokens per second, for sequence models.
    pub tokens_per_s: Option<f64>,
    pub mem_peak: usize,
}

impl Window {
    /// Closes the window (and opens the next one).
    pub fn take(&mut self) -> WindowSummary {
        let w = std::mem::take(self);
        let secs = w.since.elapsed().as_secs_f64().max(1e-9);
        let steps = w.steps.max(1) as f64;
        WindowSummary {
            steps: w.steps,
            skipped: w.skipped,
            loss: (w.samples > 0).then(|| w.loss_sum / w.samples as f64),
            samples: w.samples,
            batch: w.samples as f64 / steps,
            micro_batch: w.micro_batch,
            step_seconds: w.step_seconds / (w.steps + w.skipped).max(1) as f64,
            data_wait: w.data_wait,
            samples_per_s: w.samples as f64 / secs,
            tokens_per_s: (w.tokens > w.samples).then(|| w.tokens as f64 / secs),
            mem_peak: w.mem_peak,
        }
    }
}
