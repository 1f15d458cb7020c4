//! The memory planner: from a model's parameter count, its optimizer and the
//! measured activation bytes per sample, the bytes a training step needs, and
//! the largest micro-batch that fits under a limit with a safety margin.

/// Bytes of one training step, by part.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// Heap in use before training (data, Lua, the model itself).
    pub resident: usize,
    pub parameters: usize,
    /// The gradient accumulator, one value per parameter. It exists only
    /// when a batch is split: a whole-batch step hands the backward's own
    /// gradients (counted in the activations' probe) to the optimizer.
    pub gradients: usize,
    /// Optimizer state (AdamW: two moments; SGD with momentum: one buffer).
    pub optimizer: usize,
    /// Activations and their gradients for one more sample in a micro-batch.
    pub per_sample: usize,
    /// Step memory that does not grow with the micro-batch.
    pub per_step: usize,
    /// The training batch the plan is for (0: unknown, never split).
    pub batch: usize,
}

impl Plan {
    /// The heap peak of a step with micro-batches of `micro`. Parameters are
    /// part of `resident`; optimizer state is counted until it exists.
    /// While one micro-batch's backward runs, the gradients of the earlier
    /// ones wait in the accumulator: one more gradient set than a whole-batch
    /// step holds.
    pub fn peak(&self, micro: usize, optimizer_allocated: bool) -> usize {
        let optimizer = if optimizer_allocated {
            0
        } else {
            self.optimizer
        };
        let accumulator = if micro < self.batch {
            self.gradients
        } else {
            0
        };
        self.resident + optimizer + accumulator + self.per_step + self.per_sample * micro
    }

    /// The largest micro-batch (at most the batch) whose peak stays under
    /// `limit * (1 - margin)`; None if not even 1 fits.
    pub fn max_micro(&self, limit: usize, margin: f64) -> Option<usize> {
        let batch = self.batch.max(1);
        if self.peak(batch, false) <= under(limit, margin) {
            return Some(batch);
        }
        self.micro_under(limit, margin).map(|m| m.clamp(1, batch))
    }

    /// The largest micro-batch of a split batch whose peak stays under
    /// `limit * (1 - margin)`, of any batch (a larger one later in a
    /// run); None if not even 1 fits.
    pub fn micro_under(&self, limit: usize, margin: f64) -> Option<usize> {
        let budget = under(limit, margin);
        let fixed = self.peak(0, false);
        if budget < fixed + self.per_sample {
            return None;
        }
        let m = (budget - fixed)
            .checked_div(self.per_sample)
            .unwrap_or(usize::MAX);
        Some(m.max(1))
    }
}

/// `limit * (1 - margin)`.
fn under(limit: usize, margin: f64) -> usize {
    (limit as f64 * (1.0 - margin)) as usize
}

/// Least-squares line through (samples, bytes): (per sample, intercept).
pub fn fit(points: &[(usize, usize)]) -> (usize, usize) {
    let (slope, intercept) = line(points);
    // A falling line is noise: flat, through the mean.
    let (slope, intercept) = if slope < 0.0 {
        let mx = points.iter().map(|p| p.0 as f64).sum::<f64>() / points.len() as f64;
        (0.0, intercept + slope * mx)
    } else {
        (slope, intercept)
    };
    (slope.round() as usize, intercept.max(0.0).round() as usize)
}

/// Least-squares line through points: (slope, intercept); a flat line
/// through the mean where the x values do not differ.
pub fn line(points: &[(usize, usize)]) -> (f64, f64) {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0 as f64).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1 as f64).sum::<f64>() / n;
    let sxy: f64 = points
        .iter()
        .map(|p| (p.0 as f64 - mx) * (p.1 as f64 - my))
        .sum();
    let sxx: f64 = points.iter().map(|p| (p.0 as f64 - mx).powi(2)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (slope, my - slope * mx)
}

/// `1.5 MiB`-style sizes for people.
pub fn human(bytes: usize) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1 << 20) as f64 {
        format!("{:.1} MiB", b / (1 << 20) as f64)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_lines_and_proposes_micro_batches() {
        assert_eq!(fit(&[(1, 150), (2, 250), (4, 450), (8, 850)]), (100, 50));
        let p = Plan {
            resident: 1000,
            parameters: 100,
            gradients: 100,
            optimizer: 200,
            per_sample: 50,
            per_step: 0,
            batch: 64,
        };
        // Split: the accumulator waits while a micro-batch runs.
        assert_eq!(p.peak(4, false), 1000 + 200 + 100 + 200);
        assert_eq!(p.peak(4, true), 1000 + 100 + 200);
        // Whole: no accumulator.
        assert_eq!(p.peak(64, false), 1000 + 200 + 64 * 50);
        // budget 2000 * 0.9 = 1800; fixed 1300; (1800 - 1300) / 50 = 10
        assert_eq!(p.max_micro(2000, 0.1), Some(10));
        let small = Plan { batch: 8, ..p };
        // 1000 + 200 + 8 * 50 = 1600 fits whole, without an accumulator.
        assert_eq!(small.max_micro(2000, 0.1), Some(8));
        // Budget 1575: the whole batch needs 1600; split, 1300 + 50 per
        // sample leaves room for 5.
        assert_eq!(small.max_micro(1750, 0.1), Some(5));
        assert_eq!(small.max_micro(1400, 0.1), None);
        // Past the batch: 1300 fixed while split, 2000 * 0.9 leaves 10.
        assert_eq!(small.micro_under(2000, 0.1), Some(10));
        assert_eq!(small.micro_under(1400, 0.1), None);
    }
}
