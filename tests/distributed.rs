//! Data-parallel runs on real MPI ranks (`taper launch`, Open MPI from
//! Debian): the same weights as one process with the same global batch, an
//! OOM on one rank recovered on all, a rank killed or hung, a stop and a
//! resume. Needs `--features mpi` (`.ci/run` builds and runs it).
#![cfg(feature = "mpi")]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use serde_json::Value;
use taper::engine::checkpoint;

mod common;
use common::records;

const DEADLINE: Duration = Duration::from_secs(180);

fn taper(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_taper"));
    c.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

const DIGITS: &[&str] = &["scripts/digits.lua", "--set", "epochs=2"];
/// Penguins weighs its classes ("balanced"): the ranks' shards of a batch
/// differ in weight, and each divides by the whole batch's.
const PENGUINS: &[&str] = &["scripts/penguins.lua", "--set", "epochs=20"];
/// A short run of the Shakespeare GPT: 4 steps, a small evaluation.
const SHAKESPEARE: &[&str] = &[
    "scripts/shakespeare.lua",
    "--set",
    "epochs=1",
    "--set",
    "steps=4",
    "--set",
    "sample=0",
    "--set",
    "val_windows=64",
];

/// `taper train` (ranks = 0) or `taper launch -n RANKS`, to completion.
fn train(ranks: usize, recipe: &[&str], out: &Path, extra: &[&str]) -> Output {
    let n = ranks.to_string();
    let mut args: Vec<&str> = if ranks == 0 {
        vec!["train"]
    } else {
        vec!["launch", "-n", &n]
    };
    args.extend_from_slice(recipe);
    args.extend(["--quiet", "--out", s(out)]);
    args.extend_from_slice(extra);
    let o = taper(&args).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        std::fs::read_to_string(out.join("rank1.log")).unwrap_or_default()
    );
    o
}

fn weights(out: &Path) -> Vec<(String, Vec<f64>)> {
    let (t, _) = checkpoint::load(&out.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    let mut v: Vec<_> = t
        .into_iter()
        .filter(|(k, _)| k.starts_with("model."))
        .map(|(k, t)| {
            let t = t.flatten_all().unwrap().to_dtype(DType::F64).unwrap();
            (k, t.to_vec1::<f64>().unwrap())
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!v.is_empty());
    v
}

/// The largest per-tensor relative difference, ||a - b|| / ||b|| (the
/// measure of tests/accumulation.rs). The keys' third of a GPT's qkv bias
/// is left out: softmax ignores a shift of a query's scores, so its
/// gradient is zero but for rounding, and AdamW turns that noise into
/// steps of the learning rate, whatever the order of the sums.
fn rel_diff(a: &[(String, Vec<f64>)], b: &[(String, Vec<f64>)]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|((ka, a), (kb, b))| {
            assert_eq!(ka, kb);
            let keys = if ka.ends_with("attn.qkv.bias") {
                a.len() / 3..2 * a.len() / 3
            } else {
                0..0
            };
            let (mut d, mut n) = (0f64, 0f64);
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                if !keys.contains(&i) {
                    d += (x - y).powi(2);
                    n += y.powi(2);
                }
            }
            (d / n.max(f64::MIN_POSITIVE)).sqrt()
        })
        .fold(0.0, f64::max)
}

