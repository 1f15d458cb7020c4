//! The best evaluation a run has had: which score it is judged by, the best
//! value so far and the step that had it, and how many evaluations have
//! passed since without doing better (for stopping early). Checkpoints
//! carry it, so that a resumed run compares with what the run it continues
//! had, and stops early exactly where a run that never stopped would.

use serde::{Deserialize, Serialize};

use super::Eval;

/// Every score an evaluation may have, as `run:evaluate` names them.
pub const SCORES: [&str; 11] = [
    "loss",
    "accuracy",
    "balanced_accuracy",
    "macro_f1",
    "exact_match",
    "f1_micro",
    "f1_macro",
    "rmse",
    "mae",
    "r2",
    "objective",
];

/// Scores where lower is better; every other score named by
/// [`Eval::score`] is better higher.
const LOWER_IS_BETTER: [&str; 4] = ["loss", "objective", "rmse", "mae"];

impl Eval {
    /// The evaluation's score `name`, as `run:evaluate` returns it (`loss`,
    /// `accuracy`, `balanced_accuracy`, `macro_f1`, `exact_match`,
    /// `f1_micro`, `f1_macro`, `rmse`, `mae`, `r2`, `objective`), when this
    /// evaluation has it.
    pub fn score(&self, name: &str) -> Option<f64> {
        self.scores()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
    }

    /// Every score this evaluation has, by name.
    pub fn scores(&self) -> Vec<(&'static str, f64)> {
        let mut s = vec![("loss", self.loss)];
        match &self.regression {
            Some(g) => s.extend([("rmse", g.rmse()), ("mae", g.mae()), ("r2", g.r2())]),
            None => s.push(("accuracy", self.accuracy)),
        }
        if let Some(p) = &self.per_class {
            s.push(("balanced_accuracy", p.balanced_accuracy()));
            s.push(("macro_f1", p.macro_f1()));
        }
        if let Some(m) = &self.multi_label {
            s.extend([
                ("exact_match", m.exact_match),
                ("f1_micro", m.f1_micro),
                ("f1_macro", m.f1_macro),
            ]);
        }
        if let Some(o) = self.objective {
            s.push(("objective", o));
        }
        s
    }
}

/// Whether a lower value of score `name` is the better one.
pub fn lower_is_better(name: &str) -> bool {
    LOWER_IS_BETTER.contains(&name)
}

/// The best evaluation so far of a run that keeps its best model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Best {
    /// The score it is judged by (`loss`, `accuracy`, ...).
    pub metric: String,
    /// The evaluated data's split name (`val`).
    pub split: String,
    pub value: f64,
    /// Steps taken and epoch when it was evaluated.
    pub step: u64,
    pub epoch: u64,
    /// Evaluations of that score since, none of them better.
    pub evals_since: u64,
    /// How many such evaluations end the run (as last asked), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patience: Option<u64>,
    /// How much better than the best a value must be to be better (as last
    /// asked; Keras' and Lightning's `min_delta`): 0, any.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_delta: f64,
    /// The checkpoint that holds its model, when one was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// What an evaluation did to the best so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// The first evaluation of this score and split, or a better one.
    Better,
    /// No better (equal is not better); the count since the best grew.
    NotBetter,
    /// The best so far was of another score or split: this evaluation
    /// starts the comparison afresh.
    Restarted,
}

/// The evaluation that is being compared.
pub struct Candidate<'a> {
    pub metric: &'a str,
    pub split: &'a str,
    pub value: f64,
    pub step: u64,
    pub epoch: u64,
    pub patience: Option<u64>,
    /// Better means better by more than this.
    pub min_delta: f64,
}

impl Best {
    /// Compares `c` with the best so far (none: `c` is the first), updating
    /// it; a new best has no `path` until its model is written. A value that
    /// is not finite is never better, nor one better by `min_delta` or less.
    pub fn offer(best: &mut Option<Best>, c: &Candidate) -> Offer {
        let fresh = Best {
            metric: c.metric.to_string(),
            split: c.split.to_string(),
            value: c.value,
            step: c.step,
            epoch: c.epoch,
            evals_since: 0,
            patience: c.patience,
            min_delta: c.min_delta,
            path: None,
        };
        let Some(b) = best.as_mut() else {
            if !c.value.is_finite() {
                return Offer::NotBetter;
            }
            *best = Some(fresh);
            return Offer::Better;
        };
        if b.metric != c.metric || b.split != c.split {
            if !c.value.is_finite() {
                *best = None;
                return Offer::NotBetter;
            }
            *best = Some(fresh);
            return Offer::Restarted;
        }
        b.patience = c.patience;
        b.min_delta = c.min_delta;
        let better = c.value.is_finite()
            && if lower_is_better(c.metric) {
                c.value < b.value - c.min_delta
            } else {
                c.value > b.value + c.min_delta
            };
        if better {
            *b = fresh;
            Offer::Better
        } else {
            b.evals_since += 1;
            Offer::NotBetter
        }
    }

