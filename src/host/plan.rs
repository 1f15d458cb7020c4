//! Memory plans for a recipe's runs (`taper plan`).

use super::Host;
use crate::{Error, Result};

/// The memory plan of one run (see [`Host::plans`]).
#[derive(Debug, Clone)]
pub struct RunPlan {
    pub model: String,
    /// The run's training batch size (0 when it has no native data).
    pub batch_size: usize,
    pub plan: crate::memory::planner::Plan,
    /// The run's memory budget, if any.
    pub limit: Option<usize>,
}

impl Host {
    /// Memory plans for the runs the last recipe created (run it with
    /// `check_only` so nothing trains): parameter, gradient and optimizer
    /// bytes from the model, activation bytes per sample measured by forward
    /// and backward passes over 1, 2, 4 and 8 samples of the run's data.
    pub fn plans(&self) -> Result<Vec<RunPlan>> {
        if !crate::memory::HostMemory::is_counting() {
            return Err(Error::Config(
                "taper plan needs taper::memory::CountingAlloc as the global allocator".into(),
            ));
        }
        let mut out = Vec::new();
        for r in self.state.runs.borrow().iter() {
            let r = r.borrow();
            let (plan, batch_size) = plan_of(&r)?;
            out.push(RunPlan {
                model: r.core.trainer.spec().describe(),
                batch_size,
                plan,
                limit: r.core.oom.budget,
            });
        }
        Ok(out)
    }
}

/// A run's memory plan, and its training batch size (0 without native
/// data): parameter, gradient and optimizer bytes from the model, activation
/// bytes per sample from forward and backward passes over 1, 2, 4 and 8
/// samples of its first batch. Needs the counting allocator.
pub(crate) fn plan_of(
    r: &super::run_state::RunState,
) -> Result<(crate::memory::planner::Plan, usize)> {
    use crate::memory::planner::{fit, Plan};
    let t = &r.core.trainer;
    let params = t
        .params()
        .vars()
        .iter()
        .map(|(_, v)| v.elem_count() * v.dtype().size_in_bytes())
        .sum();
    let batch = match &r.data {
        Some(super::generator::Feed::Pipeline(p)) => p
            .epoch(1, super::generator::TRAIN_BATCH, 0)
            .next()
            .transpose()?,
        _ => None,
    };
    let (per_sample, per_step, batch_size) = match &batch {
        Some(b) => {
            let points = [1, 2, 4, 8]
                .iter()
                .filter(|&&n| n <= b.len())
                .map(|&n| Ok((n, t.probe_bytes(b, n)?)))
                .collect::<Result<Vec<_>>>()?;
            let (slope, intercept) = fit(&points);
            (slope, intercept, b.len())
        }
        None => (0, 0, 0),
    };
    let plan = Plan {
        resident: crate::memory::HostMemory::current(),
        parameters: params,
        gradients: params,
        optimizer: t.optimizer_state_bytes(),
        per_sample,
        per_step,
    };
    Ok((plan, batch_size))
}
