//! The host's memory limits: `--mem-limit` made real on a GPU (the rest of
//! the card reserved), and on the CPU the limit of the container taper runs
//! in, or outside one the machine's memory, which becomes each run's heap
//! budget unless a limit is given.

use candle_core::Device;

use super::output::Output;
use super::run_state::RunState;
use crate::memory::container::{MemoryLimit, Residency, Whose};
use crate::memory::planner::human;
use crate::Result;

/// On a GPU the limit is made real: everything above it is reserved.
pub(super) fn reserve_above_limit(
    limit: Option<usize>,
    device: &Device,
    out: &Output,
) -> Result<Option<crate::memory::device::Ballast>> {
    let (Some(limit), Device::Cuda(_)) = (limit, device) else {
        return Ok(None);
    };
    let b = crate::memory::device::ballast(device, limit)?;
    out.line(&format!(
        "--mem-limit: reserved {} of {} so that {} stays usable",
        human(b.bytes),
        crate::engine::describe_device(device),
        human(limit)
    ));
    Ok(Some(b))
}

/// A container's memory limit, or the machine's memory, and the heap budget
/// taken from it.
#[derive(Debug, Clone)]
pub(crate) struct HostBudget {
    pub limit: MemoryLimit,
    /// What other processes in the container, or on the machine, held at
    /// the start.
    others: usize,
    ranks: usize,
    /// Bytes of counted heap a run keeps under, before a plan measures
    /// how resident memory follows the heap (see
    /// [`MemoryLimit::heap_budget`]).
    pub budget: usize,
}

/// The container's limit, or the machine's memory, as a heap budget: on
/// the CPU, with the counting allocator. Past it the kernel kills the
/// process (or the machine swaps until the run crawls), so runs keep below
/// it (unless a limit is given) and the planner probes below it.
pub(super) fn host_budget(device: &Device) -> Option<HostBudget> {
    if !device.is_cpu() || !crate::memory::HostMemory::is_counting() {
        return None;
    }
    let limit = crate::memory::container::detect_any()?;
    let (others, ranks) = (limit.others(), local_ranks());
    let budget = limit.heap_budget(others, Residency::assumed(), ranks);
    Some(HostBudget {
        limit,
        others,
        ranks,
        budget,
    })
}

/// The processes of a data-parallel run on this machine, which share its
/// container: Open MPI's and MPICH's count, else one.
fn local_ranks() -> usize {
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse().ok())
        .unwrap_or(1)
}

/// The planner's margin (`taper plan`'s default): its estimates were
/// within 0.4% of whole and micro-batched GPT steps, measured.
const PLAN_MARGIN: f64 = 0.1;

/// Under the container's limit (or the machine's memory), a run's heap
/// budget follows from how its resident memory followed the heap in the
/// plan's probes (`measured`), and its micro-batches never pass what the
/// plan says fits, even when the policy or a growing batch asks: a step past
/// the limit would be killed before any phase boundary could see it. (A
/// data-parallel run's ranks agree on their micro-batches through the OOM
/// policy instead.) A container's budget is said at the start; the
/// machine's, only when the run must keep under it.
pub(super) fn start_under(
    run: &mut RunState,
    c: &HostBudget,
    measured: Option<Residency>,
    out: &Output,
) {
    let budget = measured.map_or(c.budget, |r| c.limit.heap_budget(c.others, r, c.ranks));
    run.core.oom.budget = Some(budget);
    let contained = c.limit.whose == Whose::Container;
    let say_budget = || {
        out.line(&format!(
            "memory: {}; training keeps its heap under {}, and a step past that is an \
             OOM the run recovers from (--mem-limit sets another)",
            c.limit.describe(),
            human(budget)
        ))
    };
    if run.id == 1 && contained {
        say_budget();
    }
    let Some(plan) = run.plan else { return };
    if crate::dist::world().is_some() {
        return;
    }
    let whole = plan.peak(plan.batch, false);
    match plan.micro_under(budget, PLAN_MARGIN) {
        // No bytes per sample measured (a model too small to tell): no
        // ceiling to keep.
        Some(usize::MAX) => {}
        Some(m) => {
            run.core.oom.ceiling = Some(m);
            if m < plan.batch {
                if !contained {
                    say_budget();
                }
                out.line(&format!(
                    "memory: a step of the whole batch ({}) would need about {} of heap: \
                     it runs in micro-batches of {m} (the same gradient)",
                    plan.batch,
                    human(whole)
                ));
            }
        }
        None => out.warn(&format!(
            "memory: one sample at a time needs about {} of heap, more than the {} \
             the {} leaves: the kernel may stop the run",
            human(plan.peak(1, false)),
            human(budget),
            if contained { "container" } else { "machine" }
        )),
    }
}
