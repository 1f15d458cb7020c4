//! A pipeline over a source: a range of its samples (take, skip, split), a
//! seeded per-epoch shuffle, batching, and prefetching on a background thread.

use std::ops::Range;
use std::sync::Arc;

use super::epoch::{Direct, Epoch, Order};
use super::permutation::Permutation;

mod split;
use super::standardize::Standardize;
use super::{Source, Transform};
use crate::{Error, Result};

#[derive(Clone)]
pub struct Pipeline {
    source: Arc<dyn Source>,
    start: usize,
    end: Option<usize>,
    shuffle: Option<u64>,
    /// Shuffled batches of samples of like lengths (`shuffle_by_length`).
    by_length: bool,
    batch_size: Option<usize>,
    drop_last: bool,
    prefetch: usize,
    name: Option<String>,
    transforms: Vec<Arc<dyn Transform>>,
    /// The statistics `standardize` applies, for data standardized like it.
    standardized: Option<Arc<Standardize>>,
}

impl Pipeline {
    pub fn new(source: Arc<dyn Source>) -> Self {
        Pipeline {
            source,
            start: 0,
            end: None,
            shuffle: None,
            by_length: false,
            batch_size: None,
            drop_last: false,
            prefetch: 0,
            name: None,
            transforms: Vec::new(),
            standardized: None,
        }
    }

    /// Features shifted and scaled to mean 0 and deviation 1 (per channel
    /// for an image folder's samples), with the statistics `from` gives.
    pub fn standardize(self, from: Stats<'_>) -> Result<Self> {
        self.standardize_with(from, &mut || Ok(()))
    }

