//! Micro-batch accumulation is exact: one optimizer step on a batch of 64
//! equals the same step computed as 8 micro-batches of 8, or as uneven
//! 24 + 24 + 16, within float32 rounding.

mod common;

use std::sync::{Arc, Mutex};

use anyhow::Result;
use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::VarBuilder;
use taper::data::{digits, shakespeare, Batch, Pipeline};
use taper::engine::loss::{CrossEntropy, Loss, IGNORE};
use taper::engine::model::TrainModule;
use taper::engine::optim::{AdamWConfig, OptimSpec, SgdConfig};
use taper::engine::{Activation, Bert, Draw, Gpt, Mlp, ModelSpec, Trainer, TrainerOptions};

/// Parameters after `steps` steps with micro-batches of `micro`.
fn train(
    spec: Arc<dyn ModelSpec>,
    optim: &OptimSpec,
    data: &Pipeline,
    micro: usize,
    steps: usize,
) -> Result<Vec<Vec<f32>>> {
    train_with(spec, optim, data, micro, steps, CrossEntropy::default())
}

fn train_with(
    spec: Arc<dyn ModelSpec>,
    optim: &OptimSpec,
    data: &Pipeline,
    micro: usize,
    steps: usize,
    loss: CrossEntropy,
) -> Result<Vec<Vec<f32>>> {
    let mut t = trainer(spec, optim, loss)?;
    for batch in data.epoch(1, 64, 0).take(steps) {
        t.train_step_micro(&batch?, micro)?;
    }
    params(&t)
}

fn trainer(spec: Arc<dyn ModelSpec>, optim: &OptimSpec, loss: CrossEntropy) -> Result<Trainer> {
    Ok(Trainer::new(
        spec,
        optim,
        TrainerOptions {
            seed: 4,
            loss: Loss::CrossEntropy(loss),
            ..Default::default()
        },
    )?)
}

/// Every parameter's values, in f32.
fn params(t: &Trainer) -> Result<Vec<Vec<f32>>> {
    t.params()
        .vars()
        .iter()
        .map(|(_, v)| {
            Ok(v.as_tensor()
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1()?)
        })
        .collect()
}

/// The largest per-tensor relative difference, ||a - b|| / ||a||.
fn max_rel_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    let mut worst = 0f64;
    for (x, y) in a.iter().zip(b) {
        let diff: f64 = x
            .iter()
            .zip(y)
            .map(|(p, q)| (*p as f64 - *q as f64).powi(2))
            .sum();
        let norm: f64 = x.iter().map(|p| (*p as f64).powi(2)).sum();
        worst = worst.max((diff / norm.max(1e-30)).sqrt());
    }
    worst
}

/// An MLP on the digits (with `dropout` after its hidden layer), and their
/// batches of 64.
fn digits_mlp(dropout: f64) -> Result<(Arc<dyn ModelSpec>, Pipeline)> {
    let spec: Arc<dyn ModelSpec> = Arc::new(Mlp {
        inputs: 64,
        hidden: vec![32],
        outputs: 10,
        activation: Activation::Relu,
        dropout,
    });
    let data = Pipeline::new(Arc::new(digits("train")?))
        .shuffle(2)
        .batch(64, false);
    Ok((spec, data))
}

/// Without dropout and with it: each sample's mask is drawn for its place
/// in the batch, whatever micro-batch computes it.
#[test]
fn mlp_accumulation_equals_full_batch() -> Result<()> {
    let plain = mlp_accumulation(0.0)?;
    let dropped = mlp_accumulation(0.5)?;
    let moved = max_rel_diff(&plain, &dropped);
    assert!(moved > 1e-3, "dropout changed the weights by {moved} only");
    Ok(())
}

/// The weights AdamW trains the whole batches to.
fn mlp_accumulation(dropout: f64) -> Result<Vec<Vec<f32>>> {
    let mut ends = Vec::new();
    let (spec, data) = digits_mlp(dropout)?;
    for optim in [
        OptimSpec::Sgd(SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            ..Default::default()
        }),
        OptimSpec::AdamW(AdamWConfig {
            lr: 1e-3,
            clip_grad_norm: Some(1.0),
            ..Default::default()
        }),
    ] {
        let full = train(spec.clone(), &optim, &data, 64, 5)?;
        ends.push(full.clone());
        for micro in [8, 24, 1] {
            let acc = train(spec.clone(), &optim, &data, micro, 5)?;
            let d = max_rel_diff(&full, &acc);
            eprintln!(
                "dropout {dropout}, {} micro {micro}: {d:e}",
                optim.describe()
            );
            assert!(
                d < 1e-6,
                "{} micro {micro}: max relative difference {d}",
                optim.describe()
            );
        }
    }
    Ok(ends.pop().expect("trained"))
}

