//! The dropout draws of the transformers' blocks (the GPT's and the
//! BERT's): each site of a net is its own draw of `kernels::Dropout`, the
//! embeddings' site 0 and block `i`'s sites `1 + 3i` to `3 + 3i`; and
//! which rates a run may change on resume or reload ([`rate_changes`]).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::model::{Draw, ModelSpec};
use crate::kernels::Dropout;

/// The draw of dropout site `site` at `rate` in training (`draw`); none in
/// evaluation or at rate 0.
pub(super) fn site(draw: Option<Draw>, rate: f64, site: u64) -> Option<Dropout> {
    draw.and_then(|d| Dropout::new(rate, d.seed, d.step, site))
}

/// One block's draws in a training step; none in evaluation.
#[derive(Clone, Copy, Default)]
pub(super) struct BlockDrops {
    /// On the attention weights.
    pub weights: Option<Dropout>,
    /// On the attention's output, before the residual add.
    pub attention_out: Option<Dropout>,
    /// On the MLP's output, before the residual add.
    pub mlp_out: Option<Dropout>,
    /// The batch's place of the piece's first sample.
    pub first: usize,
}

impl BlockDrops {
    /// Block `i`'s draws: the weights' at `weights`, the outputs' at
    /// `hidden`.
    pub(super) fn of(draw: Option<Draw>, (weights, hidden): (f64, f64), i: usize) -> BlockDrops {
        let at = 1 + 3 * i as u64;
        BlockDrops {
            weights: site(draw, weights, at),
            attention_out: site(draw, hidden, at + 1),
            mlp_out: site(draw, hidden, at + 2),
            first: draw.map_or(0, |d| d.first),
        }
    }

    /// The weights' draw as the attention kernels take it.
    pub(super) fn on_weights(&self) -> Option<(Dropout, usize)> {
        self.weights.map(|d| (d, self.first))
    }
}

/// ` dropout r` for a model's description, nothing at 0.
pub fn describe_rate(rate: f64) -> String {
    match rate {
        0.0 => String::new(),
        r => format!(" dropout {r}"),
    }
}

/// A model's dropout rates: one for every site, or one a site in order
/// (`taper.model.cnn{ dropout = { 0.25, 0.5 } }`: its flattened features,
/// then each hidden activation, as PyTorch's MNIST example places its
/// `Dropout(0.25)` and `Dropout(0.5)`). One rate is written as a number,
/// as before lists were taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Rates {
    One(f64),
    Each(Vec<f64>),
}

impl Default for Rates {
    fn default() -> Self {
        Rates::One(0.0)
    }
}

impl From<f64> for Rates {
    fn from(rate: f64) -> Self {
        Rates::One(rate)
    }
}

impl std::fmt::Display for Rates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rates::One(r) => write!(f, "{r}"),
            Rates::Each(v) => write!(f, "{v:?}"),
        }
    }
}

impl Rates {
    /// Site `site`'s rate.
    pub fn at(&self, site: usize) -> f64 {
        match self {
            Rates::One(r) => *r,
            Rates::Each(v) => v.get(site).copied().unwrap_or(0.0),
        }
    }

    /// ` dropout r` (or ` dropout [r0, r1]`) for a model's description,
    /// nothing when every rate is 0.
    pub fn describe(&self) -> String {
        match self {
            Rates::One(r) => describe_rate(*r),
            Rates::Each(v) if v.iter().all(|&r| r == 0.0) => String::new(),
            Rates::Each(v) => format!(" dropout {v:?}"),
        }
    }

    /// Each rate in [0, 1), and a list of one per site of the `sites`
    /// (named by `where_`).
    pub fn check(&self, sites: usize, where_: &str) -> crate::Result<()> {
        let rates = match self {
            Rates::One(r) => return check_rate(*r),
            Rates::Each(v) => v,
        };
        if rates.len() != sites {
            return Err(crate::Error::Config(format!(
                "dropout has {} rates and the model {sites} places for them ({where_}): give one rate, or one a place",
                rates.len()
            )));
        }
        rates.iter().try_for_each(|&r| check_rate(r))
    }
}

/// Whether the rate `dropout` is one, as an error of the model's check.
pub(super) fn check_rate(rate: f64) -> crate::Result<()> {
    match (0.0..1.0).contains(&rate) {
        true => Ok(()),
        false => Err(crate::Error::Config(format!(
            "dropout {rate} is not a rate in [0, 1)"
        ))),
    }
}

/// The options of the built-in models' constructors that set a dropout
/// rate. A rate changes how a model trains, not what it is (no weight
/// depends on it), so a run resumed or reloaded with other rates goes on
/// with the same weights, as a PyTorch module's `p` may be set between
/// steps.
const RATE_OPTIONS: [&str; 4] = [
    "dropout",
    "attention_dropout",
    "classifier_dropout",
    "lora_dropout",
];

/// A dropout rate that differs between two versions of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct RateChange {
    pub option: &'static str,
    pub was: Rates,
    pub now: Rates,
}

/// Whether `was` and `now` are the same model but for their dropout rates:
/// the rates that differ (none if the models are the same), or None when
/// anything else differs. Models without a config (an embedder's own) are
/// the same when their descriptions are.
pub fn rate_changes(was: &dyn ModelSpec, now: &dyn ModelSpec) -> Option<Vec<RateChange>> {
    if was.describe() == now.describe() {
        return Some(Vec::new());
    }
    config_rate_changes(&was.config()?, &now.config()?)
}

