//! `taper bench ranks`: data-parallel throughput of scripts/shakespeare.lua
//! on 1, 2 and 4 MPI ranks (`taper launch`), against one plain process,
//! alternating. The figure is the epoch record's samples/s (startup and the
//! evaluation excluded), global batch fixed: more ranks, smaller shards.

use std::path::Path;
use std::process::Command;

use super::median;
use crate::{Error, Result};

pub fn run(ranks: &[usize], steps: usize, rounds: usize, batch: usize) -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| Error::Config(e.to_string()))?;
    let dir = tempfile_dir()?;
    println!(
        "scripts/shakespeare.lua, {steps} steps of batch {batch}, {} cores; samples/s of the epoch, median of {rounds}",
        std::thread::available_parallelism().map_or(1, |c| c.get())
    );
    // 0: one process, no MPI.
    let mut kinds = vec![0];
    kinds.extend_from_slice(ranks);
    let mut seen: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for round in 0..rounds {
        for (i, &k) in kinds.iter().enumerate() {
            let out = dir.join(format!("r{round}-{k}"));
            seen[i].push(one(&exe, k, steps, batch, &out)?);
        }
    }
    let base = median(&mut seen[0].clone());
    println!("{:<22} {:>10} {:>8}", "", "samples/s", "vs one");
    for (i, &k) in kinds.iter().enumerate() {
        let m = median(&mut seen[i]);
        let name = match k {
            0 => "one process".to_string(),
            1 => "1 rank (MPI)".to_string(),
            k => format!("{k} ranks (MPI)"),
        };
        println!("{name:<22} {m:>10.0} {:>7.2}x", m / base);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// One run's epoch samples/s: `taper train` (k = 0) or `taper launch -n k`.
fn one(exe: &Path, k: usize, steps: usize, batch: usize, out: &Path) -> Result<f64> {
    let mut cmd = Command::new(exe);
    if k == 0 {
        cmd.arg("train");
    } else {
        cmd.args(["launch", "-n", &k.to_string()]);
    }
    cmd.arg("scripts/shakespeare.lua");
    for (key, v) in [
        ("epochs", "1".to_string()),
        ("steps", steps.to_string()),
        ("batch", batch.to_string()),
        ("sample", "0".into()),
        ("val_windows", "64".into()),
    ] {
        cmd.arg("--set").arg(format!("{key}={v}"));
    }
    cmd.args(["--quiet", "--checkpoint-every", "never", "--out"])
        .arg(out);
    let o = cmd
        .output()
        .map_err(|e| Error::Config(format!("bench ranks: {e}")))?;
    if !o.status.success() {
        return Err(Error::Config(format!(
            "bench ranks: {k} ranks failed (a build with --features mpi and Open MPI are needed): {}",
            String::from_utf8_lossy(&o.stderr)
        )));
    }
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl"))
        .map_err(|e| Error::io(out.join("metrics.jsonl"), e))?;
    metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|r| r["event"] == "epoch")
        .and_then(|r| r["samples_per_s"].as_f64())
        .ok_or_else(|| Error::Config(format!("bench ranks: no epoch record in {}", out.display())))
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("taper-bench-ranks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    Ok(dir)
}
