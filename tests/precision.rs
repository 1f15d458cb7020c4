//! Mixed precision: the loss scaler skips exactly the updates whose
//! gradients are not finite, the masters stay f32, and a low-precision step
//! follows the f32 step within the low type's rounding.

use std::sync::Arc;

use anyhow::Result;
use candle_core::{DType, Tensor};
use taper::data::{digits, Batch, Pipeline};
use taper::engine::optim::{AdamWConfig, OptimSpec, SgdConfig};
use taper::engine::precision::Precision;
use taper::engine::{Activation, Mlp, ModelSpec, Trainer, TrainerOptions};
use taper::run::Run;

fn mlp() -> Arc<dyn ModelSpec> {
    Arc::new(Mlp {
        inputs: 64,
        hidden: vec![64],
        outputs: 10,
        activation: Activation::Relu,
        dropout: 0.0,
    })
}

fn trainer(p: Precision) -> Result<Trainer> {
    let optim = OptimSpec::AdamW(AdamWConfig {
        lr: 3e-3,
        ..Default::default()
    });
    trainer_with(p, &optim)
}

fn trainer_with(p: Precision, optim: &OptimSpec) -> Result<Trainer> {
    let mut t = Trainer::new(
        mlp(),
        optim,
        TrainerOptions {
            seed: 3,
            ..Default::default()
        },
    )?;
    t.set_precision(p)?;
    Ok(t)
}

fn weights(t: &Trainer) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    for (_, v) in t.params().vars() {
        assert_eq!(v.dtype(), DType::F32, "masters are f32");
        out.extend(v.as_tensor().flatten_all()?.to_vec1::<f32>()?);
    }
    Ok(out)
}

/// The batch with one input set to 1e6, which is inf in f16: every gradient
/// downstream of it is inf or NaN.
fn poisoned(b: &Batch) -> Result<Batch> {
    let mut x: Vec<f32> = b.x.flatten_all()?.to_vec1()?;
    x[3] = 1e6;
    Ok(Batch {
        x: Tensor::from_vec(x, b.x.shape(), b.x.device())?,
        y: b.y.clone(),
        indices: b.indices.clone(),
    })
}

#[test]
fn f16_loss_scaling_skips_exactly_the_poisoned_step() -> Result<()> {
    let data = Pipeline::new(Arc::new(digits("train")?))
        .shuffle(1)
        .batch(32, false);
    let mut t = trainer(Precision::F16)?;
    assert_eq!(t.loss_scale(), Some(65536.0));
    let mut skipped = Vec::new();
    for (i, batch) in data.epoch(1, 32, 0).take(30).enumerate() {
        let batch = if i == 12 { poisoned(&batch?)? } else { batch? };
        let (before, scale) = (weights(&t)?, t.loss_scale().unwrap());
        t.train_step(&batch)?;
        let after = weights(&t)?;
        match t.take_overflow() {
            Some(new_scale) => {
                skipped.push(i);
                assert_eq!(new_scale, scale / 2.0);
                assert_eq!(before, after, "a skipped step changed the weights");
            }
            None => assert_ne!(before, after, "step {i} did not update"),
        }
    }
    assert_eq!(skipped, [12]);
    assert_eq!(t.loss_scale(), Some(32768.0));
    assert_eq!(t.step, 30);
    Ok(())
}

