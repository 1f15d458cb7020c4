//! A model that starts from another run's trained weights
//! (`taper.model.cnn{ from = "runs/pets", outputs = 5 }`): the checkpoint's
//! architecture and weights, with a new classifier head when `outputs`
//! differs (fine-tuning on other classes). The model is the checkpoint's
//! in every other respect, so checkpoints and exports describe it as such.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;

use super::dropout::Rates;
use super::model::{Interface, ModelSpec, TrainModule};
use super::{Cnn, Mlp};
use crate::{Error, Result};

/// `inner`, its parameters starting from `initial` (by name) rather than
/// from their random initialisation.
pub struct WarmStart {
    inner: Arc<dyn ModelSpec>,
    initial: Vec<(String, Tensor)>,
}

/// What [`start_from`] made: the model, and the head it initialised afresh
/// (its name and the checkpoint's output count), if any.
pub struct Started {
    pub spec: WarmStart,
    pub new_head: Option<(String, usize)>,
}

/// The `kind` (`mlp` or `cnn`) model of the checkpoint at `path`
/// (`tensors`, `config`: what [`super::checkpoint::load`] read), with
/// `outputs` classes when given: a head of another size starts afresh,
/// every other weight from the checkpoint; and `dropout` for the
/// checkpoint's rate when given (fine-tuning often drops out more).
pub fn start_from(
    path: &Path,
    kind: &str,
    config: Option<&serde_json::Value>,
    mut tensors: HashMap<String, Tensor>,
    (outputs, dropout): (Option<usize>, Option<f64>),
) -> Result<Started> {
    let bad = |msg: String| Error::Checkpoint {
        path: PathBuf::from(path),
        msg,
    };
    let options = config
        .and_then(|c| c.get(kind))
        .ok_or_else(|| {
            let what = config
                .and_then(|c| c.as_object())
                .and_then(|o| o.keys().next().cloned())
                .unwrap_or_else(|| "a model without its config (an older checkpoint)".into());
            bad(format!("it holds a {what} model, not a {kind}"))
        })?
        .clone();
    let parse = |e: serde_json::Error| bad(format!("its model config: {e}"));
    let (inner, hidden, trained): (Arc<dyn ModelSpec>, usize, usize) = match kind {
        "mlp" => {
            let mut m: Mlp = serde_json::from_value(options).map_err(parse)?;
            let trained = m.outputs;
            m.outputs = outputs.unwrap_or(trained);
            m.dropout = dropout.unwrap_or(m.dropout);
            let hidden = m.hidden.len();
            (Arc::new(m), hidden, trained)
        }
        "cnn" => {
            let mut c: Cnn = serde_json::from_value(options).map_err(parse)?;
            let trained = c.outputs;
            c.outputs = outputs.unwrap_or(trained);
            c.dropout = dropout.map_or(c.dropout, Rates::One);
            let hidden = c.hidden.len();
            (Arc::new(c), hidden, trained)
        }
        other => {
            return Err(Error::Config(format!(
                "`from` starts an mlp or a cnn, not a {other}"
            )))
        }
    };
    inner.check()?;
    let mut initial: Vec<(String, Tensor)> = tensors
        .drain()
        .filter_map(|(k, t)| k.strip_prefix("model.").map(|k| (k.to_string(), t)))
        .collect();
    initial.sort_by(|a, b| a.0.cmp(&b.0));
    // The head is the last dense layer: fc0 after the convolutions with no
    // hidden layer, fcN after N hidden ones.
    let head = format!("fc{hidden}");
    let new_head = (outputs.is_some_and(|n| n != trained)).then(|| {
        initial.retain(|(k, _)| !k.starts_with(&format!("{head}.")));
        (head, trained)
    });
    Ok(Started {
        spec: WarmStart { inner, initial },
        new_head,
    })
}

impl ModelSpec for WarmStart {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn build(&self, vb: VarBuilder) -> candle_core::Result<Box<dyn Module>> {
        self.inner.build(vb)
    }
    fn build_train(&self, vb: VarBuilder) -> candle_core::Result<Box<dyn TrainModule>> {
        self.inner.build_train(vb)
    }
    fn initial_params(&self) -> candle_core::Result<Vec<(String, Tensor)>> {
        Ok(self.initial.clone())
    }
    fn context(&self) -> Option<usize> {
        self.inner.context()
    }
    fn causal(&self) -> bool {
        self.inner.causal()
    }
    fn interface(&self) -> Interface {
        self.inner.interface()
    }
    fn config(&self) -> Option<serde_json::Value> {
        self.inner.config()
    }
    fn check(&self) -> Result<()> {
        self.inner.check()
    }
}
