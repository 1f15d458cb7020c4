//! `taper bench records`: what the per-step `step` records cost. One record
//! is timed directly (the same fields, written and flushed to a real
//! `metrics.jsonl`), and the Shakespeare recipe runs with a record after
//! every step and with none, alternating, for the end-to-end difference
//! (noisier: it is a small part of a step).

use std::path::Path;
use std::time::Instant;

use serde_json::{json, Map};

use super::median;
use crate::host::output_for_bench;
use crate::{HostOptions, Result};

/// Seconds of the whole run, and per training step (its epoch record).
fn train(dir: &Path, steps: usize, log_every: u64) -> Result<(f64, f64)> {
    let opts = HostOptions {
        checkpoint_every: Some(None),
        log_every,
        ..HostOptions::default()
    };
    let (total, epoch) = super::shakespeare_run(dir, steps, opts)?;
    Ok((total, epoch / steps as f64))
}

/// Microseconds per `step` record written to a metrics file in `dir`.
fn one_record(dir: &Path, n: usize) -> Result<f64> {
    let out = output_for_bench(dir)?;
    let start = Instant::now();
    for i in 0..n {
        let mut f = Map::new();
        f.insert("run".into(), 1.into());
        f.insert(
            "loss".into(),
            json!(1.712_664_580_345_154 + i as f64 * 1e-9),
        );
        f.insert("lr".into(), json!(6.000_110_115_346_156e-4));
        f.insert("steps".into(), 10.into());
        f.insert("batch".into(), json!(32.0));
        f.insert("micro_batch".into(), 32.into());
        f.insert("step_s".into(), json!(0.032_465_810_000_000_005));
        f.insert("data_wait_s".into(), json!(9.247_799_999_999_999e-5));
        f.insert("samples_per_s".into(), json!(983.396_614_290_84));
        f.insert("tokens_per_s".into(), json!(62_937.383_314_613_76));
        f.insert("memory".into(), json!(11_849_286));
        f.insert("memory_peak".into(), json!(44_265_064));
        out.record("step", i as u64, 1, f)?;
    }
    Ok(start.elapsed().as_secs_f64() / n as f64 * 1e6)
}

pub fn run(steps: usize, rounds: usize) -> Result<()> {
    let root = std::env::temp_dir().join(format!("taper-bench-records-{}", std::process::id()));
    let record_us = one_record(&root.join("direct"), 20_000)?;
    let (mut none, mut every, mut step) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // Each run in a folder of its own (a run folder is never reused).
        let (t, per_step) = train(&root.join(format!("none-{round}")), steps, 0)?;
        none.push(t);
        step.push(per_step);
        every.push(train(&root.join(format!("every-{round}")), steps, 1)?.0);
    }
    let _ = std::fs::remove_dir_all(&root);
    let (t0, t1) = (median(&mut none), median(&mut every));
    let step_us = median(&mut step) * 1e6;
    println!("scripts/shakespeare.lua, {steps} steps, {rounds} rounds alternating (medians)");
    println!("  one step record, written and flushed  {record_us:.1} us");
    println!(
        "  a training step                       {:.2} ms",
        step_us / 1e3
    );
    for (label, every) in [("every step", 1.0), ("every 10 steps (the default)", 10.0)] {
        println!(
            "  records {label:<29} {:.4}% of training time",
            record_us / every / step_us * 100.0
        );
    }
    println!(
        "  end to end: no records {t0:.2} s, a record every step {t1:.2} s ({:+.2}%, noise included)",
        (t1 / t0 - 1.0) * 100.0
    );
    Ok(())
}