    /// [`Pipeline::standardize`], asking `stop` before each chunk of samples
    /// it reads for statistics (a large image folder takes minutes): its
    /// error ends the reading.
    pub fn standardize_with(
        self,
        from: Stats<'_>,
        stop: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Self> {
        let stats = match from {
            Stats::Like(Pipeline {
                standardized: Some(s),
                ..
            }) => s.clone(),
            Stats::Like(other) => Arc::new(Standardize::of(other, stop)?),
            Stats::Own => Arc::new(Standardize::of(&self, stop)?),
            Stats::OwnFeatures => Arc::new(Standardize::of(&self, stop)?.without_target()),
            Stats::Given(m) => {
                let features = match self.in_order(1).next() {
                    Some(b) => b?.x.elem_count(),
                    None => m.mean.len(),
                };
                let groups = m.mean.len();
                if groups == 0 || !features.is_multiple_of(groups) {
                    return Err(Error::Config(format!(
                        "standardize: {groups} means for samples of {features} features; give one per channel or per feature"
                    )));
                }
                let channels = self.source.image_input().map(|i| i.channels);
                if groups != features && groups != 1 && Some(groups) != channels {
                    return Err(Error::Config(format!(
                        "standardize: {groups} means for samples of {features} features{}; give one per feature, one per channel, or one for all",
                        channels.map(|c| format!(" in {c} channels")).unwrap_or_default()
                    )));
                }
                Arc::new(Standardize::new(m, features / groups)?)
            }
        };
        let mut p = self.transform(stats.clone());
        p.standardized = Some(stats);
        Ok(p)
    }

    /// The standardization this data applies, if any.
    pub fn standardized(&self) -> Option<&Standardize> {
        self.standardized.as_deref()
    }

    /// The batches of epoch 1 in source order, `size` samples each, with
    /// this data's transforms, built here.
    pub(super) fn in_order(&self, size: usize) -> Epoch {
        let mut p = self.clone();
        p.shuffle = None;
        p.prefetch = 0;
        p.batch(size, false).epoch(1, size, 0)
    }

    /// Runs `t` over every batch, after it is built.
    pub fn transform(mut self, t: Arc<dyn Transform>) -> Self {
        self.transforms.push(t);
        self
    }

    /// The split name reported for this data (default: the source's).
    pub fn split_name(&self) -> &str {
        self.name.as_deref().unwrap_or_else(|| self.source.split())
    }

    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    pub fn source(&self) -> &Arc<dyn Source> {
        &self.source
    }

    /// How an image file becomes one of this pipeline's samples, when its
    /// source is an image folder and no transform changes the samples.
    pub fn image_input(&self) -> Option<super::ImageInput> {
        let mut input = self.source.image_input()?;
        input.standardize = self.only_standardized()?;
        Some(input)
    }

    /// `Some(None)` without transforms, `Some(Some(moments))` when the one
    /// transform is a standardization, `None` when another changes samples.
    fn only_standardized(&self) -> Option<Option<super::Moments>> {
        match (self.transforms.len(), &self.standardized) {
            (0, _) => Some(None),
            (1, Some(s)) => Some(Some(s.moments().clone())),
            _ => None,
        }
    }

    /// How a table row becomes one of this pipeline's samples, when its
    /// source is a CSV file and no transform but a standardization changes
    /// the samples.
    pub fn table_input(&self) -> Option<super::TableInput> {
        let mut input = self.source.table_input()?;
        input.standardize = self.only_standardized()?;
        input.target_standardize = self.standardized().and_then(|s| s.target().cloned());
        Some(input)
    }

    /// The standardization of this pipeline's samples, when it is its only
    /// transform and the source is neither a CSV file nor an image folder
    /// (whose readings, [`Pipeline::table_input`] and
    /// [`Pipeline::image_input`], carry it).
    pub fn sample_input(&self) -> Option<super::SampleInput> {
        if self.source.table_input().is_some() || self.source.image_input().is_some() {
            return None;
        }
        let standardize = self.only_standardized()??;
        Some(super::SampleInput {
            standardize,
            target_standardize: self.standardized().and_then(|s| s.target().cloned()),
        })
    }

    /// How an array's sample becomes one of this pipeline's samples, when
    /// its source is a safetensors file or NumPy arrays and no transform
    /// but a standardization (which [`Pipeline::sample_input`] carries)
    /// changes the samples.
    pub fn array_input(&self) -> Option<super::ArrayInput> {
        self.only_standardized()?;
        self.source.array_input()
    }

    /// The source indices this pipeline reads.
    pub fn range(&self) -> Range<usize> {
        let end = self.end.unwrap_or(usize::MAX).min(self.source.len());
        self.start.min(end)..end
    }

    /// Whether this reads some of the samples `other` reads, as far as can
    /// be told: the same source (or one described alike: the same file
    /// opened again), over ranges that meet. `train:take(500)` overlaps
    /// `train`; the parts of a split do not, nor two files.
    pub fn overlaps(&self, other: &Pipeline) -> bool {
        let (a, b) = (self.range(), other.range());
        let same = Arc::ptr_eq(&self.source, &other.source)
            || self.source.describe() == other.source.describe();
        same && a.start < b.end && b.start < a.end
    }

    /// Keeps the first `n` samples (before any shuffle).
    pub fn take(mut self, n: usize) -> Self {
        let r = self.range();
        self.end = Some(r.start + n.min(r.len()));
        self
    }

    /// Drops the first `n` samples (before any shuffle).
    pub fn skip(mut self, n: usize) -> Self {
        let r = self.range();
        self.start = r.start + n.min(r.len());
        self.end = Some(r.end);
        self
    }

    /// A new permutation every epoch, a function of `(seed, epoch)` only: the
    /// order of any epoch can be recomputed (resume, retry) without state,
    /// and shuffling costs no buffer whatever the data size.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.shuffle = Some(seed);
        self
    }

