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
    /// The micro-batches the activations were measured on.
    pub probes: Vec<usize>,
    /// When the budget is the host's: the container's limit or the
    /// machine's memory.
    pub host_limit: Option<crate::memory::container::MemoryLimit>,
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
            let ceiling = self.state.budget.as_ref().map(|c| c.budget);
            let probed = plan_of(&r, ceiling, FirstBatch::MustFit)?;
            out.push(RunPlan {
                model: r.core.trainer.spec().describe(),
                plan: probed.plan,
                limit: r.core.oom.budget,
                probes: probed.probes,
                host_limit: match (&self.state.budget, r.under_host_limit) {
                    (Some(c), true) => Some(c.limit.clone()),
                    _ => None,
                },
            });
        }
        Ok(out)
    }
}

/// What [`plan_of`] measured.
pub(crate) struct Probed {
    pub plan: crate::memory::planner::Plan,
    /// The sample counts probed.
    pub probes: Vec<usize>,
    /// Under a ceiling: how resident memory followed the heap in the probes.
    pub residency: Option<crate::memory::container::Residency>,
}

/// A run's memory plan, for its training batch (0 without native data):
/// parameter, gradient and optimizer bytes from the model, activation
/// bytes per sample from forward and backward passes over parts of its
/// first batch ([`probe`]). Needs the counting allocator.
pub(crate) fn plan_of(
    r: &super::run_state::RunState,
    ceiling: Option<usize>,
    first: FirstBatch,
) -> Result<Probed> {
    use crate::memory::planner::fit;
    let t = &r.core.trainer;
    let first = first_batch(r, first)?;
    let (mut per_sample, mut per_step, mut batch) = (0, 0, 0);
    let (mut probes, mut residency) = (Vec::new(), None);
    if let Some(b) = &first {
        let points = probe(t, b, ceiling)?;
        (per_sample, per_step) = fit(&points
            .iter()
            .map(|p| (p.samples, p.heap))
            .collect::<Vec<_>>());
        batch = b.len();
        probes = points.iter().map(|p| p.samples).collect();
        let resident: Option<Vec<_>> = points.iter().map(|p| Some((p.peak, p.resident?))).collect();
        residency = resident.and_then(|r| crate::memory::container::Residency::fit(&r));
    }
    Ok(Probed {
        plan: plan_with(t, per_sample, per_step, batch),
        probes,
        residency,
    })
}

/// Whether a run's whole batch plainly fits under `budget`: a step's peak
/// as one pass of a single sample bounds it, every sample charged that
/// pass's bytes (its one-time allocations and the weights' gradients too),
/// is under a quarter of the budget. One pass, where a plan ([`plan_of`])
/// takes the equal of two steps or more (3.3 s of a QLoRA run's start).
pub(crate) fn plainly_fits(r: &super::run_state::RunState, budget: usize) -> Result<bool> {
    let Some(b) = first_batch(r, FirstBatch::MayNotFit)? else {
        return Ok(true);
    };
    let t = &r.core.trainer;
    let one = t.probe_bytes(&b, 1)?;
    Ok(plan_with(t, one, 0, b.len()).peak(b.len(), false) <= budget / 4)
}

/// What a plan does with a first batch that does not fit the model.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum FirstBatch {
    /// Its error is the plan's (`taper plan`).
    MustFit,
    /// No plan: the run's first step names the sample and the recipe's line.
    MayNotFit,
}

/// The first training batch of a run's native data, if it has some (and,
/// as `fit` says, if it fits the model).
fn first_batch(
    r: &super::run_state::RunState,
    fit: FirstBatch,
) -> Result<Option<crate::data::Batch>> {
    let first = match &r.data {
        Some(super::generator::Feed::Pipeline(p)) => p
            .epoch(1, super::generator::TRAIN_BATCH, 0)
            .next()
            .transpose()?,
        _ => None,
    };
    match first.map(|b| r.core.fits(&b).map(|()| b)) {
        Some(Err(crate::Error::Data(why))) if fit == FirstBatch::MustFit => Err(
            crate::Error::Data(format!("the run's first training batch: {why}")),
        ),
        Some(Err(e)) if fit == FirstBatch::MustFit => Err(e),
        Some(Err(_)) => Ok(None),
        fits => fits.transpose(),
    }
}

/// A plan of the trainer's model and optimizer with these activations.
fn plan_with(
    t: &crate::engine::Trainer,
    per_sample: usize,
    per_step: usize,
    batch: usize,
) -> crate::memory::planner::Plan {
    let params = t
        .params()
        .vars()
        .iter()
        .map(|(_, v)| v.elem_count() * v.dtype().size_in_bytes())
        .sum();
    crate::memory::planner::Plan {
        resident: crate::memory::HostMemory::current(),
        parameters: params,
        gradients: params,
        optimizer: t.optimizer_state_bytes(),
        per_sample,
        per_step,
        batch,
    }
}

/// One probe: a forward and backward pass over `samples` of a batch.
struct Point {
    samples: usize,
    /// Heap bytes above the level before it.
    heap: usize,
    /// The heap's peak, all of it.
    peak: usize,
    /// The process's resident peak, under a ceiling where it can be
    /// measured.
    resident: Option<usize>,
}

/// Probes of parts of `batch` ([`probe_sizes`]). Under a `ceiling` (the
/// heap a container leaves, past which the kernel kills the process) two
/// scouts of a 64th of the batch and twice that go first, a probe that the
/// line through the points so far puts past the ceiling is not run, and
/// each probe's resident peak is measured too.
fn probe(
    t: &crate::engine::Trainer,
    b: &crate::data::Batch,
    ceiling: Option<usize>,
) -> Result<Vec<Point>> {
    use crate::memory::container;
    let mut sizes = probe_sizes(b.len());
    if ceiling.is_some() {
        let scout = (b.len() / 64).max(1);
        sizes.extend([scout, 2 * scout]);
        sizes.sort_unstable();
        sizes.dedup();
    }
    // The first pass allocates once what later ones reuse (a third of the
    // smallest probe on the Shakespeare GPT): a warm-up pass, not
    // measured, keeps it out of the line.
    t.probe_bytes(b, sizes[0])?;
    let mut points: Vec<Point> = Vec::new();
    for samples in sizes {
        if let (Some(limit), true) = (ceiling, points.len() >= 2) {
            let line: Vec<_> = points.iter().map(|p| (p.samples, p.heap)).collect();
            let (slope, intercept) = crate::memory::planner::fit(&line);
            let predicted = crate::memory::HostMemory::current() + intercept + slope * samples;
            if predicted > limit {
                break;
            }
        }
        let measure = ceiling.is_some() && container::reset_resident_peak();
        let before = crate::memory::HostMemory::current();
        let heap = t.probe_bytes(b, samples)?;
        points.push(Point {
            samples,
            heap,
            peak: before + heap,
            resident: measure.then(container::resident_peak).flatten(),
        });
    }
    Ok(points)
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
