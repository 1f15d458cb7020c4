//! One training step or evaluation across the ranks of a data-parallel run
//! (see `crate::dist`): each rank computes its shard, the ranks agree on
//! what happened in one small all-reduce before any gradient is summed, and
//! again before any parameter changes. An OOM on any rank is then an OOM of
//! the step on every rank, which the recovery site answers with one action
//! for all (rank 0's policy decides; see `Recovery::train_step`).

use candle_core::{Device, Tensor};

use super::policy::MemoryFigures;
use super::recovery::memory_figures;
use crate::data::Batch;
use crate::dist::{shard, Collective};
use crate::engine::{EvalSums, Grads, Trainer};
use crate::memory::{OomCause, OomError, Phase};
use crate::{Error, Result};

/// An OOM of the step, agreed by every rank: the first failing rank's error
/// and memory, and every rank that failed.
#[derive(Debug, Clone)]
pub struct Failure {
    pub error: OomError,
    pub ranks: Vec<usize>,
    pub memory: MemoryFigures,
}

/// What one attempt at a step came to on every rank.
pub enum Attempt {
    Trained(f64),
    Oom(Failure),
}

/// f64 slots per rank in a status all-reduce.
const SLOTS: usize = 10;
const OK: f64 = 0.0;
const OOM: f64 = 1.0;
const FAILED: f64 = 2.0;

/// A rank's status at an agreement point.
struct Status {
    state: f64,
    error: Option<OomError>,
    memory: MemoryFigures,
    micro: usize,
    /// The rank's weighted share of the batch loss (or eval sums).
    value: f64,
}

impl Status {
    fn encode(&self, out: &mut [f64]) {
        out[0] = self.state;
        if let Some(e) = &self.error {
            out[1] = Phase::ALL.iter().position(|p| *p == e.phase).unwrap_or(0) as f64;
            out[2] = OomCause::ALL
                .iter()
                .position(|c| *c == e.cause)
                .unwrap_or(0) as f64;
            out[3] = e.requested.map_or(0.0, |r| r as f64 + 1.0);
        }
        out[4] = self.micro as f64;
        let (kind, a, b, c) = match self.memory {
            MemoryFigures::Host { used, peak, limit } => {
                (0.0, used, peak, limit.map_or(0, |l| l + 1))
            }
            MemoryFigures::Device { used, free, total } => (1.0, used, free, total),
        };
        out[5] = kind;
        out[6] = a as f64;
        out[7] = b as f64;
        out[8] = c as f64;
        out[9] = self.value;
    }

    /// The OOM a rank's slots tell of (its detail text comes separately).
    fn decode(slots: &[f64]) -> (OomError, MemoryFigures) {
        let error = OomError {
            phase: Phase::ALL[(slots[1] as usize).min(Phase::ALL.len() - 1)],
            cause: OomCause::ALL[(slots[2] as usize).min(OomCause::ALL.len() - 1)],
            detail: String::new(),
            requested: (slots[3] > 0.0).then(|| slots[3] as u64 - 1),
        };
        let (a, b, c) = (slots[6] as u64, slots[7] as u64, slots[8] as u64);
        let memory = if slots[5] == 0.0 {
            MemoryFigures::Host {
                used: a,
                peak: b,
                limit: (c > 0).then(|| c - 1),
            }
        } else {
            MemoryFigures::Device {
                used: a,
                free: b,
                total: c,
            }
        };
        (error, memory)
    }
}

/// What every rank learned at an agreement point.
struct Agreed {
    /// All ranks' slots, then the extra values summed over ranks.
    all: Vec<f64>,
    size: usize,
}

impl Agreed {
    fn slots(&self, rank: usize) -> &[f64] {
        &self.all[rank * SLOTS..(rank + 1) * SLOTS]
    }
    fn extra(&self) -> &[f64] {
        &self.all[self.size * SLOTS..]
    }
    fn sum_values(&self) -> f64 {
        (0..self.size).map(|r| self.slots(r)[9]).sum()
    }
    fn failing(&self, state: f64) -> Vec<usize> {
        (0..self.size)
            .filter(|&r| self.slots(r)[0] == state)
            .collect()
    }
}

