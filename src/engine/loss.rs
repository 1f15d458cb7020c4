//! Losses over the last dimension of the logits, any leading shape.

use std::sync::Arc;

use candle_core::{DType, Result, Tensor, D};
use serde::Deserialize;

pub use super::bce::Bce;
pub use super::class_weights::ClassWeights;
use super::class_weights::{weight_sum, weighted_terms};
pub use super::distill::Distill;
use super::ignored;
pub use super::ignored::IGNORE;

/// What a run trains against.
#[derive(Clone)]
pub enum Loss {
    CrossEntropy(CrossEntropy),
    Distill(Distill),
    /// Mean squared error against a regression target.
    Mse,
    /// Binary cross-entropy of each of several labels (multi-label).
    Bce(Bce),
}

impl Default for Loss {
    fn default() -> Self {
        Loss::CrossEntropy(CrossEntropy::default())
    }
}

impl Loss {
    /// The mean loss of `logits` (the student's, from inputs `x`) against
    /// `targets`.
    pub fn loss(&self, x: &Tensor, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        match self {
            Loss::CrossEntropy(c) => c.loss(logits, targets),
            Loss::Distill(d) => d.loss(x, logits, targets),
            Loss::Mse => mse(logits, targets),
            Loss::Bce(b) => b.loss(logits, targets),
        }
    }

    /// For a cross-entropy with class weights, the sum of the weights of
    /// `targets`' labels: the denominator of the weighted mean over them.
    pub fn weight_sum(&self, targets: &Tensor) -> Result<Option<f64>> {
        match self {
            Loss::CrossEntropy(c) => match c.resolved_weights()? {
                Some(w) => weight_sum(targets, w).map(Some),
                None => Ok(None),
            },
            _ => Ok(None),
        }
    }

    /// The weighted cross-entropy's numerator (its sum, before the mean
    /// divides it by the weights of the labels).
    pub fn weighted_numerator(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        match self {
            Loss::CrossEntropy(c) => match c.weighted(logits, targets)? {
                Some((num, _)) => Ok(num),
                None => candle_core::bail!("the loss has no class weights"),
            },
            _ => candle_core::bail!("the loss has no class weights"),
        }
    }

    /// What evaluation reports as `loss`: the cross-entropy against the
    /// labels, or a regression's mean squared error.
    pub fn base(&self) -> Loss {
        match self {
            Loss::CrossEntropy(c) => Loss::CrossEntropy(c.unweighted()),
            Loss::Distill(d) => Loss::CrossEntropy(d.base.unweighted()),
            Loss::Mse => Loss::Mse,
            Loss::Bce(b) => Loss::Bce(b.clone()),
        }
    }

    /// Whether it trains against a regression target (float values) rather
    /// than class labels.
    pub fn regression(&self) -> bool {
        matches!(self, Loss::Mse)
    }

    /// Whether each sample has several yes-or-no labels (0 or 1 targets,
    /// one per output).
    pub fn multi_label(&self) -> bool {
        matches!(self, Loss::Bce(_))
    }

    /// Whether its targets are numbers, one per output (a regression's, or
    /// a multi-label classifier's 0s and 1s), rather than class labels.
    pub fn float_targets(&self) -> bool {
        self.regression() || self.multi_label()
    }

    /// Why `targets` cannot be this loss's (class labels for a regression
    /// or multi-label classifier, numbers for a classifier), or None.
    pub fn refuses(&self, targets: &Tensor) -> Option<String> {
        match (self, targets.dtype().is_float()) {
            (Loss::Mse, false) => Some(
                "the targets are class labels, and the loss (mse) takes numbers: give a CSV file's number column or a safetensors file's tensor as `target`, or train classes with taper.loss.cross_entropy{}"
                    .into(),
            ),
            (Loss::Bce(_), false) => Some(
                "the targets are class labels, and the loss (bce) takes each sample's labels as 0s and 1s, one per output: give a CSV file's 0/1 columns as `target = { ... }` (or a safetensors file's tensor), or train one class per sample with taper.loss.cross_entropy{}"
                    .into(),
            ),
            (Loss::CrossEntropy(_) | Loss::Distill(_), true) => Some(
                "the targets are numbers (a regression target), and the loss (cross-entropy) takes class labels: train numbers with `loss = taper.loss.mse{}`, or several 0/1 labels per sample with `loss = taper.loss.bce{}`"
                    .into(),
            ),
            _ => None,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Loss::CrossEntropy(c) => {
                let mut d = format!("cross_entropy label_smoothing {}", c.label_smoothing);
                if let Some(w) = &c.weights {
                    let w: Vec<String> = w.iter().map(|v| format!("{v:.4}")).collect();
                    d += &format!(" weight [{}]", w.join(", "));
                } else if let Some(asked) = &c.class_weights {
                    d += &format!(" weight {}", asked.describe());
                }
                d
            }
            Loss::Distill(d) => format!(
                "distill from {} temperature {} alpha {}",
                d.teacher_name, d.temperature, d.alpha
            ),
            Loss::Mse => "mse".into(),
            Loss::Bce(b) => b.describe(),
        }
    }
}

