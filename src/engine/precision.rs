//! Mixed precision: forward and backward in bf16 or f16 over a working copy
//! of the parameters, while the optimizer updates f32 master weights (and
//! keeps f32 state). f16 adds dynamic loss scaling with PyTorch's
//! `GradScaler` semantics. The loss itself is computed in f32 (as
//! `torch.autocast` does for `cross_entropy`).

use std::collections::{HashMap, HashSet};

use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor, Var};
use serde::Deserialize;

use super::params::ParamStore;

/// The type forward and backward run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum Precision {
    #[default]
    #[serde(rename = "f32")]
    F32,
    #[serde(rename = "bf16")]
    Bf16,
    #[serde(rename = "f16")]
    F16,
}

impl Precision {
    pub const NAMES: &'static str = "f32, bf16, f16";

    pub fn parse(s: &str) -> Option<Precision> {
        match s {
            "f32" => Some(Precision::F32),
            "bf16" => Some(Precision::Bf16),
            "f16" => Some(Precision::F16),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }

    /// The working dtype; `None` for f32, which trains the masters directly.
    pub fn low(self) -> Option<DType> {
        match self {
            Precision::F32 => None,
            Precision::Bf16 => Some(DType::BF16),
            Precision::F16 => Some(DType::F16),
        }
    }
}

/// Dynamic loss scaling, as `torch.amp.GradScaler` with its defaults: start
/// at 2^16; after a step whose gradients hold an inf or NaN, skip the update
/// and halve the scale; after 2000 clean steps in a row, double it.
#[derive(Debug, Clone, PartialEq)]
pub struct GradScaler {
    pub scale: f64,
    clean: u32,
    /// Updates skipped so far.
    pub skipped: u64,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler {
            scale: 65536.0,
            clean: 0,
            skipped: 0,
        }
    }
}

impl GradScaler {
    pub const GROWTH_INTERVAL: u32 = 2000;

    /// Records a step's outcome; returns whether the update may go ahead.
    pub fn update(&mut self, finite: bool) -> bool {
        if !finite {
            self.scale *= 0.5;
            self.clean = 0;
            self.skipped += 1;
            return false;
        }
        self.clean += 1;
        if self.clean == Self::GROWTH_INTERVAL {
            self.scale *= 2.0;
            self.clean = 0;
        }
        true
    }
}

/// The low-precision working copy of a model's parameters.
pub struct Mixed {
    pub precision: Precision,
    pub work: ParamStore,
    pub scaler: Option<GradScaler>,
}

impl Mixed {
    /// A working copy of `master` in `precision` (which must not be f32).
    pub fn new(master: &ParamStore, precision: Precision) -> Result<Mixed> {
        let Some(dtype) = precision.low() else {
            candle_core::bail!("mixed precision needs bf16 or f16")
        };
        Ok(Mixed {
            precision,
            work: master.cast(dtype)?,
            scaler: (precision == Precision::F16).then(GradScaler::default),
        })
    }

    /// The dtype of the working copy.
    pub fn work_dtype(&self) -> DType {
        self.precision.low().unwrap_or(DType::F32)
    }

    /// The factor the loss is multiplied by before backward.
    pub fn loss_scale(&self) -> f64 {
        self.scaler.as_ref().map_or(1.0, |s| s.scale)
    }

    /// The f32 gradients of the masters from the working copy's (scaled)
    /// gradients, and whether they are all finite. With a scaler, one
    /// device-to-host read decides that.
    pub fn master_grads(
        &self,
        masters: &[(String, Var)],
        mut work: GradStore,
    ) -> Result<(GradStore, bool)> {
        let by_name: HashMap<String, Var> = self.work.vars().into_iter().collect();
        let inv = 1.0 / self.loss_scale();
        let mut out = GradStore::default();
        let mut total: Option<Tensor> = None;
        for (name, master) in masters {
            let Some(g) = by_name.get(name).and_then(|w| work.remove(w)) else {
                continue;
            };
            let g = g.to_dtype(master.dtype())?;
            let g = if inv != 1.0 { (g * inv)? } else { g };
            if self.scaler.is_some() {
                let s = g.sum_all()?.to_dtype(DType::F32)?;
                total = Some(match total {
                    Some(t) => (t + s)?,
                    None => s,
                });
            }
            out.insert(master, g);
        }
        let finite = match total {
            Some(t) => t.to_scalar::<f32>()?.is_finite(),
            None => true,
        };
        Ok((out, finite))
    }

    /// The working copy's gradients keyed by their masters, as they are
    /// (for `Optimizer::step_mixed`, which reads them in their dtype). Only
    /// without loss scaling: a scaled gradient needs unscaling and a
    /// finiteness check first (`master_grads`).
    pub fn low_grads(&self, masters: &[(String, Var)], mut work: GradStore) -> GradStore {
        let by_name: HashMap<String, Var> = self.work.vars().into_iter().collect();
        let mut out = GradStore::default();
        for (name, master) in masters {
            if let Some(g) = by_name.get(name).and_then(|w| work.remove(w)) {
                out.insert(master, g);
            }
        }
        out
    }

    /// The working copy's variables by name.
    pub fn work_vars(&self) -> HashMap<String, Var> {
        self.work.vars().into_iter().collect()
    }

    /// Copies the masters, rounded, into the working copy.
    pub fn sync(&self, masters: &[(String, Var)]) -> Result<()> {
        self.sync_except(masters, &HashSet::new())
    }

    /// [`Mixed::sync`] but for the names in `done`, whose working copies
    /// the update already wrote.
    pub fn sync_except(&self, masters: &[(String, Var)], done: &HashSet<String>) -> Result<()> {
        let by_name: HashMap<String, Var> = self.work.vars().into_iter().collect();
        for (name, master) in masters {
            if done.contains(name) {
                continue;
            }
            if let Some(w) = by_name.get(name) {
                w.set(&master.as_tensor().to_dtype(w.dtype())?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scaler_halves_on_overflow_and_doubles_after_2000_clean_steps() {
        let mut s = GradScaler::default();
        assert_eq!(s.scale, 65536.0);
        assert!(!s.update(false));
        assert_eq!((s.scale, s.skipped), (32768.0, 1));
        for _ in 0..1999 {
            assert!(s.update(true));
        }
        assert_eq!(s.scale, 32768.0);
        assert!(s.update(true));
        assert_eq!(s.scale, 65536.0);
        // An overflow resets the count of clean steps.
        for _ in 0..1500 {
            s.update(true);
        }
        s.update(false);
        for _ in 0..1999 {
            s.update(true);
        }
        assert_eq!((s.scale, s.skipped), (32768.0, 2));
    }

    #[test]
    fn precision_names_parse() {
        for p in [Precision::F32, Precision::Bf16, Precision::F16] {
            assert_eq!(Precision::parse(p.name()), Some(p));
        }
        assert_eq!(Precision::parse("fp8"), None);
    }
}
