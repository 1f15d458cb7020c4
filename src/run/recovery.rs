//! The one OOM recovery site. A training step or an evaluation that runs
//! out of memory, in any phase, is abandoned (its tensors dropped, the
//! device pool trimmed), reported to the run's policy, and retried on the
//! same batch with the policy's plan. Sources of OOM: the device, the
//! memory budget (`--mem-limit`, measured by the counting allocator at phase
//! boundaries) and injected faults (`--inject-oom`).

use super::policy::{Action, MemoryFigures, OomEvent, OomPolicy, PoolFigures, StepInfo};
use super::ranks::{self, Attempt, Failure};
use crate::data::Batch;
use crate::engine::{loss::Loss, Eval, EvalSums, Trainer};
use crate::memory::inject::Injection;
use crate::memory::{HostMemory, Phase};
use crate::{Error, Result};

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
        let world = crate::dist::world();
        // The most samples one forward pass takes: the batch, or in a
        // data-parallel run the largest rank's shard of it (micro-batches
        // are per rank).
        let room = world.map_or(n, |w| n.div_ceil(w.size()));
        let mut micro = planned
            .min(self.cap.unwrap_or(usize::MAX))
            .clamp(1, room.max(1));
        let step = trainer.step + 1;
        let mut attempt = 0;
        HostMemory::set_limit(self.budget);
        loop {
            attempt += 1;
            HostMemory::reset_peak();
            let budget = self.budget;
            let mut check = |phase| self.check(step, attempt, phase);
            let attempted = match world {
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
            };
            let failure = match attempted {
                Attempt::Trained(loss) => {
                    self.after_success(trainer.step, micro, n)?;
                    return Ok(StepOutcome::Trained {
                        loss,
                        micro_batch: micro,
                    });
                }
                Attempt::Oom(f) => f,
            };
            let e = &failure.error;
            let ev = self.event(trainer, &failure, (step, epoch, attempt), n, micro)?;
            let action = self.decide_everywhere(&ev, attempt)?;
            let action = match action {
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
            };
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
            match action {
                Action::Precision(p) => trainer.set_precision(p)?,
                Action::Recompute(n) => trainer.set_recompute(n).map_err(|why| {
                    Error::Stopped(format!("the OOM policy asked to recompute: {why} ({e})"))
                })?,
                Action::Offload => trainer.set_offload(true).map_err(|why| {
                    Error::Stopped(format!("the OOM policy asked to offload: {why} ({e})"))
                })?,
                Action::Skip => return Ok(StepOutcome::Skipped),
                Action::Stop(why) => return Err(Error::Stopped(format!("{why} ({e})"))),
                Action::Split(_) | Action::Retry => {}
            }
        }
    }

    /// Mean loss and accuracy over `batches`, as [`Trainer::evaluate_with`],
    /// recovering from OOMs: an evaluation batch that runs out of memory is
    /// evaluated again in smaller pieces. Training state is not touched.
    pub fn evaluate(
        &mut self,
        trainer: &Trainer,
        batches: impl Iterator<Item = Result<Batch>>,
        objective: Option<&Loss>,
        epoch: u64,
        observe: &mut Observer<'_>,
    ) -> Result<Eval> {
        let world = crate::dist::world();
        let local = self.evaluate_local(trainer, batches, objective, epoch, observe);
        let total = match world {
            // Every rank evaluated its shard of each batch: the sums add up.
            Some(w) => ranks::eval_total(w, local, trainer.device())?,
            None => local?,
        };
        total.eval(objective.is_some())
    }

    /// This process's part of [`Recovery::evaluate`]: every batch, or this
    /// rank's shard of each.
    fn evaluate_local(
        &mut self,
        trainer: &Trainer,
        batches: impl Iterator<Item = Result<Batch>>,
        objective: Option<&Loss>,
        epoch: u64,
        observe: &mut Observer<'_>,
    ) -> Result<EvalSums> {
        let model = trainer.frozen()?;
        let mut total = EvalSums::default();
        let step = trainer.step + 1;
        HostMemory::set_limit(self.budget);
        let world = crate::dist::world();
        for batch in batches {
            let batch = batch?;
            let n = batch.len();
            // A rank evaluates its shard; pieces are per rank (see
            // `train_step`), and a rank with no rows still agrees.
            let (rows, room) = match world {
                Some(w) => (
                    crate::dist::shard(n, w.rank(), w.size()),
                    n.div_ceil(w.size()),
                ),
                None => ((0, n), n),
            };
            let mine = match rows {
                (_, 0) => None,
                (0, len) if len == n => Some(batch),
                (start, len) => Some(batch.rows(start, len)?),
            };
            let mut attempt = 0;
            loop {
                attempt += 1;
                HostMemory::reset_peak();
                let piece = self.eval_cap.unwrap_or(room).clamp(1, room.max(1));
                let result = match &mine {
                    Some(b) => trainer.eval_batch(&*model, b, piece, objective, &mut |p| {
                        self.check(step, attempt, p)
                    }),
                    None => Ok(EvalSums::default()),
                };
                let attempted = match world {
                    Some(w) => {
                        ranks::eval_attempt(w, result, trainer.device(), self.budget, piece)?
                    }
                    None => match result {
                        Ok(sums) => Ok(sums),
                        Err(Error::Oom(error)) => Err(Failure {
                            memory: memory_figures(trainer.device(), self.budget),
                            error,
                            ranks: Vec::new(),
                        }),
                        Err(other) => return Err(other),
                    },
                };
                let failure = match attempted {
                    Ok(sums) => {
                        total.add(&sums);
                        break;
                    }
                    Err(f) => f,
                };
                let e = &failure.error;
                let ev = self.event(trainer, &failure, (step, epoch, attempt), n, piece)?;
                // Evaluation has nothing to skip or to lower: anything but
                // retry and stop splits the evaluation batch.
                let action = match self.decide_everywhere(&ev, attempt)? {
                    stop @ Action::Stop(_) => stop,
                    Action::Retry => Action::Retry,
                    asked => {
                        let m = if let Action::Split(m) = asked {
                            m
                        } else {
                            None
                        };
                        match split(m, piece, room) {
                            Some(m) if m == piece => Action::Retry,
                            Some(m) => Action::Split(Some(m)),
                            None => nothing_to_split(step),
                        }
                    }
                };
                if let Action::Split(Some(m)) = action {
                    self.eval_cap = Some(m);
                }
                observe(&Recovered {
                    event: &ev,
                    action: &action,
                    new_micro_batch: self.eval_cap.unwrap_or(room),
                })?;
                if let Action::Stop(why) = action {
                    return Err(Error::Stopped(format!("{why} (in evaluation: {e})")));
                }
            }
        }
        Ok(total)
    }

    /// The action every rank takes: rank 0's policy decides and tells the
    /// others (a policy that fails stops them all); in a single process,
    /// [`Recovery::decide`].
    fn decide_everywhere(&mut self, ev: &OomEvent, attempt: u32) -> Result<Action> {
        let Some(w) = crate::dist::world() else {
            return self.decide(ev, attempt);
        };
        if w.rank() != 0 {
            self.events += 1;
            let mut bytes = Vec::new();
            w.broadcast_bytes(0, &mut bytes)?;
            return decode_action(&bytes);
        }
        let decided = self.decide(ev, attempt);
        let told = match &decided {
            Ok(a) => a.clone(),
            Err(e) => Action::Stop(format!("rank 0's OOM policy failed: {e}")),
        };
        w.broadcast_bytes(0, &mut encode_action(&told))?;
        decided
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
        let decided = match crate::dist::world() {
            None => decided?,
            Some(w) => {
                let mut bytes = match (w.rank(), &decided) {
                    (0, Ok(Some(m))) => m.to_string().into_bytes(),
                    (0, Ok(None)) => b"-".to_vec(),
                    (0, Err(_)) => b"error".to_vec(),
                    _ => Vec::new(),
                };
                w.broadcast_bytes(0, &mut bytes)?;
                decided?;
                match bytes.as_slice() {
                    b"-" => None,
                    b"error" => {
                        return Err(Error::Peer("rank 0's OOM policy failed in on_step".into()))
                    }
                    m => Some(String::from_utf8_lossy(m).parse().map_err(|_| {
                        Error::Peer("rank 0 sent a micro-batch that is not a number".into())
                    })?),
                }
            }
        };
        if let Some(m) = decided {
            self.cap = Some(m.max(1));
        }
        Ok(())
    }
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