/// In a run, a step whose loss is NaN stops the run there, and a NaN that
/// spoiled the weights without showing in the loss (the ReLU maps NaN to
/// 0, as candle's does) stops it at the next weights check; an f16 step
/// that the loss scaler skipped changed nothing, and the run goes on. A NaN
/// input never gets that far: the step refuses its batch.
#[test]
fn a_run_stops_where_it_diverges_unless_the_loss_scaler_skipped_the_step() -> Result<()> {
    let data = Pipeline::new(Arc::new(digits("train")?)).batch(32, false);
    let nan_input = |_: &mut Run, b: Batch| -> Result<Batch> {
        let mut x: Vec<f32> = b.x.flatten_all()?.to_vec1()?;
        x[3] = f32::NAN;
        Ok(Batch {
            x: Tensor::from_vec(x, b.x.shape(), b.x.device())?,
            ..b
        })
    };
    // One weight of the first layer made NaN (as a bad gradient would): its
    // unit's output is NaN for every sample, and the ReLU hides it.
    let nan_weight = |run: &mut Run, b: Batch| -> Result<Batch> {
        let vars = run.trainer.params().vars();
        let (_, v) = vars
            .iter()
            .find(|(n, _)| n.ends_with("fc0.weight"))
            .unwrap();
        let mut w: Vec<f32> = v.as_tensor().flatten_all()?.to_vec1()?;
        w[3] = f32::NAN;
        v.set(&Tensor::from_vec(w, v.shape(), v.device())?)?;
        Ok(b)
    };
    // Trains 25 steps; at the 13th, `poison` changes the batch or the run.
    // Returns where the run stopped and why.
    type Poison<'a> = &'a dyn Fn(&mut Run, Batch) -> Result<Batch>;
    // Returns where the run stopped and why, or the 13th step's loss.
    let ends =
        |p: Precision, poison: Poison| -> Result<std::result::Result<f64, (usize, String)>> {
            let mut run = Run::new(trainer(p)?, 3);
            let mut poisoned_loss = None;
            for (i, batch) in data.epoch(1, 32, 0).take(25).enumerate() {
                let batch = if i == 12 {
                    poison(&mut run, batch?)?
                } else {
                    batch?
                };
                match run.step(&batch, &mut |_| Ok(())) {
                    Ok(loss) if i == 12 => poisoned_loss = loss,
                    Ok(_) => {}
                    Err(e) => return Ok(Err((i, e.to_string()))),
                }
            }
            assert_eq!(run.trainer.step, 25);
            assert!(weights(&run.trainer)?.iter().all(|w| w.is_finite()));
            Ok(Ok(poisoned_loss.unwrap()))
        };
    let high_lr = |run: &mut Run, b: Batch| -> Result<Batch> {
        run.trainer.set_learning_rate(1e30);
        Ok(b)
    };
    let why = ": the training diverged (lower the learning rate, now";
    // f16: the scaler skips the update of a loss that is not finite (1e6
    // is inf in f16), and the run goes on.
    let inf = &|_: &mut Run, b: Batch| poisoned(&b);
    assert!(!ends(Precision::F16, inf)?.unwrap().is_finite());
    for p in [Precision::F32, Precision::Bf16, Precision::F16] {
        let (i, e) = ends(p, &nan_input)?.expect_err("a NaN input was trained on");
        assert_eq!(i, 12);
        let says = "epoch 0, batch 13: sample 384 (row 0 of the batch): input value 3 of the sample is NaN";
        assert!(e.contains(says), "{p:?}: {e}");
    }
    for p in [Precision::F32, Precision::Bf16] {
        let (i, e) = ends(p, &nan_weight)?.expect_err("NaN weights went on");
        assert_eq!(i, 19, "{p:?}: {e}");
        let says = "the weights hold NaN or infinite values after step 20 (epoch 0, batch 20), whose loss was";
        assert!(e.starts_with(says) && e.contains(why), "{p:?}: {e}");
        let (i, e) = ends(p, &high_lr)?.expect_err("a NaN loss went on");
        assert!(e.starts_with(&format!(
            "the loss of step {} (epoch 0, batch {0}) is NaN",
            i + 1
        )));
        assert!(
            e.contains(": the training diverged (lower the learning rate, now 1e30,"),
            "{e}"
        );
        assert!((13..19).contains(&i), "{p:?}: {e}");
    }
    Ok(())
}

#[test]
fn a_low_precision_step_follows_the_f32_step() -> Result<()> {
    // One identical SGD step from identical weights (SGD: the update is the
    // gradient, so this compares gradients): it differs only by the low
    // type's rounding of weights, activations and gradients (bf16 keeps 8
    // bits of mantissa, f16 11).
    let data = Pipeline::new(Arc::new(digits("train")?)).batch(64, false);
    let batch = data.epoch(1, 64, 0).next().unwrap()?;
    let sgd = OptimSpec::Sgd(SgdConfig {
        lr: 0.1,
        ..Default::default()
    });
    let mut reference = trainer_with(Precision::F32, &sgd)?;
    let w0 = weights(&reference)?;
    reference.train_step(&batch)?;
    let d32: Vec<f32> = weights(&reference)?
        .iter()
        .zip(&w0)
        .map(|(a, b)| a - b)
        .collect();
    for (p, tol) in [(Precision::Bf16, 0.05), (Precision::F16, 0.005)] {
        let mut t = trainer_with(p, &sgd)?;
        t.train_step(&batch)?;
        let d: Vec<f32> = weights(&t)?.iter().zip(&w0).map(|(a, b)| a - b).collect();
        let diff: f64 = d
            .iter()
            .zip(&d32)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let norm: f64 = d32.iter().map(|a| (*a as f64).powi(2)).sum();
        let rel = (diff / norm).sqrt();
        eprintln!("{}: the update differs from f32 by {rel:.2e}", p.name());
        assert!(rel < tol, "{}: update differs from f32 by {rel}", p.name());
        assert!(rel > 0.0, "{}: no rounding at all?", p.name());
    }
    Ok(())
}

