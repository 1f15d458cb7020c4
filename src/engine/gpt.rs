//! A small GPT-2 style causal language model (pre-norm blocks, learned
//! positions, tied embeddings), built from differentiable ops only: candle's
//! fused softmax/layer-norm record no backward op (candle #2168). With
//! `dropout`, training drops out as GPT-2 and nanoGPT do: the embeddings'
//! sum, the attention weights, and each block's attention and MLP outputs
//! before their residual adds, with masks drawn as `kernels::Dropout`
//! draws them (the same however a step's batch is split, recomputed or
//! resumed).

use candle_core::{Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::dropout::{site, BlockDrops};
use super::linear::Linear;
use super::model::{layer_norm, Draw, ModelSpec, TrainModule};
use crate::kernels::dropout;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Gpt {
    pub vocab: usize,
    pub context: usize,
    #[serde(default = "Gpt::default_width")]
    pub width: usize,
    #[serde(default = "Gpt::default_layers")]
    pub layers: usize,
    #[serde(default = "Gpt::default_heads")]
    pub heads: usize,
    /// Hidden size of the MLP as a multiple of `width`.
    #[serde(default = "Gpt::default_mlp")]
    pub mlp: usize,
    /// Dropout in training at every site (nanoGPT's `dropout`; GPT-2's
    /// `resid_pdrop`); 0, none, by default.
    #[serde(default)]
    pub dropout: f64,
    /// Where the starting weights came from (a Hugging Face GPT-2
    /// `model.safetensors`), for the record: see [`Gpt::initial`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Starting weights by taper's parameter names, in place of the random
    /// initialisation (`taper.model.gpt{ from = ... }` reads them).
    #[serde(skip)]
    pub initial: Option<Arc<Vec<(String, Tensor)>>>,
}

impl Gpt {
    fn default_width() -> usize {
        128
    }
    fn default_layers() -> usize {
        4
    }
    fn default_heads() -> usize {
        4
    }
    fn default_mlp() -> usize {
        4
    }
}

const STD: f64 = 0.02;

fn linear(vb: &VarBuilder, i: usize, o: usize, std: f64) -> Result<Linear> {
    let w = vb.get_with_hints(
        (o, i),
        "weight",
        Init::Randn {
            mean: 0.,
            stdev: std,
        },
    )?;
    let b = vb.get_with_hints(o, "bias", Init::Const(0.))?;
    Ok(Linear::new(w, Some(b)))
}

struct Norm {
    w: Tensor,
    b: Tensor,
}

impl Norm {
    fn new(vb: VarBuilder, width: usize) -> Result<Self> {
        Ok(Norm {
            w: vb.get_with_hints(width, "weight", Init::Const(1.))?,
            b: vb.get_with_hints(width, "bias", Init::Const(0.))?,
        })
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        layer_norm(x, &self.w, &self.b, 1e-5)
    }
}

struct Block {
    ln1: Norm,
    qkv: Linear,
    proj: Linear,
    ln2: Norm,
    fc: Linear,
    fc_proj: Linear,
    heads: usize,
}

impl Block {
    /// The tensors the block reads, for recomputation's gradients.
    fn params(&self) -> Vec<Tensor> {
        let mut out = vec![
            self.ln1.w.clone(),
            self.ln1.b.clone(),
            self.ln2.w.clone(),
            self.ln2.b.clone(),
        ];
        for l in [&self.qkv, &self.proj, &self.fc, &self.fc_proj] {
            out.extend(l.tensors());
        }
        out
    }

    fn new(vb: VarBuilder, cfg: &Gpt) -> Result<Self> {
        let w = cfg.width;
        // GPT-2: residual projections scaled by 1/sqrt(2 * layers).
        let res_std = STD / (2.0 * cfg.layers as f64).sqrt();
        Ok(Block {
            ln1: Norm::new(vb.pp("ln1"), w)?,
            qkv: linear(&vb.pp("attn.qkv"), w, 3 * w, STD)?,
            proj: linear(&vb.pp("attn.proj"), w, w, res_std)?,
            ln2: Norm::new(vb.pp("ln2"), w)?,
            fc: linear(&vb.pp("mlp.fc"), w, cfg.mlp * w, STD)?,
            fc_proj: linear(&vb.pp("mlp.proj"), cfg.mlp * w, w, res_std)?,
            heads: cfg.heads,
        })
    }

    fn attention(&self, x: &Tensor, drop: &BlockDrops) -> Result<Tensor> {
        let qkv = self.qkv.forward(x)?;
        let y = crate::kernels::causal_attention_dropped(&qkv, self.heads, drop.on_weights())?;
        dropout(
            &self.proj.forward(&y)?,
            drop.attention_out.as_ref(),
            drop.first,
        )
    }

    fn forward(&self, x: &Tensor, drop: &BlockDrops) -> Result<Tensor> {
        use crate::kernels::add;
        let x = add(x, &self.attention(&self.ln1.forward(x)?, drop)?)?;
        let h = crate::kernels::gelu(&self.fc.forward(&self.ln2.forward(&x)?)?)?;
        let m = dropout(
            &self.fc_proj.forward(&h)?,
            drop.mlp_out.as_ref(),
            drop.first,
        )?;
        add(&x, &m)
    }
}

struct GptNet {
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Arc<Block>>,
    ln_f: Norm,
    context: usize,
    dropout: f64,
    /// Recompute every n-th block in the backward (0: none); see
    /// `engine::recompute`.
    recompute: AtomicUsize,
}

impl GptNet {
    /// `[batch, time]` token ids (u32) to the final hidden states
    /// `[batch, time, width]` (after the last layer norm), with dropout
    /// drawn from `draw` (training) or none.
    fn hidden(&self, idx: &Tensor, draw: Option<Draw>) -> Result<Tensor> {
        let (_, t) = idx.dims2()?;
        if t > self.context {
            candle_core::bail!(
                "gpt: sequence of {t} tokens exceeds the context of {}",
                self.context
            );
        }
        let tok = crate::kernels::embedding(&self.wte, idx)?;
        let pos = self.wpe.narrow(0, 0, t)?;
        let x = tok.broadcast_add(&pos)?;
        let embedded = site(draw, self.dropout, 0);
        let mut x = dropout(&x, embedded.as_ref(), draw.map_or(0, |d| d.first))?;
        let every = self.recompute.load(Ordering::Relaxed);
        for (i, block) in self.blocks.iter().enumerate() {
            // A recomputed block draws the same masks again.
            let drop = BlockDrops::of(draw, (self.dropout, self.dropout), i);
            x = if every > 0 && i % every == 0 {
                let b = Arc::clone(block);
                let f: super::recompute::Block = Arc::new(move |x: &Tensor| b.forward(x, &drop));
                super::recompute::checkpoint(&x, block.params(), f)?
            } else {
                block.forward(&x, &drop)?
            };
        }
        self.ln_f.forward(&x)
    }
}

impl Module for GptNet {
    /// `[batch, time]` token ids (u32) to `[batch, time, vocab]` logits.
    fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        // Tied embeddings: the head is the token embedding transposed.
        self.hidden(idx, None)?.broadcast_matmul(&self.wte.t()?)
    }
}

