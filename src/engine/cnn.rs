//! The small convolutional net (`taper.model.cnn`): 3x3 convolutions with
//! 2x2 max-pooling, then a dense head.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

use super::dropout::describe_rate;
use super::mlp::{check_rate, Activation, Dense};
use super::model::{tagged_config, Draw, Interface, ModelSpec, TrainModule};
use crate::kernels::{dropout, Dropout};

/// A small convolutional net: per entry of `channels`, a 3x3 convolution
/// (padding 1), the activation and a 2x2 max-pool; then a dense head. With
/// `dropout`, training drops out the head's inputs (the flattened features)
/// and each of its hidden activations, as PyTorch's MNIST example does.
/// Accepts `[batch, C*H*W]` (flat samples) or `[batch, C, H, W]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Cnn {
    /// `{channels, height, width}` of one sample.
    pub input: [usize; 3],
    pub channels: Vec<usize>,
    #[serde(default)]
    pub hidden: Vec<usize>,
    pub outputs: usize,
    #[serde(default)]
    pub activation: Activation,
    /// Dropout before each dense layer, in training; 0, none.
    #[serde(default)]
    pub dropout: f64,
}

struct CnnNet {
    input: [usize; 3],
    convs: Vec<candle_nn::Conv2d>,
    head: Dense,
    act: Activation,
    dropout: f64,
}

impl CnnNet {
    /// The logits of `x`, with dropout drawn from `draw` (training) or none.
    fn logits(&self, x: &Tensor, draw: Option<Draw>) -> Result<Tensor> {
        let b = x.dim(0)?;
        let [c, h, w] = self.input;
        let mut x = x.reshape((b, c, h, w))?;
        for conv in &self.convs {
            // taper's fused 3x3 convolution (candle's conv2d elsewhere).
            let y = match conv.bias() {
                Some(b) => crate::kernels::conv3x3(&x, conv.weight(), b)?,
                None => conv.forward(&x)?,
            };
            // A non-decreasing activation commutes with max: pooling first
            // applies it to a quarter of the values (the same result and
            // gradient; ReLU and tanh).
            x = match self.act {
                Activation::Relu | Activation::Tanh => self.act.apply(&max_pool_2x2(&y)?)?,
                _ => max_pool_2x2(&self.act.apply(&y)?)?,
            };
        }
        let x = x.flatten_from(1)?;
        let Some(d) = draw else {
            return self.head.forward_drawn(&x, None);
        };
        let site = Dropout::new(self.dropout, d.seed, d.step, 0);
        let x = dropout(&x, site.as_ref(), d.first)?;
        self.head.forward_drawn(&x, Some((d, self.dropout)))
    }
}

impl Module for CnnNet {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.logits(x, None)
    }
}

impl TrainModule for CnnNet {
    fn forward_train(&self, x: &Tensor, draw: Draw) -> Result<Tensor> {
        self.logits(x, Some(draw))
    }
}

impl Cnn {
    fn flat_features(&self) -> usize {
        let [_, mut h, mut w] = self.input;
        for _ in &self.channels {
            h /= 2;
            w /= 2;
        }
        self.channels.last().copied().unwrap_or(self.input[0]) * h * w
    }
}

impl ModelSpec for Cnn {
    fn check(&self) -> crate::Result<()> {
        let [c, h, w] = self.input;
        let mut sizes = vec![
            ("input's channels", c),
            ("input's height", h),
            ("input's width", w),
            ("outputs", self.outputs),
        ];
        sizes.extend(self.channels.iter().map(|&n| ("each of channels", n)));
        sizes.extend(self.hidden.iter().map(|&n| ("each hidden width", n)));
        super::model::sizes_at_least_one(&sizes)?;
        if h >> self.channels.len() == 0 || w >> self.channels.len() == 0 {
            return Err(crate::Error::Config(format!(
                "{} conv stages, each halving the size by its 2x2 pool, shrink a {h}x{w} input to nothing",
                self.channels.len()
            )));
        }
        check_rate(self.dropout)
    }
    fn interface(&self) -> Interface {
        Interface {
            features: Some(self.input.iter().product()),
            vocab: None,
            classes: Some(self.outputs),
            image: Some(self.input),
        }
    }
    fn config(&self) -> Option<serde_json::Value> {
        tagged_config("cnn", self)
    }

    fn describe(&self) -> String {
        let [c, h, w] = self.input;
        format!(
            "cnn {c}x{h}x{w} conv{:?} hidden{:?} -> {} {}{}",
            self.channels,
            self.hidden,
            self.outputs,
            self.activation.name(),
            describe_rate(self.dropout)
        )
    }
    fn build(&self, vb: VarBuilder) -> Result<Box<dyn Module>> {
        Ok(Box::new(self.net(vb)?))
    }
    fn build_train(&self, vb: VarBuilder) -> Result<Box<dyn TrainModule>> {
        Ok(Box::new(self.net(vb)?))
    }
}

impl Cnn {
    fn net(&self, vb: VarBuilder) -> Result<CnnNet> {
        let [_, h, w] = self.input;
        if h >> self.channels.len() == 0 || w >> self.channels.len() == 0 {
            candle_core::bail!(
                "cnn: {} pooling stages shrink a {h}x{w} input to nothing",
                self.channels.len()
            );
        }
        let cfg = candle_nn::Conv2dConfig {
            padding: 1,
            ..Default::default()
        };
        let mut in_c = self.input[0];
        let mut convs = Vec::new();
        for (i, &out_c) in self.channels.iter().enumerate() {
            convs.push(candle_nn::conv2d(
                in_c,
                out_c,
                3,
                cfg,
                vb.pp(format!("conv{i}")),
            )?);
            in_c = out_c;
        }
        let mut sizes = vec![self.flat_features()];
        sizes.extend(&self.hidden);
        sizes.push(self.outputs);
        let head = Dense::new(&vb, "fc", &sizes, self.activation)?;
        Ok(CnnNet {
            input: self.input,
            convs,
            head,
            act: self.activation,
            dropout: self.dropout,
        })
    }
}

/// 2x2 max-pooling with stride 2 (odd trailing rows/columns dropped, as
/// PyTorch does), from reshape and `max`. candle 0.11.1's `max_pool2d`
/// backward multiplies the gradient by (maxima / k^2) instead of dividing by
/// the number of maxima, so its gradients come out 4x too small; the gradient
/// check in tests/gradients.rs caught it.
pub fn max_pool_2x2(x: &Tensor) -> Result<Tensor> {
    if let Some(y) = crate::kernels::max_pool2x2(x)? {
        return Ok(y);
    }
    let (b, c, h, w) = x.dims4()?;
    let (h2, w2) = (h / 2, w / 2);
    x.narrow(2, 0, 2 * h2)?
        .narrow(3, 0, 2 * w2)?
        .reshape((b, c, h2, 2, w2, 2))?
        .max(5)?
        .max(3)
}
