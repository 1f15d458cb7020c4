//! Multi-label classification: each of a sample's `k` labels is a yes or
//! no (a target of 1 or 0) that the model's `k` outputs predict
//! independently, through the binary cross-entropy on the logits, as
//! `torch.nn.BCEWithLogitsLoss` computes it (its mean over every value,
//! `pos_weight` weighing each label's positives).

use candle_core::{DType, Result, Tensor};

/// `torch.nn.BCEWithLogitsLoss(pos_weight=...)`, mean reduction.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bce {
    /// Each label's weight of its positive targets (one number for every
    /// label, or one per label); None: 1.
    pub pos_weight: Option<Vec<f32>>,
}

impl Bce {
    /// The mean over every value of `logits` (`[n, k]`) against `targets`
    /// (0 to 1, as many), in f32: `(1 - y) x + (1 + (w - 1) y)
    /// softplus(-x)`, softplus computed as `max(-x, 0) + ln(1 + e^-|x|)` so
    /// that no exponential overflows (PyTorch's form).
    pub fn loss(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        if logits.elem_count() != targets.elem_count() {
            candle_core::bail!(
                "bce: the model gives {:?} values, the targets are {:?}",
                logits.dims(),
                targets.dims()
            );
        }
        let x = logits.to_dtype(DType::F32)?;
        let y = targets.to_dtype(DType::F32)?.reshape(x.shape())?;
        let softplus = (x.neg()?.relu()? + (x.abs()?.neg()?.exp()? + 1.0)?.log()?)?;
        let weight = match &self.pos_weight {
            None => None,
            Some(w) => {
                let k = x.dims().last().copied().unwrap_or(1);
                let w = match w.len() {
                    1 => vec![w[0]; k],
                    n if n == k => w.clone(),
                    n => candle_core::bail!(
                        "bce: pos_weight has {n} values, and the model gives {k} labels"
                    ),
                };
                let w = Tensor::from_vec(w, k, x.device())?;
                Some(((y.broadcast_mul(&(w - 1.0)?))? + 1.0)?)
            }
        };
        let positive = match weight {
            Some(w) => (w * softplus)?,
            None => softplus,
        };
        let negative = ((y.neg()? + 1.0)? * &x)?;
        (negative + positive)?.mean_all()
    }

    pub fn describe(&self) -> String {
        match &self.pos_weight {
            None => "bce".into(),
            Some(w) => {
                let w: Vec<String> = w.iter().map(|v| format!("{v}")).collect();
                format!("bce pos_weight [{}]", w.join(", "))
            }
        }
    }
}

/// Each label's decisions (a logit above 0 is a yes, a target of 0.5 or
/// more a yes) counted against the targets, and the samples whose every
/// label was right.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelCounts {
    /// Per label: true positives, false positives, false negatives, true
    /// negatives.
    pub labels: Vec<[f64; 4]>,
    /// Samples with every label right.
    pub exact: f64,
}

/// [`LabelCounts`] of `logits` (`[n, k]`) against `targets`.
pub fn label_counts(logits: &Tensor, targets: &Tensor) -> Result<LabelCounts> {
    let n = logits.dims().first().copied().unwrap_or(1).max(1);
    let f = |t: &Tensor| -> Result<Vec<f32>> { t.flatten_all()?.to_dtype(DType::F32)?.to_vec1() };
    let (x, y) = (f(logits)?, f(targets)?);
    if x.len() != y.len() {
        candle_core::bail!("evaluate: {} predictions for {} targets", x.len(), y.len());
    }
    let k = (x.len() / n).max(1);
    let mut counts = LabelCounts {
        labels: vec![[0.0; 4]; k],
        exact: 0.0,
    };
    for (row_x, row_y) in x.chunks_exact(k).zip(y.chunks_exact(k)) {
        let mut all = true;
        for ((c, &p), &t) in counts.labels.iter_mut().zip(row_x).zip(row_y) {
            let (said, is) = (p > 0.0, t >= 0.5);
            c[match (said, is) {
                (true, true) => 0,
                (true, false) => 1,
                (false, true) => 2,
                (false, false) => 3,
            }] += 1.0;
            all &= said == is;
        }
        counts.exact += f64::from(u8::from(all));
    }
    Ok(counts)
}

impl LabelCounts {
    pub fn add(&mut self, o: &LabelCounts) {
        if self.labels.is_empty() {
            self.labels = vec![[0.0; 4]; o.labels.len()];
        }
        for (a, b) in self.labels.iter_mut().zip(&o.labels) {
            for (x, y) in a.iter_mut().zip(b) {
                *x += y;
            }
        }
        self.exact += o.exact;
    }

