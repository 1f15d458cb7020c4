//! The one OOM recovery site. A training step or an evaluation that runs
//! out of memory, in any phase, is abandoned (its tensors dropped, the
//! device pool trimmed), reported to the run's policy, and retried on the
//! same batch with the policy's plan. Sources of OOM: the device, the
//! memory budget (`--mem-limit`, measured by the counting allocator at phase
//! boundaries) and injected faults (`--inject-oom`).

use super::policy::{Action, MemoryFigures, OomEvent, OomPolicy, PoolFigures, StepInfo};
use super::ranks::{self, Attempt, Failure};
use crate::data::Batch;
use crate::engine::Trainer;
use crate::memory::inject::Injection;
use crate::memory::{HostMemory, Phase};
use crate::{Error, Result};

mod agree;
mod eval;
#[cfg(test)]
mod tests;

/// Attempts at one batch before the run stops.
pub const MAX_ATTEMPTS: u32 = 16;

/// One OOM and what was done about it, for the run's records.
#[derive(Debug, Clone)]
pub struct Recovered<'a> {
    pub event: &'a OomEvent,
    pub action: &'a Action,
    /// The micro-batch the next attempt uses.
    pub new_micro_batch: usize,
}

/// Sees each OOM after the policy decided and before the action is taken.
pub type Observer<'o> = dyn FnMut(&Recovered<'_>) -> Result<()> + 'o;

/// What a training step came to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepOutcome {
    /// The optimizer stepped; the batch's mean loss, and the micro-batch
    /// that succeeded.
    Trained { loss: f64, micro_batch: usize },
    /// The policy skipped the batch: no update.
    Skipped,
}

/// A run's OOM handling: its policy, faults to inject, budget, and what it
/// learned (the micro-batch caps that fit).
#[derive(Default)]
pub struct Recovery {
    pub policy: Option<Box<dyn OomPolicy>>,
    pub injections: Vec<Injection>,
    pub budget: Option<usize>,
    /// The largest training micro-batch known to fit (lowered on OOM,
    /// raised by the policy's `on_step`).
    pub cap: Option<usize>,
    /// A micro-batch never passed, whatever the policy asks: the most the
    /// plan says fits under a limit the kernel enforces by killing (a
    /// container's), where an OOM would come too late to recover. An
    /// evaluation batch goes in pieces no larger.
    pub ceiling: Option<usize>,
    /// The largest evaluation batch known to fit.
    pub eval_cap: Option<usize>,
    pub clean_steps: u64,
    /// OOMs met so far.
    pub events: u64,
}

impl Recovery {
    /// Fails with an injected or budget OOM when one is due in `phase`.
    fn check(&mut self, step: u64, attempt: u32, phase: Phase) -> Result<()> {
        let at = crate::memory::oom::At {
            step,
            attempt,
            phase,
        };
        crate::memory::oom::check(&mut self.injections, self.budget, at).map_err(Error::Oom)
    }

    /// One optimizer step on `batch` in micro-batches of at most `planned`
    /// samples, recovering from OOMs in every phase of it.
    pub fn train_step(
        &mut self,
        trainer: &mut Trainer,
        batch: &Batch,
        planned: usize,
        epoch: u64,
        observe: &mut Observer<'_>,
    ) -> Result<StepOutcome> {
        let n = batch.len();
        // The most samples one forward pass takes: the batch, or in a
        // data-parallel run the largest rank's shard of it (micro-batches
        // are per rank).
        let room = crate::dist::world().map_or(n, |w| n.div_ceil(w.size()));
        let mut micro = planned
            .min(self.cap.unwrap_or(usize::MAX))
            .min(self.ceiling.unwrap_or(usize::MAX))
            .clamp(1, room.max(1));
        let step = trainer.step + 1;
        let mut attempt = 0;
        HostMemory::set_limit(self.budget);
        loop {
            attempt += 1;
            let failure = match self.attempt(trainer, batch, micro, (step, attempt))? {
                Attempt::Trained(loss) => {
                    self.after_success(trainer.step, micro, n)?;
                    return Ok(StepOutcome::Trained {
                        loss,
                        micro_batch: micro,
                    });
                }
                Attempt::Oom(f) => f,
            };
            let ev = self.event(trainer, &failure, (step, epoch, attempt), n, micro)?;
            let asked = self.decide_everywhere(&ev, attempt)?;
            let action = feasible(asked, trainer, micro, room, step);
            if let Action::Split(Some(m)) = action {
                micro = m;
                self.cap = Some(m);
            }
            self.clean_steps = 0;
            observe(&Recovered {
                event: &ev,
                action: &action,
                new_micro_batch: micro,
            })?;
            if let Some(outcome) = take(action, trainer, &failure.error)? {
                return Ok(outcome);
            }
        }
    }

