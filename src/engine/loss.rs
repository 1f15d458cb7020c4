//! Losses over the last dimension of the logits, any leading shape.

use candle_core::{DType, Result, Tensor, D};
use serde::Deserialize;

/// Cross-entropy with optional label smoothing (as `torch.nn.CrossEntropyLoss`).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CrossEntropy {
    pub label_smoothing: f64,
}

fn flatten(logits: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
    let classes = logits.dim(D::Minus1)?;
    Ok((logits.reshape(((), classes))?, targets.flatten_all()?))
}

impl CrossEntropy {
    /// Mean loss over all positions: `logits [.., C]`, `targets [..]` (u32).
    pub fn loss(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
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

    // Reference: float64 from the definitions used by torch.nn.CrossEntropyLoss,
    // loss = (1 - eps) * nll + eps * mean_c(-log p_c).
    #[test]
    fn cross_entropy_matches_float64_reference() -> anyhow::Result<()> {
        let x = Tensor::new(&[[1.0f64, 2.0, 0.5], [0.1, -1.0, 3.0]], &Device::Cpu)?;
        let y = Tensor::new(&[1u32, 0], &Device::Cpu)?;
        let plain = CrossEntropy::default().loss(&x, &y)?.to_scalar::<f64>()?;
        let smooth = CrossEntropy {
            label_smoothing: 0.1,
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
