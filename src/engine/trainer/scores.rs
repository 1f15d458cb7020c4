//! What an evaluation sums batch by batch and what it scores: the mean
//! loss and accuracy, a regression's errors and R², and a classifier's
//! confusion matrix with each class's precision, recall and F1, as
//! scikit-learn's `classification_report` gives them.

use candle_core::{DType, Tensor};

use super::regression::{Regression, TargetSums};
use super::Eval;
use crate::engine::bce::LabelCounts;
use crate::{Error, Result};

/// The most classes whose confusion matrix an evaluation keeps.
pub const MAX_CONFUSION_CLASSES: usize = 100;

/// Running sums of an evaluation, batch by batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvalSums {
    pub loss: f64,
    pub objective: f64,
    pub correct: f64,
    /// Samples (sequence models: positions; a regression: target values).
    pub count: usize,
    /// A regression's sums, target by target (a sample's `k`th value is
    /// target `k`); `regression` counts the batches that had them.
    pub targets: Vec<TargetSums>,
    pub regression: usize,
    /// A classifier's confusion matrix, `k x k` row by row (row: the
    /// class, column: the prediction); empty when not kept.
    pub confusion: Vec<f64>,
    /// A multi-label classifier's decisions, label by label (none
    /// otherwise).
    pub labels: LabelCounts,
}

impl EvalSums {
    pub fn add(&mut self, o: &EvalSums) {
        self.loss += o.loss;
        self.objective += o.objective;
        self.correct += o.correct;
        self.count += o.count;
        if self.targets.is_empty() {
            self.targets = o.targets.clone();
        } else if o.targets.len() == self.targets.len() {
            for (a, b) in self.targets.iter_mut().zip(&o.targets) {
                a.add(b);
            }
        }
        self.regression += o.regression;
        if !o.labels.labels.is_empty() {
            self.labels.add(&o.labels);
        }
        if self.confusion.is_empty() {
            self.confusion = o.confusion.clone();
        } else if o.confusion.len() == self.confusion.len() {
            for (a, b) in self.confusion.iter_mut().zip(&o.confusion) {
                *a += b;
            }
        }
    }

    /// No sums yet, keeping a confusion matrix of `classes` (none for 0).
    pub fn with_classes(classes: usize) -> EvalSums {
        EvalSums {
            confusion: vec![0.0; classes * classes],
            ..EvalSums::default()
        }
    }

    /// No sums yet, for a multi-label classifier of `labels` labels.
    pub fn with_labels(labels: usize) -> EvalSums {
        EvalSums {
            labels: LabelCounts {
                labels: vec![[0.0; 4]; labels],
                exact: 0.0,
            },
            ..EvalSums::default()
        }
    }

    /// No sums yet, for a regression of `targets` values per sample.
    pub fn with_targets(targets: usize) -> EvalSums {
        EvalSums {
            targets: vec![TargetSums::default(); targets],
            ..EvalSums::default()
        }
    }

    /// Counts each prediction (the largest of a row of `logits`) against
    /// its label in the confusion matrix, when one is kept; returns how
    /// many were right then (the accuracy's count, without a second
    /// argmax), or None when no matrix counted them.
    pub fn add_predictions(
        &mut self,
        logits: &Tensor,
        labels: &Tensor,
    ) -> candle_core::Result<Option<f64>> {
        let k = self.classes();
        if k == 0 || logits.rank() != 2 || labels.rank() != 1 {
            return Ok(None);
        }
        let predicted: Vec<u32> = logits.argmax(1)?.to_dtype(DType::U32)?.to_vec1()?;
        let labels: Vec<u32> = labels.to_dtype(DType::U32)?.to_vec1()?;
        let mut right = 0.0;
        for (&y, &p) in labels.iter().zip(&predicted) {
            if let Some(cell) = self.confusion.get_mut(y as usize * k + p as usize) {
                *cell += 1.0;
            }
            right += f64::from(u8::from(y == p));
        }
        Ok(Some(right))
    }

    /// The classes of the confusion matrix (0: none kept).
    pub fn classes(&self) -> usize {
        (self.confusion.len() as f64).sqrt().round() as usize
    }

    /// The sums as numbers, in a fixed order (for summing over ranks):
    /// the regression's target by target, a multi-label classifier's
    /// label by label and its exact count, then the confusion matrix.
    pub fn to_values(&self) -> Vec<f64> {
        let mut v = vec![
            self.loss,
            self.objective,
            self.correct,
            self.count as f64,
            self.regression as f64,
        ];
        for t in &self.targets {
            v.extend([t.squared, t.absolute, t.sum, t.squares]);
        }
        for c in &self.labels.labels {
            v.extend(c);
        }
        if !self.labels.labels.is_empty() {
            v.push(self.labels.exact);
        }
        v.extend(&self.confusion);
        v
    }