    /// [`Pipeline::shuffle`], then the samples grouped by length, as
    /// transformers' `group_by_length` groups them: each run of 50 batches
    /// of the epoch's order sorted longest first (see `by_length`). For
    /// sources whose samples have lengths (a chat file's conversations).
    pub fn shuffle_by_length(self, seed: u64) -> Result<Self> {
        if self.source.lengths().is_none() {
            return Err(Error::Config(format!(
                "group_by_length: the samples of {} all have one length; it groups sources of many (a chat file's conversations)",
                self.source.describe()
            )));
        }
        let mut p = self.shuffle(seed);
        p.by_length = true;
        Ok(p)
    }

    pub fn batch(mut self, size: usize, drop_last: bool) -> Self {
        self.batch_size = Some(size.max(1));
        self.drop_last = drop_last;
        self
    }

    /// Builds up to `depth` batches ahead on a background thread.
    pub fn prefetch(mut self, depth: usize) -> Self {
        self.prefetch = depth;
        self
    }

    pub fn batch_size(&self) -> Option<usize> {
        self.batch_size
    }

    /// Samples per epoch.
    pub fn len(&self) -> usize {
        self.range().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn batches_per_epoch(&self, default_batch: usize) -> usize {
        let b = self.batch_size.unwrap_or(default_batch);
        if self.drop_last {
            self.len() / b
        } else {
            self.len().div_ceil(b)
        }
    }

    /// The order of `epoch`'s samples, drawn in batches of `batch`.
    fn order(&self, epoch: u64, batch: usize) -> Order {
        let r = self.range();
        let perm = self
            .shuffle
            .map(|seed| Permutation::new(self.len(), seed, &format!("epoch {epoch}")));
        let listed = match (&perm, self.by_length) {
            (Some(p), true) => self.source.lengths().map(|all| {
                let group = batch.max(1) * super::by_length::GROUP_BATCHES;
                super::by_length::grouped((0..r.len()).map(|i| p.get(i)), &all[r.clone()], group)
            }),
            _ => None,
        };
        Order {
            start: r.start,
            perm,
            listed,
        }
    }

    /// The source index of each sample of `epoch` (1-based), in order.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        let o = self.order(epoch, self.batch_size.unwrap_or(1));
        (0..self.len()).map(|i| o.get(i)).collect()
    }

    /// The batches of `epoch`, starting `skip` samples into its order (the
    /// cursor a checkpoint stores, so that resume is exact even when batch
    /// sizes vary).
    pub fn epoch(&self, epoch: u64, default_batch: usize, skip: usize) -> Epoch {
        let size = self.batch_size.unwrap_or(default_batch);
        let direct = Direct {
            source: self.source.clone(),
            order: self.order(epoch, size),
            len: self.len(),
            size,
            pos: skip.min(self.len()),
            drop_last: self.drop_last,
            transforms: self.transforms.clone(),
            epoch,
        };
        Epoch::new(direct, self.prefetch)
    }

    pub fn describe(&self) -> String {
        let mut s = self.source.describe();
        let r = self.range();
        if r != (0..self.source.len()) {
            s += &format!(" [{}..{})", r.start, r.end);
        }
        if let Some(seed) = self.shuffle {
            s += &format!(" shuffle(seed {seed})");
        }
        if self.by_length {
            s += " grouped by length";
        }
        if let Some(b) = self.batch_size {
            s += &format!(" batch {b}");
        }
        for t in &self.transforms {
            s += &format!(" map({})", t.describe());
        }
        if self.prefetch > 0 {
            s += &format!(" prefetch {}", self.prefetch);
        }
        s
    }
}

/// Where [`Pipeline::standardize`] takes its statistics from.
pub enum Stats<'a> {
    /// This data's own samples.
    Own,
    /// This data's own samples, its features only: the targets stay as
    /// they are (a multi-label classifier's 0s and 1s).
    OwnFeatures,
    /// Those another data applies, or else its samples'.
    Like(&'a Pipeline),
    /// These: one mean and deviation per feature, per channel, or for all.
    Given(super::Moments),
}

#[cfg(test)]
mod tests;
