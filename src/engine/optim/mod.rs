//! Optimizers with PyTorch semantics. taper owns their state (candle's AdamW
//! keeps its moments private) so that checkpoints can save and restore it.

mod adamw;
mod clip;
pub mod offload;
mod sgd;

pub use adamw::{AdamW, MIN_8BIT};
pub use clip::{clip_grad_norm, clip_scale, grad_norm, scale_grads, ClipScale};
pub use sgd::Sgd;

use std::collections::{HashMap, HashSet};

use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor, Var};
use serde::Deserialize;

/// What a recipe asked for; the run turns it into an [`Optimizer`].
#[derive(Debug, Clone)]
pub enum OptimSpec {
    AdamW(AdamWConfig),
    Sgd(SgdConfig),
}

impl OptimSpec {
    pub fn build(&self) -> Box<dyn Optimizer> {
        match self {
            OptimSpec::AdamW(c) => Box::new(AdamW::new(c.clone())),
            OptimSpec::Sgd(c) => Box::new(Sgd::new(c.clone())),
        }
    }
    /// The configured learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            OptimSpec::AdamW(c) => c.lr,
            OptimSpec::Sgd(c) => c.lr,
        }
    }

    /// Same optimizer and hyperparameters, except perhaps the learning rate:
    /// its state carries over (what a reload may change).
    pub fn same_but_lr(&self, other: &OptimSpec) -> bool {
        let with = |s: &OptimSpec| match s.clone() {
            OptimSpec::AdamW(c) => format!("{:?}", AdamWConfig { lr: 0.0, ..c }),
            OptimSpec::Sgd(c) => format!("{:?}", SgdConfig { lr: 0.0, ..c }),
        };
        with(self) == with(other)
    }

    pub fn describe(&self) -> String {
        match self {
            OptimSpec::AdamW(c) => format!(
                "adamw lr {} betas {:?} eps {} weight_decay {}{}",
                c.lr,
                c.betas,
                c.eps,
                c.weight_decay,
                match c.state {
                    StateFormat::F32 => "",
                    StateFormat::Q8 => " state 8bit",
                }
            ),
            OptimSpec::Sgd(c) => format!(
                "sgd lr {} momentum {} weight_decay {}",
                c.lr, c.momentum, c.weight_decay
            ),
        }
    }
}

/// `torch.optim.AdamW` defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdamWConfig {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    /// Clip the global gradient norm to this value before the update.
    pub clip_grad_norm: Option<f64>,
    /// How the moments are stored: `"f32"` or `"8bit"` (blockwise 8-bit,
    /// for parameters of at least [`MIN_8BIT`] elements).
    pub state: StateFormat,
}

/// The storage of AdamW's moments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum StateFormat {
    #[default]
    #[serde(rename = "f32")]
    F32,
    #[serde(rename = "8bit")]
    Q8,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            clip_grad_norm: None,
            state: StateFormat::F32,
        }
    }
}

/// Whether `lr` can be a learning rate: a finite number >= 0 (optimizers,
/// schedules, `--lr` and `run:set_lr` all ask this).
pub fn check_lr(lr: f64) -> std::result::Result<(), String> {
    if lr.is_finite() && lr >= 0.0 {
        Ok(())
    } else {
        Err(format!(
            "bad learning rate {lr}: it must be a finite number >= 0"
        ))
    }
}

/// `Err(why)` unless `v` is finite and in `lo..hi` (`hi` itself when
/// `closed`): the optimizers' and schedules' hyperparameter checks.
pub(crate) fn in_range(
    name: &str,
    v: f64,
    lo: f64,
    hi: f64,
    closed: bool,
) -> std::result::Result<(), String> {
    let ok = v.is_finite() && v >= lo && (v < hi || (closed && v == hi));
    if ok {
        return Ok(());
    }
    let bound = |x: f64| {
        if x.is_infinite() {
            "inf".to_string()
        } else {
            x.to_string()
        }
    };
    Err(format!(
        "option `{name}` must be in [{}, {}{}, got {v}",
        bound(lo),
        bound(hi),
        if closed { "]" } else { ")" }
    ))
}

/// A gradient-norm bound must be a positive finite number.
fn check_clip(clip: Option<f64>) -> std::result::Result<(), String> {
    match clip {
        Some(c) if !(c.is_finite() && c > 0.0) => Err(format!(
            "option `clip_grad_norm` must be a positive number, got {c}"
        )),
        _ => Ok(()),
    }
}

impl AdamWConfig {
    /// The hyperparameters PyTorch's AdamW refuses, refused here too
    /// (`lr` has its own check, shared with `--lr`): betas in [0, 1), eps
    /// and weight decay not negative.
    pub fn check(&self) -> std::result::Result<(), String> {
        in_range("betas[1]", self.betas.0, 0.0, 1.0, false)?;
        in_range("betas[2]", self.betas.1, 0.0, 1.0, false)?;
        in_range("eps", self.eps, 0.0, f64::INFINITY, false)?;
        in_range("weight_decay", self.weight_decay, 0.0, f64::INFINITY, false)?;
        check_clip(self.clip_grad_norm)
    }
}

/// `torch.optim.SGD` defaults (lr 1e-3).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SgdConfig {
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub nesterov: bool,
    pub weight_decay: f64,
    pub clip_grad_norm: Option<f64>,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            clip_grad_norm: None,
        }
    }
}