/// The mean squared error of `out` against `targets` (as
/// `torch.nn.MSELoss()`): every value of both, in `out`'s type.
pub fn mse(out: &Tensor, targets: &Tensor) -> Result<Tensor> {
    if out.elem_count() != targets.elem_count() {
        candle_core::bail!(
            "mse: the model gives {:?} values, the targets are {:?}",
            out.dims(),
            targets.dims()
        );
    }
    let t = targets.to_dtype(out.dtype())?.reshape(out.shape())?;
    (out - t)?.sqr()?.mean_all()
}

/// Cross-entropy with optional label smoothing (as `torch.nn.CrossEntropyLoss`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CrossEntropy {
    pub label_smoothing: f64,
    /// Rows per block for the chunked cross-entropy of models with a
    /// language-model head (GPT): the `positions x vocab` logits are never
    /// all in memory. 0 (the default) computes the full logits.
    pub chunk: usize,
    /// The class weights asked for, until the run resolves them into
    /// `weights`.
    #[serde(skip)]
    pub class_weights: Option<ClassWeights>,
    /// One weight per label (PyTorch's `weight`): the mean is then
    /// `sum(w[y] * loss) / sum(w[y])`.
    #[serde(skip)]
    pub weights: Option<Arc<[f32]>>,
}

fn flatten(logits: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
    let classes = logits.dim(D::Minus1)?;
    Ok((logits.reshape(((), classes))?, targets.flatten_all()?))
}

impl CrossEntropy {
    /// Mean loss over all positions: `logits [.., C]`, `targets [..]` (u32);
    /// with class weights, the weighted mean (0 when every weight is 0).
    /// A sequence's positions labelled [`IGNORE`] are left out, as
    /// PyTorch's `ignore_index` leaves them out: the mean is over the others.
    pub fn loss(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        if let Some(keep) = ignored::labelled_index(targets, targets.device())? {
            if keep.elem_count() == 0 {
                return ignored::nothing(logits);
            }
            let (logits, targets) = flatten(logits, targets)?;
            let (logits, targets) = ignored::keep_rows(&logits, &targets, &keep)?;
            return self.loss(&logits, &targets);
        }
        if let Some((num, den)) = self.weighted(logits, targets)? {
            let den = den.maximum(f32::MIN_POSITIVE as f64)?; // stays > 0 in f32
            return num.broadcast_div(&den);
        }
        let (logits, targets) = flatten(logits, targets)?;
        let logp = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let nll = candle_nn::loss::nll(&logp, &targets)?;
        if self.label_smoothing == 0.0 {
            return Ok(nll);
        }
        let eps = self.label_smoothing;
        let uniform = logp.mean(D::Minus1)?.mean_all()?.neg()?;
        (nll * (1.0 - eps))? + (uniform * eps)?
    }

    /// With class weights, the weighted loss's numerator and denominator
    /// over these positions; None without them. An error when the weights
    /// were asked for and not resolved (no silent unweighted loss).
    pub fn weighted(&self, logits: &Tensor, targets: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
        let Some(w) = self.resolved_weights()? else {
            return Ok(None);
        };
        let (logits, targets) = match ignored::labelled_index(targets, targets.device())? {
            Some(keep) if keep.elem_count() == 0 => {
                return Ok(Some((
                    ignored::nothing(logits)?,
                    Tensor::new(0f32, logits.device())?,
                )))
            }
            Some(keep) => {
                let (logits, targets) = flatten(logits, targets)?;
                ignored::keep_rows(&logits, &targets, &keep)?
            }
            None => flatten(logits, targets)?,
        };
        weighted_terms(&logits, &targets, w, self.label_smoothing).map(Some)
    }