#[test]
fn two_and_four_ranks_train_to_the_weights_of_one_process() {
    let dir = tempfile::tempdir().unwrap();
    for (name, recipe) in [
        ("digits", DIGITS),
        ("shakespeare", SHAKESPEARE),
        ("penguins", PENGUINS),
    ] {
        let one = dir.path().join(format!("{name}-1"));
        train(0, recipe, &one, &[]);
        let reference = weights(&one);
        for ranks in [2, 4] {
            let out = dir.path().join(format!("{name}-{ranks}"));
            train(ranks, recipe, &out, &[]);
            let d = rel_diff(&weights(&out), &reference);
            assert!(d < 1e-6, "{name}, {ranks} ranks: weights differ by {d}");
            let run = &records(&out, "run")[0];
            assert_eq!(run["ranks"], ranks, "{run}");
            // Only rank 0 writes records and checkpoints; the others log.
            let log = std::fs::read_to_string(out.join("rank1.log")).unwrap();
            assert!(log.contains(&format!("rank 1 of {ranks}")), "{log}");
            assert!(!out.join("rank0.log").exists());
            // The evaluation is summed over the ranks' shards: the same as
            // one process's.
            let (e1, e) = (&records(&one, "eval")[0], &records(&out, "eval")[0]);
            assert_eq!(e["samples"], e1["samples"], "{e}");
            let (l1, l) = (e1["loss"].as_f64().unwrap(), e["loss"].as_f64().unwrap());
            assert!((l - l1).abs() <= 1e-5 * l1, "{name}: eval loss {l} vs {l1}");
        }
    }
    // Two ranks sum the same two halves of each batch as one process in
    // micro-batches of 16: the same weights, bitwise, key bias and all.
    let micro = dir.path().join("shakespeare-micro16");
    let mut recipe = SHAKESPEARE.to_vec();
    recipe.extend(["--set", "micro_batch=16"]);
    train(0, &recipe, &micro, &[]);
    let (a, b) = (weights(&dir.path().join("shakespeare-2")), weights(&micro));
    assert!(
        a == b,
        "2 ranks vs micro-batches of 16: {}",
        rel_diff(&a, &b)
    );
}

#[test]
fn an_oom_on_one_rank_in_any_phase_is_recovered_the_same_way_on_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = &["scripts/digits.lua", "--set", "epochs=1"];
    let plain = dir.path().join("plain");
    train(2, recipe, &plain, &[]);
    let reference = weights(&plain);
    for phase in [
        "upload",
        "forward",
        "backward",
        "accumulate",
        "optimizer",
        "eval",
    ] {
        let out = dir.path().join(phase);
        // 45 steps to the epoch; its evaluation counts as step 46.
        let step = if phase == "eval" { 46 } else { 3 };
        let spec = format!("step={step},phase={phase},rank=1");
        train(2, recipe, &out, &["--inject-oom", &spec]);
        let ooms = records(&out, "oom");
        assert_eq!(ooms.len(), 1, "{phase}: {ooms:?}");
        let oom = &ooms[0];
        assert_eq!(oom["phase"], phase, "{oom}");
        assert_eq!(oom["action"], "split", "{oom}");
        // Rank 0 decided for both ranks, which split alike: micro-batches
        // are per rank (a training shard of 16, an evaluation one of 128).
        assert_eq!(oom["ranks"], serde_json::json!([1]), "{oom}");
        let (from, to) = if phase == "eval" { (128, 64) } else { (16, 8) };
        assert_eq!(oom["micro_batch"], from, "{oom}");
        assert_eq!(oom["new_micro_batch"], to, "{oom}");
        let log = std::fs::read_to_string(out.join("rank1.log")).unwrap();
        let line = format!(
            "OOM at step {step} ({phase}, injected), attempt 1: split micro-batch {from} -> {to}"
        );
        assert!(log.contains(&line), "{log}");
        let (e, e0) = (&records(&out, "eval")[0], &records(&plain, "eval")[0]);
        let (l, l0) = (e["loss"].as_f64().unwrap(), e0["loss"].as_f64().unwrap());
        assert!(
            (l - l0).abs() <= 1e-6 * l0,
            "{phase}: eval loss {l} vs {l0}"
        );
        // The ranks' confusion matrices add up to one process's.
        assert_eq!(e["confusion"], e0["confusion"], "{phase}");
        let counted: u64 = e["confusion"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r.as_array().unwrap())
            .map(|c| c.as_u64().unwrap())
            .sum();
        assert_eq!(Some(counted), e["samples"].as_u64(), "{phase}: {e}");
        let d = rel_diff(&weights(&out), &reference);
        assert!(d < 1e-6, "{phase}: weights differ by {d}");
    }
}

