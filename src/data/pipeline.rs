//! A pipeline over a source: take, a seeded per-epoch shuffle, batching.

use std::sync::Arc;

use super::{Batch, Source};
use crate::engine::rng::Rng;
use crate::Result;

#[derive(Clone)]
pub struct Pipeline {
    source: Arc<dyn Source>,
    take: Option<usize>,
    shuffle: Option<u64>,
    batch_size: Option<usize>,
    drop_last: bool,
}

impl Pipeline {
    pub fn new(source: Arc<dyn Source>) -> Self {
        Pipeline {
            source,
            take: None,
            shuffle: None,
            batch_size: None,
            drop_last: false,
        }
    }

    pub fn source(&self) -> &Arc<dyn Source> {
        &self.source
    }

    /// Keeps the first `n` samples of the source (before any shuffle).
    pub fn take(mut self, n: usize) -> Self {
        self.take = Some(n.min(self.take.unwrap_or(usize::MAX)));
        self
    }

    /// A new permutation every epoch, a function of `(seed, epoch)` only: the
    /// order of any epoch can be recomputed (resume, retry) without state.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.shuffle = Some(seed);
        self
    }

    pub fn batch(mut self, size: usize, drop_last: bool) -> Self {
        self.batch_size = Some(size.max(1));
        self.drop_last = drop_last;
        self
    }

    pub fn batch_size(&self) -> Option<usize> {
        self.batch_size
    }

    /// Samples per epoch.
    pub fn len(&self) -> usize {
        self.source.len().min(self.take.unwrap_or(usize::MAX))
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

    /// The sample order of `epoch` (1-based).
    pub fn order(&self, epoch: u64) -> Vec<usize> {
        match self.shuffle {
            Some(seed) => Rng::stream(seed, &format!("epoch {epoch}")).permutation(self.len()),
            None => (0..self.len()).collect(),
        }
    }

    /// The batches of `epoch`, starting after `skip` batches.
    pub fn epoch(&self, epoch: u64, default_batch: usize, skip: usize) -> Epoch {
        let size = self.batch_size.unwrap_or(default_batch);
        let total = self.batches_per_epoch(default_batch);
        Epoch {
            source: self.source.clone(),
            order: self.order(epoch),
            size,
            next: skip.min(total),
            total,
        }
    }

    pub fn describe(&self) -> String {
        let mut s = self.source.describe();
        if let Some(n) = self.take {
            s += &format!(" take {n}");
        }
        if let Some(seed) = self.shuffle {
            s += &format!(" shuffle(seed {seed})");
        }
        if let Some(b) = self.batch_size {
            s += &format!(" batch {b}");
        }
        s
    }
}

/// Iterates the batches of one epoch.
pub struct Epoch {
    source: Arc<dyn Source>,
    order: Vec<usize>,
    size: usize,
    next: usize,
    total: usize,
}

impl Epoch {
    /// Batches left in this epoch.
    pub fn remaining(&self) -> usize {
        self.total - self.next
    }
    /// Batches of this epoch already handed out.
    pub fn position(&self) -> usize {
        self.next
    }
}

impl Iterator for Epoch {
    type Item = Result<Batch>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.total {
            return None;
        }
        let start = self.next * self.size;
        let end = (start + self.size).min(self.order.len());
        self.next += 1;
        let indices = self.order[start..end].to_vec();
        Some(
            self.source
                .gather(&indices)
                .map(|(x, y)| Batch { x, y, indices }),
        )
    }
}
