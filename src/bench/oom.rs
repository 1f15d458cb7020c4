//! `taper bench oom`: what recovering from an OOM costs. (1) The time from an
//! OOM to the next successful step, as a multiple of a normal step. (2)
//! Throughput when a memory limit forces micro-batching, against the same
//! run unconstrained.

use std::sync::Arc;
use std::time::Instant;

use super::median;
use crate::data::{shakespeare, Pipeline};
use crate::memory::{HostMemory, OomCause, OomError, Phase};
use crate::{Host, HostOptions, Result};

/// Normal step vs (failed attempt + retry at half the micro-batch), on the
/// Shakespeare GPT, alternating.
fn recovery(rounds: usize) -> Result<()> {
    let mut t = super::shakespeare_gpt(1e-3)?;
    let src = shakespeare("train", 64, None)?;
    let data = Pipeline::new(Arc::new(src)).shuffle(1).batch(32, false);
    let mut batches = data.epoch(1, 32, 0);
    let oom = |p: Phase| -> Result<()> {
        match p {
            Phase::Backward => Err(OomError {
                phase: p,
                cause: OomCause::Injected,
                detail: "bench".into(),
                requested: None,
            }
            .into()),
            _ => Ok(()),
        }
    };
    let (mut normal, mut failed, mut retry) = (Vec::new(), Vec::new(), Vec::new());
    t.train_step(
        &batches
            .next()
            .ok_or(crate::Error::Data("no data".into()))??,
    )?;
    for _ in 0..rounds {
        let b = batches
            .next()
            .ok_or(crate::Error::Data("no data".into()))??;
        let s = Instant::now();
        t.train_step(&b)?;
        normal.push(s.elapsed().as_secs_f64());
        let b = batches
            .next()
            .ok_or(crate::Error::Data("no data".into()))??;
        let s = Instant::now();
        let _ = t.train_step_guarded(&b, 32, &mut |p| oom(p));
        let f = s.elapsed().as_secs_f64();
        let s = Instant::now();
        t.train_step_micro(&b, 16)?;
        failed.push(f);
        retry.push(s.elapsed().as_secs_f64());
    }
    let (n, f, r) = (median(&mut normal), median(&mut failed), median(&mut retry));
    println!("recovery (Shakespeare GPT, batch 32, OOM injected at the end of backward, retried as 2 x 16):");
    println!(
        "  normal step {:.1} ms; failed attempt {:.1} ms; retry {:.1} ms",
        n * 1e3,
        f * 1e3,
        r * 1e3
    );
    println!(
        "  OOM to the next successful step (the retry): {:.2}x a normal step; counting the failed attempt: {:.2}x",
        r / n,
        (f + r) / n
    );
    Ok(())
}

const MLP: &str = r#"
local cfg = taper.config{ micro = 0, epochs = 2 }
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 1024, 1024 }, outputs = 10 },
  data = taper.data.digits{}:shuffle{ seed = 1 }:batch(256),
  micro_batch = cfg.micro > 0 and cfg.micro or nil,
}
for epoch in run:epochs(cfg.epochs) do
  for b in run:batches() do run:step(b) end
end
"#;

const GPT: &str = r#"
local cfg = taper.config{ micro = 0, epochs = 1 }
local data = taper.data.shakespeare{ context = 64 }:take(32 * 24):shuffle{ seed = 1 }:batch(32)
local run = taper.run{
  model = taper.model.gpt{ vocab = data:vocab_size(), context = 64, width = 64, layers = 2, heads = 4 },
  data = data,
  micro_batch = cfg.micro > 0 and cfg.micro or nil,
}
for epoch in run:epochs(cfg.epochs) do
  for b in run:batches() do run:step(b) end
end
"#;