    /// Whether the run has gone `patience` evaluations without a better one.
    pub fn stopped(&self) -> bool {
        self.patience.is_some_and(|p| self.evals_since >= p)
    }

    /// A value of score `metric` as the lines show it: `1.7123`, or
    /// `97.50%` for a share.
    pub fn shown(metric: &str, value: f64) -> String {
        match metric {
            "accuracy" | "balanced_accuracy" | "exact_match" => format!("{:.2}%", value * 100.0),
            _ => format!("{value:.4}"),
        }
    }

    /// `val loss 1.7123` / `val accuracy 97.50%`.
    pub fn describe_value(metric: &str, split: &str, value: f64) -> String {
        format!("{split} {metric} {}", Best::shown(metric, value))
    }

    /// `val loss 1.7123 at step 880, epoch 2`.
    pub fn describe(&self) -> String {
        format!(
            "{} at step {}, epoch {}",
            Best::describe_value(&self.metric, &self.split, self.value),
            self.step,
            self.epoch
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(best: &mut Option<Best>, metric: &str, value: f64, step: u64) -> Offer {
        Best::offer(
            best,
            &Candidate {
                metric,
                split: "val",
                value,
                step,
                epoch: step,
                patience: Some(2),
                min_delta: 0.0,
            },
        )
    }

    /// With `min_delta`, a value better by that much or less is no better
    /// (Keras' EarlyStopping); lower or higher, as the score goes.
    #[test]
    fn min_delta_is_the_least_improvement_that_counts() {
        let by = |b: &mut Option<Best>, metric: &str, value: f64| {
            Best::offer(
                b,
                &Candidate {
                    metric,
                    split: "val",
                    value,
                    step: 1,
                    epoch: 1,
                    patience: None,
                    min_delta: 0.25,
                },
            )
        };
        let mut b = None;
        assert_eq!(by(&mut b, "loss", 2.0), Offer::Better);
        assert_eq!(by(&mut b, "loss", 1.75), Offer::NotBetter);
        assert_eq!(by(&mut b, "loss", 1.7), Offer::Better);
        assert_eq!(b.as_ref().unwrap().value, 1.7);
        let mut b = None;
        assert_eq!(by(&mut b, "accuracy", 0.5), Offer::Better);
        assert_eq!(by(&mut b, "accuracy", 0.75), Offer::NotBetter);
        assert_eq!(by(&mut b, "accuracy", 0.8), Offer::Better);
        assert_eq!(b.as_ref().unwrap().evals_since, 0);
    }

    #[test]
    fn lower_loss_and_higher_accuracy_are_better_and_ties_are_not() {
        let mut b = None;
        assert_eq!(offer(&mut b, "loss", 2.0, 1), Offer::Better);
        assert_eq!(offer(&mut b, "loss", 1.5, 2), Offer::Better);
        assert_eq!(offer(&mut b, "loss", 1.5, 3), Offer::NotBetter);
        assert_eq!(b.as_ref().unwrap().step, 2);
        assert!(!b.as_ref().unwrap().stopped());
        assert_eq!(offer(&mut b, "loss", f64::NAN, 4), Offer::NotBetter);
        assert!(b.as_ref().unwrap().stopped(), "two evaluations, patience 2");
        assert_eq!(b.as_ref().unwrap().evals_since, 2);
        // Another score starts afresh.
        assert_eq!(offer(&mut b, "accuracy", 0.5, 5), Offer::Restarted);
        assert_eq!(offer(&mut b, "accuracy", 0.4, 6), Offer::NotBetter);
        assert_eq!(offer(&mut b, "accuracy", 0.6, 7), Offer::Better);
        assert_eq!(b.as_ref().unwrap().value, 0.6);
        assert_eq!(b.as_ref().unwrap().evals_since, 0);
    }

    #[test]
    fn a_first_value_that_is_not_finite_is_no_best() {
        let mut b = None;
        assert_eq!(offer(&mut b, "loss", f64::INFINITY, 1), Offer::NotBetter);
        assert!(b.is_none());
        assert_eq!(offer(&mut b, "loss", 3.0, 2), Offer::Better);
    }
}