/// With class weights (PyTorch's `CrossEntropyLoss(weight=)`) the batch's
/// mean divides by its weight sum, not its sample count: micro-batches of
/// uneven weight still add up to the full batch's gradient, a class of
/// weight 0 adds nothing, and weights all equal are the plain loss.
#[test]
fn weighted_cross_entropy_accumulation_equals_full_batch() -> Result<()> {
    let (spec, data) = digits_mlp(0.0)?;
    let optim = OptimSpec::Sgd(SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        ..Default::default()
    });
    let weighted = |w: &[f32], smoothing| CrossEntropy {
        label_smoothing: smoothing,
        weights: Some(w.into()),
        ..Default::default()
    };
    let w = [0.0, 1.0, 2.0, 0.5, 4.0, 1.0, 1.0, 3.0, 0.25, 1.0];
    for smoothing in [0.0, 0.1] {
        let full = train_with(spec.clone(), &optim, &data, 64, 5, weighted(&w, smoothing))?;
        for micro in [8, 24, 1] {
            let acc = train_with(
                spec.clone(),
                &optim,
                &data,
                micro,
                5,
                weighted(&w, smoothing),
            )?;
            let d = max_rel_diff(&full, &acc);
            eprintln!("weighted, smoothing {smoothing}, micro {micro}: {d:e}");
            assert!(d < 1e-6, "micro {micro}: max relative difference {d}");
        }
        let plain = train_with(
            spec.clone(),
            &optim,
            &data,
            64,
            5,
            CrossEntropy {
                label_smoothing: smoothing,
                ..Default::default()
            },
        )?;
        let apart = max_rel_diff(&plain, &full);
        assert!(apart > 1e-3, "the weights changed nothing: {apart}");
        let equal = train_with(
            spec.clone(),
            &optim,
            &data,
            24,
            5,
            weighted(&[3.0; 10], smoothing),
        )?;
        let d = max_rel_diff(&plain, &equal);
        assert!(d < 1e-6, "equal weights: max relative difference {d}");
    }
    Ok(())
}

/// A one-layer GPT on Shakespeare with context 16, and its batches of 64.
fn tiny_gpt() -> Result<(Arc<dyn ModelSpec>, Pipeline)> {
    let (gpt, data) = tiny_gpt_of()?;
    Ok((Arc::new(gpt), data))
}

fn tiny_gpt_of() -> Result<(Gpt, Pipeline)> {
    let src = shakespeare("train", 16, None)?;
    let vocab = taper::data::Source::vocab(&src)
        .map(|v| v.len())
        .unwrap_or(0);
    let spec = Gpt {
        vocab,
        context: 16,
        width: 16,
        layers: 1,
        heads: 2,
        mlp: 2,
        dropout: 0.0,
        from: None,
        initial: None,
    };
    Ok((spec, Pipeline::new(Arc::new(src)).batch(64, false)))
}

/// Micro-batches of 24 train to the weights of whole batches of 64,
/// without dropout and with it (each sample's masks drawn for its place in
/// the batch).
#[test]
fn gpt_accumulation_equals_full_batch() -> Result<()> {
    let (gpt, data) = tiny_gpt_of()?;
    let optim = OptimSpec::Sgd(SgdConfig {
        lr: 0.5,
        ..Default::default()
    });
    let mut ends = Vec::new();
    for dropout in [0.0, 0.2] {
        let spec: Arc<dyn ModelSpec> = Arc::new(Gpt {
            dropout,
            ..gpt.clone()
        });
        let full = train(spec.clone(), &optim, &data, 64, 3)?;
        let acc = train(spec, &optim, &data, 24, 3)?;
        let d = max_rel_diff(&full, &acc);
        eprintln!("gpt micro 24, dropout {dropout}: {d:e}");
        assert!(d < 1e-6, "dropout {dropout}: max relative difference {d}");
        ends.push(full);
    }
    let moved = max_rel_diff(&ends[0], &ends[1]);
    assert!(moved > 1e-3, "dropout changed the weights by {moved} only");
    Ok(())
}

