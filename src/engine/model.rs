//! Models: a spec (plain config, cheap to clone) that builds a forward
//! function over parameters drawn from a `VarBuilder`. Built-in specs are
//! `Mlp` (`mlp.rs`), `Cnn` (`cnn.rs`) and `Gpt` (`gpt.rs`); embedders implement [`ModelSpec`] for their own.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Serialize;

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
    /// Whether each position's output depends on its own input and earlier
    /// ones only (a GPT's, a llama's). Then a batch's last positions that
    /// no sample labels are not computed: they change neither the loss nor
    /// its gradient ([`crate::engine::ignored::labelled_width`]).
    fn causal(&self) -> bool {
        false
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
    /// Whether the options make a model: a size of 0, heads that do not
    /// divide the width, ... as a [`crate::Error::Config`] naming the
    /// option (a model read from a file may also give a
    /// [`crate::Error::Data`]). `taper.model.*{}` calls it, so that the
    /// error points at the recipe's line, not at the first step.
    fn check(&self) -> crate::Result<()> {
        Ok(())
    }
}

/// `Err(Config)` naming the first of `sizes` (option, value) that is 0.
pub fn sizes_at_least_one(sizes: &[(&str, usize)]) -> crate::Result<()> {
    match sizes.iter().find(|(_, v)| *v == 0) {
        Some((name, _)) => Err(crate::Error::Config(format!("{name} must be at least 1"))),
        None => Ok(()),
    }
}

/// A classifier's `outputs`: one per class, and so at least two. Its loss
/// is the cross-entropy over the outputs' softmax, which is 0 for any
/// weights with one output: a run would train nothing, and say nothing.
/// (A regression's model, trained with `taper.loss.mse{}`, has one output
/// per target value.)
pub fn classifier_outputs(outputs: usize) -> crate::Result<()> {
    if outputs == 1 {
        return Err(crate::Error::Config(
            "the model has outputs = 1, and its loss is the cross-entropy over the outputs' softmax, which is 0 whatever the weights with a single output: a classifier needs one output per class (outputs = 2 for two classes, labelled 0 and 1). To predict a number (regression), train with `loss = taper.loss.mse{}` on a CSV file's or a safetensors file's `target`".into(),
        ));
    }
    Ok(())
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
    /// Image inputs, `[channels, height, width]` (a CNN's): a sample shaped
    /// otherwise than flat or so (a grey one also `[height, width]`) is
    /// refused, since its values would be read in another order.
    pub image: Option<[usize; 3]>,
}

/// ` (0 to n-1)`, or nothing for none.
pub(crate) fn from_zero(n: usize) -> String {
    match n {
        0 => String::new(),
        n => format!(" (0 to {})", n - 1),
    }
}

/// Checks a batch (inputs `x`, targets `y`, batch first) against a model's
/// interface, and float inputs for NaN and infinity. Returns the first row
/// that does not fit (None: no row fits, a shape or type), and why.
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
    if let Some(why) = i.image.and_then(|chw| image_shape(chw, &x.dims()[1..])) {
        return Ok(Err((None, why)));
    }
    if let Some(v) = i.vocab {
        if floats {
            return Ok(Err((
                None,
                format!("the inputs are floats, the model takes token ids (below {v})"),
            )));
        }
        if let Some((at, id)) = first_at_or_above(x, v, false)? {
            return Ok(Err((
                Some(at / per.max(1)),
                format!(
                    "token id {id} is out of range: the model's vocabulary has {v} ids{}",
                    from_zero(v)
                ),
            )));
        }
    }
    if floats {
        if let Some((at, v)) = first_not_finite(x)? {
            return Ok(Err((
                Some(at / per.max(1)),
                format!(
                    "input value {} of the sample is {v}: the data holds a number that is not finite (a missing value?), and training on it would spoil the weights",
                    at % per.max(1)
                ),
            )));
        }
    }
    if let (Some(c), false) = (i.classes, y.dtype().is_float()) {
        let per_y = y.elem_count() / y.dim(0)?.max(1);
        if let Some((at, t)) = first_at_or_above(y, c, true)? {
            return Ok(Err((
                Some(at / per_y.max(1)),
                format!(
                    "target {t} is out of range: the model has {c} outputs{}",
                    from_zero(c)
                ),
            )));
        }
    }
    Ok(Ok(()))
}

