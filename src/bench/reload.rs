//! `taper bench reload`: how long a saved edit takes to reach a running
//! recipe, and how long applying it stops the run. A recipe with a safe
//! point after every step (`run:reload_point()`) trains the digits MLP
//! under `--watch` while a thread saves a new schedule module (write a
//! temporary file, rename it over the old one) at intervals.

use std::path::Path;
use std::time::Duration;

use super::median;
use crate::{Error, Host, HostOptions, Result};

const RECIPE: &str = r#"
local sched = require("sched")
local train = taper.data.digits{ split = "train" }:shuffle{ seed = 1 }:batch(32)
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 128, 64 }, outputs = 10 },
  data = train, seed = 1, schedule = sched,
}
local edits, deadline = EDITS, taper.clock() + 120
for epoch in run:epochs(100000) do
  for batch in run:batches() do
    run:step(batch)
    run:reload_point()
  end
  if taper.generation >= edits or taper.clock() > deadline then break end
end
"#;

fn save(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("lua.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

fn schedule(i: usize) -> String {
    format!(
        "return function(step, epoch) return {{ lr = {} }} end\n",
        1e-3 / (i + 1) as f64
    )
}

pub fn run(edits: usize, interval_ms: u64) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("taper-bench-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let recipe = dir.join("recipe.lua");
    let sched = dir.join("sched.lua");
    std::fs::write(&recipe, RECIPE.replace("EDITS", &edits.to_string()))
        .map_err(|e| Error::io(&recipe, e))?;
    std::fs::write(&sched, schedule(0)).map_err(|e| Error::io(&sched, e))?;
    let out = dir.join("out");
    let opts = HostOptions {
        out_dir: Some(out.clone()),
        watch: true,
        ..HostOptions::default()
    };
    let mut host = Host::new(opts)?;
    let writer = {
        let sched = sched.clone();
        std::thread::spawn(move || {
            for i in 1..=edits {
                std::thread::sleep(Duration::from_millis(interval_ms));
                if save(&sched, &schedule(i)).is_err() {
                    return;
                }
            }
        })
    };
    let result = host.run_file(&recipe);
    let _ = writer.join();
    result?;
    let text =
        std::fs::read_to_string(out.join("metrics.jsonl")).map_err(|e| Error::io(&out, e))?;
    let records: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let pick = |event: &str, key: &str| -> Vec<f64> {
        records
            .iter()
            .filter(|r| r["event"] == event)
            .filter_map(|r| r[key].as_f64())
            .collect()
    };
    let ok = records
        .iter()
        .filter(|r| r["event"] == "reload" && r["ok"] == true)
        .count();
    let (mut latency, mut pause) = (pick("reload", "latency_ms"), pick("reload", "pause_ms"));
    if latency.is_empty() || pause.is_empty() {
        return Err(Error::Script(format!(
            "no reload was applied; see {}",
            out.join("metrics.jsonl").display()
        )));
    }
    let (secs, steps) = (pick("epoch", "seconds"), pick("epoch", "step"));
    let step_ms = if steps.len() > 1 {
        let n = steps[steps.len() - 1] - steps[0];
        secs[1..].iter().sum::<f64>() * 1e3 / n.max(1.0)
    } else {
        f64::NAN
    };
    let range = |v: &[f64]| {
        let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        (lo, hi)
    };
    println!(
        "reload (digits MLP 64-128-64-10, batch 32, a safe point after every step; {ok} of {edits} saves applied, debounce {} ms):",
        crate::host::reload::DEBOUNCE.as_millis()
    );
    let (lo, hi) = range(&latency);
    println!(
        "  save to applied: median {:.1} ms (min {lo:.1}, max {hi:.1})",
        median(&mut latency)
    );
    let (lo, hi) = range(&pause);
    println!(
        "  pause (new version loaded, set up and swapped in): median {:.2} ms (min {lo:.2}, max {hi:.2}); one training step {step_ms:.2} ms",
        median(&mut pause)
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