/// The chunked cross-entropy (the head and loss fused, a block of positions
/// at a time) trains the GPT as the full logits do, with label smoothing and
/// with micro-batches too.
#[test]
fn chunked_cross_entropy_trains_like_the_full_logits() -> Result<()> {
    let (spec, data) = tiny_gpt()?;
    // SGD: the update is the gradient, so this compares gradients (AdamW
    // would magnify rounding in tiny ones).
    let optim = OptimSpec::Sgd(SgdConfig {
        lr: 0.5,
        ..Default::default()
    });
    for (smoothing, micro) in [(0.0, 64), (0.1, 24)] {
        let ce = |chunk| CrossEntropy {
            label_smoothing: smoothing,
            chunk,
            ..Default::default()
        };
        let full = train_with(spec.clone(), &optim, &data, micro, 3, ce(0))?;
        let chunked = train_with(spec.clone(), &optim, &data, micro, 3, ce(100))?;
        let d = max_rel_diff(&full, &chunked);
        eprintln!("chunked cross-entropy, smoothing {smoothing}, micro {micro}: {d:e}");
        assert!(d < 1e-6, "max relative difference {d}");
    }
    Ok(())
}

/// Batch `b`'s labels with positions ignored, as a chat's prompt and
/// padding are: sample `i` ignores its first `(i * 5 + b) % 17` positions
/// (all 16 of them for some samples), so micro-batches hold uneven counts
/// of labelled positions and some hold none.
fn masked(batch: Batch, b: usize) -> Result<Batch> {
    let (n, t) = batch.y.dims2()?;
    let mut y = batch.y.flatten_all()?.to_vec1::<u32>()?;
    for i in 0..n {
        let cut = (i * 5 + b) % 17;
        for label in &mut y[i * t..i * t + cut.min(t)] {
            *label = IGNORE;
        }
    }
    Ok(Batch {
        y: Tensor::from_vec(y, (n, t), &Device::Cpu)?,
        ..batch
    })
}

/// Parameters after 3 steps over masked batches, with micro-batches of
/// `micro`; each step's loss is checked ([`step_checked`]).
fn train_masked(
    spec: Arc<dyn ModelSpec>,
    optim: &OptimSpec,
    data: &Pipeline,
    micro: usize,
    loss: CrossEntropy,
) -> Result<Vec<Vec<f32>>> {
    let mut t = trainer(spec, optim, loss)?;
    for (b, batch) in data.epoch(1, 64, 0).take(3).enumerate() {
        step_checked(&mut t, &masked(batch?, b)?, micro, b)?;
    }
    params(&t)
}

/// One step over `batch` (step `b`), its loss checked against the float64
/// mean over the labelled positions, from the model's logits before it.
fn step_checked(t: &mut Trainer, batch: &Batch, micro: usize, b: usize) -> Result<()> {
    let logits = t.frozen()?.forward(&batch.x)?;
    let (want, got) = (
        labelled_mean(&logits, &batch.y)?,
        t.train_step_micro(batch, micro)?,
    );
    assert!(
        (want - got).abs() < 1e-5 * want,
        "step {b}: loss {got}, want {want}"
    );
    Ok(())
}

/// The cross-entropy of `logits` over the positions whose label is not
/// ignored, in float64.
fn labelled_mean(logits: &Tensor, y: &Tensor) -> Result<f64> {
    let v = logits.dim(D::Minus1)?;
    let rows = logits
        .to_dtype(DType::F64)?
        .reshape(((), v))?
        .to_vec2::<f64>()?;
    let labels = y.flatten_all()?.to_vec1::<u32>()?;
    let (mut sum, mut n) = (0.0, 0usize);
    for (row, &label) in rows.iter().zip(&labels) {
        if label == IGNORE {
            continue;
        }
        let max = row.iter().cloned().fold(f64::MIN, f64::max);
        let lse = max + row.iter().map(|z| (z - max).exp()).sum::<f64>().ln();
        sum += lse - row[label as usize];
        n += 1;
    }
    Ok(sum / n as f64)
}

/// Ignored positions (PyTorch's `ignore_index`) are left out of the loss
/// and its mean over the whole batch: micro-batches weighted by their
/// labelled positions (some pieces have none) give the full batch's
/// gradient, the fused chunked loss gives the full logits', and the loss a
/// step returns is the float64 mean over the labelled positions.
#[test]
fn ignored_positions_accumulate_to_the_full_batch_and_leave_the_mean() -> Result<()> {
    let (spec, data) = tiny_gpt()?;
    let optim = OptimSpec::Sgd(SgdConfig {
        lr: 0.5,
        ..Default::default()
    });
    let ce = |chunk| CrossEntropy {
        chunk,
        ..Default::default()
    };
    let full = train_masked(spec.clone(), &optim, &data, 64, ce(0))?;
    for (micro, chunk) in [(24, 0), (1, 0), (64, 100), (7, 100)] {
        let acc = train_masked(spec.clone(), &optim, &data, micro, ce(chunk))?;
        let d = max_rel_diff(&full, &acc);
        eprintln!("ignored positions, micro {micro}, chunk {chunk}: {d:e}");
        assert!(
            d < 1e-6,
            "micro {micro}, chunk {chunk}: max relative difference {d}"
        );
    }
    let plain = train(spec, &optim, &data, 64, 3)?;
    let apart = max_rel_diff(&plain, &full);
    assert!(apart > 1e-3, "ignoring positions changed nothing: {apart}");
    Ok(())
}

