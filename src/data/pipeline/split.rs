//! A pipeline's parts: contiguous ranges of its samples, or, with a seed,
//! samples drawn through a fixed permutation (a [`Subset`] of the source).

use std::sync::Arc;

use super::Pipeline;
use crate::data::permutation::Permutation;
use crate::data::Source;
use crate::{Error, Result};

impl Pipeline {
    /// Parts in the given proportions: fractions that sum to 1, or weights
    /// (normalised to sum to 1; the last part takes the rounding remainder). Contiguous, or with `seed`, drawn through
    /// a fixed seeded permutation (for files sorted by class).
    pub fn split(&self, parts: &[f64], seed: Option<u64>) -> Result<Vec<Pipeline>> {
        let contiguous = self.split_ranges(parts)?;
        let Some(seed) = seed else {
            return Ok(contiguous);
        };
        let r = self.range();
        let perm = Permutation::new(r.len(), seed, "split");
        let n = contiguous.len();
        Ok(contiguous
            .into_iter()
            .enumerate()
            .map(|(i, part)| {
                let pr = part.range();
                let indices = (pr.start - r.start..pr.end - r.start)
                    .map(|i| r.start + perm.get(i))
                    .collect();
                let mut p = self.clone();
                p.source = Arc::new(Subset {
                    inner: self.source.clone(),
                    indices,
                    part: (i + 1, n),
                });
                p.start = 0;
                p.end = None;
                p
            })
            .collect())
    }

    fn split_ranges(&self, parts: &[f64]) -> Result<Vec<Pipeline>> {
        let total: f64 = parts.iter().sum();
        if parts.is_empty() || parts.iter().any(|p| !p.is_finite() || *p < 0.0) || total <= 0.0 {
            return Err(Error::Config(format!(
                "split: the proportions {parts:?} must be numbers of 0 or more, not all 0"
            )));
        }
        // Fractions that do not sum to 1 are a slip (`{ 0.8, 0.1 }`: a
        // part forgotten), not weights: PyTorch's random_split refuses them.
        if parts.iter().all(|p| *p < 1.0) && (total - 1.0).abs() > 1e-6 {
            return Err(Error::Config(format!(
                "split: the proportions {parts:?} are fractions that sum to {total}, not 1; give fractions that sum to 1 ({{ 0.9, 0.1 }}) or weights ({{ 9, 1 }})"
            )));
        }
        let r = self.range();
        let mut out = Vec::new();
        let mut at = r.start;
        let mut acc = 0.0;
        for (i, p) in parts.iter().enumerate() {
            acc += p;
            let end = if i + 1 == parts.len() {
                r.end
            } else {
                r.start + ((acc / total) * r.len() as f64).round() as usize
            };
            let mut part = self.clone();
            part.start = at;
            part.end = Some(end.max(at));
            at = end.max(at);
            out.push(part);
        }
        Ok(out)
    }
}

/// Some samples of another source, by index.
struct Subset {
    inner: Arc<dyn Source>,
    indices: Vec<usize>,
    /// Which part of the split this is, and of how many (from 1).
    part: (usize, usize),
}

impl Source for Subset {
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn split(&self) -> &str {
        self.inner.split()
    }
    fn describe(&self) -> String {
        let (i, n) = self.part;
        format!(
            "{} part {i} of {n} ({} samples, seeded)",
            self.inner.describe(),
            self.indices.len()
        )
    }
    fn gather(&self, indices: &[usize]) -> Result<(candle_core::Tensor, candle_core::Tensor)> {
        let mapped: Vec<usize> = indices.iter().map(|&i| self.indices[i]).collect();
        self.inner.gather(&mapped)
    }
    fn gather_epoch(
        &self,
        indices: &[usize],
        epoch: u64,
    ) -> Result<(candle_core::Tensor, candle_core::Tensor)> {
        let mapped: Vec<usize> = indices.iter().map(|&i| self.indices[i]).collect();
        self.inner.gather_epoch(&mapped, epoch)
    }
    fn vocab(&self) -> Option<&crate::data::Vocab> {
        self.inner.vocab()
    }
    fn lengths(&self) -> Option<Vec<usize>> {
        let all = self.inner.lengths()?;
        Some(self.indices.iter().map(|&i| all[i]).collect())
    }
    fn classes(&self) -> Option<&[String]> {
        self.inner.classes()
    }
    fn labels(&self, indices: &[usize]) -> Result<Option<Vec<u32>>> {
        let mapped: Vec<usize> = indices.iter().map(|&i| self.indices[i]).collect();
        self.inner.labels(&mapped)
    }
    fn image_input(&self) -> Option<crate::data::ImageInput> {
        self.inner.image_input()
    }
    fn table_input(&self) -> Option<crate::data::TableInput> {
        self.inner.table_input()
    }
    fn array_input(&self) -> Option<crate::data::ArrayInput> {
        self.inner.array_input()
    }
}