/// Every rank's status (and `extra` values, summed) in one all-reduce.
fn agree(w: &dyn Collective, mine: &Status, extra: &[f64]) -> Result<Agreed> {
    let size = w.size();
    let mut all = vec![0.0; size * SLOTS + extra.len()];
    mine.encode(&mut all[w.rank() * SLOTS..(w.rank() + 1) * SLOTS]);
    all[size * SLOTS..].copy_from_slice(extra);
    w.all_reduce_sum_f64(&mut all)?;
    Ok(Agreed { all, size })
}

/// Turns an agreement into the step's failure, if any rank failed: the
/// error of a rank that failed otherwise than by OOM stops every rank; an
/// OOM is returned for the policy, with the first failing rank's detail
/// (sent to all).
fn outcome(
    w: &dyn Collective,
    agreed: &Agreed,
    mine: Result<()>,
    own: Option<&OomError>,
) -> Result<Option<Failure>> {
    let failed = agreed.failing(FAILED);
    if let Some(&r) = failed.first() {
        mine?;
        return Err(Error::Peer(format!(
            "rank {r} failed (its log says why); rank {} stops too",
            w.rank()
        )));
    }
    mine?;
    let ranks = agreed.failing(OOM);
    let Some(&first) = ranks.first() else {
        return Ok(None);
    };
    let (mut error, memory) = Status::decode(agreed.slots(first));
    let mut detail = match own {
        Some(e) if w.rank() == first => e.detail.clone().into_bytes(),
        _ => Vec::new(),
    };
    w.broadcast_bytes(first, &mut detail)?;
    error.detail = format!(
        "rank {first}: {}",
        String::from_utf8_lossy(&detail).into_owned()
    );
    Ok(Some(Failure {
        error,
        ranks,
        memory,
    }))
}

/// A rank's status from a local result: Ok, an OOM (kept for the policy)
/// or another error (returned once every rank knows).
fn status_of<T>(
    r: Result<T>,
    device: &Device,
    budget: Option<usize>,
    micro: usize,
) -> (Option<T>, Status, Result<()>) {
    let memory = memory_figures(device, budget);
    let mut st = Status {
        state: OK,
        error: None,
        memory,
        micro,
        value: 0.0,
    };
    match r {
        Ok(v) => (Some(v), st, Ok(())),
        Err(Error::Oom(e)) => {
            st.state = OOM;
            st.error = Some(e);
            (None, st, Ok(()))
        }
        Err(other) => {
            st.state = FAILED;
            (None, st, Err(other))
        }
    }
}

/// One attempt at a training step on every rank. `check` is the recovery
/// site's phase check (injected faults, the budget).
pub fn train_attempt(
    w: &dyn Collective,
    trainer: &mut Trainer,
    batch: &Batch,
    micro: usize,
    budget: Option<usize>,
    check: &mut dyn FnMut(Phase) -> Result<()>,
) -> Result<Attempt> {
    let n = batch.len();
    let rows = shard(n, w.rank(), w.size());
    let device = trainer.device().clone();
    let vars = trainer.grad_vars();
    // The local gradients, flattened into the bucket the all-reduce sums
    // (its bytes count against the budget, as the step's own).
    let local = trainer
        .local_grads(batch, rows, n, micro, check)
        .and_then(|mut g| {
            // The ranks agree on the loss below: read it here, where a
            // failure is this rank's reported error.
            g.loss_sum = g.loss_sum.value()?.into();
            let bucket = flatten(&vars, &g)?;
            crate::memory::oom::check(
                &mut [],
                budget,
                crate::memory::oom::At {
                    step: trainer.step + 1,
                    attempt: 0,
                    phase: Phase::Accumulate,
                },
            )?;
            Ok((g, bucket))
        });
    let (local, mut st, mine) = status_of(local, &device, budget, micro);
    let own = st.error.clone();
    let presence: Vec<f64> = match &local {
        Some((_, (_, present))) => present.iter().map(|&p| f64::from(u8::from(p))).collect(),
        None => vec![0.0; vars.len()],
    };
    st.value = match &local {
        Some((g, _)) => g.loss_sum.value()?,
        None => 0.0,
    };
    let agreed = agree(w, &st, &presence)?;
    if let Some(f) = outcome(w, &agreed, mine, own.as_ref())? {
        return Ok(Attempt::Oom(f));
    }
    let Some((mut grads, (bucket, _))) = local else {
        unreachable!("every rank reported its gradients");
    };
    // The local sums go first: the bucket holds them.
    grads.acc = Default::default();
    let summed = w.all_reduce_sum_tensor(&bucket)?;
    drop(bucket);
    grads.acc = unflatten(&vars, &summed, agreed.extra())?;
    grads.loss_sum = agreed.sum_values().into();
    drop(summed);

    let ready = trainer
        .prepare_update(grads)
        .and_then(|r| check(Phase::Optimizer).map(|()| r));
    let (ready, st, mine) = status_of(ready, &device, budget, micro);
    let own = st.error.clone();
    let agreed = agree(w, &st, &[])?;
    if let Some(f) = outcome(w, &agreed, mine, own.as_ref())? {
        return Ok(Attempt::Oom(f));
    }
    let ready = ready.expect("every rank prepared its update");
    Ok(Attempt::Trained(trainer.commit_update(ready)?))
}