/// A GPT that records the positions of each input it is given; `causal`
/// says whether taper may leave out positions no sample labels.
struct Spy {
    gpt: Gpt,
    causal: bool,
    widths: Arc<Mutex<Vec<usize>>>,
}

struct SpyModule {
    inner: Box<dyn TrainModule>,
    widths: Arc<Mutex<Vec<usize>>>,
}

impl Module for SpyModule {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.widths.lock().unwrap().push(x.dim(1)?);
        self.inner.forward(x)
    }
}

impl TrainModule for SpyModule {
    fn forward_train(&self, x: &Tensor, draw: Draw) -> candle_core::Result<Tensor> {
        self.widths.lock().unwrap().push(x.dim(1)?);
        self.inner.forward_train(x, draw)
    }

    fn hidden_and_head(
        &self,
        x: &Tensor,
        draw: Draw,
    ) -> candle_core::Result<Option<(Tensor, Tensor)>> {
        self.widths.lock().unwrap().push(x.dim(1)?);
        self.inner.hidden_and_head(x, draw)
    }
}

impl ModelSpec for Spy {
    fn describe(&self) -> String {
        self.gpt.describe()
    }
    fn build(&self, vb: VarBuilder) -> candle_core::Result<Box<dyn Module>> {
        self.gpt.build(vb)
    }
    fn build_train(&self, vb: VarBuilder) -> candle_core::Result<Box<dyn TrainModule>> {
        Ok(Box::new(SpyModule {
            inner: self.gpt.build_train(vb)?,
            widths: self.widths.clone(),
        }))
    }
    fn context(&self) -> Option<usize> {
        self.gpt.context()
    }
    fn causal(&self) -> bool {
        self.causal
    }
}

/// Batch `b`'s labels as a batch of conversations padded to the context
/// has them: sample `i` labels its positions from `(i + b) % 3` up to
/// `(i * 7 + b) % 11` (none when that is not after the first), the rest
/// ignored.
fn padded(batch: Batch, b: usize) -> Result<Batch> {
    let (n, t) = batch.y.dims2()?;
    let mut y = batch.y.flatten_all()?.to_vec1::<u32>()?;
    for i in 0..n {
        let (from, end) = ((i + b) % 3, (i * 7 + b) % 11);
        for (p, label) in y[i * t..(i + 1) * t].iter_mut().enumerate() {
            if p < from || p >= end {
                *label = IGNORE;
            }
        }
    }
    Ok(Batch {
        y: Tensor::from_vec(y, (n, t), &Device::Cpu)?,
        ..batch
    })
}

/// The last labelled position of any of samples `[from, from + m)`, plus
/// one (at least 1).
fn width(y: &Tensor, from: usize, m: usize) -> Result<usize> {
    let rows = y.narrow(0, from, m)?.to_vec2::<u32>()?;
    let last = rows
        .iter()
        .filter_map(|r| r.iter().rposition(|&l| l != IGNORE))
        .max();
    Ok(last.map_or(1, |l| l + 1))
}

