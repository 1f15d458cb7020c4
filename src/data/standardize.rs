//! `data:standardize()`: each feature shifted and scaled to mean 0 and
//! standard deviation 1 over a data set's samples, as scikit-learn's
//! `StandardScaler` does (population deviation; a constant feature is only
//! shifted). The statistics come from the training data and are applied
//! unchanged to the data evaluated against it.

use candle_core::{DType, Device, Tensor};

use super::{Batch, Pipeline, Transform};
use crate::{Error, Result};

/// The per-feature mean and standard deviation, and the transform that
/// applies them.
#[derive(Debug)]
pub struct Standardize {
    mean: Vec<f32>,
    std: Vec<f32>,
    /// `[1, features]`, for broadcasting over a batch.
    mean_t: Tensor,
    std_t: Tensor,
}

/// Samples read at a time while the statistics are computed.
const CHUNK: usize = 4096;

impl Standardize {
    /// The statistics of `data`'s samples as its batches give them, in f64.
    pub fn of(data: &Pipeline) -> Result<Standardize> {
        if data.is_empty() {
            return Err(Error::Config(
                "standardize: the data has no samples to compute a mean from".into(),
            ));
        }
        let mut n = 0f64;
        let (mut mean, mut m2): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
        for batch in data.in_order(CHUNK) {
            let x = batch?.x;
            if x.dtype() != DType::F32 {
                return Err(Error::Config(format!(
                    "standardize: the samples are {:?}, not float features (token ids are not standardized)",
                    x.dtype()
                )));
            }
            let rows: Vec<Vec<f32>> = x.flatten_from(1)?.to_vec2()?;
            for row in rows {
                if mean.is_empty() {
                    mean = vec![0.0; row.len()];
                    m2 = vec![0.0; row.len()];
                }
                if row.len() != mean.len() {
                    return Err(Error::Config(format!(
                        "standardize: samples of {} and {} features",
                        mean.len(),
                        row.len()
                    )));
                }
                // Welford's update, one sample at a time.
                n += 1.0;
                for ((m, s), &v) in mean.iter_mut().zip(&mut m2).zip(&row) {
                    let d = v as f64 - *m;
                    *m += d / n;
                    *s += d * (v as f64 - *m);
                }
            }
        }
        let std: Vec<f32> = m2
            .iter()
            .map(|s| match (s / n).sqrt() {
                d if d > 0.0 && d.is_finite() => d as f32,
                _ => 1.0,
            })
            .collect();
        Standardize::new(mean.into_iter().map(|m| m as f32).collect(), std)
    }

    pub fn new(mean: Vec<f32>, std: Vec<f32>) -> Result<Standardize> {
        let w = mean.len();
        Ok(Standardize {
            mean_t: Tensor::from_vec(mean.clone(), (1, w), &Device::Cpu)?,
            std_t: Tensor::from_vec(std.clone(), (1, w), &Device::Cpu)?,
            mean,
            std,
        })
    }

    pub fn mean(&self) -> &[f32] {
        &self.mean
    }

    pub fn std(&self) -> &[f32] {
        &self.std
    }
}

impl Transform for Standardize {
    fn apply(&self, batch: Batch, _epoch: u64) -> Result<Batch> {
        let shape = batch.x.shape().clone();
        let flat = batch.x.flatten_from(1)?;
        if flat.dim(1)? != self.mean.len() {
            return Err(Error::Data(format!(
                "standardize: a batch of {} features, against statistics of {}",
                flat.dim(1)?,
                self.mean.len()
            )));
        }
        let x = flat
            .broadcast_sub(&self.mean_t)?
            .broadcast_div(&self.std_t)?
            .reshape(shape)?;
        Ok(Batch { x, ..batch })
    }

    fn describe(&self) -> String {
        format!("standardize {} features", self.mean.len())
    }
}
