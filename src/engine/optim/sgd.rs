//! SGD with momentum, dampening and Nesterov, as `torch.optim.SGD`.

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

use super::{Optimizer, SgdConfig};

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
        // Every new value first, then the assignments: an error on the way
        // (an OOM) leaves the parameters and the momentum as they were.
        let mut updates = Vec::new();
        for (name, var) in vars {
            let Some(g) = grads.get(var) else { continue };
            let mut d = if c.weight_decay != 0.0 {
                (g + (var.as_tensor() * c.weight_decay)?)?
            } else {
                g.clone()
            };
            let mut buf = None;
            if c.momentum != 0.0 {
                let b = match self.momentum.get(name) {
                    Some(b) => ((b * c.momentum)? + (&d * (1.0 - c.dampening))?)?,
                    None => d.clone(),
                };
                d = if c.nesterov {
                    (d + (&b * c.momentum)?)?
                } else {
                    b.clone()
                };
                buf = Some(b);
            }
            updates.push((name, var, (var.as_tensor() - (d * c.lr)?)?, buf));
        }
        for (name, var, value, buf) in updates {
            var.set(&value)?;
            if let Some(b) = buf {
                self.momentum.insert(name.clone(), b);
            }
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
    fn state_bytes(&self, vars: &[(String, Var)]) -> usize {
        if self.cfg.momentum == 0.0 {
            return 0;
        }
        vars.iter()
            .map(|(_, v)| v.elem_count() * v.dtype().size_in_bytes())
            .sum()
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
