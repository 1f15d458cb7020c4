//! The small convolutional net (`taper.model.cnn`): convolutions (3x3 with
//! padding 1 unless told), each followed by 2x2 max-pooling unless told,
//! then a dense head.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

use super::dropout::Rates;
use super::mlp::{Activation, Dense};
use super::model::{tagged_config, Draw, Interface, ModelSpec, TrainModule};
use crate::kernels::{dropout, Dropout};

/// A small convolutional net: per entry of `channels`, a `kernel x kernel`
/// convolution (stride 1, `padding` zeros on each side: by default
/// `kernel / 2`, which keeps the size for odd kernels), the activation and
/// a 2x2 max-pool (unless `pool` says otherwise for it); then a dense head.
/// With `dropout`, training drops out the head's inputs (the flattened
/// features) and each of its hidden activations, as PyTorch's MNIST
/// example does: at one rate, or at a rate each (`[0.25, 0.5]`, the
/// example's).
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
    /// Dropout before each dense layer, in training: one rate, or one a
    /// layer; 0, none.
    #[serde(default)]
    pub dropout: Rates,
    /// The convolutions' kernel size (3 unless told; left out of configs
    /// when 3, so that they read as before the option).
    #[serde(default = "three", skip_serializing_if = "is_three")]
    pub kernel: usize,
    /// Zeros on each side of a convolution's input; None: `kernel / 2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padding: Option<usize>,
    /// Whether a 2x2 max-pool follows each convolution, one per entry of
    /// `channels` (PyTorch's MNIST example pools after its second only:
    /// `{false, true}`); None: after every one (and left out of configs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<Vec<bool>>,
}

fn three() -> usize {
    3
}

fn is_three(k: &usize) -> bool {
    *k == 3
}

struct CnnNet {
    input: [usize; 3],
    padding: usize,
    convs: Vec<candle_nn::Conv2d>,
    pools: Vec<bool>,
    head: Dense,
    act: Activation,
    dropout: Rates,
}

