//! A BERT encoder with a classification head, as transformers'
//! `BertForSequenceClassification` computes it: word, position and token
//! type embeddings, post-norm blocks of bidirectional self-attention over
//! the unpadded positions and an erf GELU MLP, the `[CLS]` position through
//! the pooler (dense, tanh), then a dense head; or as its DistilBERT and
//! RoBERTa classifiers do (their differences: [`Family`]). Parameters keep
//! BERT's names in transformers (`encoder.layer.0.attention.self.query.weight`),
//! so a Hugging Face BERT (MiniLM, bert-base, ...) loads as it is
//! (`interop::bert::import`; the others renamed). Training applies transformers' dropout
//! (after the embeddings, on the attention weights, after each block's
//! attention and MLP outputs, and on the pooled `[CLS]`) at the config's
//! rates, with masks drawn as `kernels::Dropout` draws them: the same
//! however a step's batch is split or resumed; evaluation applies none.
//!
//! Inputs are token ids padded with `pad` after each text (as
//! `taper.data.csv{ text = ... }` gives them): the padded positions are
//! masked out of attention, and a batch is computed only as wide as its
//! longest text (dynamic padding), which changes no output.

mod net;

use std::sync::Arc;

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

use super::model::{Interface, ModelSpec, TrainModule};

/// Which of transformers' BERT-like classifiers the weights are, and so
/// how the encoder reads them. The blocks are the same; the families
/// differ at their ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// `BertForSequenceClassification`: token types, the pooler (dense,
    /// tanh) then dropout and the head.
    #[default]
    Bert,
    /// `DistilBertForSequenceClassification`: no token types, no dropout
    /// on the attention's output, `pre_classifier` (dense, ReLU) then
    /// dropout and the head.
    Distilbert,
    /// `RobertaForSequenceClassification`: one token type, positions from
    /// `pad + 1` (the import keeps only those rows), a head of dropout,
    /// dense, tanh, dropout and the output layer.
    Roberta,
}

impl Family {
    fn is_bert(&self) -> bool {
        *self == Family::Bert
    }

    /// transformers' `model_type`.
    pub fn name(&self) -> &'static str {
        match self {
            Family::Bert => "bert",
            Family::Distilbert => "distilbert",
            Family::Roberta => "roberta",
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Bert {
    /// Which transformers classifier the weights come from (BERT in
    /// checkpoints from before the others).
    #[serde(default, skip_serializing_if = "Family::is_bert")]
    pub family: Family,
    pub vocab: usize,
    /// Positions the model takes (at most the checkpoint's
    /// `max_position_embeddings`).
    pub context: usize,
    pub width: usize,
    pub layers: usize,
    pub heads: usize,
    /// The MLP's hidden size (`intermediate_size`).
    pub intermediate: usize,
    /// Token types (segments) the embedding has: a text's are type 0; a
    /// pair's second text, after the first `sep`, type 1. None (0) in a
    /// DistilBERT.
    pub type_vocab: usize,
    pub eps: f64,
    /// The padding token id: these positions are masked.
    pub pad: u32,
    /// The separator token id (`[SEP]`): a text pair, `[CLS] a [SEP] b
    /// [SEP]`, has its ids after the first one as type 1, as transformers'
    /// tokenizer gives `token_type_ids`. None (checkpoints from before
    /// pairs, a folder without a tokenizer): every id is type 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sep: Option<u32>,
    /// Classes (or regression targets) of the head.
    pub outputs: usize,
    /// Dropout after the embeddings and each block's attention and MLP
    /// outputs (`hidden_dropout_prob`); 0 in checkpoints from before it.
    #[serde(default)]
    pub dropout: f64,
    /// Dropout on the attention weights (`attention_probs_dropout_prob`).
    #[serde(default)]
    pub attention_dropout: f64,
    /// Dropout on the pooled `[CLS]` before the head (`classifier_dropout`,
    /// else `hidden_dropout_prob`).
    #[serde(default)]
    pub classifier_dropout: f64,
    /// Where the starting weights came from, for the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Starting weights by name (`taper.model.bert{ from = ... }`).
    #[serde(skip)]
    pub initial: Option<Arc<Vec<(String, Tensor)>>>,
}

impl ModelSpec for Bert {
    fn check(&self) -> crate::Result<()> {
        super::model::sizes_at_least_one(&[
            ("vocab", self.vocab),
            ("context", self.context),
            ("width", self.width),
            ("layers", self.layers),
            ("heads", self.heads),
            ("intermediate", self.intermediate),
            ("outputs", self.outputs),
        ])?;
        if (self.type_vocab == 0) != (self.family == Family::Distilbert) {
            return Err(crate::Error::Config(format!(
                "type_vocab {}: a {} has {}",
                self.type_vocab,
                self.family.name(),
                match self.family {
                    Family::Distilbert => "no token types",
                    _ => "at least one token type",
                }
            )));
        }
        if !self.width.is_multiple_of(self.heads) {
            return Err(crate::Error::Config(format!(
                "width {} is not divisible by heads {}",
                self.width, self.heads
            )));
        }
        for (name, rate) in [
            ("dropout", self.dropout),
            ("attention_dropout", self.attention_dropout),
            ("classifier_dropout", self.classifier_dropout),
        ] {
            if !(0.0..1.0).contains(&rate) {
                return Err(crate::Error::Config(format!(
                    "{name} {rate} is not a rate in [0, 1)"
                )));
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let from = self
            .from
            .as_deref()
            .map(|f| format!(" from {f}"))
            .unwrap_or_default();
        let rates = [
            self.dropout,
            self.attention_dropout,
            self.classifier_dropout,
        ];
        let drop = match rates {
            [0.0, 0.0, 0.0] => String::new(),
            [h, a, c] if h == a && a == c => format!(" dropout {h}"),
            [h, a, c] => format!(" dropout {h} attention {a} classifier {c}"),
        };
        format!(
            "{} vocab {} context {} width {} layers {} heads {} outputs {}{drop}{from}",
            self.family.name(),
            self.vocab,
            self.context,
            self.width,
            self.layers,
            self.heads,
            self.outputs
        )
    }

    fn config(&self) -> Option<serde_json::Value> {
        super::model::tagged_config("bert", self)
    }

    fn build(&self, vb: VarBuilder) -> Result<Box<dyn Module>> {
        Ok(Box::new(self.net(vb)?))
    }

    fn build_train(&self, vb: VarBuilder) -> Result<Box<dyn TrainModule>> {
        Ok(Box::new(self.net(vb)?))
    }

    fn initial_params(&self) -> Result<Vec<(String, Tensor)>> {
        Ok(self.initial.as_deref().cloned().unwrap_or_default())
    }

    fn context(&self) -> Option<usize> {
        Some(self.context)
    }

    fn interface(&self) -> Interface {
        Interface {
            features: None,
            vocab: Some(self.vocab),
            classes: Some(self.outputs),
            image: None,
        }
    }
}
