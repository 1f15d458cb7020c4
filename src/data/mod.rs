//! Data: sources of samples and the pipeline (take, shuffle, batch) a recipe
//! builds over them. Batches are built natively on the host; Lua only holds
//! handles.

mod augment;
mod builtin;
mod epoch;
mod files;
mod images;
mod mapped;
mod permutation;
mod pipeline;
mod samples;
mod tokenized;
mod tokens;
mod vocab;

pub use augment::Augment;
pub use builtin::{digits, shakespeare, shakespeare_tokens, CharText, Digits};
pub use epoch::Epoch;
pub use files::{csv, idx, parse_csv, text, Csv, Idx};
pub use images::{images, Images};
pub use permutation::Permutation;
pub use pipeline::Pipeline;
pub use samples::{samples, Samples};
pub use tokens::{tokens, TokenType, Tokens};
pub use vocab::Vocab;

use candle_core::Tensor;

use crate::Result;

/// A finite, indexable set of samples.
pub trait Source: Send + Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The split this source reads (`train`, `test`, ...), for metrics.
    fn split(&self) -> &str;
    /// One line for `__tostring` and logs.
    fn describe(&self) -> String;
    /// Inputs and targets for these samples, on the CPU, batch first.
    fn gather(&self, indices: &[usize]) -> Result<(Tensor, Tensor)>;
    /// The samples as `epoch` sees them: as [`Source::gather`], unless the
    /// source draws anew each epoch (an image folder's augmentation).
    fn gather_epoch(&self, indices: &[usize], _epoch: u64) -> Result<(Tensor, Tensor)> {
        self.gather(indices)
    }
    /// Text sources: their vocabulary, for encoding prompts and decoding output.
    fn vocab(&self) -> Option<&Vocab> {
        None
    }
    /// Class names, label 0 first, where the source knows them (an image
    /// folder's).
    fn classes(&self) -> Option<&[String]> {
        None
    }
}

/// A native per-batch transform in a pipeline (`data:map(plugin)`), run
/// where the batch is built (on the prefetch thread, with prefetch).
pub trait Transform: Send + Sync {
    fn apply(&self, batch: Batch, epoch: u64) -> crate::Result<Batch>;
    fn describe(&self) -> String;
}

/// One batch: inputs, targets and the sample indices they came from.
#[derive(Debug, Clone)]
pub struct Batch {
    pub x: Tensor,
    pub y: Tensor,
    pub indices: Vec<usize>,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.indices.len()
    }
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
    /// The rows `[start, start + len)` (a data-parallel rank's shard).
    pub fn rows(&self, start: usize, len: usize) -> candle_core::Result<Batch> {
        Ok(Batch {
            x: self.x.narrow(0, start, len)?,
            y: self.y.narrow(0, start, len)?,
            indices: self.indices[start..start + len].to_vec(),
        })
    }
}
