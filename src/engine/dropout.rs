//! The dropout draws of the transformers' blocks (the GPT's and the
//! BERT's): each site of a net is its own draw of `kernels::Dropout`, the
//! embeddings' site 0 and block `i`'s sites `1 + 3i` to `3 + 3i`.

use super::model::Draw;
use crate::kernels::Dropout;

/// The draw of dropout site `site` at `rate` in training (`draw`); none in
/// evaluation or at rate 0.
pub(super) fn site(draw: Option<Draw>, rate: f64, site: u64) -> Option<Dropout> {
    draw.and_then(|d| Dropout::new(rate, d.seed, d.step, site))
}

/// One block's draws in a training step; none in evaluation.
#[derive(Clone, Copy, Default)]
pub(super) struct BlockDrops {
    /// On the attention weights.
    pub weights: Option<Dropout>,
    /// On the attention's output, before the residual add.
    pub attention_out: Option<Dropout>,
    /// On the MLP's output, before the residual add.
    pub mlp_out: Option<Dropout>,
    /// The batch's place of the piece's first sample.
    pub first: usize,
}

impl BlockDrops {
    /// Block `i`'s draws: the weights' at `weights`, the outputs' at
    /// `hidden`.
    pub(super) fn of(draw: Option<Draw>, (weights, hidden): (f64, f64), i: usize) -> BlockDrops {
        let at = 1 + 3 * i as u64;
        BlockDrops {
            weights: site(draw, weights, at),
            attention_out: site(draw, hidden, at + 1),
            mlp_out: site(draw, hidden, at + 2),
            first: draw.map_or(0, |d| d.first),
        }
    }

    /// The weights' draw as the attention kernels take it.
    pub(super) fn on_weights(&self) -> Option<(Dropout, usize)> {
        self.weights.map(|d| (d, self.first))
    }
}
