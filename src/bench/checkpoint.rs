//! `taper bench checkpoint`: what periodic checkpoints cost. The shipped
//! Shakespeare recipe trains `steps` steps without periodic checkpoints and
//! with one after every step, alternating; the difference per step is the
//! cost of one checkpoint (keeping the default 2, and only the newest), and
//! from it the cost at a given period.

use std::path::Path;

use super::median;
use crate::run::periodic::Every;
use crate::{HostOptions, Result};

/// Seconds of the whole run, and of its training epoch alone.
fn train(dir: &Path, steps: usize, every: Option<Every>, keep: usize) -> Result<(f64, f64)> {
    let opts = HostOptions {
        checkpoint_every: Some(every),
        keep_checkpoints: Some(keep),
        ..HostOptions::default()
    };
    super::shakespeare_run(dir, steps, opts)
}

pub fn run(steps: usize, rounds: usize) -> Result<()> {
    let root = std::env::temp_dir().join(format!("taper-bench-ckpt-{}", std::process::id()));
    let (mut without, mut with, mut one, mut epoch) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let every = Some(Every::Steps(1));
    for round in 0..rounds {
        // Each run in a folder of its own (a run folder is never reused).
        let (total, training) = train(&root.join(format!("never-{round}")), steps, None, 2)?;
        without.push(total);
        epoch.push(training);
        with.push(train(&root.join(format!("every-{round}")), steps, every, 2)?.0);
        one.push(train(&root.join(format!("one-{round}")), steps, every, 1)?.0);
    }
    let bytes = std::fs::metadata(root.join("never-0/checkpoint.safetensors"))
        .map(|m| m.len())
        .unwrap_or(0);
    let _ = std::fs::remove_dir_all(&root);
    let (t0, t1, t2) = (median(&mut without), median(&mut with), median(&mut one));
    let step_ms = median(&mut epoch) / steps as f64 * 1e3;
    let per = |t: f64| ((t - t0) / steps as f64 * 1e3).max(0.0);
    let save_ms = per(t1);
    println!(
        "scripts/shakespeare.lua, {steps} steps, {rounds} rounds alternating (medians); checkpoint {:.2} MB",
        bytes as f64 / 1e6
    );
    println!("  run without periodic checkpoints  {t0:.2} s  ({step_ms:.2} ms per training step)");
    println!("  a checkpoint after every step     {t1:.2} s  (+{save_ms:.2} ms per checkpoint, keeping 2)");
    println!(
        "  the same, keeping only the newest {t2:.2} s  (+{:.2} ms per checkpoint)",
        per(t2)
    );
    for (label, every_steps) in [
        ("every 100 steps", 100.0),
        ("every 5 minutes (the default)", 300e3 / step_ms.max(1e-9)),
    ] {
        let share = save_ms / every_steps / step_ms.max(1e-9) * 100.0;
        println!("  cost {label:<30} {share:.3}% of training time");
    }
    Ok(())
}
