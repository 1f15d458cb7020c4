//! Optimizers with PyTorch semantics. taper owns their state (candle's AdamW
//! keeps its moments private) so that checkpoints can save and restore it.

use std::collections::HashMap;

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
                "adamw lr {} betas {:?} eps {} weight_decay {}",
                c.lr, c.betas, c.eps, c.weight_decay
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
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            clip_grad_norm: None,
        }
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

pub trait Optimizer {
    fn kind(&self) -> &'static str;
    /// One update of `vars` from `grads`. Variables without a gradient are
    /// left alone, as PyTorch does for parameters whose `.grad` is None.
    fn step(&mut self, vars: &[(String, Var)], grads: &GradStore) -> Result<()>;
    fn learning_rate(&self) -> f64;
    fn set_learning_rate(&mut self, lr: f64);
    fn clip_grad_norm(&self) -> Option<f64>;
    /// Elements of state kept per parameter element (for the memory planner).
    fn state_factor(&self) -> usize;
    /// State tensors by name, for checkpoints.
    fn state(&self) -> Vec<(String, Tensor)>;
    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()>;
}

/// The global L2 norm of all gradients. The squares are summed on the
/// device and read back once: one CPU-GPU sync point per step, not one per
/// parameter.
pub fn grad_norm(vars: &[(String, Var)], grads: &GradStore) -> Result<f64> {
    let mut total: Option<Tensor> = None;
    for (_, v) in vars {
        if let Some(g) = grads.get(v) {
            let s = g.to_dtype(DType::F64)?.sqr()?.sum_all()?;
            total = Some(match total {
                Some(t) => (t + s)?,
                None => s,
            });
        }
    }
    Ok(match total {
        Some(t) => t.to_scalar::<f64>()?.sqrt(),
        None => 0.0,
    })
}

/// Scales gradients so that their global norm is at most `max_norm`, as
/// `torch.nn.utils.clip_grad_norm_` does. Returns the norm before clipping.
pub fn clip_grad_norm(vars: &[(String, Var)], grads: &mut GradStore, max_norm: f64) -> Result<f64> {
    let norm = grad_norm(vars, grads)?;
    let scale = max_norm / (norm + 1e-6);
    if scale < 1.0 {
        for (_, v) in vars {
            if let Some(g) = grads.remove(v) {
                grads.insert(v, (g * scale)?);
            }
        }
    }
    Ok(norm)
}

pub struct AdamW {
    cfg: AdamWConfig,
    t: u64,
    moments: HashMap<String, (Tensor, Tensor)>,
}

impl AdamW {
    pub fn new(cfg: AdamWConfig) -> Self {
        AdamW {
            cfg,
            t: 0,
            moments: HashMap::new(),
        }
    }
}

impl Optimizer for AdamW {
    fn kind(&self) -> &'static str {
        "adamw"
    }

    fn step(&mut self, vars: &[(String, Var)], grads: &GradStore) -> Result<()> {
        self.t += 1;
        let (b1, b2) = self.cfg.betas;
        let lr = self.cfg.lr;
        let bc1 = 1.0 - b1.powi(self.t as i32);
        let bc2 = 1.0 - b2.powi(self.t as i32);
        for (name, var) in vars {
            let Some(g) = grads.get(var) else { continue };
            let (m, v) = match self.moments.remove(name) {
                Some(mv) => mv,
                None => (g.zeros_like()?, g.zeros_like()?),
            };
            let m = ((m * b1)? + (g * (1.0 - b1))?)?;
            let v = ((v * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let theta = (var.as_tensor() * (1.0 - lr * self.cfg.weight_decay))?;
            let denom = ((&v * (1.0 / bc2))?.sqrt()? + self.cfg.eps)?;
            let update = ((&m * (lr / bc1))? / denom)?;
            var.set(&(theta - update)?)?;
            self.moments.insert(name.clone(), (m, v));
        }
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.cfg.lr
    }
    fn set_learning_rate(&mut self, lr: f64) {
        self.cfg.lr = lr;
    }
    fn clip_grad_norm(&self) -> Option<f64> {
        self.cfg.clip_grad_norm
    }
    fn state_factor(&self) -> usize {
        2
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        if let Ok(t) = Tensor::new(self.t as f64, &candle_core::Device::Cpu) {
            out.push(("t".to_string(), t));
        }
        for (name, (m, v)) in &self.moments {
            out.push((format!("m.{name}"), m.clone()));
            out.push((format!("v.{name}"), v.clone()));
        }
        out
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        self.t = match state.get("t") {
            Some(t) => t.to_dtype(DType::F64)?.to_scalar::<f64>()? as u64,
            None => 0,
        };
        self.moments.clear();
        for (key, m) in state {
            if let Some(name) = key.strip_prefix("m.") {
                let Some(v) = state.get(&format!("v.{name}")) else {
                    candle_core::bail!("adamw state: m.{name} without v.{name}");
                };
                self.moments
                    .insert(name.to_string(), (m.clone(), v.clone()));
            }
        }
        Ok(())
    }
}

pub struct Sgd {
    cfg: SgdConfig,
    momentum: HashMap<String, Tensor>,
}

impl Sgd {
    pub fn new(cfg: SgdConfig) -> Self {
        Sgd {
            cfg,
            momentum: HashMap::new(),
        }
    }
}

impl Optimizer for Sgd {
    fn kind(&self) -> &'static str {
        "sgd"
    }

    fn step(&mut self, vars: &[(String, Var)], grads: &GradStore) -> Result<()> {
        let c = &self.cfg;
        for (name, var) in vars {
            let Some(g) = grads.get(var) else { continue };
            let mut d = if c.weight_decay != 0.0 {
                (g + (var.as_tensor() * c.weight_decay)?)?
            } else {
                g.clone()
            };
            if c.momentum != 0.0 {
                let buf = match self.momentum.remove(name) {
                    Some(b) => ((b * c.momentum)? + (&d * (1.0 - c.dampening))?)?,
                    None => d.clone(),
                };
                d = if c.nesterov {
                    (d + (&buf * c.momentum)?)?
                } else {
                    buf.clone()
                };
                self.momentum.insert(name.clone(), buf);
            }
            var.set(&(var.as_tensor() - (d * c.lr)?)?)?;
        }
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.cfg.lr
    }
    fn set_learning_rate(&mut self, lr: f64) {
        self.cfg.lr = lr;
    }
    fn clip_grad_norm(&self) -> Option<f64> {
        self.cfg.clip_grad_norm
    }
    fn state_factor(&self) -> usize {
        usize::from(self.cfg.momentum != 0.0)
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        self.momentum
            .iter()
            .map(|(k, v)| (format!("momentum.{k}"), v.clone()))
            .collect()
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        self.momentum = state
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("momentum.")?.to_string(), v.clone())))
            .collect();
        Ok(())
    }
}

/// Moves loaded optimizer state (`m.<param>`, `momentum.<param>`) to the
/// dtype and device of the variable it belongs to.
pub(crate) fn place_state(
    state: HashMap<String, Tensor>,
    vars: &[(String, Var)],
) -> Result<HashMap<String, Tensor>> {
    let by_name: HashMap<&str, &Var> = vars.iter().map(|(k, v)| (k.as_str(), v)).collect();
    state
        .into_iter()
        .map(|(k, t)| {
            let param = k.split_once('.').map(|(_, p)| p).unwrap_or("");
            let t = match by_name.get(param) {
                Some(v) => t.to_dtype(v.dtype())?.to_device(v.device())?,
                None => t,
            };
            Ok((k, t))
        })
        .collect()
}