impl SgdConfig {
    /// Momentum in [0, 1) (at 1 or more the velocity never decays),
    /// dampening in [0, 1], weight decay not negative, and Nesterov only
    /// with a momentum and no dampening, as PyTorch's SGD.
    pub fn check(&self) -> std::result::Result<(), String> {
        in_range("momentum", self.momentum, 0.0, 1.0, false)?;
        in_range("dampening", self.dampening, 0.0, 1.0, true)?;
        in_range("weight_decay", self.weight_decay, 0.0, f64::INFINITY, false)?;
        if self.nesterov && (self.momentum == 0.0 || self.dampening != 0.0) {
            return Err("nesterov needs a momentum and zero dampening".into());
        }
        check_clip(self.clip_grad_norm)
    }
}

pub trait Optimizer {
    fn kind(&self) -> &'static str;
    /// One update of `vars` from `grads`. Variables without a gradient are
    /// left alone, as PyTorch does for parameters whose `.grad` is None.
    fn step(&mut self, vars: &[(String, Var)], grads: &GradStore) -> Result<()>;
    /// Mixed precision: whether [`Optimizer::step_mixed`] updates master
    /// `var` from its low-precision gradient `g` in one pass that also
    /// writes its working copy `work`. Default: no.
    fn one_pass(&self, _var: &Var, _g: &Tensor, _work: &Var) -> bool {
        false
    }
    /// Mixed precision: one update of the f32 masters `vars` from `grads`
    /// as [`mixed_grads`] prepares them: in the working copy's dtype, to be
    /// multiplied by `scale` (gradient clipping's factor, or 1), for the
    /// parameters [`Optimizer::one_pass`] takes, which it updates and whose
    /// working copies `work[name]` it writes in the same pass; f32 and
    /// already scaled for the rest, which get the ordinary step. Returns
    /// the names whose working copies it wrote. Allocates nothing but
    /// what `step` does.
    fn step_mixed(
        &mut self,
        vars: &[(String, Var)],
        grads: &GradStore,
        _scale: &ClipScale,
        _work: &HashMap<String, Var>,
    ) -> Result<HashSet<String>> {
        self.step(vars, grads)?;
        Ok(HashSet::new())
    }
    /// Allocates the state the next [`Optimizer::step`] needs (the first
    /// step's moments) without changing any parameter, so that an OOM
    /// there leaves the step retryable.
    fn prepare(&mut self, _vars: &[(String, Var)], _grads: &GradStore) -> Result<()> {
        Ok(())
    }
    fn learning_rate(&self) -> f64;
    fn set_learning_rate(&mut self, lr: f64);
    fn clip_grad_norm(&self) -> Option<f64>;
    /// Bytes of state this optimizer keeps for `vars` (for the memory
    /// planner and `taper bench precision`).
    fn state_bytes(&self, vars: &[(String, Var)]) -> usize;
    /// State tensors by name, for checkpoints.
    fn state(&self) -> Vec<(String, Tensor)>;
    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()>;
    /// Keeps the state at `place` (None: back in memory), moving what
    /// exists now. False when this optimizer cannot.
    fn set_offload(&mut self, _place: Option<offload::Place>) -> Result<bool> {
        Ok(false)
    }
    /// Where the state is offloaded to, if it is.
    fn offload(&self) -> Option<&offload::Place> {
        None
    }
}

/// The gradients [`Optimizer::step_mixed`] takes, from the working copy's
/// `grads` keyed by master: as they are where `opt` updates in one pass,
/// in f32 times `scale` (as [`scale_grads`] scales them)
/// elsewhere. Everything the
/// mixed update allocates, before it changes anything.
pub fn mixed_grads(
    opt: &dyn Optimizer,
    vars: &[(String, Var)],
    mut grads: GradStore,
    scale: &ClipScale,
    work: &HashMap<String, Var>,
) -> Result<GradStore> {
    let mut out = GradStore::default();
    for (name, v) in vars {
        let Some(g) = grads.remove(v) else { continue };
        if work.get(name).is_some_and(|w| opt.one_pass(v, &g, w)) {
            out.insert(v, g);
        } else {
            out.insert(v, scale.apply(g.to_dtype(DType::F32)?)?);
        }
    }
    Ok(out)
}

/// Moves loaded optimizer state (`m.<param>`, `momentum.<param>`) to the
/// dtype and device of the variable it belongs to. 8-bit state (`m8.*`,
/// `m8max.*`, ...) keeps its dtypes.
pub(crate) fn place_state(
    state: HashMap<String, Tensor>,
    vars: &[(String, Var)],
) -> Result<HashMap<String, Tensor>> {
    let by_name: HashMap<&str, &Var> = vars.iter().map(|(k, v)| (k.as_str(), v)).collect();
    state
        .into_iter()
        .map(|(k, t)| {
            let (kind, param) = k.split_once('.').unwrap_or(("", ""));
            let t = match by_name.get(param) {
                Some(v) if ["m", "v", "momentum"].contains(&kind) => {
                    t.to_dtype(v.dtype())?.to_device(v.device())?
                }
                _ => t,
            };
            Ok((k, t))
        })
        .collect()
}

#[cfg(test)]
mod tests;