/// An action as rank 0 sends it to the others.
fn encode_action(a: &Action) -> Vec<u8> {
    match a {
        Action::Split(Some(m)) => format!("split {m}"),
        Action::Split(None) => "split".into(),
        Action::Retry => "retry".into(),
        Action::Precision(p) => format!("precision {}", p.name()),
        Action::Recompute(n) => format!("recompute {n}"),
        Action::Offload => "offload".into(),
        Action::Skip => "skip".into(),
        Action::Stop(why) => format!("stop {why}"),
    }
    .into_bytes()
}

fn decode_action(bytes: &[u8]) -> Result<Action> {
    let s = String::from_utf8_lossy(bytes);
    let (name, arg) = s.split_once(' ').unwrap_or((&s, ""));
    let bad = || {
        Error::Peer(format!(
            "rank 0 sent an action this rank cannot read: `{s}`"
        ))
    };
    Ok(match name {
        "split" if arg.is_empty() => Action::Split(None),
        "split" => Action::Split(Some(arg.parse().map_err(|_| bad())?)),
        "retry" => Action::Retry,
        "precision" => {
            Action::Precision(crate::engine::precision::Precision::parse(arg).ok_or_else(bad)?)
        }
        "recompute" => Action::Recompute(arg.parse().map_err(|_| bad())?),
        "offload" => Action::Offload,
        "skip" => Action::Skip,
        "stop" => Action::Stop(arg.to_string()),
        _ => return Err(bad()),
    })
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

/// The recovery loop driven by injected faults and Rust policies: no Lua.
#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::data::{digits, Pipeline};
    use crate::engine::optim::OptimSpec;
    use crate::engine::{Activation, Mlp, TrainerOptions};
    use crate::run::Halve;

    const BATCH: usize = 64;

    fn trainer() -> Trainer {
        let spec = Mlp {
            inputs: 64,
            hidden: vec![32],
            outputs: 10,
            activation: Activation::Relu,
        };
        let optim = OptimSpec::AdamW(Default::default());
        Trainer::new(Arc::new(spec), &optim, TrainerOptions::default()).unwrap()
    }

    fn batches(split: &str, n: usize) -> Vec<Batch> {
        Pipeline::new(Arc::new(digits(split).unwrap()))
            .batch(BATCH, false)
            .epoch(1, BATCH, 0)
            .take(n)
            .collect::<Result<Vec<_>>>()
            .unwrap()
    }

    /// (phase, action, micro-batch after) of each OOM.
    type Log = Vec<(Phase, &'static str, usize)>;

    fn train(
        rec: &mut Recovery,
        t: &mut Trainer,
        data: &[Batch],
    ) -> Result<(Log, Vec<StepOutcome>)> {
        let mut log = Log::new();
        let mut outcomes = Vec::new();
        for b in data {
            outcomes.push(rec.train_step(t, b, BATCH, 1, &mut |r| {
                log.push((r.event.phase, r.action.name(), r.new_micro_batch));
                Ok(())
            })?);
        }
        Ok((log, outcomes))
    }

    fn weights(t: &Trainer) -> Vec<Vec<f64>> {
        t.params()
            .vars()
            .iter()
            .map(|(_, v)| {
                let f = v.as_tensor().flatten_all().unwrap();
                f.to_dtype(candle_core::DType::F64)
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            })
            .collect()
    }

    /// The largest difference in any tensor, relative to its largest value.
    fn rel_diff(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(a, b)| {
                let scale = b.iter().fold(0f64, |m, x| m.max(x.abs()));
                let d = a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
                d / scale.max(f64::MIN_POSITIVE)
            })
            .fold(0.0, f64::max)
    }

    fn inject(step: u64, phase: Phase, times: u32) -> Recovery {
        Recovery {
            injections: vec![Injection {
                step,
                phase,
                times,
                rank: None,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn an_oom_in_any_training_phase_is_recovered_to_the_same_weights() -> Result<()> {
        let data = batches("train", 6);
        let mut plain = trainer();
        train(&mut Recovery::default(), &mut plain, &data)?;
        let reference = weights(&plain);
        for phase in [
            Phase::Upload,
            Phase::Forward,
            Phase::Backward,
            Phase::Accumulate,
            Phase::Optimizer,
        ] {
            let mut t = trainer();
            let mut rec = inject(3, phase, 2);
            let (log, outcomes) = train(&mut rec, &mut t, &data)?;
            // The default: halve, twice, on the same batch; the cap stays.
            assert_eq!(
                log,
                [(phase, "split", 32), (phase, "split", 16)],
                "{phase:?}"
            );
            assert_eq!(rec.cap, Some(16));
            assert_eq!(t.step, 6, "{phase:?}");
            assert!(outcomes
                .iter()
                .all(|o| matches!(o, StepOutcome::Trained { .. })));
            let d = rel_diff(&weights(&t), &reference);
            assert!(d < 1e-6, "{phase:?}: weights differ by {d}");
        }
        Ok(())
    }

    #[test]
    fn a_retry_after_an_optimizer_oom_is_bitwise_the_same() -> Result<()> {
        // The optimizer phase fails after the first step allocated its
        // moments and before any parameter changed.
        let data = batches("train", 3);
        let mut plain = trainer();
        train(&mut Recovery::default(), &mut plain, &data)?;
        let mut t = trainer();
        let mut rec = inject(1, Phase::Optimizer, 1);
        rec.policy = Some(Box::new(Always(Action::Retry)));
        let (log, _) = train(&mut rec, &mut t, &data)?;
        assert_eq!(log, [(Phase::Optimizer, "retry", BATCH)]);
        assert_eq!(weights(&t), weights(&plain), "a retry is bitwise the same");
        Ok(())
    }

    #[test]
    fn an_oom_in_evaluation_splits_the_evaluation_batch_and_touches_no_training_state() -> Result<()>
    {
        let mut t = trainer();
        train(&mut Recovery::default(), &mut t, &batches("train", 3))?;
        let test = batches("test", 3);
        let plain = Recovery::default().evaluate(
            &t,
            test.clone().into_iter().map(Ok),
            None,
            1,
            &mut |_| Ok(()),
        )?;
        let before = (weights(&t), t.step);

        let mut rec = inject(4, Phase::Eval, 2);
        let mut log = Log::new();
        let ev = rec.evaluate(&t, test.into_iter().map(Ok), None, 1, &mut |r| {
            log.push((r.event.phase, r.action.name(), r.new_micro_batch));
            Ok(())
        })?;
        assert_eq!(
            log,
            [(Phase::Eval, "split", 32), (Phase::Eval, "split", 16)]
        );
        assert_eq!(rec.eval_cap, Some(16), "later evaluations start small");
        assert_eq!(
            rec.cap, None,
            "the training micro-batch is not the evaluation's"
        );
        assert_eq!(ev.samples, plain.samples);
        assert_eq!(ev.accuracy, plain.accuracy);
        assert!(
            (ev.loss - plain.loss).abs() <= 1e-6 * plain.loss,
            "{ev:?} {plain:?}"
        );
        assert_eq!((weights(&t), t.step), before);
        Ok(())
    }

    /// Answers every OOM the same way, and remembers the events.
    struct Always(Action);
    impl OomPolicy for Always {
        fn on_oom(&mut self, _: &OomEvent) -> Result<Option<Action>> {
            Ok(Some(self.0.clone()))
        }
        fn describe(&self) -> String {
            format!("always {}", self.0.name())
        }
    }

    #[test]
    fn policies_skip_stop_and_are_bounded() -> Result<()> {
        let data = batches("train", 3);
        // Skip: the batch is dropped, no update, and the step is not taken.
        let mut t = trainer();
        let mut rec = inject(2, Phase::Backward, 1);
        rec.policy = Some(Box::new(Always(Action::Skip)));
        let (log, outcomes) = train(&mut rec, &mut t, &data)?;
        assert_eq!(log, [(Phase::Backward, "skip", BATCH)]);
        assert_eq!(outcomes[1], StepOutcome::Skipped);
        assert_eq!(t.step, 2);

        // Stop: an error that says why.
        let mut t = trainer();
        let mut rec = inject(1, Phase::Forward, 1);
        rec.policy = Some(Box::new(Always(Action::Stop("enough".into()))));
        let err = train(&mut rec, &mut t, &data).unwrap_err();
        assert!(
            matches!(err, Error::Stopped(ref m) if m.starts_with("enough")),
            "{err}"
        );
        assert_eq!(t.step, 0);

        // A policy that retries forever meets the bound.
        let mut t = trainer();
        let mut rec = inject(1, Phase::Forward, 100);
        rec.policy = Some(Box::new(Always(Action::Retry)));
        let err = train(&mut rec, &mut t, &data).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{MAX_ATTEMPTS} attempts at step 1")),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn the_built_in_policy_halves_to_its_floor_and_grows_back() -> Result<()> {
        let data = batches("train", 8);
        let mut t = trainer();
        let mut rec = inject(1, Phase::Forward, 2);
        rec.policy = Some(Box::new(Halve {
            floor: 16,
            grow_after: 3,
        }));
        let (log, outcomes) = train(&mut rec, &mut t, &data)?;
        assert_eq!(
            log,
            [(Phase::Forward, "split", 32), (Phase::Forward, "split", 16)]
        );
        let micro: Vec<usize> = outcomes
            .iter()
            .map(|o| match o {
                StepOutcome::Trained { micro_batch, .. } => *micro_batch,
                StepOutcome::Skipped => 0,
            })
            .collect();
        // 3 clean steps at 16, then 32 for 3, then the whole batch.
        assert_eq!(micro, [16, 16, 16, 32, 32, 32, 64, 64]);

        let mut t = trainer();
        let mut rec = inject(1, Phase::Forward, 3);
        rec.policy = Some(Box::new(Halve {
            floor: 16,
            grow_after: 0,
        }));
        let err = train(&mut rec, &mut t, &data).unwrap_err().to_string();
        assert!(
            err.contains("cannot be halved above the floor of 16"),
            "{err}"
        );
        Ok(())
    }
}