impl TrainModule for GptNet {
    fn set_recompute(&self, every: usize) -> bool {
        self.recompute.store(every, Ordering::Relaxed);
        true
    }

    fn forward_train(&self, idx: &Tensor, draw: Draw) -> Result<Tensor> {
        self.hidden(idx, Some(draw))?
            .broadcast_matmul(&self.wte.t()?)
    }

    fn hidden_and_head(&self, idx: &Tensor, draw: Draw) -> Result<Option<(Tensor, Tensor)>> {
        Ok(Some((self.hidden(idx, Some(draw))?, self.wte.clone())))
    }
}

impl ModelSpec for Gpt {
    fn check(&self) -> crate::Result<()> {
        super::model::sizes_at_least_one(&[
            ("vocab", self.vocab),
            ("context", self.context),
            ("width", self.width),
            ("layers", self.layers),
            ("heads", self.heads),
            ("mlp", self.mlp),
        ])?;
        if !self.width.is_multiple_of(self.heads) {
            return Err(crate::Error::Config(format!(
                "width {} is not divisible by heads {}",
                self.width, self.heads
            )));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(crate::Error::Config(format!(
                "dropout {} is not a rate in [0, 1)",
                self.dropout
            )));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let drop = super::dropout::describe_rate(self.dropout);
        format!(
            "gpt vocab {} context {} width {} layers {} heads {}{drop}",
            self.vocab, self.context, self.width, self.layers, self.heads
        )
    }

    fn config(&self) -> Option<serde_json::Value> {
        super::model::tagged_config("gpt", self)
    }

    fn build(&self, vb: VarBuilder) -> Result<Box<dyn Module>> {
        Ok(Box::new(self.net(vb)?))
    }

    fn initial_params(&self) -> Result<Vec<(String, Tensor)>> {
        Ok(self.initial.as_deref().cloned().unwrap_or_default())
    }

    fn build_train(&self, vb: VarBuilder) -> Result<Box<dyn TrainModule>> {
        Ok(Box::new(self.net(vb)?))
    }

    fn context(&self) -> Option<usize> {
        Some(self.context)
    }

    fn causal(&self) -> bool {
        true
    }

    fn interface(&self) -> crate::engine::model::Interface {
        crate::engine::model::Interface {
            features: None,
            vocab: Some(self.vocab),
            classes: Some(self.vocab),
            image: None,
        }
    }
}

impl Gpt {
    fn net(&self, vb: VarBuilder) -> Result<GptNet> {
        if self.heads == 0 || !self.width.is_multiple_of(self.heads) {
            candle_core::bail!(
                "gpt: width {} is not divisible by heads {}",
                self.width,
                self.heads
            );
        }
        let emb = Init::Randn {
            mean: 0.,
            stdev: STD,
        };
        let blocks = (0..self.layers)
            .map(|i| Block::new(vb.pp(format!("h{i}")), self).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        Ok(GptNet {
            wte: vb.get_with_hints((self.vocab, self.width), "wte", emb)?,
            wpe: vb.get_with_hints((self.context, self.width), "wpe", emb)?,
            blocks,
            ln_f: Norm::new(vb.pp("ln_f"), self.width)?,
            context: self.context,
            dropout: self.dropout,
            recompute: AtomicUsize::new(0),
        })
    }
}
