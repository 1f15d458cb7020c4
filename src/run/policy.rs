//! The OOM policy slot: the one event every policy sees (built in, Lua or
//! plugin), the actions it may answer, and the built-in policy.

use crate::engine::precision::Precision;
use crate::memory::{OomCause, Phase};
use crate::Result;

/// Memory figures at the moment of an OOM: the host heap on the CPU, the
/// device on a GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemoryFigures {
    /// Bytes of the counting allocator, and the budget (`--mem-limit`).
    Host {
        used: u64,
        peak: u64,
        limit: Option<u64>,
    },
    /// The driver's figures (under `--mem-limit` the rest of the card is
    /// reserved, so `free` is what the limit leaves).
    Device { used: u64, free: u64, total: u64 },
}

/// The device memory pool's bytes at an OOM (see [`OomEvent::pool`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolFigures {
    pub reserved: u64,
    pub used: u64,
}

/// A tensor the run holds between steps (weights, optimizer state), one of
/// the largest at an OOM: what holds the memory a retry will not get back.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveTensor {
    /// As in the checkpoint: `model.h0.mlp.fc.weight`, `optim.m.wte`.
    pub name: String,
    /// The model part that owns it: `h0` (a block), `wte`, `blk.3`.
    pub part: String,
    pub bytes: u64,
}

/// The largest `n` of `tensors` by bytes, and the bytes of them all.
pub fn largest_tensors(
    tensors: &[(String, candle_core::Tensor)],
    n: usize,
) -> (Vec<LiveTensor>, u64) {
    let mut all: Vec<LiveTensor> = tensors
        .iter()
        .map(|(name, t)| LiveTensor {
            name: name.clone(),
            part: part_of(name),
            bytes: (t.elem_count() * t.dtype().size_in_bytes()) as u64,
        })
        .collect();
    let total = all.iter().map(|t| t.bytes).sum();
    all.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    all.truncate(n);
    (all, total)
}

/// The model part a state tensor belongs to: its parameter's first name
/// component (two when the second is a block number, as llama's `blk.3`).
fn part_of(name: &str) -> String {
    let rest = [
        "model.",
        "optim.m.",
        "optim.v.",
        "optim.momentum.",
        "optim.",
        "mask.",
    ]
    .iter()
    .find_map(|p| name.strip_prefix(p))
    .unwrap_or(name);
    let mut it = rest.split('.');
    let first = it.next().unwrap_or_default();
    match it.next() {
        Some(n) if n.chars().all(|c| c.is_ascii_digit()) => format!("{first}.{n}"),
        _ => first.to_string(),
    }
}

/// An out-of-memory event, as every policy receives it. Documented once, in
/// `docs/reference/lua-api.md` (the Lua table) and `plugins/include/taper_plugin.h`.
#[derive(Debug, Clone, PartialEq)]
pub struct OomEvent {
    pub phase: Phase,
    pub cause: OomCause,
    /// The step that failed (1-based); in evaluation, the next step.
    pub step: u64,
    pub epoch: u64,
    /// 1 for the first attempt at this batch.
    pub attempt: u32,
    /// Samples in the batch, and in the micro-batch that ran out.
    pub batch_size: usize,
    pub micro_batch: usize,
    /// Bytes the failed allocation asked for, when known.
    pub requested: Option<u64>,
    pub memory: MemoryFigures,
    /// On a GPU: the memory pool's reserved and used bytes once the failed
    /// attempt's tensors were dropped, before its cached blocks go back to
    /// the driver (reserved - used is what caching and fragmentation held).
    pub pool: Option<PoolFigures>,
    /// The precision forward and backward ran in.
    pub precision: Precision,
    /// Every how many blocks the backward recomputed (0: none).
    pub recompute: usize,
    /// Whether the optimizer's state was offloaded.
    pub offload: bool,
    /// The error, as one line.
    pub error: String,
    /// The largest tensors the run holds (weights, optimizer state), and
    /// the bytes of all it holds: what a retry cannot free.
    pub live: Vec<LiveTensor>,
    pub live_bytes: u64,
    /// In a data-parallel run: the ranks that ran out (the figures above
    /// are the first one's); empty in a single process.
    pub ranks: Vec<usize>,
}

