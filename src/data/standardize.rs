//! `data:standardize()`: features shifted and scaled to mean 0 and standard
//! deviation 1 over a data set's samples, as scikit-learn's
//! `StandardScaler` does for a table (each feature; population deviation; a
//! constant feature only shifted; one-hot categories left as they are) and as torchvision's `Normalize` is used
//! for images (each channel, with the data set's own mean and deviation).
//! The statistics come from the training data and are applied unchanged to
//! the data evaluated against it. A regression target (float `y`, a CSV
//! file's `target`) is standardized too, as scikit-learn's
//! `TransformedTargetRegressor` with a `StandardScaler` does: evaluation
//! gives its errors back in the target's units.

use candle_core::{DType, Device, Tensor};

use super::{Batch, Pipeline, Transform};
use crate::{Error, Result};

/// A standardization, `(x - mean) / std`: one mean and deviation per
/// feature, or per channel of an image.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Moments {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
}

impl Moments {
    /// Standardizes one sample's values in place, each mean and deviation
    /// covering an equal run of them (a feature, or a channel's pixels),
    /// with the same f32 operations as a standardized batch gets.
    pub fn apply(&self, values: &mut [f32]) {
        let span = (values.len() / self.mean.len().max(1)).max(1);
        for (k, v) in values.iter_mut().enumerate() {
            *v = (*v - self.mean[k / span]) / self.std[k / span];
        }
    }
}

/// How a sample, as its source gives it, becomes the model's input, for a
/// standardized run on data that is neither a CSV file nor an image folder
/// (a safetensors or IDX file, the built-in digits): the standardization
/// taper applied, and a regression target's. Saved with checkpoints, so
/// that an export applies them in its graph.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SampleInput {
    pub standardize: Moments,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_standardize: Option<Moments>,
}

/// The statistics, how many consecutive features each covers (1, or a
/// channel's pixels), and the transform that applies them.
#[derive(Debug)]
pub struct Standardize {
    moments: Moments,
    span: usize,
    /// `[1, groups, 1]`, for broadcasting over `[batch, groups, span]`.
    mean_t: Tensor,
    std_t: Tensor,
    /// A regression target's statistics (one per target value), and the
    /// same as `[1, targets]` tensors.
    target: Option<(Moments, Tensor, Tensor)>,
}

/// Samples read at a time while the statistics are computed.
const CHUNK: usize = 4096;

/// Count, mean and sum of squared deviations, merged chunk by chunk (Chan et
/// al.), in f64.
#[derive(Clone, Copy, Default)]
struct Running {
    n: f64,
    mean: f64,
    m2: f64,
}

impl Running {
    fn add(&mut self, values: &[f32]) {
        let nb = values.len() as f64;
        let mb = values.iter().map(|&v| v as f64).sum::<f64>() / nb;
        let m2b: f64 = values.iter().map(|&v| (v as f64 - mb).powi(2)).sum();
        let n = self.n + nb;
        let delta = mb - self.mean;
        self.mean += delta * nb / n;
        self.m2 += m2b + delta * delta * self.n * nb / n;
        self.n = n;
    }
}

/// Means and population deviations (1 for a constant value).
fn moments_of(groups: &[Running]) -> Moments {
    Moments {
        mean: groups.iter().map(|g| g.mean as f32).collect(),
        std: groups
            .iter()
            .map(|g| match (g.m2 / g.n).sqrt() {
                d if d > 0.0 && d.is_finite() => d as f32,
                _ => 1.0,
            })
            .collect(),
    }
}

