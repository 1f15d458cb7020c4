//! transformers' tensor names of a BERT-like classifier and taper's. taper's
//! [`Bert`](crate::engine::Bert) names its parameters as a BERT does
//! (`encoder.layer.0.attention.self.query.weight`, `pooler.dense`,
//! `classifier`); a DistilBERT's and a RoBERTa's weights are renamed on
//! import and back on export.

use crate::engine::Family;

/// A DistilBERT block's parts (under `transformer.layer.i.`) and BERT's
/// (under `encoder.layer.i.`).
const DISTILBERT_LAYER: [(&str, &str); 8] = [
    ("attention.q_lin.", "attention.self.query."),
    ("attention.k_lin.", "attention.self.key."),
    ("attention.v_lin.", "attention.self.value."),
    ("attention.out_lin.", "attention.output.dense."),
    ("sa_layer_norm.", "attention.output.LayerNorm."),
    ("ffn.lin1.", "intermediate.dense."),
    ("ffn.lin2.", "output.dense."),
    ("output_layer_norm.", "output.LayerNorm."),
];

/// The head's layers: the family's name (under its prefix for BERT's
/// pooler, else at the top) and taper's.
fn head(family: Family) -> [(&'static str, &'static str); 2] {
    match family {
        Family::Bert => [
            ("pooler.dense.", "pooler.dense."),
            ("classifier.", "classifier."),
        ],
        Family::Distilbert => [
            ("pre_classifier.", "pooler.dense."),
            ("classifier.", "classifier."),
        ],
        Family::Roberta => [
            ("classifier.dense.", "pooler.dense."),
            ("classifier.out_proj.", "classifier."),
        ],
    }
}

/// The prefix of the encoder's tensors in a `...ForSequenceClassification`
/// file (a bare `...Model` saves them without it).
fn prefix(family: Family) -> &'static str {
    match family {
        Family::Bert => "bert.",
        Family::Distilbert => "distilbert.",
        Family::Roberta => "roberta.",
    }
}

/// `name` with `from`'s start replaced by `to`'s, if it starts so.
fn swap(name: &str, from: &str, to: &str) -> Option<String> {
    name.strip_prefix(from).map(|rest| format!("{to}{rest}"))
}

/// taper's name for the tensor `name` of a `family` file, or None where it
/// is not the classifier's (a pre-training head, RoBERTa's unused pooler).
pub(super) fn to_taper(family: Family, name: &str) -> Option<String> {
    let bare = name.strip_prefix(prefix(family)).unwrap_or(name);
    if let Some(n) = head(family).iter().find_map(|(f, t)| swap(bare, f, t)) {
        return Some(n);
    }
    if bare.starts_with("embeddings.") {
        return Some(bare.to_string());
    }
    match family {
        Family::Distilbert => {
            let (i, part) = bare.strip_prefix("transformer.layer.")?.split_once('.')?;
            DISTILBERT_LAYER
                .iter()
                .find_map(|(theirs, ours)| swap(part, theirs, ours))
                .map(|n| format!("encoder.layer.{i}.{n}"))
        }
        _ => bare.starts_with("encoder.layer.").then(|| bare.to_string()),
    }
}

/// transformers' name for taper's parameter `name` of a `family` model, as
/// its `...ForSequenceClassification` saves it.
pub(super) fn to_hf(family: Family, name: &str) -> String {
    let bare = head(family)
        .iter()
        .find_map(|(f, t)| swap(name, t, f))
        .or_else(|| match family {
            Family::Distilbert => {
                let (i, part) = name.strip_prefix("encoder.layer.")?.split_once('.')?;
                DISTILBERT_LAYER
                    .iter()
                    .find_map(|(theirs, ours)| swap(part, ours, theirs))
                    .map(|n| format!("transformer.layer.{i}.{n}"))
            }
            _ => None,
        })
        .unwrap_or_else(|| name.to_string());
    match bare.starts_with("classifier.") || bare.starts_with("pre_classifier.") {
        true => bare,
        false => format!("{}{bare}", prefix(family)),
    }
}

/// What the family calls the dense layer before its output layer, and the
/// output layer, for notes.
pub(super) fn head_names(family: Family) -> (&'static str, &'static str) {
    match family {
        Family::Bert => ("the pooler", "`classifier`"),
        Family::Distilbert => ("`pre_classifier`", "`classifier`"),
        Family::Roberta => ("`classifier.dense`", "`classifier.out_proj`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name maps to taper's and back, as each family's classifier
    /// saves it; what the classifier does not use maps to nothing.
    #[test]
    fn names_go_both_ways() {
        let cases = [
            (
                Family::Bert,
                "bert.encoder.layer.3.attention.self.query.weight",
                "encoder.layer.3.attention.self.query.weight",
            ),
            (Family::Bert, "bert.pooler.dense.bias", "pooler.dense.bias"),
            (Family::Bert, "classifier.weight", "classifier.weight"),
            (
                Family::Distilbert,
                "distilbert.transformer.layer.5.attention.out_lin.bias",
                "encoder.layer.5.attention.output.dense.bias",
            ),
            (
                Family::Distilbert,
                "distilbert.transformer.layer.0.sa_layer_norm.weight",
                "encoder.layer.0.attention.output.LayerNorm.weight",
            ),
            (
                Family::Distilbert,
                "distilbert.transformer.layer.1.ffn.lin2.weight",
                "encoder.layer.1.output.dense.weight",
            ),
            (
                Family::Distilbert,
                "distilbert.embeddings.LayerNorm.bias",
                "embeddings.LayerNorm.bias",
            ),
            (
                Family::Distilbert,
                "pre_classifier.weight",
                "pooler.dense.weight",
            ),
            (
                Family::Roberta,
                "roberta.embeddings.token_type_embeddings.weight",
                "embeddings.token_type_embeddings.weight",
            ),
            (
                Family::Roberta,
                "classifier.dense.weight",
                "pooler.dense.weight",
            ),
            (
                Family::Roberta,
                "classifier.out_proj.bias",
                "classifier.bias",
            ),
        ];
        for (family, theirs, ours) in cases {
            assert_eq!(to_taper(family, theirs).as_deref(), Some(ours), "{theirs}");
            assert_eq!(to_hf(family, ours), theirs, "{ours}");
        }
        // A bare model's names, without the prefix.
        assert_eq!(
            to_taper(Family::Distilbert, "transformer.layer.2.ffn.lin1.weight").as_deref(),
            Some("encoder.layer.2.intermediate.dense.weight")
        );
        for (family, unused) in [
            (Family::Bert, "cls.predictions.bias"),
            (Family::Distilbert, "vocab_projector.bias"),
            (
                Family::Distilbert,
                "distilbert.transformer.layer.0.attention.mystery.weight",
            ),
            (Family::Roberta, "roberta.pooler.dense.weight"),
            (Family::Roberta, "lm_head.dense.weight"),
        ] {
            assert_eq!(to_taper(family, unused), None, "{unused}");
        }
    }
}
