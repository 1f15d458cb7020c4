//! The run core, with no Lua in it: a [`Run`] (trainer, slots, cursor,
//! counters, step), the OOM slot as a trait, and the one site where OOMs
//! are recovered ([`Recovery`]). The Lua bindings
//! (`host`) and the plugins (`plugins`) implement the slots; an embedder
//! without Lua can drive [`Recovery`] with the built-in policy.

mod checks;
pub mod interrupt;
pub mod periodic;
mod policy;
pub mod ranks;
mod recovery;
mod resume_notes;
mod saving;
mod state;
pub mod window;

pub use checks::CHECK_WEIGHTS_EVERY;
pub use policy::{
    largest_tensors, Action, Halve, LiveTensor, MemoryFigures, OomEvent, OomPolicy, PoolFigures,
    StepInfo,
};
pub use recovery::{memory_figures, Observer, Recovered, Recovery, StepOutcome, MAX_ATTEMPTS};
pub use state::{Cursor, EpochStats, EpochSummary, Run};

pub use crate::engine::optim::check_lr;
