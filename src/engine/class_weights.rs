//! Class weights for the cross-entropy (PyTorch's `CrossEntropyLoss(weight=)`):
//! what a recipe gives, and the weights by label the run resolves it to.

use std::sync::Arc;

use candle_core::{DType, Result, Tensor, D};

/// The weights a recipe asks for, before the run knows its classes.
#[derive(Debug, Clone, PartialEq)]
pub enum ClassWeights {
    /// One weight per label, label 0 first.
    Labels(Vec<f64>),
    /// Weights by class name; a class not named weighs 1.
    Names(Vec<(String, f64)>),
    /// scikit-learn's `compute_class_weight("balanced")`: `n / (k * count)`
    /// over the training data's labels.
    Balanced,
}

impl ClassWeights {
    /// As a recipe gives it.
    pub fn describe(&self) -> String {
        match self {
            ClassWeights::Labels(w) => format!("{w:?}"),
            ClassWeights::Names(by_name) => {
                let named: Vec<String> =
                    by_name.iter().map(|(n, w)| format!("{n} = {w}")).collect();
                format!("{{ {} }}", named.join(", "))
            }
            ClassWeights::Balanced => "\"balanced\"".into(),
        }
    }

    /// The weight of each of `classes` labels. `names` are the data's class
    /// names (label 0 first), where it has them; `labels` reads the
    /// training data's labels, for `Balanced`. The error says what is wrong.
    pub fn resolve(
        &self,
        classes: usize,
        names: Option<&[String]>,
        labels: &mut dyn FnMut() -> std::result::Result<Option<Vec<u32>>, String>,
    ) -> std::result::Result<Arc<[f32]>, String> {
        let weights = match self {
            ClassWeights::Labels(w) if w.len() != classes => {
                return Err(format!(
                "{} weights for a model of {classes} classes: give one per class, label 0 first",
                w.len()
            ))
            }
            ClassWeights::Labels(w) => w.clone(),
            ClassWeights::Names(by_name) => {
                let names = names.ok_or(
                    "weights by class name, and the training data has no class names: give one weight per class, label 0 first",
                )?;
                let mut w = vec![1.0; classes];
                for (name, v) in by_name {
                    match names.iter().position(|n| n == name) {
                        Some(i) if i < classes => w[i] = *v,
                        _ => {
                            return Err(format!(
                                "a weight for class `{name}`, which the training data does not have (its classes: {})",
                                names.join(", ")
                            ))
                        }
                    }
                }
                w
            }
            ClassWeights::Balanced => balanced(classes, names, labels)?,
        };
        if let Some(bad) = weights.iter().find(|w| !(w.is_finite() && **w >= 0.0)) {
            return Err(format!(
                "a class weight of {bad}: weights must be finite and >= 0"
            ));
        }
        if weights.iter().all(|w| *w == 0.0) {
            return Err("every class weight is 0: nothing would be learnt".into());
        }
        Ok(weights.iter().map(|w| *w as f32).collect())
    }
}

/// `n / (k * count_c)` for each class c of the labels (`k` classes).
fn balanced(
    classes: usize,
    names: Option<&[String]>,
    labels: &mut dyn FnMut() -> std::result::Result<Option<Vec<u32>>, String>,
) -> std::result::Result<Vec<f64>, String> {
    let labels = labels()?.ok_or(
        "\"balanced\" counts the training data's labels, and the run has none it can count (no `data`, a generator, or targets that are not one label per sample): give the weights, one per class",
    )?;
    let mut counts = vec![0usize; classes];
    for &l in &labels {
        match counts.get_mut(l as usize) {
            Some(c) => *c += 1,
            None => {
                return Err(format!(
                    "the training data holds label {l}, and the model has {classes} classes"
                ))
            }
        }
    }
    if let Some(absent) = counts.iter().position(|c| *c == 0) {
        let name = names
            .and_then(|n| n.get(absent))
            .map_or(format!("label {absent}"), |n| format!("class `{n}`"));
        return Err(format!(
            "\"balanced\": {name} has no sample in the training data, so n / (k * count) has no value for it (scikit-learn refuses it too): give the weights, one per class"
        ));
    }
    let n = labels.len() as f64;
    Ok(counts
        .iter()
        .map(|c| n / (classes as f64 * *c as f64))
        .collect())
}

/// The weighted cross-entropy's numerator and denominator over `logits
/// [N, C]` and `targets [N]`, as `torch.nn.CrossEntropyLoss(weight=w,
/// label_smoothing=eps)` sums them before its mean: each sample adds
/// `(1 - eps) * w[y] * -log p_y + eps / C * sum_c w[c] * -log p_c` to the
/// numerator and `w[y]` to the denominator.
pub fn weighted_terms(
    logits: &Tensor,
    targets: &Tensor,
    weights: &[f32],
    label_smoothing: f64,
) -> Result<(Tensor, Tensor)> {
    let classes = logits.dim(D::Minus1)?;
    if classes != weights.len() {
        candle_core::bail!(
            "cross_entropy: {} class weights for logits of {classes} classes",
            weights.len()
        );
    }
    let logp = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let w = Tensor::from_slice(weights, classes, logits.device())?.to_dtype(logp.dtype())?;
    let wy = w.index_select(targets, 0)?;
    let nll = logp.gather(&targets.unsqueeze(1)?, 1)?.squeeze(1)?.neg()?;
    let mut per = (nll * &wy)?;
    if label_smoothing > 0.0 {
        let smooth = logp.broadcast_mul(&w.unsqueeze(0)?)?.sum(1)?.neg()?;
        per = ((per * (1.0 - label_smoothing))? + (smooth * (label_smoothing / classes as f64))?)?;
    }
    Ok((per.sum_all()?, wy.sum_all()?))
}