#[test]
fn switching_precision_keeps_weights_and_optimizer_state() -> Result<()> {
    let data = Pipeline::new(Arc::new(digits("train")?)).batch(32, false);
    let mut t = trainer(Precision::F32)?;
    let mut batches = data.epoch(1, 32, 0);
    t.train_step(&batches.next().unwrap()?)?;
    let w = weights(&t)?;
    t.set_precision(Precision::Bf16)?;
    assert_eq!(weights(&t)?, w);
    t.train_step(&batches.next().unwrap()?)?;
    t.set_precision(Precision::F32)?;
    t.train_step(&batches.next().unwrap()?)?;
    assert_eq!(t.step, 3);
    assert_eq!(t.precision(), Precision::F32);
    Ok(())
}

/// A snapshot (a distillation teacher) keeps the weights it was taken with
/// while the trainer goes on updating its own in place.
#[test]
fn a_snapshot_does_not_follow_later_updates() -> Result<()> {
    let data = Pipeline::new(Arc::new(digits("train")?)).batch(32, false);
    let mut t = trainer(Precision::F32)?;
    let mut batches = data.epoch(1, 32, 0);
    let batch = batches.next().unwrap()?;
    let snap = t.snapshot()?;
    let before: Vec<f32> = snap.forward(&batch.x)?.flatten_all()?.to_vec1()?;
    t.train_step(&batch)?;
    let after: Vec<f32> = snap.forward(&batch.x)?.flatten_all()?.to_vec1()?;
    assert_eq!(before, after);
    let fresh: Vec<f32> = t.snapshot()?.forward(&batch.x)?.flatten_all()?.to_vec1()?;
    assert_ne!(before, fresh);
    Ok(())
}

/// bf16 with AdamW and clipping takes the one-pass update (bf16 gradient
/// in, working copy out): after every step each working weight is its
/// master rounded to bf16, bit for bit, though the trainer no longer
/// copies them; and the MLP still learns the digits.
#[test]
fn one_pass_bf16_updates_keep_the_working_copy_equal_to_the_rounded_masters() -> Result<()> {
    let optim = OptimSpec::AdamW(AdamWConfig {
        lr: 3e-3,
        clip_grad_norm: Some(0.5),
        ..Default::default()
    });
    let mut t = trainer_with(Precision::Bf16, &optim)?;
    let data = Pipeline::new(Arc::new(digits("train")?))
        .shuffle(1)
        .batch(32, false);
    let (mut first, mut last) = (None, 0.0);
    for (i, b) in data.epoch(1, 32, 0).take(40).enumerate() {
        last = t.train_step(&b?)?;
        first.get_or_insert(last);
        let masters: std::collections::HashMap<String, Tensor> = t
            .params()
            .vars()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect();
        for (name, w) in t.grad_vars() {
            assert_eq!(w.dtype(), DType::BF16);
            let want: Vec<u16> = masters[&name]
                .to_dtype(DType::BF16)?
                .flatten_all()?
                .to_vec1::<half::bf16>()?
                .iter()
                .map(|x| x.to_bits())
                .collect();
            let got: Vec<u16> = w
                .as_tensor()
                .flatten_all()?
                .to_vec1::<half::bf16>()?
                .iter()
                .map(|x| x.to_bits())
                .collect();
            assert_eq!(got, want, "{name} after step {i}");
        }
    }
    let first = first.expect("a step");
    assert!(last < 0.5 * first, "loss {first} -> {last}");
    Ok(())
}