/// Why samples of shape `dims` cannot be a CNN's `[c, h, w]` input, though
/// they hold as many values: any shape but flat, `[c, h, w]` and (grey)
/// `[h, w]` would have its values read in another order, as channels-last
/// arrays (NumPy images, Keras) would.
fn image_shape([c, h, w]: [usize; 3], dims: &[usize]) -> Option<String> {
    if dims.len() <= 1 || dims == [c, h, w] || (c == 1 && dims == [h, w]) {
        return None;
    }
    let hint = if dims == [h, w, c] {
        ": they are channels last (height, width, channels, as NumPy and Keras images are); put the channels first, np.transpose(x, (0, 3, 1, 2)), or flatten them in that order"
    } else {
        ""
    };
    Some(format!(
        "each sample has shape {dims:?}, the model takes {:?} (channels, height, width), or the same values flat{hint}",
        [c, h, w]
    ))
}

/// The first NaN or infinite element of a float tensor: (flat index, value).
fn first_not_finite(t: &Tensor) -> Result<Option<(usize, f32)>> {
    let v = t
        .flatten_all()?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1::<f32>()?;
    Ok(v.iter().position(|e| !e.is_finite()).map(|p| (p, v[p])))
}

/// The first element of an integer tensor at or above `limit`: (flat index, value).
/// `labels`: `t` is targets, where a sequence's ignored positions are no
/// label (`engine::ignored`); inputs never hold one.
fn first_at_or_above(t: &Tensor, limit: usize, labels: bool) -> Result<Option<(usize, i64)>> {
    let v = t
        .flatten_all()?
        .to_dtype(candle_core::DType::I64)?
        .to_vec1::<i64>()?;
    let ignored = |e: i64| labels && t.rank() >= 2 && e == super::ignored::IGNORE as i64;
    Ok(v.iter()
        .position(|&e| (e < 0 || e as u64 >= limit as u64) && !ignored(e))
        .map(|p| (p, v[p])))
}

/// A model as the trainer sees it.
/// Where a training forward's random draws (dropout) come from: the run's
/// seed, the optimizer step, and the place in the step's batch of the
/// piece's first sample. A step's masks are thereby the same however the
/// batch is split, retried or resumed ([`crate::kernels::Dropout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Draw {
    pub seed: u64,
    pub step: u64,
    pub first: usize,
}

pub trait TrainModule: Module {
    /// The forward pass of training, with dropout where the model has it
    /// (drawn from `draw`); `forward` (evaluation) has none.
    fn forward_train(&self, x: &Tensor, _draw: Draw) -> Result<Tensor> {
        self.forward(x)
    }
    /// Recompute every `every`-th repeated block in the backward instead of
    /// keeping its activations (0: none). False when the model has no
    /// repeated blocks to recompute.
    fn set_recompute(&self, _every: usize) -> bool {
        false
    }
    /// The last hidden states `[.., hidden]` and the head's weight
    /// `[classes, hidden]` whose product is `forward_train(x, draw)`'s
    /// logits, for losses that fuse the head; `None` when the model has no
    /// such head.
    fn hidden_and_head(&self, _x: &Tensor, _draw: Draw) -> Result<Option<(Tensor, Tensor)>> {
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

/// Layer norm over the last dimension, differentiable (candle's fused
/// `layer_norm` records no backward op, candle #2168): taper's fused kernel
/// on the CPU, composed ops elsewhere.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    crate::kernels::layer_norm(x, w, b, eps)
}