/// What a policy decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Smaller micro-batches (`None`: half), same batch, same gradient.
    Split(Option<usize>),
    /// The same attempt again (memory freed by others, for example).
    Retry,
    /// Switch forward and backward to this precision, then retry.
    Precision(Precision),
    /// Recompute every n-th block's activations in the backward instead of
    /// keeping them (1: every block), then retry.
    Recompute(usize),
    /// Move the optimizer's state out of memory (to a file), then retry.
    Offload,
    /// Drop this batch, recorded.
    Skip,
    /// Stop the run (a checkpoint is written first).
    Stop(String),
}

impl Action {
    pub fn name(&self) -> &'static str {
        match self {
            Action::Split(_) => "split",
            Action::Retry => "retry",
            Action::Precision(_) => "precision",
            Action::Recompute(_) => "recompute",
            Action::Offload => "offload",
            Action::Skip => "skip",
            Action::Stop(_) => "stop",
        }
    }
}

/// After each clean training step: for policies that grow the micro-batch back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepInfo {
    pub step: u64,
    pub micro_batch: usize,
    pub batch_size: usize,
    /// Successful steps since the last OOM.
    pub clean_steps: u64,
    /// The step's measured peak (the heap on the CPU, by the counting
    /// allocator) and the memory limit, when known: a policy can shrink
    /// the micro-batch before an OOM when the peak nears the limit.
    pub peak: Option<u64>,
    pub limit: Option<u64>,
}

/// The `on_oom` slot. Built in ([`Halve`]), Lua-backed (`host`) and
/// plugin-backed (`plugins`) policies implement it; the recovery loop in
/// [`super::Recovery`] cannot tell them apart.
pub trait OomPolicy {
    /// The action for `event`; `None` leaves it to the default (halve the
    /// micro-batch).
    fn on_oom(&mut self, event: &OomEvent) -> Result<Option<Action>>;
    /// After a clean step: a new micro-batch cap, or `None` to keep it.
    fn on_step(&mut self, _info: &StepInfo) -> Result<Option<usize>> {
        Ok(None)
    }
    /// How records and errors name it.
    fn describe(&self) -> String;
}

/// The built-in policy: halve the micro-batch on every OOM, down to a
/// floor, then stop; after `grow_after` clean steps (0: never), double it
/// back towards the batch.
#[derive(Debug, Clone, Default)]
pub struct Halve {
    pub floor: usize,
    pub grow_after: u64,
}

impl OomPolicy for Halve {
    fn on_oom(&mut self, e: &OomEvent) -> Result<Option<Action>> {
        let half = e.micro_batch / 2;
        Ok(Some(if half < self.floor.max(1) {
            Action::Stop(format!(
                "micro-batch {} cannot be halved above the floor of {}",
                e.micro_batch,
                self.floor.max(1)
            ))
        } else {
            Action::Split(Some(half))
        }))
    }

    fn on_step(&mut self, info: &StepInfo) -> Result<Option<usize>> {
        let grow = self.grow_after > 0
            && info.clean_steps > 0
            && info.clean_steps.is_multiple_of(self.grow_after)
            && info.micro_batch < info.batch_size;
        Ok(grow.then(|| (info.micro_batch * 2).min(info.batch_size)))
    }

    fn describe(&self) -> String {
        format!("halve (floor {})", self.floor.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_tensors_belong_to_their_model_part() {
        assert_eq!(part_of("model.h3.attn.qkv.weight"), "h3");
        assert_eq!(part_of("optim.m.wte"), "wte");
        assert_eq!(part_of("optim.v.blk.12.attn_q.lora_a"), "blk.12");
        assert_eq!(part_of("optim.t"), "t");
    }
}
