//! One epoch of a pipeline: its sample order, the batches drawn in that
//! order (directly, or built ahead on a background thread), and the cursor
//! a checkpoint stores.

use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::permutation::Permutation;
use super::{Batch, Source, Transform};
use crate::{Error, Result};

pub(super) struct Order {
    pub(super) start: usize,
    pub(super) perm: Option<Permutation>,
    /// The epoch's positions in order, where they are not the
    /// permutation's (samples grouped by length).
    pub(super) listed: Option<Vec<usize>>,
}

impl Order {
    pub(super) fn get(&self, i: usize) -> usize {
        self.start
            + match (&self.listed, &self.perm) {
                (Some(l), _) => l[i],
                (None, Some(p)) => p.get(i),
                (None, None) => i,
            }
    }
}

/// The batches of one epoch, drawn on demand.
pub(super) struct Direct {
    pub(super) source: Arc<dyn Source>,
    pub(super) order: Order,
    pub(super) len: usize,
    pub(super) size: usize,
    /// The next sample position in the epoch's order.
    pub(super) pos: usize,
    pub(super) drop_last: bool,
    pub(super) transforms: Vec<Arc<dyn Transform>>,
    pub(super) epoch: u64,
}

impl Direct {
    fn remaining(&self) -> usize {
        let left = self.len - self.pos;
        if self.drop_last {
            left / self.size
        } else {
            left.div_ceil(self.size)
        }
    }

    /// The next `n` samples (fewer at the end of the epoch, unless drop_last).
    fn draw(&mut self, n: usize) -> Option<Result<Batch>> {
        let n = n.max(1);
        if self.pos >= self.len || (self.drop_last && self.len - self.pos < n) {
            self.pos = self.len;
            return None;
        }
        let end = (self.pos + n).min(self.len);
        let indices: Vec<usize> = (self.pos..end).map(|i| self.order.get(i)).collect();
        self.pos = end;
        let batch = self
            .source
            .gather_epoch(&indices, self.epoch)
            .map(|(x, y)| Batch { x, y, indices });
        let epoch = self.epoch;
        Some(batch.and_then(|b| self.transforms.iter().try_fold(b, |b, t| t.apply(b, epoch))))
    }
}

impl Iterator for Direct {
    type Item = Result<Batch>;
    fn next(&mut self) -> Option<Self::Item> {
        self.draw(self.size)
    }
}

enum Inner {
    Direct(Direct),
    Prefetch(Receiver<Result<Batch>>),
}

/// Iterates the batches of one epoch.
pub struct Epoch {
    inner: Inner,
    size: usize,
    next: usize,
    remaining: usize,
    wait: Duration,
}

impl Epoch {
    /// The epoch's batches from `direct`, built `prefetch` batches ahead
    /// on a background thread unless `prefetch` is 0.
    pub(super) fn new(direct: Direct, prefetch: usize) -> Epoch {
        let (size, remaining) = (direct.size, direct.remaining());
        let inner = if prefetch == 0 {
            Inner::Direct(direct)
        } else {
            let (tx, rx) = sync_channel(prefetch);
            // The thread stops when the epoch ends or the receiver is dropped.
            std::thread::spawn(move || {
                for b in direct {
                    if tx.send(b).is_err() {
                        break;
                    }
                }
            });
            Inner::Prefetch(rx)
        };
        Epoch {
            inner,
            size,
            next: 0,
            remaining,
            wait: Duration::ZERO,
        }
    }

    /// Batches left in this epoch at the data's batch size.
    pub fn remaining(&self) -> usize {
        self.remaining.saturating_sub(self.next)
    }
    /// Batches of this epoch already handed out.
    pub fn position(&self) -> usize {
        self.next
    }
    /// Time spent waiting for batches so far (building them, or, with
    /// prefetch, waiting for the background thread).
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// The next batch with `n` samples instead of the data's batch size (a
    /// batch-size schedule). Prefetched data is built ahead at its own batch
    /// size, so there only that size can be drawn.
    pub fn next_sized(&mut self, n: usize) -> Option<Result<Batch>> {
        let t = Instant::now();
        let item = match &mut self.inner {
            Inner::Direct(d) => d.draw(n),
            Inner::Prefetch(_) if n != self.size => Some(Err(Error::Config(format!(
                "a schedule asked for a batch of {n}, but this data is prefetched in batches of {}: \
                 drop :prefetch() to let the schedule choose batch sizes",
                self.size
            )))),
            Inner::Prefetch(rx) => rx.recv().ok(),
        };
        self.wait += t.elapsed();
        if matches!(item, Some(Ok(_))) {
            self.next += 1;
        }
        item
    }
}

impl Iterator for Epoch {
    type Item = Result<Batch>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_sized(self.size)
    }
}
