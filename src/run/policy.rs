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
    /// The precision forward and backward ran in.
    pub precision: Precision,
    /// The error, as one line.
    pub error: String,
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
