//! The BERT encoder's computation: embeddings, post-norm blocks, the
//! first position through the head, as each family (see [`Family`])
//! computes it in transformers.

use candle_core::{DType, Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use super::{Bert, Family};
use crate::engine::dropout::{site, BlockDrops};
use crate::engine::linear::Linear;
use crate::engine::model::{layer_norm, Draw, TrainModule};
use crate::kernels::dropout;

/// transformers' `initializer_range`, for the weights a checkpoint lacks
/// (the head).
const STD: f64 = 0.02;

fn linear(vb: &VarBuilder, i: usize, o: usize) -> Result<Linear> {
    let init = Init::Randn {
        mean: 0.,
        stdev: STD,
    };
    let w = vb.get_with_hints((o, i), "weight", init)?;
    let b = vb.get_with_hints(o, "bias", Init::Const(0.))?;
    Ok(Linear::new(w, Some(b)))
}

struct Norm {
    w: Tensor,
    b: Tensor,
    eps: f64,
}

impl Norm {
    fn new(vb: VarBuilder, width: usize, eps: f64) -> Result<Self> {
        Ok(Norm {
            w: vb.get_with_hints(width, "weight", Init::Const(1.))?,
            b: vb.get_with_hints(width, "bias", Init::Const(0.))?,
            eps,
        })
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        layer_norm(x, &self.w, &self.b, self.eps)
    }
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    out: Linear,
    attn_norm: Norm,
    up: Linear,
    down: Linear,
    out_norm: Norm,
    heads: usize,
    family: Family,
}

impl Layer {
    fn new(vb: VarBuilder, cfg: &Bert) -> Result<Self> {
        let (w, m) = (cfg.width, cfg.intermediate);
        Ok(Layer {
            query: linear(&vb.pp("attention.self.query"), w, w)?,
            key: linear(&vb.pp("attention.self.key"), w, w)?,
            value: linear(&vb.pp("attention.self.value"), w, w)?,
            out: linear(&vb.pp("attention.output.dense"), w, w)?,
            attn_norm: Norm::new(vb.pp("attention.output.LayerNorm"), w, cfg.eps)?,
            up: linear(&vb.pp("intermediate.dense"), w, m)?,
            down: linear(&vb.pp("output.dense"), m, w)?,
            out_norm: Norm::new(vb.pp("output.LayerNorm"), w, cfg.eps)?,
            heads: cfg.heads,
            family: cfg.family,
        })
    }

    /// The query, key and value projections as one `[3w, w]` layer (their
    /// outputs side by side, as the fused attention takes them).
    fn qkv(&self) -> Result<Linear> {
        let parts = [&self.query, &self.key, &self.value].map(|l| l.tensors());
        let w = Tensor::cat(&[&parts[0][0], &parts[1][0], &parts[2][0]], 0)?;
        let b = Tensor::cat(&[&parts[0][1], &parts[1][1], &parts[2][1]], 0)?;
        Ok(Linear::new(w, Some(b)))
    }

    /// `x [n, t, w]`, each text's first `lens[i]` positions its own (the
    /// rest padding, which no position attends to); in training, dropout
    /// drawn by `drop` ([`BlockDrops`]).
    fn forward(&self, x: &Tensor, lens: &[usize], drop: &BlockDrops) -> Result<Tensor> {
        use crate::kernels::add;
        let qkv = self.qkv()?.forward(x)?;
        let ctx = crate::kernels::padded_attention(&qkv, self.heads, lens, drop.on_weights())?;
        // DistilBERT has no dropout on the attention's output.
        let a = match self.family {
            Family::Distilbert => self.out.forward(&ctx)?,
            _ => dropout(
                &self.out.forward(&ctx)?,
                drop.attention_out.as_ref(),
                drop.first,
            )?,
        };
        let x = self.attn_norm.forward(&add(x, &a)?)?;
        let h = crate::kernels::gelu_erf(&self.up.forward(&x)?)?;
        let m = dropout(&self.down.forward(&h)?, drop.mlp_out.as_ref(), drop.first)?;
        self.out_norm.forward(&add(&x, &m)?)
    }
}

pub(super) struct BertNet {
    words: Tensor,
    positions: Tensor,
    /// None for a DistilBERT, which has no token types.
    types: Option<Tensor>,
    norm: Norm,
    layers: Vec<Layer>,
    /// The dense layer between the first position and the head: BERT's
    /// pooler, DistilBERT's `pre_classifier`, RoBERTa's `classifier.dense`.
    pooler: Linear,
    head: Linear,
    family: Family,
    context: usize,
    pad: u32,
    sep: Option<u32>,
    /// Dropout rates: hidden, attention weights, pooled.
    rates: (f64, f64, f64),
}

impl BertNet {
    /// The ids cut after the batch's longest text, each text's length (its
    /// positions before the padding), and the token types when a text is a
    /// pair (None: every one type 0).
    fn unpadded(&self, ids: &Tensor) -> Result<(Tensor, Vec<usize>, Option<Tensor>)> {
        let (n, t) = ids.dims2()?;
        if t > self.context {
            candle_core::bail!(
                "bert: a text of {t} tokens is longer than the model's context of {}",
                self.context
            );
        }
        let host = ids.to_dtype(DType::U32)?.to_vec2::<u32>()?;
        // A text is padded after its end: its length is up to its last
        // id that is not the padding one (at least 1, its [CLS]).
        let lens: Vec<usize> = host
            .iter()
            .map(|row| {
                row.iter()
                    .rposition(|&id| id != self.pad)
                    .map_or(1, |p| p + 1)
            })
            .collect();
        let width = lens.iter().copied().max().unwrap_or(1);
        debug_assert_eq!(lens.len(), n);
        let types = self.types_of(&host, &lens, width, ids.device())?;
        Ok((ids.narrow(1, 0, width)?, lens, types))
    }

    /// Type 1 after each row's first separator when it is not the row's
    /// last id (a pair's second text), else 0; None when no row is a pair.
    fn types_of(
        &self,
        rows: &[Vec<u32>],
        lens: &[usize],
        width: usize,
        dev: &candle_core::Device,
    ) -> Result<Option<Tensor>> {
        let Some(sep) = self.sep else {
            return Ok(None);
        };
        let second: Vec<Option<usize>> = rows
            .iter()
            .zip(lens)
            .map(|(row, &len)| {
                let at = row[..len].iter().position(|&id| id == sep)?;
                (at + 1 < len).then_some(at + 1)
            })
            .collect();
        if second.iter().all(Option::is_none) {
            return Ok(None);
        }
        let types: Vec<u32> = second
            .iter()
            .flat_map(|s| (0..width).map(move |p| s.is_some_and(|s| p >= s) as u32))
            .collect();
        Ok(Some(Tensor::from_vec(types, (rows.len(), width), dev)?))
    }
}

impl BertNet {
    /// `[batch, time]` token ids (u32) to `[batch, outputs]` logits, with
    /// dropout drawn from `draw` (training) or none.
    fn logits(&self, ids: &Tensor, draw: Option<Draw>) -> Result<Tensor> {
        let (ids, lens, types) = self.unpadded(ids)?;
        let t = ids.dim(1)?;
        let first = draw.map_or(0, |d| d.first);
        let (hidden, weights, pooled) = self.rates;
        let x = crate::kernels::embedding(&self.words, &ids)?;
        let x = x.broadcast_add(&self.positions.narrow(0, 0, t)?)?;
        let x = match (&self.types, types) {
            (None, _) => x,
            // Single texts: every position type 0 (padding's type is
            // never seen: no position attends to it).
            (Some(table), None) => x.broadcast_add(&table.narrow(0, 0, 1)?)?,
            (Some(table), Some(types)) => (x + crate::kernels::embedding(table, &types)?)?,
        };
        let x = self.norm.forward(&x)?;
        let mut x = dropout(&x, site(draw, hidden, 0).as_ref(), first)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let drop = BlockDrops::of(draw, (weights, hidden), i);
            x = layer.forward(&x, &lens, &drop)?;
        }
        let cls = x.narrow(1, 0, 1)?.squeeze(1)?;
        let after = site(draw, pooled, u64::MAX);
        let pooled_out = match self.family {
            Family::Bert => self.pooler.forward(&cls)?.tanh()?,
            Family::Distilbert => self.pooler.forward(&cls)?.relu()?,
            // RobertaClassificationHead: dropout before its dense layer too.
            Family::Roberta => {
                let before = site(draw, pooled, u64::MAX - 1);
                let cls = dropout(&cls, before.as_ref(), first)?;
                self.pooler.forward(&cls)?.tanh()?
            }
        };
        let pooled_out = dropout(&pooled_out, after.as_ref(), first)?;
        self.head.forward(&pooled_out)
    }
}