    /// The sums [`EvalSums::to_values`] gave, of a regression of `targets`
    /// values per sample, or a multi-label classifier of `labels` (0 for
    /// none).
    pub fn from_values(v: &[f64], targets: usize, labels: usize) -> EvalSums {
        let end = 5 + 4 * targets;
        let (counts, rest) = match labels {
            0 => (LabelCounts::default(), end),
            k => {
                let at = end + 4 * k;
                let labels = v[end..at]
                    .chunks_exact(4)
                    .map(|c| [c[0], c[1], c[2], c[3]])
                    .collect();
                (
                    LabelCounts {
                        labels,
                        exact: v[at],
                    },
                    at + 1,
                )
            }
        };
        EvalSums {
            loss: v[0],
            objective: v[1],
            correct: v[2],
            count: v[3].round() as usize,
            regression: v[4].round() as usize,
            targets: v[5..end]
                .chunks_exact(4)
                .map(|t| TargetSums {
                    squared: t[0],
                    absolute: t[1],
                    sum: t[2],
                    squares: t[3],
                })
                .collect(),
            confusion: v[rest..].to_vec(),
            labels: counts,
        }
    }

    /// Adds a regression batch's errors: `out` (`[batch, targets]`)
    /// against `targets`, value by value, in f64, each to its target's sums.
    pub fn add_errors(&mut self, out: &Tensor, targets: &Tensor) -> candle_core::Result<()> {
        let f = |t: &Tensor| -> candle_core::Result<Vec<f64>> {
            t.flatten_all()?.to_dtype(DType::F64)?.to_vec1()
        };
        let (p, y) = (f(out)?, f(targets)?);
        if p.len() != y.len() {
            candle_core::bail!("evaluate: {} predictions for {} targets", p.len(), y.len());
        }
        let n = out.dims().first().copied().unwrap_or(1).max(1);
        let k = (p.len() / n).max(1);
        if self.targets.is_empty() {
            self.targets = vec![TargetSums::default(); k];
        }
        if self.targets.len() != k {
            candle_core::bail!(
                "evaluate: {k} values per sample, against an evaluation of {} targets",
                self.targets.len()
            );
        }
        for (row_p, row_y) in p.chunks_exact(k).zip(y.chunks_exact(k)) {
            for ((t, p), y) in self.targets.iter_mut().zip(row_p).zip(row_y) {
                t.squared += (p - y) * (p - y);
                t.absolute += (p - y).abs();
                t.sum += y;
                t.squares += y * y;
            }
        }
        self.regression += 1;
        Ok(())
    }

    /// The means; an error for an empty data set.
    pub fn eval(&self, with_objective: bool) -> Result<Eval> {
        if self.count == 0 {
            return Err(Error::Data("evaluate: the data set is empty".into()));
        }
        let n = self.count as f64;
        let regression = (self.regression > 0 && !self.targets.is_empty()).then(|| {
            // Each target has a value of every sample.
            let n = n / self.targets.len() as f64;
            Regression {
                targets: self.targets.iter().map(|t| t.scores(n)).collect(),
            }
        });
        Ok(Eval {
            loss: self.loss / n,
            accuracy: self.correct / n,
            // A regression counted each target's value, a multi-label
            // classifier each label's.
            samples: self.count / self.targets.len().max(self.labels.labels.len()).max(1),
            objective: with_objective.then(|| self.objective / n),
            per_class: (self.classes() > 0 && regression.is_none()).then(|| PerClass {
                confusion: self
                    .confusion
                    .chunks(self.classes())
                    .map(|row| row.iter().map(|&c| c.round() as u64).collect())
                    .collect(),
            }),
            regression,
            multi_label: (!self.labels.labels.is_empty())
                .then(|| self.labels.scores(n / self.labels.labels.len() as f64)),
        })
    }
}

/// A classifier's evaluation, class by class.
#[derive(Debug, Clone, PartialEq)]
pub struct PerClass {
    /// `confusion[class][prediction]`: how many samples of each class were
    /// predicted as each.
    pub confusion: Vec<Vec<u64>>,
}

/// One class's scores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassScores {
    pub class: usize,
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    /// The class's samples.
    pub support: u64,
}

impl PerClass {
    /// The scores of each class that is a label or a prediction (as
    /// scikit-learn's `precision_recall_fscore_support` over the labels
    /// present); a ratio whose denominator is 0 is 0 (its `zero_division`).
    pub fn scores(&self) -> Vec<ClassScores> {
        let k = self.confusion.len();
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        (0..k)
            .filter_map(|c| {
                let tp = self.confusion[c][c];
                let support: u64 = self.confusion[c].iter().sum();
                let predicted: u64 = self.confusion.iter().map(|row| row[c]).sum();
                if support == 0 && predicted == 0 {
                    return None;
                }
                let (precision, recall) = (ratio(tp, predicted), ratio(tp, support));
                let f1 = match precision + recall {
                    s if s > 0.0 => 2.0 * precision * recall / s,
                    _ => 0.0,
                };
                Some(ClassScores {
                    class: c,
                    precision,
                    recall,
                    f1,
                    support,
                })
            })
            .collect()
    }