impl Standardize {
    /// The statistics of `data`'s samples as its batches give them: per
    /// channel for an image folder's samples, else per feature. `stop` is
    /// asked before each chunk of samples: its error ends the reading (a
    /// signal's stop request, from the caller).
    pub fn of(data: &Pipeline, stop: &mut dyn FnMut() -> Result<()>) -> Result<Standardize> {
        if data.is_empty() {
            return Err(Error::Config(
                "standardize: the data has no samples to compute a mean from".into(),
            ));
        }
        let channels = data.source().image_input().map(|i| i.channels);
        let mut groups: Vec<Running> = Vec::new();
        let mut targets: Vec<Running> = Vec::new();
        let mut span = 0;
        for batch in data.in_order(CHUNK) {
            stop()?;
            let batch = batch?;
            if batch.y.dtype() == DType::F32 {
                let rows: Vec<Vec<f32>> = batch.y.flatten_from(1)?.to_vec2()?;
                for row in rows {
                    targets.resize(row.len(), Running::default());
                    for (t, v) in targets.iter_mut().zip(row) {
                        t.add(&[v]);
                    }
                }
            }
            let x = batch.x;
            if x.dtype() != DType::F32 {
                return Err(Error::Config(format!(
                    "standardize: the samples are {:?}, not float features (token ids are not standardized)",
                    x.dtype()
                )));
            }
            let rows: Vec<Vec<f32>> = x.flatten_from(1)?.to_vec2()?;
            for row in rows {
                if groups.is_empty() {
                    span = match channels {
                        Some(c) if row.len().is_multiple_of(c) => row.len() / c,
                        _ => 1,
                    };
                    groups = vec![Running::default(); row.len() / span];
                }
                if row.len() != groups.len() * span {
                    return Err(Error::Config(format!(
                        "standardize: samples of {} and {} features",
                        groups.len() * span,
                        row.len()
                    )));
                }
                for (g, values) in groups.iter_mut().zip(row.chunks_exact(span)) {
                    g.add(values);
                }
            }
        }
        let mut moments = moments_of(&groups);
        // A table's one-hot categories stay 0 and 1, as scikit-learn's
        // pipelines scale only the numeric columns.
        if let Some(table) = data.table_input() {
            let one_hot = table.one_hot_inputs();
            if one_hot.len() == moments.mean.len() {
                for (k, _) in one_hot.iter().enumerate().filter(|(_, &h)| h) {
                    (moments.mean[k], moments.std[k]) = (0.0, 1.0);
                }
            }
        }
        let mut s = Standardize::new(moments, span)?;
        // A column of label sets gives a classifier's 0s and 1s, not
        // numbers to predict.
        let label_sets = data.table_input().is_some_and(|t| t.label_sep.is_some());
        if !targets.is_empty() && !label_sets {
            s = s.with_target(moments_of(&targets))?;
        }
        Ok(s)
    }

    /// Standardizes a regression target (float `y`) with `m` too.
    pub fn with_target(mut self, m: Moments) -> Result<Standardize> {
        let n = m.mean.len();
        let mean = Tensor::from_vec(m.mean.clone(), (1, n), &Device::Cpu)?;
        let std = Tensor::from_vec(m.std.clone(), (1, n), &Device::Cpu)?;
        self.target = Some((m, mean, std));
        Ok(self)
    }

    /// These statistics with the target left as it is.
    pub fn without_target(mut self) -> Standardize {
        self.target = None;
        self
    }

    /// The regression target's statistics, when it is standardized.
    pub fn target(&self) -> Option<&Moments> {
        self.target.as_ref().map(|t| &t.0)
    }

    /// Given statistics, `span` consecutive features to each.
    pub fn new(moments: Moments, span: usize) -> Result<Standardize> {
        let g = moments.mean.len();
        if moments.std.len() != g || g == 0 || span == 0 {
            return Err(Error::Config(format!(
                "standardize: {} means and {} deviations",
                g,
                moments.std.len()
            )));
        }
        if let Some(s) = moments.std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(Error::Config(format!(
                "standardize: a deviation of {s}; each must be a positive number"
            )));
        }
        Ok(Standardize {
            mean_t: Tensor::from_vec(moments.mean.clone(), (1, g, 1), &Device::Cpu)?,
            std_t: Tensor::from_vec(moments.std.clone(), (1, g, 1), &Device::Cpu)?,
            moments,
            span,
            target: None,
        })
    }

    pub fn mean(&self) -> &[f32] {
        &self.moments.mean
    }

    pub fn std(&self) -> &[f32] {
        &self.moments.std
    }

    pub fn moments(&self) -> &Moments {
        &self.moments
    }

    /// Consecutive features each mean and deviation covers: 1, or the
    /// pixels of an image's channel.
    pub fn span(&self) -> usize {
        self.span
    }
}

impl Transform for Standardize {
    fn apply(&self, batch: Batch, _epoch: u64) -> Result<Batch> {
        let shape = batch.x.shape().clone();
        let b = shape.dims().first().copied().unwrap_or(0);
        let features = shape.elem_count() / b.max(1);
        let groups = self.moments.mean.len();
        if features != groups * self.span {
            return Err(Error::Data(format!(
                "standardize: a batch of {features} features, against statistics for {}",
                groups * self.span
            )));
        }
        let x = batch
            .x
            .reshape((b, groups, self.span))?
            .broadcast_sub(&self.mean_t)?
            .broadcast_div(&self.std_t)?
            .reshape(shape)?;
        let y = match &self.target {
            Some((m, mean, std)) if batch.y.dtype() == DType::F32 => {
                let n = m.mean.len();
                let y = batch.y.reshape((b, n))?;
                y.broadcast_sub(mean)?
                    .broadcast_div(std)?
                    .reshape(batch.y.shape())?
            }
            _ => batch.y,
        };
        Ok(Batch { x, y, ..batch })
    }

    fn describe(&self) -> String {
        let target = if self.target.is_some() {
            " and the target"
        } else {
            ""
        };
        match self.span {
            1 => format!("standardize {} features{target}", self.moments.mean.len()),
            _ => format!("standardize {} channels", self.moments.mean.len()),
        }
    }
}