/// The collective's own buffers count against the memory budget: on a
/// model of eight equal layers, the gradient bucket the all-reduce sums
/// (every parameter's gradient, 4 bytes each) sets the step's peak, so a
/// limit half a bucket under the unconstrained peak is crossed by an
/// allocation of exactly the bucket's bytes.
#[test]
fn the_gradient_bucket_counts_against_the_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("deep.lua");
    std::fs::write(
        &recipe,
        r#"local train = taper.data.digits{ split = "train" }:shuffle{ seed = 1 }:batch(32)
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 256, 256, 256, 256, 256, 256, 256, 256 }, outputs = 10 },
  optim = taper.optim.adamw{ lr = 1e-3 },
  data = train, seed = 1,
  on_oom = function(e) return "stop" end,
}
for epoch in run:epochs(1) do
  for batch in run:batches() do run:step(batch) end
end
"#,
    )
    .unwrap();
    let free = dir.path().join("free");
    train(2, &[s(&recipe)], &free, &[]);
    let params = records(&free, "run")[0]["parameters"].as_u64().unwrap();
    let peak = records(&free, "epoch")[0]["memory_peak"].as_u64().unwrap();
    let bucket = 4 * params;
    let tight = dir.path().join("tight");
    let limit = (peak - bucket / 2).to_string();
    let o = taper(&[
        "launch",
        "-n",
        "2",
        s(&recipe),
        "--quiet",
        "--out",
        s(&tight),
        "--mem-limit",
        &limit,
    ])
    .output()
    .unwrap();
    assert!(!o.status.success(), "the policy stops the run");
    let ooms = records(&tight, "oom");
    assert!(!ooms.is_empty(), "{}", String::from_utf8_lossy(&o.stderr));
    let oom = &ooms[0];
    assert_eq!(oom["cause"], "budget", "{oom}");
    assert_eq!(
        oom["requested"], bucket,
        "the bucket crossed the limit: {oom}"
    );
    assert!(
        ["accumulate", "optimizer"].contains(&oom["phase"].as_str().unwrap()),
        "{oom}"
    );
}

