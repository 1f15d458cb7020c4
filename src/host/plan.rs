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
    /// and backward passes over parts of the run's first batch ([`probe_sizes`]).
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
/// bytes per sample from forward and backward passes over parts of its
/// first batch ([`probe_sizes`]). Needs the counting allocator.
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
            let points = probe_sizes(b.len())
                .into_iter()
                .map(|n| Ok((n, t.probe_bytes(b, n)?)))
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

/// The sample counts a plan probes: an eighth, a quarter and half of a
/// batch of 16 or more, else 1, 2, 4 and 8 (as many as the batch has). A
/// step's peak is the larger of a part that does not grow with the
/// micro-batch (the weights' gradients as backward makes them) and one that
/// does (activations and their gradients); probes too small to pass the
/// first would fit a line with no slope.
pub fn probe_sizes(batch: usize) -> Vec<usize> {
    if batch >= 16 {
        vec![batch / 8, batch / 4, batch / 2]
    } else {
        [1, 2, 4, 8].into_iter().filter(|&n| n <= batch).collect()
    }
}