/// Samples/s, the step peak and the OOM count of one run of `recipe`.
fn run_recipe(
    recipe: &str,
    batch: f64,
    set: &[(&str, &str)],
    limit: Option<usize>,
) -> Result<(f64, u64, usize)> {
    let dir = std::env::temp_dir().join(format!("taper-bench-oom-{}", std::process::id()));
    let opts = HostOptions {
        out_dir: Some(dir.clone()),
        mem_limit: limit,
        overrides: set
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..HostOptions::default()
    };
    let t = Instant::now();
    let report = Host::new(opts)?.run_source("bench.lua", recipe)?;
    let secs = t.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(dir.join("metrics.jsonl"))
        .map_err(|e| crate::Error::io(&dir, e))?;
    let mut peak = 0u64;
    let mut ooms = 0usize;
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| crate::Error::Data(e.to_string()))?;
        if v["event"] == "epoch" {
            peak = peak.max(v["memory_peak"].as_u64().unwrap_or(0));
        }
        if v["event"] == "oom" {
            ooms += 1;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let samples = report.runs[0].step as f64 * batch;
    Ok((samples / secs, peak, ooms))
}

/// Throughput under a limit set between the peaks of micro-batches `lo` and
/// `2 * lo`, against the same run unconstrained.
fn constrained(name: &str, recipe: &str, batch: f64, lo: usize) -> Result<()> {
    if !HostMemory::is_counting() {
        println!("(skipping the memory-limit runs: the counting allocator is not installed)");
        return Ok(());
    }
    let (a, b) = (lo.to_string(), (2 * lo).to_string());
    let (_, p_lo, _) = run_recipe(
        recipe,
        batch,
        &[("micro", a.as_str()), ("epochs", "1")],
        None,
    )?;
    let (_, p_hi, _) = run_recipe(
        recipe,
        batch,
        &[("micro", b.as_str()), ("epochs", "1")],
        None,
    )?;
    let limit = ((p_lo + p_hi) / 2) as usize;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "under a memory limit ({name}, batch {batch}, limit {:.1} MiB between the peaks of micro-batches {lo} and {}):",
        mib(limit as u64),
        2 * lo
    );
    for round in 1..=2 {
        let (free, fp, _) = run_recipe(recipe, batch, &[], None)?;
        let (tight, tp, ooms) = run_recipe(recipe, batch, &[], Some(limit))?;
        println!(
            "  round {round}: unconstrained {free:.0} samples/s (peak {:.1} MiB); limited {tight:.0} samples/s (peak {:.1} MiB, {ooms} OOMs); ratio {:.2}",
            mib(fp),
            mib(tp),
            tight / free
        );
    }
    Ok(())
}

/// Activation recomputation on a Shakespeare GPT deep and long enough for
/// activations to dominate (width 128, 6 layers, context 256, batch 16):
/// the step's peak heap and time with every block, every other block and
/// no block recomputed, alternating. PyTorch's checkpointing is the
/// anchor: about 30% more time for O(sqrt n) activation memory.
fn recompute(rounds: usize) -> Result<()> {
    use crate::engine::{Gpt, Trainer, TrainerOptions};
    let src = shakespeare("train", 256, None)?;
    let vocab = crate::data::Source::vocab(&src).map_or(0, |v| v.len());
    let spec = Gpt {
        vocab,
        context: 256,
        width: 128,
        layers: 6,
        heads: 4,
        mlp: 4,
        dropout: 0.0,
        from: None,
        initial: None,
    };
    let mut t = Trainer::new(Arc::new(spec), &super::adamw(), TrainerOptions::default())?;
    let data = Pipeline::new(Arc::new(src)).shuffle(1).batch(16, false);
    let mut batches = data.epoch(1, 16, 0);
    let mut next = || -> Result<crate::data::Batch> {
        batches.next().ok_or(crate::Error::Data("no data".into()))?
    };
    t.train_step(&next()?)?; // optimizer state exists from here
    let settings = [0usize, 2, 1];
    let mut peak = vec![Vec::new(); settings.len()];
    let mut time = vec![Vec::new(); settings.len()];
    for _ in 0..rounds.max(1) {
        for (i, &every) in settings.iter().enumerate() {
            t.set_recompute(every)?;
            let b = next()?;
            let base = HostMemory::current();
            HostMemory::reset_peak();
            let s = Instant::now();
            t.train_step(&b)?;
            time[i].push(s.elapsed().as_secs_f64());
            peak[i].push(HostMemory::peak().saturating_sub(base) as f64);
        }
    }
    println!(
        "activation recomputation (Shakespeare GPT width 128, 6 layers, context 256, batch 16):"
    );
    let (p0, t0) = (median(&mut peak[0]), median(&mut time[0]));
    for (i, every) in settings.iter().enumerate() {
        let (p, tm) = (median(&mut peak[i]), median(&mut time[i]));
        let what = match every {
            0 => "none".to_string(),
            1 => "every block".to_string(),
            n => format!("every {n} blocks"),
        };
        println!(
            "  {what:>16}: step peak {:7.1} MiB ({:.2}x), {:6.1} ms ({:.2}x)",
            p / (1 << 20) as f64,
            p / p0,
            tm * 1e3,
            tm / t0
        );
    }
    Ok(())
}

