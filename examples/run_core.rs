//! Training without Lua: the run core (`taper::run`) driven from Rust, with
//! OOM recovery by the built-in policy. Faults are injected in a training
//! phase and in evaluation; the run recovers from both and reaches the same
//! accuracy as without them.
//!
//!     cargo run --release --example run_core

use std::sync::Arc;

use taper::data::{digits, Pipeline};
use taper::engine::optim::{AdamWConfig, OptimSpec};
use taper::engine::{Activation, Mlp, Trainer, TrainerOptions};
use taper::memory::inject::Injection;
use taper::memory::Phase;
use taper::run::{Halve, Recovered, Run};

/// Trains the digits MLP for `epochs` epochs; returns (test accuracy, OOMs
/// recovered, steps taken).
pub fn train(epochs: u64, faults: Vec<Injection>, quiet: bool) -> taper::Result<(f64, u64, u64)> {
    let spec = Mlp {
        inputs: 64,
        hidden: vec![128, 64],
        outputs: 10,
        activation: Activation::Relu,
        dropout: 0.0,
    };
    let optim = OptimSpec::AdamW(AdamWConfig {
        lr: 3e-3,
        ..Default::default()
    });
    let trainer = Trainer::new(Arc::new(spec), &optim, TrainerOptions::default())?;
    let mut run = Run::new(trainer, 1);
    run.oom.policy = Some(Box::new(Halve {
        floor: 4,
        grow_after: 20,
    }));
    run.oom.injections = faults;
    let train = Pipeline::new(Arc::new(digits("train")?))
        .shuffle(1)
        .batch(32, false);
    let test = Pipeline::new(Arc::new(digits("test")?)).batch(256, false);
    let mut report = |r: &Recovered<'_>| -> taper::Result<()> {
        if !quiet {
            let e = r.event;
            println!(
                "OOM at step {} ({}, {}): {} -> micro-batch {}",
                e.step,
                e.phase.name(),
                e.cause.name(),
                r.action.name(),
                r.new_micro_batch
            );
        }
        Ok(())
    };
    for _ in 0..epochs {
        let epoch = run.begin_epoch();
        for batch in train.epoch(epoch, 32, 0) {
            run.step(&batch?, &mut report)?;
        }
        if let Some(s) = run.end_epoch() {
            if !quiet {
                println!("epoch {epoch}: loss {:.4}", s.loss.unwrap_or(f64::NAN));
            }
        }
    }
    let ev = run.evaluate(test.epoch(1, 256, 0), None, &mut report)?;
    if !quiet {
        println!("test accuracy {:.2}%", ev.accuracy * 100.0);
    }
    Ok((ev.accuracy, run.oom.events, run.trainer.step))
}

/// Faults in the backward pass of step 10 (twice) and in the evaluation.
pub fn faults(epochs: u64) -> Vec<Injection> {
    vec![
        Injection {
            step: 10,
            phase: Phase::Backward,
            times: 2,
            rank: None,
        },
        Injection {
            step: epochs * 45 + 1,
            phase: Phase::Eval,
            times: 1,
            rank: None,
        },
    ]
}

#[allow(dead_code)] // the test harness includes this file without calling main
fn main() -> taper::Result<()> {
    taper::memory::tune_malloc();
    train(10, faults(10), false)?;
    Ok(())
}