/// The sum of `weights[y]` over `targets` (on the host): the denominator a
/// batch's weighted mean loss divides by.
pub fn weight_sum(targets: &Tensor, weights: &[f32]) -> Result<f64> {
    let labels = targets
        .flatten_all()?
        .to_dtype(DType::U32)?
        .to_vec1::<u32>()?;
    let mut sum = 0.0;
    // A sequence's ignored positions weigh nothing.
    for l in labels.into_iter().filter(|&l| l != super::ignored::IGNORE) {
        match weights.get(l as usize) {
            Some(w) => sum += *w as f64,
            None => candle_core::bail!(
                "cross_entropy: label {l}, and the class weights are for {} classes",
                weights.len()
            ),
        }
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::loss::CrossEntropy;
    use candle_core::Device;

    fn weighted(w: &[f32], eps: f64) -> CrossEntropy {
        CrossEntropy {
            label_smoothing: eps,
            weights: Some(w.into()),
            ..Default::default()
        }
    }

    // Reference: torch 2.15, float64:
    //   x = [[1.0, 2.0, 0.5], [0.1, -1.0, 3.0], [0.3, 0.2, -0.4]]; y = [1, 0, 2]
    //   F.cross_entropy(x, y, weight=[0.5, 2.0, 1.5]) = 1.1945541803534117
    //   ... label_smoothing=0.1 = 1.2342222411696298
    #[test]
    fn weighted_cross_entropy_matches_pytorch() -> anyhow::Result<()> {
        let x = Tensor::new(
            &[[1.0f64, 2.0, 0.5], [0.1, -1.0, 3.0], [0.3, 0.2, -0.4]],
            &Device::Cpu,
        )?;
        let y = Tensor::new(&[1u32, 0, 2], &Device::Cpu)?;
        let w = [0.5f32, 2.0, 1.5];
        let plain = weighted(&w, 0.0).loss(&x, &y)?.to_scalar::<f64>()?;
        let smooth = weighted(&w, 0.1).loss(&x, &y)?.to_scalar::<f64>()?;
        assert!((plain - 1.1945541803534117).abs() < 1e-12, "{plain}");
        assert!((smooth - 1.2342222411696298).abs() < 1e-12, "{smooth}");
        // Split: the pieces' numerators over the whole batch's weight sum
        // give the same mean (what the trainer's micro-batches add up).
        let ce = weighted(&w, 0.1);
        let total = weight_sum(&y, &w)?;
        assert_eq!(total, 2.0 + 0.5 + 1.5);
        let mut sum = 0.0;
        for (from, len) in [(0, 1), (1, 2)] {
            let (num, _) = ce
                .weighted(&x.narrow(0, from, len)?, &y.narrow(0, from, len)?)?
                .unwrap();
            sum += num.to_scalar::<f64>()? / total;
        }
        assert!((sum - smooth).abs() < 1e-12, "{sum} {smooth}");
        // Equal weights are the plain loss.
        let equal = weighted(&[3.0, 3.0, 3.0], 0.1)
            .loss(&x, &y)?
            .to_scalar::<f64>()?;
        let unweighted = CrossEntropy {
            label_smoothing: 0.1,
            ..Default::default()
        }
        .loss(&x, &y)?
        .to_scalar::<f64>()?;
        assert!((equal - unweighted).abs() < 1e-12);
        // Samples whose classes all weigh 0: a loss of 0, not 0 / 0, in f32 too.
        let zero = weighted(&[0.0, 0.0, 1.0], 0.0)
            .loss(
                &x.narrow(0, 0, 2)?.to_dtype(DType::F32)?,
                &y.narrow(0, 0, 2)?,
            )?
            .to_scalar::<f32>()?;
        assert_eq!(zero, 0.0);
        Ok(())
    }

    #[test]
    fn asked_weights_are_resolved_or_refused_by_name() {
        let names: Vec<String> = ["cat", "dog", "fox"].map(String::from).to_vec();
        let mut labels = || Ok(Some(vec![0, 0, 0, 1, 2, 2]));
        // scikit-learn: compute_class_weight("balanced", classes=[0, 1, 2],
        // y=[0, 0, 0, 1, 2, 2]) = [0.6667, 2.0, 1.0]
        let b = ClassWeights::Balanced
            .resolve(3, Some(&names), &mut labels)
            .unwrap();
        assert_eq!(&*b, &[(6.0f64 / 9.0) as f32, 2.0, 1.0]);
        let by_name = ClassWeights::Names(vec![("dog".into(), 4.0)])
            .resolve(3, Some(&names), &mut labels)
            .unwrap();
        assert_eq!(&*by_name, &[1.0, 4.0, 1.0]);
        let err = |w: ClassWeights, labels: Option<Vec<u32>>| {
            w.resolve(3, Some(&names), &mut || Ok(labels.clone()))
                .unwrap_err()
        };
        let e = err(ClassWeights::Labels(vec![1.0, 2.0]), None);
        assert!(e.contains("2 weights for a model of 3 classes"), "{e}");
        let e = err(ClassWeights::Names(vec![("wolf".into(), 2.0)]), None);
        assert!(
            e.contains("class `wolf`") && e.contains("cat, dog, fox"),
            "{e}"
        );
        let e = err(ClassWeights::Balanced, Some(vec![0, 2, 2]));
        assert!(e.contains("class `dog` has no sample"), "{e}");
        let e = err(ClassWeights::Balanced, None);
        assert!(e.contains("give the weights"), "{e}");
        let e = err(ClassWeights::Labels(vec![1.0, -1.0, 1.0]), None);
        assert!(e.contains("weight of -1"), "{e}");
        let e = err(ClassWeights::Labels(vec![0.0; 3]), None);
        assert!(e.contains("every class weight is 0"), "{e}");
    }
}