    /// The mean F1 over the classes present (`f1_score(average="macro")`).
    pub fn macro_f1(&self) -> f64 {
        let s = self.scores();
        s.iter().map(|c| c.f1).sum::<f64>() / s.len().max(1) as f64
    }

    /// The mean recall over the classes that have samples
    /// (`balanced_accuracy_score`): accuracy that a large class cannot carry.
    pub fn balanced_accuracy(&self) -> f64 {
        let r: Vec<f64> = self
            .scores()
            .iter()
            .filter(|c| c.support > 0)
            .map(|c| c.recall)
            .collect();
        r.iter().sum::<f64>() / r.len().max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Labels and predictions counted through `add_predictions` (in two
    /// batches), scored against scikit-learn's definitions computed here
    /// from the pairs: class 3 is only predicted (precision 0, no recall),
    /// class 4 neither (left out), class 2 never predicted (precision 0
    /// by `zero_division`).
    #[test]
    fn per_class_scores_follow_scikit_learns_definitions() -> candle_core::Result<()> {
        let pairs = [
            (0u32, 0u32),
            (0, 0),
            (0, 1),
            (1, 1),
            (1, 1),
            (1, 1),
            (1, 0),
            (2, 1),
            (2, 3),
            (0, 3),
        ];
        let mut sums = EvalSums::with_classes(5);
        for part in pairs.chunks(6) {
            let y: Vec<u32> = part.iter().map(|p| p.0).collect();
            let mut logits = vec![0f32; part.len() * 5];
            for (i, p) in part.iter().enumerate() {
                logits[i * 5 + p.1 as usize] = 1.0;
            }
            let logits = Tensor::from_vec(logits, (part.len(), 5), &Device::Cpu)?;
            let y = Tensor::new(y, &Device::Cpu)?;
            let mut s = EvalSums::with_classes(5);
            s.add_predictions(&logits, &y)?;
            sums.add(&s);
        }
        let back = EvalSums::from_values(&sums.to_values(), 0, 0);
        assert_eq!(back, sums);
        sums.count = pairs.len();
        let p = sums.eval(false).unwrap().per_class.unwrap();
        assert_eq!(p.confusion[0], [2, 1, 0, 1, 0]);

        let count =
            |f: &dyn Fn(u32, u32) -> bool| pairs.iter().filter(|&&(y, q)| f(y, q)).count() as f64;
        let mut f1s = Vec::new();
        let mut recalls = Vec::new();
        let scores = p.scores();
        assert_eq!(
            scores.iter().map(|s| s.class).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        for s in &scores {
            let c = s.class as u32;
            let tp = count(&|y, q| y == c && q == c);
            let (support, predicted) = (count(&|y, _| y == c), count(&|_, q| q == c));
            let precision = if predicted > 0.0 { tp / predicted } else { 0.0 };
            let recall = if support > 0.0 { tp / support } else { 0.0 };
            let f1 = if tp > 0.0 {
                2.0 * precision * recall / (precision + recall)
            } else {
                0.0
            };
            assert_eq!(
                (s.precision, s.recall, s.f1, s.support),
                (precision, recall, f1, support as u64)
            );
            f1s.push(f1);
            if support > 0.0 {
                recalls.push(recall);
            }
        }
        assert!((p.macro_f1() - f1s.iter().sum::<f64>() / 4.0).abs() < 1e-15);
        assert!((p.balanced_accuracy() - recalls.iter().sum::<f64>() / 3.0).abs() < 1e-15);
        // (2/4 + 3/4 + 0/2) / 3, as balanced_accuracy_score gives it.
        assert!((p.balanced_accuracy() - 1.25 / 3.0).abs() < 1e-15);
        Ok(())
    }

    /// A regression, a sequence model and a batch of other shapes keep none.
    #[test]
    fn no_matrix_without_one_label_per_sample() -> candle_core::Result<()> {
        let mut none = EvalSums::default();
        let logits = Tensor::zeros((2, 3), DType::F32, &Device::Cpu)?;
        none.add_predictions(&logits, &Tensor::new(&[0u32, 1], &Device::Cpu)?)?;
        assert!(none.confusion.is_empty());
        let mut seq = EvalSums::with_classes(3);
        let logits = Tensor::zeros((2, 4, 3), DType::F32, &Device::Cpu)?;
        seq.add_predictions(&logits, &Tensor::zeros((2, 4), DType::U32, &Device::Cpu)?)?;
        assert!(seq.confusion.iter().all(|&c| c == 0.0));
        Ok(())
    }
}