    /// The scores, over `samples` samples.
    pub fn scores(&self, samples: f64) -> MultiLabel {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let f1 = |tp: f64, fp: f64, fn_: f64| ratio(2.0 * tp, 2.0 * tp + fp + fn_);
        let labels: Vec<LabelScores> = self
            .labels
            .iter()
            .map(|&[tp, fp, fn_, _]| LabelScores {
                precision: ratio(tp, tp + fp),
                recall: ratio(tp, tp + fn_),
                f1: f1(tp, fp, fn_),
                support: (tp + fn_).round() as u64,
            })
            .collect();
        let sum = |i: usize| self.labels.iter().map(|c| c[i]).sum::<f64>();
        MultiLabel {
            exact_match: ratio(self.exact, samples),
            f1_micro: f1(sum(0), sum(1), sum(2)),
            f1_macro: labels.iter().map(|l| l.f1).sum::<f64>() / labels.len().max(1) as f64,
            labels,
        }
    }
}

/// A multi-label classifier's evaluation, as scikit-learn scores one:
/// `exact_match` is its `accuracy_score` (every label of a sample right),
/// `f1_micro` and `f1_macro` its `f1_score(average=...)` (an F1 of a label
/// with no positive and none predicted is 0, its `zero_division=0`).
#[derive(Debug, Clone, PartialEq)]
pub struct MultiLabel {
    pub exact_match: f64,
    pub f1_micro: f64,
    pub f1_macro: f64,
    pub labels: Vec<LabelScores>,
}

/// One label's precision, recall and F1, and its positives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LabelScores {
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    pub support: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    // Reference, torch 2.15 in float64:
    //   x = [[2.0, -1.0, 0.5], [-3.0, 0.25, 40.0]]; y = [[1, 0, 1], [0, 0.5, 0]]
    //   nn.BCEWithLogitsLoss()(x, y)                       -> 6.9439655757
    //   nn.BCEWithLogitsLoss(pos_weight=[2, 1, 0.5])(x, y) -> 6.9256138289
    //   its gradient wrt x (pos_weight [2, 1, 0.5]):
    //   [[-0.0397343073, 0.0448235702, -0.0314617224],
    //    [0.0079043122, 0.0103627501, 0.1666666667]]
    fn inputs() -> (Tensor, Tensor) {
        let x = [[2.0f32, -1.0, 0.5], [-3.0, 0.25, 40.0]];
        let y = [[1.0f32, 0.0, 1.0], [0.0, 0.5, 0.0]];
        let d = &Device::Cpu;
        (Tensor::new(&x, d).unwrap(), Tensor::new(&y, d).unwrap())
    }

    /// The loss and its gradient are PyTorch's, with and without
    /// `pos_weight`, for a large logit too (no overflow).
    #[test]
    fn bce_is_torchs_bce_with_logits() {
        let (x, y) = inputs();
        let plain = Bce::default().loss(&x, &y).unwrap();
        assert!((plain.to_scalar::<f32>().unwrap() - 6.943_965_6).abs() < 1e-5);
        let v = Var::from_tensor(&x).unwrap();
        let weighted = Bce {
            pos_weight: Some(vec![2.0, 1.0, 0.5]),
        };
        let l = weighted.loss(v.as_tensor(), &y).unwrap();
        assert!((l.to_scalar::<f32>().unwrap() - 6.925_614).abs() < 1e-5);
        let g = l.backward().unwrap();
        let g: Vec<Vec<f32>> = g.get(v.as_tensor()).unwrap().to_vec2().unwrap();
        let want = [
            [-0.039_734_307, 0.044_823_57, -0.031_461_722],
            [0.007_904_312, 0.010_362_75, 0.166_666_67],
        ];
        for (r, w) in g.iter().zip(want) {
            for (a, b) in r.iter().zip(w) {
                assert!((a - b).abs() < 1e-6, "{g:?}");
            }
        }
        let e = Bce {
            pos_weight: Some(vec![1.0, 2.0]),
        }
        .loss(&x, &y)
        .unwrap_err();
        assert!(e.to_string().contains("pos_weight has 2 values"), "{e}");
    }

    #[test]
    fn labels_are_counted_by_their_decisions() {
        let (x, y) = inputs();
        let c = label_counts(&x, &y).unwrap();
        // Row 0: yes/yes, no/no, yes/yes: exact. Row 1: no/no, yes/yes
        // (0.5 is a yes), yes/no.
        assert_eq!(
            c.labels,
            vec![
                [1.0, 0.0, 0.0, 1.0],
                [1.0, 0.0, 0.0, 1.0],
                [1.0, 1.0, 0.0, 0.0]
            ]
        );
        assert_eq!(c.exact, 1.0);
    }
}