impl CnnNet {
    /// The logits of `x`, with dropout drawn from `draw` (training) or none.
    fn logits(&self, x: &Tensor, draw: Option<Draw>) -> Result<Tensor> {
        let b = x.dim(0)?;
        let [c, h, w] = self.input;
        let mut x = x.reshape((b, c, h, w))?;
        for (conv, &pool) in self.convs.iter().zip(&self.pools) {
            // taper's fused convolution (candle's conv2d where it has none).
            let y = match conv.bias() {
                Some(b) => crate::kernels::conv2d(&x, conv.weight(), b, self.padding)?,
                None => conv.forward(&x)?,
            };
            // A non-decreasing activation commutes with max: pooling first
            // applies it to a quarter of the values (the same result and
            // gradient; ReLU and tanh).
            x = match (pool, self.act) {
                (false, _) => self.act.apply(&y)?,
                (true, Activation::Relu | Activation::Tanh) => {
                    self.act.apply(&max_pool_2x2(&y)?)?
                }
                (true, _) => max_pool_2x2(&self.act.apply(&y)?)?,
            };
        }
        let x = x.flatten_from(1)?;
        let Some(d) = draw else {
            return self.head.forward_drawn(&x, None);
        };
        let site = Dropout::new(self.dropout.at(0), d.seed, d.step, 0);
        let x = dropout(&x, site.as_ref(), d.first)?;
        self.head.forward_drawn(&x, Some((d, &self.dropout)))
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
    /// The zeros on each side of a convolution's input.
    pub fn pad(&self) -> usize {
        self.padding.unwrap_or(self.kernel / 2)
    }

    /// Whether a 2x2 max-pool follows convolution `i`.
    pub fn pools(&self, i: usize) -> bool {
        self.pool
            .as_ref()
            .is_none_or(|p| p.get(i).copied().unwrap_or(true))
    }

    /// Each stage's `(channels, height, width)` after its convolution, and
    /// after its pool, if it has one (None once a stage leaves nothing).
    pub fn stages(&self) -> Vec<Option<([usize; 3], [usize; 3])>> {
        let [_, mut h, mut w] = self.input;
        let (k, p) = (self.kernel, self.pad());
        let mut out = Vec::new();
        for (i, &o) in self.channels.iter().enumerate() {
            let conv = [
                o,
                (h + 2 * p + 1).saturating_sub(k),
                (w + 2 * p + 1).saturating_sub(k),
            ];
            let pooled = match self.pools(i) {
                true => [o, conv[1] / 2, conv[2] / 2],
                false => conv,
            };
            if k == 0 || pooled[1] == 0 || pooled[2] == 0 {
                out.push(None);
                break;
            }
            out.push(Some((conv, pooled)));
            [_, h, w] = pooled;
        }
        out
    }

    /// Values per sample into the dense head.
    pub fn flat_features(&self) -> usize {
        match self.stages().last() {
            Some(Some((_, [c, h, w]))) => c * h * w,
            Some(None) => 0,
            None => self.input.iter().product(),
        }
    }

    /// Why the stages leave nothing to the head, if they do.
    fn shrinks(&self) -> Option<String> {
        let stages = self.stages();
        let i = stages.iter().position(Option::is_none)?;
        let [_, h, w] = match i {
            0 => self.input,
            _ => stages[i - 1].map(|(_, pooled)| pooled)?,
        };
        let (k, p) = (self.kernel, self.pad());
        let pool = if self.pools(i) {
            " and 2x2 max-pool"
        } else {
            ""
        };
        Some(format!(
            "{} conv stages shrink a {}x{} input to nothing: stage {} gets {h}x{w}, which its {k}x{k} kernel (padding {p}){pool} leave{} empty",
            self.channels.len(),
            self.input[1],
            self.input[2],
            i + 1,
            if pool.is_empty() { "s" } else { "" }
        ))
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
        sizes.push(("kernel", self.kernel));
        super::model::sizes_at_least_one(&sizes)?;
        if let Some(pool) = &self.pool {
            if pool.len() != self.channels.len() {
                let n = pool.len();
                return Err(crate::Error::Config(format!(
                    "`pool` has {n} {} and `channels` {}: give one per convolution (true: a 2x2 max-pool after it)",
                    if n == 1 { "entry" } else { "entries" },
                    self.channels.len()
                )));
            }
        }
        if let Some(why) = self.shrinks() {
            return Err(crate::Error::Config(why));
        }
        let places = "the flattened features, then each hidden activation";
        self.dropout.check(1 + self.hidden.len(), places)
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
        // The default 3x3 with padding 1 is left out: descriptions (which
        // a resume compares) read as before the options.
        let mut kernel = match (self.kernel, self.pad()) {
            (3, 1) => String::new(),
            (k, p) => format!(" {k}x{k} pad {p}"),
        };
        // Likewise a pool after every convolution.
        if let Some(pool) = self.pool.as_ref().filter(|p| p.contains(&false)) {
            kernel += &format!(" pool{pool:?}");
        }
        format!(
            "cnn {c}x{h}x{w} conv{:?}{kernel} hidden{:?} -> {} {}{}",
            self.channels,
            self.hidden,
            self.outputs,
            self.activation.name(),
            self.dropout.describe()
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
        if let Some(why) = self.shrinks() {
            candle_core::bail!("cnn: {why}");
        }
        let cfg = candle_nn::Conv2dConfig {
            padding: self.pad(),
            ..Default::default()
        };
        let mut in_c = self.input[0];
        let mut convs = Vec::new();
        for (i, &out_c) in self.channels.iter().enumerate() {
            convs.push(candle_nn::conv2d(
                in_c,
                out_c,
                self.kernel,
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
            padding: self.pad(),
            pools: (0..convs.len()).map(|i| self.pools(i)).collect(),
            convs,
            head,
            act: self.activation,
            dropout: self.dropout.clone(),
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
