//! Models: a spec (plain config, cheap to clone) that builds a forward
//! function over parameters drawn from a `VarBuilder`. Built-in specs are
//! `Mlp`, `Cnn` and `Gpt`; embedders implement [`ModelSpec`] for their own.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

use super::linear::Linear;

/// What a model is: describes itself and builds its forward function.
pub trait ModelSpec: Send + Sync {
    /// One line, for `__tostring`, logs and checkpoints: `mlp 64-128-64-10 relu`.
    fn describe(&self) -> String;
    /// Builds the forward function. Every parameter comes from `vb`, so the
    /// same spec builds a trainable model (over a `ParamStore`) or a frozen
    /// one (over detached tensors, for evaluation).
    fn build(&self, vb: VarBuilder) -> Result<Box<dyn Module>>;
    /// Builds the model the trainer trains: the forward function, and for
    /// models with a language-model head, access to its last hidden states
    /// and head weight (for the chunked cross-entropy).
    fn build_train(&self, vb: VarBuilder) -> Result<Box<dyn TrainModule>> {
        Ok(Box::new(Plain(self.build(vb)?)))
    }
    /// Initial values for parameters that do not start from an `Init`
    /// (pretrained weights), by name; the trainer puts them in its store
    /// before building.
    fn initial_params(&self) -> Result<Vec<(String, Tensor)>> {
        Ok(Vec::new())
    }
    /// For sequence models: the longest input they accept (generation crops to it).
    fn context(&self) -> Option<usize> {
        None
    }
    /// What the model takes and gives, so that each batch is checked
    /// against it (see [`check_batch`]); all unknown by default.
    fn interface(&self) -> Interface {
        Interface::default()
    }
    /// The model as structured data, `{ kind = options }` with the options
    /// its `taper.model.<kind>{}` constructor takes: written into
    /// checkpoints so that a checkpoint alone says what it holds, and read
    /// back by [`crate::interop::spec_from_config`]. None for models that
    /// cannot be described so (an embedder's own).
    fn config(&self) -> Option<serde_json::Value> {
        None
    }
}

/// `{ kind: options }` for a serializable spec.
pub fn tagged_config(kind: &str, spec: &impl Serialize) -> Option<serde_json::Value> {
    let options = serde_json::to_value(spec).ok()?;
    Some(serde_json::json!({ kind: options }))
}

/// What a model takes and gives: a batch that does not fit gets an error
/// naming the sample, instead of a failed gather or matmul deep in the step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Interface {
    /// Float inputs: values per sample (an MLP's `inputs`, a CNN's C*H*W).
    pub features: Option<usize>,
    /// Token-id inputs: every id is below this (the vocabulary).
    pub vocab: Option<usize>,
    /// Integer targets: every one is below this (classes, or the vocabulary).
    pub classes: Option<usize>,
}

/// Checks a batch (inputs `x`, targets `y`, batch first) against a model's
/// interface. Returns the first row that does not fit (None: no row fits,
/// a shape or type), and why.
pub fn check_batch(
    i: &Interface,
    x: &Tensor,
    y: &Tensor,
) -> Result<std::result::Result<(), (Option<usize>, String)>> {
    let rows = x.dim(0)?.max(1);
    let per = x.elem_count() / rows;
    let floats = x.dtype().is_float();
    if let Some(f) = i.features {
        if !floats {
            return Ok(Err((
                None,
                format!(
                    "the inputs are integers ({:?}), the model takes {f} float values per sample",
                    x.dtype()
                ),
            )));
        }
        if per != f {
            return Ok(Err((
                None,
                format!(
                    "each sample has {per} input values (shape {:?}), the model takes {f}",
                    &x.dims()[1..]
                ),
            )));
        }
    }
    if let Some(v) = i.vocab {
        if floats {
            return Ok(Err((
                None,
                format!("the inputs are floats, the model takes token ids (below {v})"),
            )));
        }
        if let Some((at, id)) = first_at_or_above(x, v)? {
            return Ok(Err((
                Some(at / per.max(1)),
                format!(
                    "token id {id} is out of range: the model's vocabulary has {v} ids (0 to {})",
                    v - 1
                ),
            )));
        }
    }
    if let (Some(c), false) = (i.classes, y.dtype().is_float()) {
        let per_y = y.elem_count() / y.dim(0)?.max(1);
        if let Some((at, t)) = first_at_or_above(y, c)? {
            return Ok(Err((
                Some(at / per_y.max(1)),
                format!(
                    "target {t} is out of range: the model has {c} outputs (0 to {})",
                    c - 1
                ),
            )));
        }
    }
    Ok(Ok(()))
}