/// Optimizer-state offload on a parameter-heavy GPT (width 256, 4 layers,
/// context 64, batch 16; 3.2M parameters): the heap's peak during a step,
/// all of it (the moments are held between steps), and the step's time,
/// with AdamW's moments in memory and in a file, alternating.
fn offload(rounds: usize) -> Result<()> {
    use crate::engine::{Gpt, Trainer, TrainerOptions};
    let src = shakespeare("train", 64, None)?;
    let vocab = crate::data::Source::vocab(&src).map_or(0, |v| v.len());
    let spec = Arc::new(Gpt {
        vocab,
        context: 64,
        width: 256,
        layers: 4,
        heads: 4,
        mlp: 4,
        dropout: 0.0,
        from: None,
        initial: None,
    });
    let data = Pipeline::new(Arc::new(src)).shuffle(1).batch(16, false);
    let mut batches = data.epoch(1, 16, 0);
    let mut next = || -> Result<crate::data::Batch> {
        batches.next().ok_or(crate::Error::Data("no data".into()))?
    };
    let mut params = 0;
    let mut peak = vec![Vec::new(); 2];
    let mut time = vec![Vec::new(); 2];
    for _ in 0..rounds.max(1) {
        let (warm, b) = (next()?, next()?);
        for (i, on) in [false, true].into_iter().enumerate() {
            // One trainer at a time, from nothing: its weights, moments
            // (unless offloaded) and the step's own memory.
            let base = HostMemory::current();
            let mut t = Trainer::new(spec.clone(), &super::adamw(), TrainerOptions::default())?;
            t.set_offload(on)?;
            t.train_step(&warm)?; // the moments exist from here
            params = t.params().num_params();
            HostMemory::reset_peak();
            let s = Instant::now();
            t.train_step(&b)?;
            time[i].push(s.elapsed().as_secs_f64());
            peak[i].push(HostMemory::peak().saturating_sub(base) as f64);
        }
    }
    let (p0, t0) = (median(&mut peak[0]), median(&mut time[0]));
    let (p1, t1) = (median(&mut peak[1]), median(&mut time[1]));
    println!(
        "optimizer-state offload (GPT width 256, 4 layers, context 64, batch 16; {params} parameters, moments {:.1} MiB):",
        (8 * params) as f64 / (1 << 20) as f64
    );
    println!(
        "  heap peak of a step, weights and state included: {:.1} MiB in memory, {:.1} MiB offloaded: {:.1} MiB less; step {:.1} vs {:.1} ms ({:.2}x)",
        p0 / (1 << 20) as f64,
        p1 / (1 << 20) as f64,
        (p0 - p1) / (1 << 20) as f64,
        t0 * 1e3,
        t1 * 1e3,
        t1 / t0
    );
    Ok(())
}

pub fn run(rounds: usize) -> Result<()> {
    recovery(rounds)?;
    recompute(rounds)?;
    offload(rounds)?;
    constrained("digits MLP 64-1024-1024-10", MLP, 256.0, 32)?;
    constrained(
        "Shakespeare GPT width 64, 2 layers, context 64",
        GPT,
        32.0,
        8,
    )
}