    /// One attempt at a training step: on every rank of a data-parallel
    /// run, which agree on whether it trained.
    fn attempt(
        &mut self,
        trainer: &mut Trainer,
        batch: &Batch,
        micro: usize,
        (step, attempt): (u64, u32),
    ) -> Result<Attempt> {
        HostMemory::reset_peak();
        let budget = self.budget;
        let mut check = |phase| self.check(step, attempt, phase);
        Ok(match crate::dist::world() {
            Some(w) => ranks::train_attempt(w, trainer, batch, micro, budget, &mut check)?,
            None => match trainer.train_step_guarded(batch, micro, &mut check) {
                Ok(loss) => Attempt::Trained(loss),
                Err(Error::Oom(error)) => Attempt::Oom(Failure {
                    error,
                    ranks: Vec::new(),
                    memory: memory_figures(trainer.device(), budget),
                }),
                Err(other) => return Err(other),
            },
        })
    }

    /// The policy's action (the default: halve), once the failed attempt's
    /// memory is handed back; bounded by [`MAX_ATTEMPTS`].
    fn decide(&mut self, ev: &OomEvent, attempt: u32) -> Result<Action> {
        self.events += 1;
        if attempt >= MAX_ATTEMPTS {
            return Ok(Action::Stop(format!(
                "{MAX_ATTEMPTS} attempts at step {} ran out of memory",
                ev.step
            )));
        }
        let decided = match self.policy.as_mut() {
            Some(p) => p.on_oom(ev)?,
            None => None,
        };
        Ok(decided.unwrap_or(Action::Split(None)))
    }

    /// The event for an OOM, after the attempt's tensors were dropped (on
    /// the way out of the attempt) and, on a GPU, the pool's freed blocks
    /// handed back, so that the figures are what the retry will find.
    fn event(
        &self,
        trainer: &Trainer,
        failure: &Failure,
        (step, epoch, attempt): (u64, u64, u32),
        batch_size: usize,
        micro_batch: usize,
    ) -> Result<OomEvent> {
        let e = &failure.error;
        let pool = match failure.ranks.is_empty() {
            true => crate::memory::device::pool(trainer.device()).map(|p| PoolFigures {
                reserved: p.reserved as u64,
                used: p.used as u64,
            }),
            false => None,
        };
        crate::memory::device::trim(trainer.device())?;
        let (live, live_bytes) = super::policy::largest_tensors(&trainer.state(), LIVE_LISTED);
        Ok(OomEvent {
            phase: e.phase,
            cause: e.cause,
            step,
            epoch,
            attempt,
            batch_size,
            micro_batch,
            requested: e.requested,
            memory: if failure.ranks.is_empty() {
                // After the trim: what the retry will find.
                memory_figures(trainer.device(), self.budget)
            } else {
                failure.memory
            },
            pool,
            precision: trainer.precision(),
            recompute: trainer.recompute(),
            offload: trainer.offload(),
            error: e.to_string(),
            live,
            live_bytes,
            ranks: failure.ranks.clone(),
        })
    }

