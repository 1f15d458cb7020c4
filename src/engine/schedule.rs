//! Batch schedules: what each optimizer step uses (learning rate, micro-batch
//! size), as a function of the step and epoch. Built-in schedules are plain
//! data; a recipe can also give a Lua function (see `host::schedule`).

use serde::Deserialize;

/// The plan for one optimizer step. `None` keeps the current value.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepPlan {
    pub lr: Option<f64>,
    /// Samples per micro-batch; gradients of the micro-batches are
    /// accumulated into one update.
    pub micro_batch: Option<usize>,
    /// Samples in this step's batch (a batch-size schedule); None: the
    /// data's batch size.
    pub batch_size: Option<usize>,
}

/// A schedule: the plan for optimizer step `step` (0-based: the steps taken
/// before it) in epoch `epoch` (1-based).
pub trait Schedule {
    fn plan(&mut self, step: u64, epoch: u64) -> crate::Result<StepPlan>;
    fn describe(&self) -> String;
    /// Whether the options make a schedule (`Err`: which option, and why),
    /// checked where the recipe declares it rather than at the step that
    /// would first use a bad value.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The learning rate option `name` as the optimizers check theirs.
fn lr_ok(name: &str, lr: f64) -> Result<(), String> {
    super::optim::check_lr(lr).map_err(|why| format!("option `{name}`: {why}"))
}

/// `Err` naming the first of `counts` that is 0.
fn counts_ok(counts: &[(&str, Option<u64>)]) -> Result<(), String> {
    match counts.iter().find(|(_, v)| *v == Some(0)) {
        Some((name, _)) => Err(format!("option `{name}` must be at least 1")),
        None => Ok(()),
    }
}

/// `Some(v)` as `v`, `None` as `-` (unchanged), for descriptions.
fn or_dash<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

/// The same plan every step.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Constant {
    pub lr: Option<f64>,
    pub micro_batch: Option<usize>,
}

impl Schedule for Constant {
    fn plan(&mut self, _: u64, _: u64) -> crate::Result<StepPlan> {
        Ok(StepPlan {
            lr: self.lr,
            micro_batch: self.micro_batch,
            batch_size: None,
        })
    }
    fn describe(&self) -> String {
        format!(
            "constant lr {} micro_batch {}",
            or_dash(self.lr),
            or_dash(self.micro_batch)
        )
    }
    fn check(&self) -> Result<(), String> {
        self.lr.map_or(Ok(()), |lr| lr_ok("lr", lr))?;
        counts_ok(&[("micro_batch", self.micro_batch.map(|m| m as u64))])
    }
}

/// Linear warmup from 0 to `lr` over `warmup` steps, then cosine decay to
/// `min_lr` at step `total` (constant after).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmupCosine {
    pub lr: f64,
    #[serde(default)]
    pub warmup: u64,
    pub total: u64,
    #[serde(default)]
    pub min_lr: f64,
    pub micro_batch: Option<usize>,
}

impl WarmupCosine {
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup {
            return self.lr * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        let p = ((step - self.warmup) as f64 / span).min(1.0);
        self.min_lr + (self.lr - self.min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
    }
}

impl Schedule for WarmupCosine {
    fn plan(&mut self, step: u64, _: u64) -> crate::Result<StepPlan> {
        Ok(StepPlan {
            lr: Some(self.lr_at(step)),
            micro_batch: self.micro_batch,
            batch_size: None,
        })
    }
    fn describe(&self) -> String {
        format!(
            "warmup_cosine lr {} warmup {} total {} min_lr {}",
            self.lr, self.warmup, self.total, self.min_lr
        )
    }
    fn check(&self) -> Result<(), String> {
        lr_ok("lr", self.lr)?;
        lr_ok("min_lr", self.min_lr)?;
        counts_ok(&[
            ("total", Some(self.total)),
            ("micro_batch", self.micro_batch.map(|m| m as u64)),
        ])
    }
}

/// `lr * gamma^(epoch_or_step / every)`: step decay, counted in optimizer
/// steps or (with `per_epoch`) in finished epochs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepDecay {
    pub lr: f64,
    pub every: u64,
    pub gamma: f64,
    #[serde(default)]
    pub per_epoch: bool,
    pub micro_batch: Option<usize>,
}

