//! The multi-layer perceptron (`taper.model.mlp`) and the activations the
//! built-in models share.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

use super::dropout::{check_rate, Rates};
use super::linear::Linear;
use super::model::{tagged_config, Draw, Interface, ModelSpec, TrainModule};
use crate::kernels::{dropout, Dropout};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    #[default]
    Relu,
    Gelu,
    Tanh,
    Silu,
}

impl Activation {
    pub fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Relu => crate::kernels::relu(x),
            Activation::Gelu => crate::kernels::gelu(x),
            Activation::Tanh => x.tanh(),
            Activation::Silu => x.silu(),
        }
    }
    pub(super) fn name(self) -> &'static str {
        match self {
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
            Activation::Tanh => "tanh",
            Activation::Silu => "silu",
        }
    }
}

/// A multi-layer perceptron: `inputs -> hidden... -> outputs`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Mlp {
    pub inputs: usize,
    #[serde(default)]
    pub hidden: Vec<usize>,
    pub outputs: usize,
    #[serde(default)]
    pub activation: Activation,
    /// Dropout after each hidden layer's activation, in training (as
    /// `nn.Dropout` between PyTorch's or Keras' dense layers); 0, none.
    #[serde(default)]
    pub dropout: f64,
}

/// Dense layers: `sizes[0] -> .. -> sizes[n]`, the activation between.
pub(super) struct Dense {
    layers: Vec<Linear>,
    act: Activation,
}

impl Dense {
    pub(super) fn new(
        vb: &VarBuilder,
        prefix: &str,
        sizes: &[usize],
        act: Activation,
    ) -> Result<Self> {
        let layers = sizes
            .windows(2)
            .enumerate()
            .map(|(i, w)| {
                candle_nn::linear(w[0], w[1], vb.pp(format!("{prefix}{i}"))).map(Linear::from)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Dense { layers, act })
    }

    /// The layers on `x`; with `drop` (the draw and the rates: training),
    /// dropout after each hidden activation, layer `i`'s at site `1 + i`
    /// (at that site's rate).
    pub(super) fn forward_drawn(&self, x: &Tensor, drop: Option<(Draw, &Rates)>) -> Result<Tensor> {
        let mut x = x.clone();
        for (i, l) in self.layers.iter().enumerate() {
            x = l.forward(&x)?;
            if i + 1 < self.layers.len() {
                x = self.act.apply(&x)?;
                if let Some((d, rates)) = drop {
                    let site = Dropout::new(rates.at(1 + i), d.seed, d.step, 1 + i as u64);
                    x = dropout(&x, site.as_ref(), d.first)?;
                }
            }
        }
        Ok(x)
    }
}

/// An MLP: its dense layers, taking samples flat or shaped (a NumPy array
/// of `[n, 28, 28]` images), whose values it reads in order.
struct MlpNet {
    dense: Dense,
    dropout: Rates,
}

impl MlpNet {
    fn logits(&self, x: &Tensor, draw: Option<Draw>) -> Result<Tensor> {
        let drop = draw.map(|d| (d, &self.dropout));
        match x.rank() {
            0..=2 => self.dense.forward_drawn(x, drop),
            _ => self.dense.forward_drawn(&x.flatten_from(1)?, drop),
        }
    }
}

impl Module for MlpNet {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.logits(x, None)
    }
}

impl TrainModule for MlpNet {
    fn forward_train(&self, x: &Tensor, draw: Draw) -> Result<Tensor> {
        self.logits(x, Some(draw))
    }
}

impl ModelSpec for Mlp {
    fn check(&self) -> crate::Result<()> {
        let mut sizes = vec![("inputs", self.inputs), ("outputs", self.outputs)];
        sizes.extend(self.hidden.iter().map(|&h| ("each hidden width", h)));
        super::model::sizes_at_least_one(&sizes)?;
        check_rate(self.dropout)
    }
    fn interface(&self) -> Interface {
        Interface {
            features: Some(self.inputs),
            vocab: None,
            classes: Some(self.outputs),
            image: None,
        }
    }
    fn config(&self) -> Option<serde_json::Value> {
        tagged_config("mlp", self)
    }

    fn describe(&self) -> String {
        let sizes: Vec<String> = self.sizes().iter().map(|s| s.to_string()).collect();
        let drop = super::dropout::describe_rate(self.dropout);
        format!("mlp {} {}{drop}", sizes.join("-"), self.activation.name())
    }
    fn build(&self, vb: VarBuilder) -> Result<Box<dyn Module>> {
        Ok(Box::new(self.net(vb)?))
    }
    fn build_train(&self, vb: VarBuilder) -> Result<Box<dyn TrainModule>> {
        Ok(Box::new(self.net(vb)?))
    }
}

impl Mlp {
    fn net(&self, vb: VarBuilder) -> Result<MlpNet> {
        Ok(MlpNet {
            dense: Dense::new(&vb, "fc", &self.sizes(), self.activation)?,
            dropout: self.dropout.into(),
        })
    }

    fn sizes(&self) -> Vec<usize> {
        let mut s = vec![self.inputs];
        s.extend(&self.hidden);
        s.push(self.outputs);
        s
    }
}
