//! Memory plans for a recipe's runs (`taper plan`).

use super::Host;
use crate::{Error, Result};

/// The memory plan of one run (see [`Host::plans`]).
#[derive(Debug, Clone)]
pub struct RunPlan {
    pub model: String,
    /// The plan; its `batch` is the run's training batch (0 when it has no
    /// native data).
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
            out.push(RunPlan {
                model: r.core.trainer.spec().describe(),
                plan: plan_of(&r)?,
                limit: r.core.oom.budget,
            });
        }
        Ok(out)
    }
}

/// A run's memory plan, for its training batch (0 without native data):
/// parameter, gradient and optimizer bytes from the model, activation
/// bytes per sample from forward and backward passes over parts of its
/// first batch ([`probe_sizes`]). Needs the counting allocator.
pub(crate) fn plan_of(r: &super::run_state::RunState) -> Result<crate::memory::planner::Plan> {
    use crate::memory::planner::{fit, Plan};
    let t = &r.core.trainer;
    let params = t
        .params()
        .vars()
        .iter()
        .map(|(_, v)| v.elem_count() * v.dtype().size_in_bytes())
        .sum();
    let first = match &r.data {
        Some(super::generator::Feed::Pipeline(p)) => p
            .epoch(1, super::generator::TRAIN_BATCH, 0)
            .next()
            .transpose()?,
        _ => None,
    };
    let (per_sample, per_step, batch) = match &first {
        Some(b) => {
            let sizes = probe_sizes(b.len());
            // The first pass allocates once what later ones reuse (a third
            // of the smallest probe on the Shakespeare GPT): a warm-up pass,
            // not measured, keeps it out of the line.
            t.probe_bytes(b, sizes[0])?;
            let points = sizes
                .into_iter()
                .map(|n| Ok((n, t.probe_bytes(b, n)?)))
                .collect::<Result<Vec<_>>>()?;
            let (slope, intercept) = fit(&points);
            (slope, intercept, b.len())
        }
        None => (0, 0, 0),
    };
    Ok(Plan {
        resident: crate::memory::HostMemory::current(),
        parameters: params,
        gradients: params,
        optimizer: t.optimizer_state_bytes(),
        per_sample,
        per_step,
        batch,
    })
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
