//! A taper plugin in two slots: an OOM policy and a micro-batch schedule.
//!
//! It plans micro-batches of `ceiling` samples (at most), halves the size on
//! an OOM, and remembers both the largest micro-batch that ran clean and the
//! smallest that ran out of memory. After `after` clean steps it grows back,
//! doubling, but never to or past `margin` times the smallest size that
//! failed, so that it does not oscillate around the limit.
//!
//! ```lua
//! local smart = taper.plugin.load("target/release/libtaper_adaptive_batch.so", { ceiling = 512 })
//! local run = taper.run{ ..., on_oom = smart, schedule = smart }
//! ```

use taper_plugin::{
    OomAction, OomEvent, Plan, Plugin, StepInfo, ACTION_STOP, KIND_OOM_POLICY, KIND_SCHEDULE,
};

struct AdaptiveBatch {
    /// The micro-batch the schedule plans.
    current: u64,
    ceiling: u64,
    after: u64,
    margin: f64,
    /// Largest micro-batch that completed a step.
    fitted: u64,
    /// Smallest micro-batch that ran out of memory.
    failed: Option<u64>,
    /// Clean steps since the last OOM or growth.
    calm: u64,
}

fn field(cfg: &serde_json::Value, key: &str) -> Result<Option<f64>, String> {
    match cfg.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| format!("option `{key}` must be a number, got {v}")),
    }
}

impl Plugin for AdaptiveBatch {
    const KINDS: u32 = KIND_OOM_POLICY | KIND_SCHEDULE;

    fn create(config_json: &str) -> Result<Self, String> {
        let cfg: serde_json::Value =
            serde_json::from_str(config_json).map_err(|e| format!("bad options: {e}"))?;
        if let Some(obj) = cfg.as_object() {
            for k in obj.keys() {
                if !["ceiling", "after", "margin"].contains(&k.as_str()) {
                    return Err(format!(
                        "unknown option `{k}` (expected ceiling, after, margin)"
                    ));
                }
            }
        }
        let ceiling = field(&cfg, "ceiling")?.unwrap_or(1024.0);
        let margin = field(&cfg, "margin")?.unwrap_or(0.75);
        if ceiling < 1.0 || !(0.0..=1.0).contains(&margin) {
            return Err(format!(
                "ceiling must be at least 1 (got {ceiling}) and margin within 0..1 (got {margin})"
            ));
        }
        Ok(AdaptiveBatch {
            current: ceiling as u64,
            ceiling: ceiling as u64,
            after: field(&cfg, "after")?.unwrap_or(50.0) as u64,
            margin,
            fitted: 0,
            failed: None,
            calm: 0,
        })
    }

    fn on_oom(&mut self, ev: &OomEvent) -> Result<OomAction, String> {
        let m = ev.micro_batch;
        self.failed = Some(self.failed.map_or(m, |f| f.min(m)));
        self.calm = 0;
        if m <= 1 {
            return Ok(OomAction::of(ACTION_STOP));
        }
        // Back to the largest size known to fit, if it is below this one.
        let next = if self.fitted > 0 && self.fitted < m {
            self.fitted
        } else {
            m / 2
        };
        self.current = next;
        Ok(OomAction::split(next))
    }

    fn on_step(&mut self, info: &StepInfo, plan: &mut Plan) -> Result<(), String> {
        self.fitted = self.fitted.max(info.micro_batch);
        self.calm += 1;
        if self.calm < self.after || info.micro_batch >= info.batch_size {
            return Ok(());
        }
        let mut target = (info.micro_batch * 2)
            .min(info.batch_size)
            .min(self.ceiling);
        if let Some(f) = self.failed {
            if target >= f {
                target = ((f as f64) * self.margin) as u64;
            }
        }
        if target > info.micro_batch {
            self.calm = 0;
            self.current = target;
            plan.micro_batch = target;
        }
        Ok(())
    }

    fn schedule(&mut self, _step: u64, _epoch: u64, plan: &mut Plan) -> Result<(), String> {
        plan.micro_batch = self.current;
        Ok(())
    }
}

taper_plugin::export!(AdaptiveBatch, name = "adaptive-batch");
