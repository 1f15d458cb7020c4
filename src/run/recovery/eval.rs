//! Evaluation under the recovery site: an evaluation batch that runs out
//! of memory is evaluated again in smaller pieces, and no training state
//! is touched.

use super::{memory_figures, nothing_to_split, split, Observer, Recovered, Recovery};
use crate::data::Batch;
use crate::engine::{loss::Loss, Eval, EvalSums, Trainer};
use crate::memory::HostMemory;
use crate::run::policy::Action;
use crate::run::ranks::{self, Failure};
use crate::{Error, Result};

impl Recovery {
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
        let local = trainer.frozen().and_then(|model| {
            let job = Job {
                trainer,
                model: &*model,
                objective,
                epoch,
            };
            self.evaluate_local(&job, batches, observe)
        });
        let total = match crate::dist::world() {
            // Every rank evaluated its shard of each batch: the sums add up.
            Some(w) => ranks::eval_total(w, local, trainer.eval_sums(), trainer.device())?,
            None => local?,
        };
        total.eval(objective.is_some())
    }

    /// This process's part of [`Recovery::evaluate`]: every batch, or this
    /// rank's shard of each.
    fn evaluate_local(
        &mut self,
        job: &Job<'_>,
        batches: impl Iterator<Item = Result<Batch>>,
        observe: &mut Observer<'_>,
    ) -> Result<EvalSums> {
        let mut total = job.trainer.eval_sums();
        HostMemory::set_limit(self.budget);
        for batch in batches {
            total.add(&self.evaluate_batch(job, batch?, observe)?);
        }
        Ok(total)
    }

    /// One evaluation batch (this rank's shard of it), in pieces of at most
    /// the evaluation cap and the ceiling, retried after each OOM as the
    /// policy says.
    fn evaluate_batch(
        &mut self,
        job: &Job<'_>,
        batch: Batch,
        observe: &mut Observer<'_>,
    ) -> Result<EvalSums> {
        let (trainer, step) = (job.trainer, job.trainer.step + 1);
        let world = crate::dist::world();
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
            // Under a container's limit an evaluation batch goes in pieces
            // no larger than a training micro-batch may be: forward alone
            // needs less, and past the limit the kernel kills the run
            // before an OOM could be seen.
            let piece = self
                .eval_cap
                .unwrap_or(room)
                .min(self.ceiling.unwrap_or(usize::MAX))
                .clamp(1, room.max(1));
            let result = match &mine {
                Some(b) => trainer.eval_batch(job.model, b, piece, job.objective, &mut |p| {
                    self.check(step, attempt, p)
                }),
                None => Ok(trainer.eval_sums()),
            };
            let attempted = match world {
                Some(w) => ranks::eval_attempt(w, result, trainer.device(), self.budget, piece)?,
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
                Ok(sums) => return Ok(sums),
                Err(f) => f,
            };
            let ev = self.event(trainer, &failure, (step, job.epoch, attempt), n, piece)?;
            let action = eval_action(self.decide_everywhere(&ev, attempt)?, piece, room, step);
            if let Action::Split(Some(m)) = action {
                self.eval_cap = Some(m);
            }
            observe(&Recovered {
                event: &ev,
                action: &action,
                new_micro_batch: self.eval_cap.unwrap_or(room),
            })?;
            if let Action::Stop(why) = action {
                let e = &failure.error;
                return Err(Error::Stopped(format!("{why} (in evaluation: {e})")));
            }
        }
    }
}

/// What an evaluation's batches share.
struct Job<'a> {
    trainer: &'a Trainer,
    model: &'a dyn candle_core::Module,
    objective: Option<&'a Loss>,
    epoch: u64,
}

/// The policy's action as an evaluation takes it. Evaluation has nothing to
/// skip or to lower: anything but retry and stop splits the evaluation
/// batch, and a split to the same size is a retry.
fn eval_action(asked: Action, piece: usize, room: usize, step: u64) -> Action {
    match asked {
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
    }
}