/// `taper launch` in the background, long enough to be stopped.
fn start_long(out: &Path, extra: &[&str]) -> Child {
    let mut args = vec![
        "launch",
        "-n",
        "2",
        "scripts/digits.lua",
        "--set",
        "epochs=400",
        "--quiet",
        "--checkpoint-every",
        "never",
        "--out",
        s(out),
    ];
    args.extend_from_slice(extra);
    taper(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Rank 1's pid, once it has trained a few epochs.
fn rank1_pid(child: &mut Child, out: &Path) -> i32 {
    let start = Instant::now();
    loop {
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        assert!(start.elapsed() < DEADLINE, "no rank 1");
        let log = std::fs::read_to_string(out.join("rank1.log")).unwrap_or_default();
        if records(out, "epoch").len() >= 3 {
            let pid = log
                .split("(pid ")
                .nth(1)
                .and_then(|r| r.split(')').next())
                .and_then(|p| p.parse().ok());
            if let Some(pid) = pid {
                return pid;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for the launcher; the seconds it took after `from`.
fn wait(mut child: Child, from: Instant) -> (Output, f64) {
    while child.try_wait().unwrap().is_none() {
        assert!(from.elapsed() < DEADLINE, "the ranks did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    let secs = from.elapsed().as_secs_f64();
    (child.wait_with_output().unwrap(), secs)
}

fn checkpoint_record(out: &Path) -> Value {
    let cks = records(out, "checkpoint");
    assert_eq!(cks.len(), 1, "{cks:?}");
    assert!(out.join("checkpoint.safetensors").exists());
    cks[0].clone()
}

#[test]
fn a_rank_killed_or_hung_stops_the_others_with_rank_0s_checkpoint() {
    let dir = tempfile::tempdir().unwrap();

    // kill -9: mpirun sees it and sends SIGTERM to rank 0, which stops at
    // once with its checkpoint.
    let out = dir.path().join("killed");
    let mut child = start_long(&out, &["--rank-timeout", "20s"]);
    let pid = rank1_pid(&mut child, &out);
    let at = Instant::now();
    // SAFETY: signalling a process of this test.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let (o, secs) = wait(child, at);
    assert!(!o.status.success());
    assert!(secs < 20.0, "rank 0 took {secs:.1}s to stop");
    let ck = checkpoint_record(&out);
    assert!(ck["step"].as_u64().unwrap() > 0, "{ck}");

    // A hung rank (SIGSTOP) is noticed by rank 0's timeout: exit 4.
    let out = dir.path().join("hung");
    let mut child = start_long(&out, &["--rank-timeout", "3s"]);
    let pid = rank1_pid(&mut child, &out);
    let at = Instant::now();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let (o, secs) = wait(child, at);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("no answer from every rank within 3s (--rank-timeout)"),
        "{stderr}"
    );
    assert!(secs < 15.0, "rank 0 took {secs:.1}s to stop");
    assert_eq!(checkpoint_record(&out)["reason"], "failed");
    // SAFETY: as above; mpirun has ended the job, and the rank with it.
    unsafe { libc::kill(pid, libc::SIGKILL) };

    // Both continue on two ranks from rank 0's checkpoint.
    train(
        2,
        &["scripts/digits.lua", "--set", "epochs=120"],
        &out,
        &["--resume", "auto"],
    );
    let log = std::fs::read_to_string(out.join("rank1.log")).unwrap();
    assert!(log.contains("resumed from"), "{log}");
}

#[test]
fn a_stopped_data_parallel_run_resumes_on_every_rank_to_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = &["scripts/digits.lua", "--set", "epochs=60"];
    let straight = dir.path().join("straight");
    train(2, recipe, &straight, &[]);

    let out = dir.path().join("stopped");
    let mut args = vec!["launch", "-n", "2"];
    args.extend_from_slice(recipe);
    args.extend(["--quiet", "--checkpoint-every", "never", "--out", s(&out)]);
    let mut child = taper(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while records(&out, "epoch").len() < 5 {
        assert!(child.try_wait().unwrap().is_none(), "ended before epoch 5");
        assert!(start.elapsed() < DEADLINE);
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: signalling our own child (the launcher passes it on).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (o, _) = wait(child, Instant::now());
    assert_eq!(
        o.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(checkpoint_record(&out)["reason"], "interrupted");
    let stopped_at = records(&out, "checkpoint")[0]["step"].as_u64().unwrap();
    assert!(stopped_at < 60 * 45, "stopped at {stopped_at}");

    // `--resume RUN_DIR` continues in that folder, as `taper train` does.
    let mut args = vec!["launch", "-n", "2"];
    args.extend_from_slice(recipe);
    args.extend(["--quiet", "--resume", s(&out)]);
    let o = taper(&args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        weights(&out),
        weights(&straight),
        "two ranks resume bitwise where they stopped"
    );
}

/// A SIGUSR1 to `taper launch` (Slurm's warning before a time limit) is
/// passed on: rank 0 saves a checkpoint, and the ranks train on.
#[test]
fn sigusr1_to_taper_launch_saves_rank_0s_checkpoint_and_the_ranks_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("usr1");
    let mut child = start_long(&out, &[]);
    rank1_pid(&mut child, &out);
    // SAFETY: signalling our own child (the launcher passes it on).
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
    let start = Instant::now();
    let saved = loop {
        assert!(child.try_wait().unwrap().is_none(), "the run ended");
        assert!(start.elapsed() < DEADLINE, "no SIGUSR1 checkpoint");
        if let Some(r) = records(&out, "checkpoint").pop() {
            break r;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(saved["reason"], "SIGUSR1", "{saved}");
    let epoch = saved["epoch"].as_u64().unwrap();
    while records(&out, "epoch").len() < epoch as usize + 2 {
        assert!(child.try_wait().unwrap().is_none(), "the run ended");
        assert!(start.elapsed() < DEADLINE, "no epoch after the checkpoint");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (o, _) = wait(child, Instant::now());
    assert_eq!(
        o.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let reasons: Vec<Value> = records(&out, "checkpoint")
        .iter()
        .map(|r| r["reason"].clone())
        .collect();
    assert_eq!(reasons, ["SIGUSR1", "interrupted"]);
}

/// Every rank sees the same summed loss, so a diverged step stops them all
/// at that step, together (exit 1); rank 0 names the checkpoint, and the
/// diverged model is saved by none.
#[test]
fn a_data_parallel_run_that_diverges_stops_on_every_rank_at_that_step() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let args = ["launch", "-n", "2", "scripts/digits.lua", "--quiet"];
    let child = taper(&args)
        .args(["--set", "lr=1e30", "--out", s(&out)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (o, secs) = wait(child, Instant::now());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(secs < 30.0, "the ranks took {secs:.1}s to stop");
    let says = "digits.lua:31: run:step: the loss of step 2 (epoch 1, batch 2) is NaN: the training diverged";
    assert!(
        stderr.contains(&format!("{says} (lower the learning rate, now 1e30,"))
            && stderr.contains("no checkpoint was written before it: start again"),
        "{stderr}"
    );
    let log = std::fs::read_to_string(out.join("rank1.log")).unwrap();
    assert!(
        log.contains(says) && log.contains("rank 0 names the checkpoint to go back to"),
        "{log}"
    );
    assert_eq!(records(&out, "diverged").len(), 1);
    assert!(records(&out, "checkpoint").is_empty());
}

#[test]
fn launch_and_rank_options_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("w");
    let o = taper(&[
        "launch",
        "-n",
        "2",
        "scripts/digits.lua",
        "--watch",
        "--out",
        s(&out),
    ])
    .output()
    .unwrap();
    assert!(!o.status.success());
    let err = std::fs::read_to_string(out.join("rank1.log")).unwrap_or_default()
        + &String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--watch is not available with several ranks"),
        "{err}"
    );

    let o = taper(&[
        "train",
        "scripts/digits.lua",
        "--inject-oom",
        "step=1,rank=x",
    ])
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("rank `x` is not a rank number"));

    // NCCL is a build of its own (`--features nccl`, on a GPU machine).
    let o = taper(&["train", "scripts/digits.lua", "--collective", "nccl"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("built without NCCL"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Keeping the best model on two ranks: rank 0 writes best.safetensors,
/// every rank stops early at the same evaluation, and `model = "best"`
/// evaluates the file's weights on each (the Lua asserts run on every
/// rank: the best's own score, to the bit, and the run's model back after
/// it); the same best model and stop as one process with the same batch.
#[test]
fn the_best_model_is_kept_and_evaluated_on_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("best.lua");
    std::fs::write(
        &recipe,
        r#"local train, val = taper.data.digits{ split = "train" }:split{ 0.9, 0.1, seed = 1 }
val = val:named("val"):batch(256)
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 64 }, outputs = 10 },
  optim = taper.optim.adamw{ lr = 3e-3 },
  data = train:named("train"):shuffle{ seed = 1 }:batch(32),
}
local last
for epoch in run:epochs(40) do
  for batch in run:batches() do run:step(batch) end
  last = run:evaluate(val, { keep_best = "loss", patience = 3 })
end
assert(run.best.stopped and run.best.path, "stopped, with the file's path")
local best = run:evaluate(val, { model = "best" })
assert(best.loss == run.best.value, best.loss .. " vs " .. run.best.value)
assert(run:evaluate(val).loss == last.loss)
"#,
    )
    .unwrap();
    let one = dir.path().join("one");
    train(0, &[s(&recipe)], &one, &[]);
    let two = dir.path().join("two");
    train(2, &[s(&recipe)], &two, &[]);
    let stop = |out: &Path| records(out, "early_stop")[0]["step"].clone();
    assert_eq!(stop(&two), stop(&one));
    let best = |out: &Path| {
        let (t, _) = checkpoint::load(&out.join("best.safetensors"), &Device::Cpu).unwrap();
        let mut w: Vec<(String, Vec<f32>)> = t
            .into_iter()
            .filter(|(k, _)| k.starts_with("model."))
            .map(|(k, v)| (k, v.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
            .collect();
        w.sort_by(|a, b| a.0.cmp(&b.0));
        w
    };
    // Sums over ranks round otherwise than over one batch: close, not
    // bitwise, after the epochs to the best.
    let (a, b) = (best(&one), best(&two));
    assert_eq!(a.len(), b.len());
    let worst = a
        .iter()
        .zip(&b)
        .flat_map(|(x, y)| {
            x.1.iter()
                .zip(&y.1)
                .map(|(p, q)| (p - q).abs() / p.abs().max(1e-2))
        })
        .fold(0f32, f32::max);
    assert!(worst < 1e-3, "best models differ by {worst} (relative)");
}