    /// After a clean step: count it, and let the policy grow the cap back.
    fn after_success(&mut self, step: u64, micro: usize, batch: usize) -> Result<()> {
        self.clean_steps += 1;
        let counting = HostMemory::is_counting();
        let info = StepInfo {
            step,
            micro_batch: micro,
            batch_size: batch,
            clean_steps: self.clean_steps,
            peak: counting.then(|| HostMemory::peak() as u64),
            limit: self.budget.map(|b| b as u64),
        };
        let decided = match self.policy.as_mut() {
            Some(p) => p.on_step(&info),
            None => return Ok(()),
        };
        // Every rank keeps rank 0's cap: a data-parallel step splits the
        // same way on all of them.
        if let Some(m) = agree::cap(decided)? {
            self.cap = Some(m.max(1));
        }
        Ok(())
    }
}

/// The policy's action as the run can take it: a split within the room
/// left, and a stop (saying why) for a split below one sample or a change
/// to what the run already does.
fn feasible(asked: Action, trainer: &Trainer, micro: usize, room: usize, step: u64) -> Action {
    match asked {
        Action::Split(m) => match split(m, micro, room) {
            Some(m) => Action::Split(Some(m)),
            None => nothing_to_split(step),
        },
        Action::Precision(p) if p == trainer.precision() => Action::Stop(format!(
            "the OOM policy asked for precision {} at step {step}, which the run already uses",
            p.name()
        )),
        Action::Recompute(n) if n == trainer.recompute() => Action::Stop(format!(
            "the OOM policy asked to recompute every {n} blocks at step {step}, which the run already does"
        )),
        Action::Offload if trainer.offload() => Action::Stop(format!(
            "the OOM policy asked to offload the optimizer's state at step {step}, which the run already does"
        )),
        other => other,
    }
}

/// Takes an action on the trainer before the next attempt; `Some` when the
/// step ends here (skipped). A stop is an error that names the OOM `e`.
fn take(
    action: Action,
    trainer: &mut Trainer,
    e: &crate::memory::oom::OomError,
) -> Result<Option<StepOutcome>> {
    match action {
        Action::Precision(p) => trainer.set_precision(p)?,
        Action::Recompute(n) => trainer.set_recompute(n).map_err(|why| {
            Error::Stopped(format!("the OOM policy asked to recompute: {why} ({e})"))
        })?,
        Action::Offload => trainer.set_offload(true).map_err(|why| {
            Error::Stopped(format!("the OOM policy asked to offload: {why} ({e})"))
        })?,
        Action::Skip => return Ok(Some(StepOutcome::Skipped)),
        Action::Stop(why) => return Err(Error::Stopped(format!("{why} ({e})"))),
        Action::Split(_) | Action::Retry => {}
    }
    Ok(None)
}

/// The micro-batch a split asks for (`None`: half), within 1..=n; `None`
/// when nothing smaller is left.
fn split(asked: Option<usize>, micro: usize, n: usize) -> Option<usize> {
    match asked {
        Some(m) => Some(m.clamp(1, n.max(1))),
        None if micro <= 1 => None,
        None => Some(micro / 2),
    }
}

fn nothing_to_split(step: u64) -> Action {
    Action::Stop(format!(
        "out of memory at step {step} with a micro-batch of 1: nothing left to split"
    ))
}

/// How many of the largest live tensors an OOM event lists.
pub const LIVE_LISTED: usize = 8;

/// What a policy is told about memory: the device's figures on a GPU, the
/// counting allocator's on the CPU.
pub fn memory_figures(device: &candle_core::Device, budget: Option<usize>) -> MemoryFigures {
    match crate::memory::device::info(device) {
        Some(d) => MemoryFigures::Device {
            used: d.used() as u64,
            free: d.free as u64,
            total: d.total as u64,
        },
        None => MemoryFigures::Host {
            used: HostMemory::current() as u64,
            peak: HostMemory::peak() as u64,
            limit: budget.map(|b| b as u64),
        },
    }
}