/// [`rate_changes`] between model configs (`{ kind = options }`, as
/// [`ModelSpec::config`] gives them and checkpoints hold them); a rate a
/// config lacks is 0 (checkpoints from before the option).
pub fn config_rate_changes(was: &Value, now: &Value) -> Option<Vec<RateChange>> {
    let (was_kind, was) = single(was)?;
    let (now_kind, now) = single(now)?;
    let rest = |o: &Map<String, Value>| {
        let mut o = o.clone();
        o.retain(|k, _| !RATE_OPTIONS.contains(&k.as_str()));
        o
    };
    if was_kind != now_kind || rest(was) != rest(now) {
        return None;
    }
    let rate = |o: &Map<String, Value>, k: &str| {
        o.get(k)
            .and_then(|v| Rates::deserialize(v).ok())
            .unwrap_or_default()
    };
    Some(
        RATE_OPTIONS
            .iter()
            .map(|&option| RateChange {
                option,
                was: rate(was, option),
                now: rate(now, option),
            })
            .filter(|c| c.was != c.now)
            .collect(),
    )
}

/// `dropout 0.1 -> 0.2, attention_dropout 0 -> 0.1`, for notes.
pub fn describe_changes(changes: &[RateChange]) -> String {
    changes
        .iter()
        .map(|c| format!("{} {} -> {}", c.option, c.was, c.now))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The kind and options of a `{ kind = options }` config.
fn single(config: &Value) -> Option<(&String, &Map<String, Value>)> {
    let o = config.as_object().filter(|o| o.len() == 1)?;
    let (kind, options) = o.iter().next()?;
    Some((kind, options.as_object()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Bert, Mlp};
    use serde_json::json;

    fn mlp(hidden: usize, dropout: f64) -> Mlp {
        serde_json::from_value(json!({
            "inputs": 4, "hidden": [hidden], "outputs": 3, "dropout": dropout
        }))
        .unwrap()
    }

    #[test]
    fn rates_alone_may_change() {
        assert_eq!(rate_changes(&mlp(8, 0.1), &mlp(8, 0.1)), Some(vec![]));
        assert_eq!(
            rate_changes(&mlp(8, 0.0), &mlp(8, 0.2)),
            Some(vec![RateChange {
                option: "dropout",
                was: 0.0.into(),
                now: 0.2.into()
            }])
        );
        assert_eq!(rate_changes(&mlp(8, 0.1), &mlp(16, 0.1)), None);
        assert_eq!(rate_changes(&mlp(8, 0.1), &mlp(16, 0.2)), None);
    }

    /// A CNN's rate a place: a change of one is a rate change (described
    /// as lists), as is a change between one rate and a list.
    #[test]
    fn lists_of_rates_may_change() {
        let cnn =
            |d: Value| json!({ "cnn": { "input": [1, 8, 8], "channels": [4], "dropout": d } });
        let (a, b) = (cnn(json!([0.25, 0.5])), cnn(json!([0.25, 0.3])));
        let changes = config_rate_changes(&a, &b).unwrap();
        assert_eq!(
            describe_changes(&changes),
            "dropout [0.25, 0.5] -> [0.25, 0.3]"
        );
        assert_eq!(config_rate_changes(&a, &a), Some(vec![]));
        let one = cnn(json!(0.25));
        assert_eq!(
            describe_changes(&config_rate_changes(&one, &a).unwrap()),
            "dropout 0.25 -> [0.25, 0.5]"
        );
        assert_eq!(Rates::Each(vec![0.25, 0.5]).at(1), 0.5);
        assert_eq!(Rates::One(0.1).at(7), 0.1);
        assert_eq!(Rates::Each(vec![0.0, 0.0]).describe(), "");
    }

    #[test]
    fn a_rate_a_config_lacks_is_0_and_kinds_differ() {
        let bert = |o: Value| json!({ "bert": o });
        let old = bert(json!({ "vocab": 10, "width": 8 }));
        let new = bert(json!({ "vocab": 10, "width": 8, "dropout": 0.1,
                               "attention_dropout": 0.1, "classifier_dropout": 0.0 }));
        let changes = config_rate_changes(&old, &new).unwrap();
        assert_eq!(
            describe_changes(&changes),
            "dropout 0 -> 0.1, attention_dropout 0 -> 0.1"
        );
        let gpt = json!({ "gpt": { "vocab": 10, "width": 8 } });
        assert_eq!(config_rate_changes(&old, &gpt), None);
        assert_eq!(config_rate_changes(&json!(3), &old), None);
        // The BERT's three rates are its options by these names.
        let b: Bert = serde_json::from_value(json!({
            "vocab": 10, "context": 8, "width": 8, "layers": 1, "heads": 2,
            "intermediate": 16, "type_vocab": 2, "eps": 1e-12, "pad": 0, "outputs": 2,
            "dropout": 0.1, "attention_dropout": 0.2, "classifier_dropout": 0.3
        }))
        .unwrap();
        let c = Bert {
            dropout: 0.0,
            attention_dropout: 0.0,
            classifier_dropout: 0.0,
            ..b.clone()
        };
        assert_eq!(
            describe_changes(&rate_changes(&b, &c).unwrap()),
            "dropout 0.1 -> 0, attention_dropout 0.2 -> 0, classifier_dropout 0.3 -> 0"
        );
    }
}
