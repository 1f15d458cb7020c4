//! Magnitude pruning with masks kept through training, as
//! `torch.nn.utils.prune.l1_unstructured` (per tensor) and
//! `global_unstructured` (over all selected tensors at once): the
//! `round(sparsity * n)` weights of smallest magnitude are set to zero, and
//! stay zero: the trainer multiplies the weights by their masks after every
//! optimizer step.

use std::collections::BTreeMap;

use candle_core::{DType, Result, Tensor, Var};

/// The masks of a model's pruned parameters (1 keeps, 0 prunes), by name.
#[derive(Default)]
pub struct Masks(BTreeMap<String, Tensor>);

impl Masks {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Zeroes the pruned weights of `vars`.
    pub fn apply(&self, vars: &[(String, Var)]) -> Result<()> {
        for (name, var) in vars {
            if let Some(m) = self.0.get(name) {
                var.set(&(var.as_tensor() * m.to_dtype(var.dtype())?)?)?;
            }
        }
        Ok(())
    }

    /// Masks as u8 tensors named `mask.<param>` (for checkpoints).
    pub fn state(&self) -> Vec<(String, Tensor)> {
        self.0
            .iter()
            .filter_map(|(k, m)| Some((format!("mask.{k}"), m.to_dtype(DType::U8).ok()?)))
            .collect()
    }

    /// Restores masks from `mask.<param>` tensors, on the variables' device.
    pub fn load(
        &mut self,
        tensors: &std::collections::HashMap<String, Tensor>,
        vars: &[(String, Var)],
    ) -> Result<()> {
        self.0.clear();
        for (name, var) in vars {
            if let Some(m) = tensors.get(&format!("mask.{name}")) {
                if m.shape() != var.shape() {
                    candle_core::bail!(
                        "mask of {name}: shape {:?}, the parameter's {:?}",
                        m.shape(),
                        var.shape()
                    );
                }
                self.0.insert(
                    name.clone(),
                    m.to_dtype(DType::F32)?.to_device(var.device())?,
                );
            }
        }
        Ok(())
    }

    /// Prunes `vars` to `sparsity` by magnitude, per tensor or globally,
    /// combined with the masks already there (a pruned weight is zero, so
    /// it is among the smallest and stays pruned). Applies the masks.
    /// Returns (pruned, total) over the selected tensors.
    pub fn prune(
        &mut self,
        vars: &[(String, Var)],
        sparsity: f64,
        global: bool,
    ) -> Result<(usize, usize)> {
        if !(0.0..=1.0).contains(&sparsity) {
            candle_core::bail!("sparsity {sparsity} is not between 0 and 1");
        }
        let mags: Vec<Vec<f32>> = vars
            .iter()
            .map(|(_, v)| {
                v.as_tensor()
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .abs()?
                    .to_vec1()
            })
            .collect::<Result<_>>()?;
        let keep: Vec<Vec<bool>> = if global {
            let flat: Vec<f32> = mags.iter().flatten().copied().collect();
            let k = flat_keep(&flat, sparsity);
            let mut at = 0;
            mags.iter()
                .map(|m| {
                    at += m.len();
                    k[at - m.len()..at].to_vec()
                })
                .collect()
        } else {
            mags.iter().map(|m| flat_keep(m, sparsity)).collect()
        };
        let (mut pruned, mut total) = (0, 0);
        for ((name, var), keep) in vars.iter().zip(keep) {
            let old: Option<Vec<f32>> = match self.0.get(name) {
                Some(m) => Some(m.flatten_all()?.to_vec1()?),
                None => None,
            };
            let mask: Vec<f32> = keep
                .iter()
                .enumerate()
                .map(|(i, &k)| {
                    if k && old.as_ref().is_none_or(|o| o[i] != 0.0) {
                        1.0
                    } else {
                        0.0
                    }
                })
                .collect();
            pruned += mask.iter().filter(|&&m| m == 0.0).count();
            total += mask.len();
            let mask = Tensor::from_vec(mask, var.shape(), var.device())?;
            self.0.insert(name.clone(), mask);
        }
        self.apply(vars)?;
        Ok((pruned, total))
    }
}

/// Which of `mags` survive: all but the `round(sparsity * n)` smallest
/// (ties broken by position, first pruned first).
fn flat_keep(mags: &[f32], sparsity: f64) -> Vec<bool> {
    let n = mags.len();
    let k = ((sparsity * n as f64).round() as usize).min(n);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| mags[a].total_cmp(&mags[b]).then(a.cmp(&b)));
    let mut keep = vec![true; n];
    for &i in &order[..k] {
        keep[i] = false;
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn prunes_the_smallest_magnitudes_like_torch() -> Result<()> {
        // torch 2.15: w = torch.tensor([[0.5, -0.1, 0.3], [-0.7, 0.05, 0.2]]);
        // prune.l1_unstructured(m, "weight", amount=0.5) gives the mask
        // [[1, 0, 1], [1, 0, 0]]; global_unstructured over w and
        // b = [0.01, -0.9] with amount=0.5 gives [[1, 0, 1], [1, 0, 0]], [0, 1].
        let dev = Device::Cpu;
        let w = Var::new(&[[0.5f32, -0.1, 0.3], [-0.7, 0.05, 0.2]], &dev)?;
        let b = Var::new(&[0.01f32, -0.9], &dev)?;
        let mut m = Masks::default();
        let (p, t) = m.prune(&[("w".into(), w.clone())], 0.5, false)?;
        assert_eq!((p, t), (3, 6));
        assert_eq!(
            w.as_tensor().to_vec2::<f32>()?,
            [[0.5, 0.0, 0.3], [-0.7, 0.0, 0.0]]
        );

        let w = Var::new(&[[0.5f32, -0.1, 0.3], [-0.7, 0.05, 0.2]], &dev)?;
        let mut m = Masks::default();
        let vars = [("w".to_string(), w.clone()), ("b".to_string(), b.clone())];
        assert_eq!(m.prune(&vars, 0.5, true)?, (4, 8));
        assert_eq!(
            w.as_tensor().to_vec2::<f32>()?,
            [[0.5, 0.0, 0.3], [-0.7, 0.0, 0.0]]
        );
        assert_eq!(b.as_tensor().to_vec1::<f32>()?, [0.0, -0.9]);

        // Masks persist: an update that moves pruned weights is undone.
        w.set(&(w.as_tensor() + 1.0)?)?;
        m.apply(&vars)?;
        assert_eq!(
            w.as_tensor().to_vec2::<f32>()?,
            [[1.5, 0.0, 1.3], [0.3, 0.0, 0.0]]
        );
        // Pruning further keeps what was pruned and takes the next smallest.
        assert_eq!(m.prune(&vars, 0.75, true)?, (6, 8));
        assert_eq!(
            w.as_tensor().to_vec2::<f32>()?,
            [[1.5, 0.0, 1.3], [0.0, 0.0, 0.0]]
        );
        Ok(())
    }
}