impl Schedule for StepDecay {
    fn plan(&mut self, step: u64, epoch: u64) -> crate::Result<StepPlan> {
        let count = if self.per_epoch {
            epoch.saturating_sub(1)
        } else {
            step
        };
        let k = count / self.every.max(1);
        Ok(StepPlan {
            lr: Some(self.lr * self.gamma.powi(k as i32)),
            micro_batch: self.micro_batch,
            batch_size: None,
        })
    }
    fn describe(&self) -> String {
        format!(
            "step lr {} every {} gamma {}",
            self.lr, self.every, self.gamma
        )
    }
    fn check(&self) -> Result<(), String> {
        lr_ok("lr", self.lr)?;
        super::optim::in_range("gamma", self.gamma, 0.0, f64::INFINITY, false)?;
        counts_ok(&[
            ("every", Some(self.every)),
            ("micro_batch", self.micro_batch.map(|m| m as u64)),
        ])
    }
}

/// A batch-size ramp, as large-model trainers warm up: the batch grows
/// linearly from `from` to `to` samples over the first `steps` steps (then
/// stays at `to`), rounded down to a multiple of `multiple`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchRamp {
    pub from: usize,
    pub to: usize,
    pub steps: u64,
    #[serde(default = "one")]
    pub multiple: usize,
    pub lr: Option<f64>,
    pub micro_batch: Option<usize>,
}

fn one() -> usize {
    1
}

impl BatchRamp {
    pub fn size_at(&self, step: u64) -> usize {
        let p = (step.min(self.steps) as f64) / self.steps.max(1) as f64;
        let raw = self.from as f64 + (self.to as f64 - self.from as f64) * p;
        let m = self.multiple.max(1);
        (((raw as usize) / m) * m)
            .max(self.from.min(self.to))
            .max(1)
    }
}

impl Schedule for BatchRamp {
    fn plan(&mut self, step: u64, _: u64) -> crate::Result<StepPlan> {
        Ok(StepPlan {
            lr: self.lr,
            micro_batch: self.micro_batch,
            batch_size: Some(self.size_at(step)),
        })
    }
    fn describe(&self) -> String {
        format!(
            "batch_ramp from {} to {} over {} steps",
            self.from, self.to, self.steps
        )
    }
    fn check(&self) -> Result<(), String> {
        self.lr.map_or(Ok(()), |lr| lr_ok("lr", lr))?;
        counts_ok(&[
            ("from", Some(self.from as u64)),
            ("to", Some(self.to as u64)),
            ("steps", Some(self.steps)),
            ("multiple", Some(self.multiple as u64)),
            ("micro_batch", self.micro_batch.map(|m| m as u64)),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_cosine_shape() {
        let s = WarmupCosine {
            lr: 1.0,
            warmup: 10,
            total: 110,
            min_lr: 0.1,
            micro_batch: None,
        };
        assert!((s.lr_at(0) - 0.1).abs() < 1e-12);
        assert!((s.lr_at(9) - 1.0).abs() < 1e-12);
        assert!((s.lr_at(10) - 1.0).abs() < 1e-12);
        assert!((s.lr_at(60) - 0.55).abs() < 1e-12); // halfway: (1 + 0.1) / 2
        assert!((s.lr_at(110) - 0.1).abs() < 1e-12);
        assert!((s.lr_at(500) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn batch_ramp_grows_linearly_then_holds() {
        let r = BatchRamp {
            from: 8,
            to: 64,
            steps: 7,
            multiple: 8,
            lr: None,
            micro_batch: None,
        };
        let sizes: Vec<usize> = (0..10).map(|s| r.size_at(s)).collect();
        assert_eq!(sizes, vec![8, 16, 24, 32, 40, 48, 56, 64, 64, 64]);
    }

    #[test]
    fn step_decay_counts_steps_or_epochs() -> crate::Result<()> {
        let mut s = StepDecay {
            lr: 1.0,
            every: 2,
            gamma: 0.5,
            per_epoch: false,
            micro_batch: None,
        };
        assert_eq!(s.plan(3, 1)?.lr, Some(0.5));
        assert_eq!(s.plan(4, 1)?.lr, Some(0.25));
        s.per_epoch = true;
        assert_eq!(s.plan(100, 1)?.lr, Some(1.0));
        assert_eq!(s.plan(100, 3)?.lr, Some(0.5));
        Ok(())
    }
}