    fn resolved_weights(&self) -> Result<Option<&[f32]>> {
        match (&self.weights, &self.class_weights) {
            (Some(w), _) => Ok(Some(w)),
            (None, Some(_)) => candle_core::bail!(
                "cross_entropy: its class weights were not resolved against a run's classes"
            ),
            (None, None) => Ok(None),
        }
    }

    /// The same loss without class weights: what evaluation reports.
    pub fn unweighted(&self) -> CrossEntropy {
        CrossEntropy {
            label_smoothing: self.label_smoothing,
            chunk: self.chunk,
            class_weights: None,
            weights: None,
        }
    }
}

/// Number of positions where the arg-max of `logits` equals `targets`.
pub fn correct(logits: &Tensor, targets: &Tensor) -> Result<f64> {
    let (logits, targets) = flatten(logits, targets)?;
    let pred = logits.argmax(D::Minus1)?;
    pred.eq(&targets)?
        .to_dtype(DType::F64)?
        .sum_all()?
        .to_scalar::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    // Reference, torch 2.15 in float64:
    //   F.mse_loss(torch.tensor([[1.5], [-0.25], [2.0]]), torch.tensor([[1.0], [0.5], [-1.0]]))
    //   = ((0.5)^2 + (-0.75)^2 + 3^2) / 3 = 9.8125 / 3
    #[test]
    fn mse_matches_pytorch_and_its_scores_match_float64() -> anyhow::Result<()> {
        let p = Tensor::new(&[[1.5f64], [-0.25], [2.0]], &Device::Cpu)?;
        let y = Tensor::new(&[[1.0f64], [0.5], [-1.0]], &Device::Cpu)?;
        let l = mse(&p, &y)?.to_scalar::<f64>()?;
        assert!((l - 9.8125 / 3.0).abs() < 1e-15, "{l}");
        // Targets of shape [n] against outputs [n, 1] are the same values.
        let flat = mse(&p, &y.flatten_all()?)?.to_scalar::<f64>()?;
        assert_eq!(flat, l);
        assert!(mse(&p, &Tensor::new(&[1.0f64, 2.0], &Device::Cpu)?).is_err());

        // RMSE, MAE and R² (scikit-learn's r2_score: 1 - SSE / SST) of the
        // same values, summed over two batches as an evaluation sums them.
        let mut sums = crate::engine::EvalSums::default();
        sums.add_errors(&p.narrow(0, 0, 2)?, &y.narrow(0, 0, 2)?)?;
        sums.add_errors(&p.narrow(0, 2, 1)?, &y.narrow(0, 2, 1)?)?;
        sums.count = 3;
        let g = sums.eval(false)?.regression.expect("regression scores");
        let sst = [1.0f64, 0.5, -1.0]
            .iter()
            .map(|v| (v - 0.5 / 3.0f64).powi(2))
            .sum::<f64>();
        assert!((g.rmse() - (9.8125f64 / 3.0).sqrt()).abs() < 1e-15, "{g:?}");
        assert!((g.mae() - 4.25 / 3.0).abs() < 1e-15, "{g:?}");
        assert!((g.r2() - (1.0 - 9.8125 / sst)).abs() < 1e-12, "{g:?}");
        let grams = g.clone().in_units(&[800.0]);
        assert_eq!(
            (grams.rmse(), grams.mae(), grams.r2()),
            (g.rmse() * 800.0, g.mae() * 800.0, g.r2())
        );
        Ok(())
    }

    // Reference: float64 by hand, scikit-learn's definitions for several
    // outputs (`multioutput="raw_values"`, and the uniform average):
    //   y = [[1, 10], [0.5, 20], [-1, 60]], p = [[1.5, 12], [-0.25, 18], [2, 50]]
    //   target 0: errors 0.5, -0.75, 3; target 1: errors 2, -2, -10
    #[test]
    fn several_targets_are_scored_each_against_its_own_values() -> anyhow::Result<()> {
        let dev = &Device::Cpu;
        let p = Tensor::new(&[[1.5f32, 12.0], [-0.25, 18.0], [2.0, 50.0]], dev)?;
        let y = Tensor::new(&[[1.0f32, 10.0], [0.5, 20.0], [-1.0, 60.0]], dev)?;
        // Summed in two batches, and once more through the values ranks sum.
        let mut a = crate::engine::EvalSums::with_targets(2);
        a.add_errors(&p.narrow(0, 0, 2)?, &y.narrow(0, 0, 2)?)?;
        a.count = 4;
        let mut b = crate::engine::EvalSums::with_targets(2);
        b.add_errors(&p.narrow(0, 2, 1)?, &y.narrow(0, 2, 1)?)?;
        b.count = 2;
        let (va, vb) = (a.to_values(), b.to_values());
        let summed: Vec<f64> = va.iter().zip(&vb).map(|(x, y)| x + y).collect();
        a.add(&b);
        assert_eq!(crate::engine::EvalSums::from_values(&summed, 2, 0), a);
        let g = a.eval(false)?.regression.expect("regression scores");
        let sst0 = [1.0f64, 0.5, -1.0]
            .iter()
            .map(|v| (v - 0.5 / 3.0f64).powi(2))
            .sum::<f64>();
        let sst1 = [10.0f64, 20.0, 60.0]
            .iter()
            .map(|v| (v - 30.0f64).powi(2))
            .sum::<f64>();
        let want = [
            ((9.8125f64 / 3.0).sqrt(), 4.25 / 3.0, 1.0 - 9.8125 / sst0),
            ((108.0f64 / 3.0).sqrt(), 14.0 / 3.0, 1.0 - 108.0 / sst1),
        ];
        for (t, (rmse, mae, r2)) in g.targets.iter().zip(want) {
            assert!((t.rmse - rmse).abs() < 1e-12, "{t:?}");
            assert!((t.mae - mae).abs() < 1e-12, "{t:?}");
            assert!((t.r2 - r2).abs() < 1e-12, "{t:?}");
        }
        assert!((g.rmse() - (want[0].0 + want[1].0) / 2.0).abs() < 1e-12);
        assert!((g.r2() - (want[0].2 + want[1].2) / 2.0).abs() < 1e-12);
        // In units: each target's errors by its own deviation.
        let u = g.clone().in_units(&[2.0, 100.0]);
        assert!((u.targets[0].rmse - 2.0 * want[0].0).abs() < 1e-12);
        assert!((u.targets[1].mae - 100.0 * want[1].1).abs() < 1e-9);
        assert_eq!(u.r2(), g.r2());
        // A batch of another width is refused, not mixed in.
        assert!(a
            .add_errors(&p.narrow(1, 0, 1)?, &y.narrow(1, 0, 1)?)
            .is_err());
        Ok(())
    }

    // Reference: float64 from the definitions used by torch.nn.CrossEntropyLoss,
    // loss = (1 - eps) * nll + eps * mean_c(-log p_c).
    #[test]
    fn cross_entropy_matches_float64_reference() -> anyhow::Result<()> {
        let x = Tensor::new(&[[1.0f64, 2.0, 0.5], [0.1, -1.0, 3.0]], &Device::Cpu)?;
        let y = Tensor::new(&[1u32, 0], &Device::Cpu)?;
        let plain = CrossEntropy::default().loss(&x, &y)?.to_scalar::<f64>()?;
        let smooth = CrossEntropy {
            label_smoothing: 0.1,
            ..Default::default()
        }
        .loss(&x, &y)?
        .to_scalar::<f64>()?;
        // float64 reference, from the definitions.
        let lse = |r: &[f64]| r.iter().map(|v| v.exp()).sum::<f64>().ln();
        let rows = [[1.0, 2.0, 0.5], [0.1, -1.0, 3.0]];
        let nll = ((lse(&rows[0]) - 2.0) + (lse(&rows[1]) - 0.1)) / 2.0;
        let unif = rows
            .iter()
            .map(|r| r.iter().map(|v| lse(r) - v).sum::<f64>() / 3.0)
            .sum::<f64>()
            / 2.0;
        assert!((plain - nll).abs() < 1e-12);
        assert!((smooth - (0.9 * nll + 0.1 * unif)).abs() < 1e-12);
        // The same values, computed independently in Python with math.exp/log.
        assert!((plain - 1.717571501534218).abs() < 1e-12, "{plain}");
        assert!((smooth - 1.7292381682008844).abs() < 1e-12, "{smooth}");
        Ok(())
    }
}