/// The variables' gradients as one f32 tensor on their device, the bucket
/// the all-reduce sums (zeros where this rank has none), and which it has.
fn flatten(vars: &[(String, candle_core::Var)], g: &Grads) -> Result<(Tensor, Vec<bool>)> {
    let mut parts = Vec::with_capacity(vars.len());
    let mut present = Vec::with_capacity(vars.len());
    for (_, v) in vars {
        match g.acc.get(v) {
            Some(t) => {
                parts.push(t.flatten_all()?.to_dtype(candle_core::DType::F32)?);
                present.push(true);
            }
            None => {
                parts.push(Tensor::zeros(
                    v.elem_count(),
                    candle_core::DType::F32,
                    v.device(),
                )?);
                present.push(false);
            }
        }
    }
    Ok((Tensor::cat(&parts, 0)?, present))
}

/// The summed gradients back as tensors, for the variables some rank had a
/// gradient for (`presence`: how many ranks did).
fn unflatten(
    vars: &[(String, candle_core::Var)],
    bucket: &Tensor,
    presence: &[f64],
) -> Result<candle_core::backprop::GradStore> {
    let mut acc = candle_core::backprop::GradStore::default();
    let mut at = 0;
    for ((_, v), &p) in vars.iter().zip(presence) {
        let k = v.elem_count();
        if p > 0.0 {
            let t = bucket
                .narrow(0, at, k)?
                .reshape(v.shape())?
                .to_dtype(v.dtype())?;
            acc.insert(v, t);
        }
        at += k;
    }
    Ok(acc)
}

/// One attempt at an evaluation batch, agreed by every rank (each evaluated
/// its shard): this rank's sums, or the OOM of the batch.
pub fn eval_attempt(
    w: &dyn Collective,
    mine: Result<EvalSums>,
    device: &Device,
    budget: Option<usize>,
    piece: usize,
) -> Result<std::result::Result<EvalSums, Failure>> {
    let (sums, st, result) = status_of(mine, device, budget, piece);
    let own = st.error.clone();
    let agreed = agree(w, &st, &[])?;
    match outcome(w, &agreed, result, own.as_ref())? {
        Some(f) => Ok(Err(f)),
        None => Ok(Ok(sums.expect("every rank evaluated its shard"))),
    }
}

/// Sums a rank's evaluation over every rank, once each has evaluated its
/// shards (`mine`: its sums, or how it failed; `empty`: sums of nothing, of
/// the same shape, which a failed rank sends so that every rank sends as
/// many numbers).
pub fn eval_total(
    w: &dyn Collective,
    mine: Result<EvalSums>,
    empty: EvalSums,
    device: &Device,
) -> Result<EvalSums> {
    // Evaluation recovers its OOMs on each rank; one that reached here
    // stopped that rank.
    let mine = mine.map_err(|e| match e {
        Error::Oom(o) => Error::Stopped(o.to_string()),
        other => other,
    });
    let (sums, st, result) = status_of(mine, device, None, 0);
    let (targets, labels) = (empty.targets.len(), empty.labels.labels.len());
    let s = sums.unwrap_or(empty);
    let agreed = agree(w, &st, &s.to_values())?;
    outcome(w, &agreed, result, None)?;
    Ok(EvalSums::from_values(agreed.extra(), targets, labels))
}