/// The first element of an integer tensor at or above `limit`: (flat index, value).
fn first_at_or_above(t: &Tensor, limit: usize) -> Result<Option<(usize, i64)>> {
    let v = t
        .flatten_all()?
        .to_dtype(candle_core::DType::I64)?
        .to_vec1::<i64>()?;
    Ok(v.iter()
        .position(|&e| e < 0 || e as u64 >= limit as u64)
        .map(|p| (p, v[p])))
}

/// A model as the trainer sees it.
pub trait TrainModule: Module {
    /// Recompute every `every`-th repeated block in the backward instead of
    /// keeping its activations (0: none). False when the model has no
    /// repeated blocks to recompute.
    fn set_recompute(&self, _every: usize) -> bool {
        false
    }
    /// The last hidden states `[.., hidden]` and the head's weight
    /// `[classes, hidden]` whose product is `forward(x)`'s logits, for losses
    /// that fuse the head; `None` when the model has no such head.
    fn hidden_and_head(&self, _x: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
        Ok(None)
    }
}

/// A model without a separable head.
struct Plain(Box<dyn Module>);

impl Module for Plain {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.0.forward(x)
    }
}

impl TrainModule for Plain {}

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
            Activation::Relu => x.relu(),
            Activation::Gelu => crate::kernels::gelu(x),
            Activation::Tanh => x.tanh(),
            Activation::Silu => x.silu(),
        }
    }
    fn name(self) -> &'static str {
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
}

struct Dense {
    layers: Vec<Linear>,
    act: Activation,
}

impl Dense {
    fn new(vb: &VarBuilder, prefix: &str, sizes: &[usize], act: Activation) -> Result<Self> {
        let layers = sizes
            .windows(2)
            .enumerate()
            .map(|(i, w)| {
                candle_nn::linear(w[0], w[1], vb.pp(format!("{prefix}{i}"))).map(Linear::from)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Dense { layers, act })
    }
}

impl Module for Dense {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut x = x.clone();
        for (i, l) in self.layers.iter().enumerate() {
            x = l.forward(&x)?;
            if i + 1 < self.layers.len() {
                x = self.act.apply(&x)?;
            }
        }
        Ok(x)
    }
}

impl ModelSpec for Mlp {
    fn interface(&self) -> Interface {
        Interface {
            features: Some(self.inputs),
            vocab: None,
            classes: Some(self.outputs),
        }
    }
    fn config(&self) -> Option<serde_json::Value> {
        tagged_config("mlp", self)
    }

    fn describe(&self) -> String {
        let sizes: Vec<String> = self.sizes().iter().map(|s| s.to_string()).collect();
        format!("mlp {} {}", sizes.join("-"), self.activation.name())
    }
    fn build(&self, vb: VarBuilder) -> Result<Box<dyn Module>> {
        Ok(Box::new(Dense::new(
            &vb,
            "fc",
            &self.sizes(),
            self.activation,
        )?))
    }
}

impl Mlp {
    fn sizes(&self) -> Vec<usize> {
        let mut s = vec![self.inputs];
        s.extend(&self.hidden);
        s.push(self.outputs);
        s
    }
}

/// A small convolutional net: per entry of `channels`, a 3x3 convolution
/// (padding 1), the activation and a 2x2 max-pool; then a dense head.
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
}

struct CnnNet {
    input: [usize; 3],
    convs: Vec<candle_nn::Conv2d>,
    head: Dense,
    act: Activation,
}

impl Module for CnnNet {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
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
        let x = self.act.apply(&x.flatten_from(1)?)?;
        self.head.forward(&x)
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
    fn interface(&self) -> Interface {
        Interface {
            features: Some(self.input.iter().product()),
            vocab: None,
            classes: Some(self.outputs),
        }
    }
    fn config(&self) -> Option<serde_json::Value> {
        tagged_config("cnn", self)
    }

    fn describe(&self) -> String {
        let [c, h, w] = self.input;
        format!(
            "cnn {c}x{h}x{w} conv{:?} hidden{:?} -> {} {}",
            self.channels,
            self.hidden,
            self.outputs,
            self.activation.name()
        )
    }
    fn build(&self, vb: VarBuilder) -> Result<Box<dyn Module>> {
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
        Ok(Box::new(CnnNet {
            input: self.input,
            convs,
            head,
            act: self.activation,
        }))
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

/// Layer norm over the last dimension, differentiable (candle's fused
/// `layer_norm` records no backward op, candle #2168): taper's fused kernel
/// on the CPU, composed ops elsewhere.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    crate::kernels::layer_norm(x, w, b, eps)
}