impl Module for BertNet {
    /// `[batch, time]` token ids (u32) to `[batch, outputs]` logits.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.logits(ids, None)
    }
}

impl TrainModule for BertNet {
    fn forward_train(&self, ids: &Tensor, draw: Draw) -> Result<Tensor> {
        self.logits(ids, Some(draw))
    }
}

impl Bert {
    pub(super) fn net(&self, vb: VarBuilder) -> Result<BertNet> {
        if self.heads == 0 || !self.width.is_multiple_of(self.heads) {
            candle_core::bail!(
                "bert: width {} is not divisible by heads {}",
                self.width,
                self.heads
            );
        }
        let emb = Init::Randn {
            mean: 0.,
            stdev: STD,
        };
        let e = vb.pp("embeddings");
        let w = self.width;
        Ok(BertNet {
            words: e.get_with_hints((self.vocab, w), "word_embeddings.weight", emb)?,
            positions: e.get_with_hints((self.context, w), "position_embeddings.weight", emb)?,
            types: (self.type_vocab > 0)
                .then(|| {
                    e.get_with_hints((self.type_vocab, w), "token_type_embeddings.weight", emb)
                })
                .transpose()?,
            norm: Norm::new(e.pp("LayerNorm"), w, self.eps)?,
            layers: (0..self.layers)
                .map(|i| Layer::new(vb.pp(format!("encoder.layer.{i}")), self))
                .collect::<Result<_>>()?,
            pooler: linear(&vb.pp("pooler.dense"), w, w)?,
            head: linear(&vb.pp("classifier"), w, self.outputs)?,
            family: self.family,
            context: self.context,
            pad: self.pad,
            sep: self.sep.filter(|_| self.type_vocab > 1),
            rates: (
                self.dropout,
                self.attention_dropout,
                self.classifier_dropout,
            ),
        })
    }
}
