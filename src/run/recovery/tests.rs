//! The recovery loop driven by injected faults and Rust policies: no Lua.

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
        dropout: 0.0,
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

fn train(rec: &mut Recovery, t: &mut Trainer, data: &[Batch]) -> Result<(Log, Vec<StepOutcome>)> {
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
fn an_oom_in_evaluation_splits_the_evaluation_batch_and_touches_no_training_state() -> Result<()> {
    let mut t = trainer();
    train(&mut Recovery::default(), &mut t, &batches("train", 3))?;
    let test = batches("test", 3);
    let plain =
        Recovery::default().evaluate(&t, test.clone().into_iter().map(Ok), None, 1, &mut |_| {
            Ok(())
        })?;
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

/// Asks for the whole batch after every clean step.
struct Greedy;
impl OomPolicy for Greedy {
    fn on_oom(&mut self, _: &OomEvent) -> Result<Option<Action>> {
        Ok(None)
    }
    fn on_step(&mut self, info: &StepInfo) -> Result<Option<usize>> {
        Ok(Some(info.batch_size))
    }
    fn describe(&self) -> String {
        "greedy".into()
    }
}

#[test]
fn a_ceiling_holds_against_a_policy_that_grows_and_after_an_oom() -> Result<()> {
    let data = batches("train", 4);
    let mut plain = trainer();
    train(&mut Recovery::default(), &mut plain, &data)?;
    let mut t = trainer();
    let mut rec = inject(3, Phase::Backward, 1);
    rec.policy = Some(Box::new(Greedy));
    rec.ceiling = Some(16);
    let (log, outcomes) = train(&mut rec, &mut t, &data)?;
    let micro: Vec<_> = outcomes
        .iter()
        .map(|o| match o {
            StepOutcome::Trained { micro_batch, .. } => *micro_batch,
            StepOutcome::Skipped => 0,
        })
        .collect();
    // The OOM at step 3 halves what ran (16), and the policy's growth
    // never passes the ceiling.
    assert_eq!(micro, [16, 16, 8, 16]);
    assert_eq!(log, [(Phase::Backward, "split", 8)]);
    let d = rel_diff(&weights(&t), &weights(&plain));
    assert!(d < 1e-6, "weights differ by {d}");

    // An evaluation batch of 64 goes in pieces of the ceiling: an OOM in
    // one halves 16, not 64.
    let test = batches("test", 1);
    assert_eq!(test[0].len(), 64);
    let plain_eval =
        Recovery::default().evaluate(&t, test.clone().into_iter().map(Ok), None, 1, &mut |_| {
            Ok(())
        })?;
    let mut rec = inject(t.step + 1, Phase::Eval, 1);
    rec.ceiling = Some(16);
    let mut log = Log::new();
    let ev = rec.evaluate(&t, test.into_iter().map(Ok), None, 1, &mut |r| {
        log.push((r.event.phase, r.action.name(), r.new_micro_batch));
        Ok(())
    })?;
    assert_eq!(log, [(Phase::Eval, "split", 8)]);
    assert!(
        (ev.loss - plain_eval.loss).abs() <= 1e-6 * plain_eval.loss,
        "{ev:?} {plain_eval:?}"
    );
    Ok(())
}