/// A causal model's positions after the last one any sample of a piece
/// labels (a chat's padding) are not computed, and leaving them out
/// changes nothing: the weights after three steps equal those of the same
/// model computing every position, in one batch or in micro-batches (some
/// with no labelled position), through the full logits or the chunked
/// loss, and each step's loss is the float64 mean over the labelled
/// positions. The model is given each piece's labelled width, no more.
#[test]
fn positions_after_the_last_labelled_one_are_not_computed_and_change_nothing() -> Result<()> {
    let (gpt, data) = tiny_gpt_of()?;
    let optim = OptimSpec::Sgd(SgdConfig {
        lr: 0.5,
        ..Default::default()
    });
    for (micro, chunk) in [(64, 0), (24, 0), (5, 100)] {
        let ce = CrossEntropy {
            chunk,
            ..Default::default()
        };
        let mut weights = Vec::new();
        for causal in [false, true] {
            let widths = Arc::new(Mutex::new(Vec::new()));
            let spy = Arc::new(Spy {
                gpt: gpt.clone(),
                causal,
                widths: widths.clone(),
            });
            let mut t = trainer(spy, &optim, ce.clone())?;
            let mut want = Vec::new();
            for (b, batch) in data.epoch(1, 64, 0).take(3).enumerate() {
                let batch = padded(batch?, b)?;
                step_checked(&mut t, &batch, micro, b)?;
                for from in (0..batch.len()).step_by(micro) {
                    let m = micro.min(batch.len() - from);
                    want.push(match causal {
                        true => width(&batch.y, from, m)?,
                        false => batch.y.dim(1)?,
                    });
                }
            }
            assert_eq!(
                *widths.lock().unwrap(),
                want,
                "causal {causal}, micro {micro}"
            );
            weights.push(params(&t)?);
        }
        let d = max_rel_diff(&weights[0], &weights[1]);
        eprintln!("padding left out, micro {micro}, chunk {chunk}: {d:e}");
        assert!(
            d < 1e-6,
            "micro {micro}, chunk {chunk}: max relative difference {d}"
        );
    }
    Ok(())
}

/// A BERT on texts of 1 to 12 words, padded, trained with dropout: each
/// micro-batch is computed only as wide as its own longest text, and 8 x 8
/// or 24 + 24 + 16 train to the weights of whole batches of 64 (the padding
/// is masked, so the width a piece is cut to changes nothing, and each
/// sample's dropout masks are drawn for its place in the batch, whatever
/// piece computes it).
#[test]
fn bert_accumulation_over_texts_of_many_lengths_equals_full_batch() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tok = dir.path().join("tokenizer.json");
    std::fs::write(&tok, common::BERT_TOKENIZER)?;
    let words = ["the", "cat", "sat", "on", "mat", ","];
    let rows: String = (0..192)
        .map(|i| {
            let n = 1 + (i * 7) % 12;
            let text: Vec<&str> = (0..n).map(|j| words[(i * 5 + j * 3) % 6]).collect();
            format!("{},\"{}\"\n", i % 3, text.join(" "))
        })
        .collect();
    let path = dir.path().join("texts.csv");
    std::fs::write(&path, format!("label,text\n{rows}"))?;
    let opts = taper::data::CsvOptions {
        label: taper::data::Column::Index(0),
        text: Some(taper::data::TextOptions {
            columns: vec![taper::data::Column::Index(1)],
            tokenizer: tok,
            context: 16,
        }),
        ..Default::default()
    };
    let data = Pipeline::new(Arc::new(taper::data::csv(&path, &opts)?));
    let bert = |rate: f64| -> Arc<dyn ModelSpec> {
        Arc::new(Bert {
            family: Default::default(),
            vocab: 10,
            context: 16,
            width: 16,
            layers: 2,
            heads: 2,
            intermediate: 32,
            type_vocab: 2,
            eps: 1e-12,
            pad: 0,
            outputs: 3,
            dropout: rate,
            attention_dropout: rate,
            classifier_dropout: rate,
            sep: None,
            from: None,
            initial: None,
        })
    };
    let spec = bert(0.1);
    // SGD: the keys' biases have a gradient of 0 up to rounding (a bias
    // added to every key moves a row's scores alike), which AdamW would
    // scale up to steps of `lr` in directions set by the rounding (they
    // change no output either way).
    let optim = OptimSpec::Sgd(SgdConfig {
        lr: 0.5,
        momentum: 0.9,
        ..Default::default()
    });
    let whole = train(spec.clone(), &optim, &data, 64, 3)?;
    // Dropout is on: the same run without it ends elsewhere.
    let plain = train(bert(0.0), &optim, &data, 64, 3)?;
    let moved = max_rel_diff(&whole, &plain);
    assert!(moved > 1e-3, "dropout changed the weights by {moved} only");
    for micro in [8, 24] {
        let split = train(spec.clone(), &optim, &data, micro, 3)?;
        // Relative to each tensor's norm, or to 1 for the keys' biases,
        // which stay 0 up to rounding (about 1e-13 here).
        let d = whole
            .iter()
            .zip(&split)
            .map(|(a, b)| {
                let norm = a.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
                max_rel_diff(std::slice::from_ref(a), std::slice::from_ref(b)) * norm
                    / norm.max(1.0)
            })
            .fold(0.0, f64::max);
        eprintln!("bert: micro-batches of {micro}: {d:.2e} relative");
        assert!(d < 1e-6, "micro-batches of {micro}: {d}");
    }
    Ok(())
}
