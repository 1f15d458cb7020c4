//! Runs that are not lost: a real SIGTERM, SIGINT or SIGKILL at a moment of
//! the run, then `--resume auto` with the same command, ends with the same
//! weights as a run that was never stopped (bitwise, on the CPU). Drills
//! (`drills.rs`) do it 20 times at random moments; `checkpoints.rs` checks
//! what is on disk: checksums, older checkpoints kept, sidecars.

mod checkpoints;
#[path = "../common/mod.rs"]
mod common;
mod drills;
mod permissions;
mod recipes;
mod save_signal;
mod terminal;

use common::records;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use serde_json::{json, Value};
use taper::engine::checkpoint;

const DEADLINE: Duration = Duration::from_secs(120);

fn cmd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_taper"));
    c.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The digits recipe, long enough to be stopped in the middle.
const DIGITS: &[&str] = &["scripts/digits.lua", "--set", "epochs=120"];

/// `taper train RECIPE SETS... --quiet --out OUT EXTRA...`
fn recipe_args<'a>(recipe: &[&'a str], out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["train"];
    a.extend_from_slice(recipe);
    a.extend(["--quiet", "--out", s(out)]);
    a.extend_from_slice(extra);
    a
}

fn train_args<'a>(out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    recipe_args(DIGITS, out, extra)
}

/// Waits until `out` holds `n` epoch records, failing if the run ends first.
fn wait_for_epochs(child: &mut Child, out: &Path, n: usize) {
    wait_until(child, &format!("epoch {n}"), || {
        records(out, "epoch").len() >= n
    });
}

/// Waits until `ready`, failing if the run ends first (`what` names the
/// moment waited for).
fn wait_until(child: &mut Child, what: &str, ready: impl Fn() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before {what}"
        );
        assert!(start.elapsed() < DEADLINE, "no {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait(mut child: Child) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < DEADLINE, "taper did not stop");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn weights(path: &Path) -> Vec<(String, Vec<f64>)> {
    let (t, _) = checkpoint::load(path, &Device::Cpu).unwrap();
    let mut v: Vec<_> = t
        .into_iter()
        .map(|(k, t)| {
            let t = t.flatten_all().unwrap().to_dtype(DType::F64).unwrap();
            (k, t.to_vec1::<f64>().unwrap())
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn straight(dir: &Path) -> PathBuf {
    straight_run(DIGITS, dir)
}

fn straight_run(recipe: &[&str], dir: &Path) -> PathBuf {
    let out = dir.join("straight");
    let o = cmd(&recipe_args(recipe, &out, &[])).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out.join("checkpoint.safetensors")
}

/// Starts the run, stops it with `signal` after `epochs` epochs, checks how
/// it ended, resumes it with the same command plus `--resume auto`, and
/// returns its final checkpoint.
fn stopped_and_resumed(out: &Path, signal: i32, epochs: usize, extra: &[&str]) -> PathBuf {
    stop_and_resume(DIGITS, out, signal, epochs, extra)
}

fn stop_and_resume(
    recipe: &[&str],
    out: &Path,
    signal: i32,
    epochs: usize,
    extra: &[&str],
) -> PathBuf {
    stop_and_resume_when(recipe, out, signal, extra, |child| {
        wait_for_epochs(child, out, epochs)
    })
}

/// [`stop_and_resume`], stopping the run once `ready` (which waits on it)
/// returns.
fn stop_and_resume_when(
    recipe: &[&str],
    out: &Path,
    signal: i32,
    extra: &[&str],
    ready: impl FnOnce(&mut Child),
) -> PathBuf {
    let mut child = cmd(&recipe_args(recipe, out, extra))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    ready(&mut child);
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    let o = wait(child);
    let err = String::from_utf8_lossy(&o.stderr);
    if signal == libc::SIGKILL {
        assert_eq!(o.status.code(), None, "{err}");
    } else {
        assert_eq!(o.status.code(), Some(128 + signal), "{err}");
        assert!(err.contains("stopped at a step boundary"), "{err}");
        let last = records(out, "checkpoint")
            .pop()
            .expect("a checkpoint record");
        assert_eq!(last["reason"], "interrupted", "{last}");
    }
    let mut again = recipe_args(recipe, out, extra);
    again.extend(["--resume", "auto"]);
    let o = cmd(&again).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out.join("checkpoint.safetensors")
}

#[test]
fn sigterm_and_sigint_stop_with_a_checkpoint_and_resume_to_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    let reference = weights(&straight(dir.path()));
    for (signal, epochs) in [(libc::SIGTERM, 2), (libc::SIGINT, 7), (libc::SIGHUP, 13)] {
        let out = dir.path().join(format!("signal-{signal}"));
        let end = stopped_and_resumed(&out, signal, epochs, &["--checkpoint-every", "never"]);
        assert!(
            weights(&end) == reference,
            "signal {signal}: weights differ"
        );
        // One run's records, appended: every epoch once.
        let epochs: Vec<u64> = records(&out, "epoch")
            .iter()
            .map(|r| r["epoch"].as_u64().unwrap())
            .collect();
        assert_eq!(epochs, (1..=120).collect::<Vec<_>>(), "signal {signal}");
        // Their time goes on across the resume: it never runs backwards.
        let times: Vec<f64> = std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["time"]
                    .as_f64()
                    .unwrap()
            })
            .collect();
        assert!(
            times.windows(2).all(|w| w[0] <= w[1]),
            "signal {signal}: time runs backwards"
        );
    }
}

#[test]
fn sigkill_loses_at_most_the_checkpoint_period_and_resumes_to_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    let reference = weights(&straight(dir.path()));
    let out = dir.path().join("killed");
    let end = stopped_and_resumed(&out, libc::SIGKILL, 5, &["--checkpoint-every", "30"]);
    assert!(weights(&end) == reference, "weights differ");
    // The resumed run started from the last periodic checkpoint: at most 30
    // steps before the kill.
    let runs = records(&out, "run");
    assert_eq!(runs.len(), 2);
    let resumed_at = runs[1]["step"].as_u64().unwrap();
    assert!(resumed_at >= 5 * 45 - 30, "resumed at step {resumed_at}");
    assert_eq!(resumed_at % 30, 0);
}

/// Starts `recipe` into `out` and waits for its first `log` record.
fn started_until_it_logs(recipe: &Path, out: &Path) -> Child {
    let mut child = cmd(&["train", s(recipe), "--quiet", "--out", s(out)])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while records(out, "log").is_empty() {
        assert!(child.try_wait().unwrap().is_none(), "ended early");
        assert!(start.elapsed() < DEADLINE, "no log record");
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

#[test]
fn a_recipe_stuck_in_a_loop_stops_on_sigint_with_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("loop.lua");
    std::fs::write(
        &recipe,
        r#"local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 16 }, outputs = 10 },
  data = taper.data.digits{ split = "train" }:batch(32),
}
local n = 0
for batch in run:batches() do
  run:step(batch)
  n = n + 1
  if n == 3 then break end
end
run:log{ looping = true }
while true do end
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let child = started_until_it_logs(&recipe, &out);
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let o = wait(child);
    assert_eq!(
        o.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (_, meta) = checkpoint::load(&out.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(meta.step, 3);
}

/// Sends `signal` to `child` and waits for it to end, failing if `what`
/// goes on for 10 s after it.
fn stopped_by(mut child: Child, signal: i32, what: &str) -> Output {
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    let signalled = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if signalled.elapsed() > Duration::from_secs(10) {
            child.kill().unwrap();
            panic!("{what} went on for 10 s after signal {signal}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// A signal during a long evaluation stops it between its batches (Slurm
/// gives a job 30 s after SIGTERM, and an evaluation can take minutes):
/// the checkpoint of the steps taken is written and no partial `eval`
/// record is. The whole evaluation takes over a minute here.
#[test]
fn a_signal_stops_a_long_evaluation_with_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("eval.lua");
    std::fs::write(
        &recipe,
        r#"local run = taper.run{
  model = taper.model.gpt{ vocab = 67, context = 64 },
  data = taper.data.shakespeare{ split = "train" }:batch(16),
}
local val = taper.data.shakespeare{ split = "val", stride = 1 }:batch(64)
for _ in run:epochs(1) do
  local n = 0
  for batch in run:batches() do
    run:step(batch)
    n = n + 1
    if n == 3 then break end
  end
  run:log{ evaluating = #val }
  run:evaluate(val)
end
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let child = started_until_it_logs(&recipe, &out);
    std::thread::sleep(Duration::from_millis(500));
    let o = stopped_by(child, libc::SIGTERM, "the evaluation");
    assert_eq!(
        o.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(records(&out, "eval").is_empty());
    let (_, meta) = checkpoint::load(&out.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(meta.step, 3);
}

/// A signal while the shipped shakespeare recipe samples its text at the
/// end (a million characters: minutes) stops the sampling between tokens:
/// exit 130 and the checkpoint, not a signal swallowed until the end.
#[test]
fn a_signal_stops_a_long_sampling_with_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let args = [
        "train",
        "scripts/shakespeare.lua",
        "--quiet",
        "--out",
        s(&out),
        "--set",
        "steps=3",
        "--set",
        "epochs=1",
        "--set",
        "sample=1000000",
    ];
    let mut child = cmd(&args).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    // The last evaluation is written; the sampling comes after it.
    while records(&out, "eval").is_empty() {
        assert!(child.try_wait().unwrap().is_none(), "ended early");
        assert!(start.elapsed() < DEADLINE, "no eval record");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    let o = stopped_by(child, libc::SIGINT, "the sampling");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted by SIGINT"), "{err}");
    let (_, meta) = checkpoint::load(&out.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(meta.step, 3);
}

/// A signal while `data:standardize()` reads the 10,000 training images of
/// Fashion-MNIST for their statistics (about 2 s at 56 x 56) stops the
/// reading between its chunks: the line after it never runs.
#[test]
fn a_signal_stops_standardize_between_its_chunks() {
    common::fetched("data/fashion-mnist-png/train/bag").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("standardize.lua");
    let folder = std::fs::canonicalize("data/fashion-mnist-png/train").unwrap();
    std::fs::write(
        &recipe,
        format!(
            r#"local folder = taper.data.images{{ path = "{}", size = {{ 56, 56 }}, channels = 1 }}
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 56 * 56, hidden = {{ 8 }}, outputs = 10 }},
  data = folder:batch(64),
}}
run:log{{ standardizing = true }}
local standardized = folder:standardize()
run:log{{ standardized = true }}
"#,
            folder.display()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let child = started_until_it_logs(&recipe, &out);
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let o = wait(child);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted by SIGINT"), "{err}");
    let logs = records(&out, "log");
    assert!(
        logs.iter().all(|r| r.get("standardized").is_none()),
        "standardize ran to its end: {logs:?}"
    );
}

/// A signal while `run:reload_point{ wait = 600 }` waits for an edit stops
/// the wait, and the run, with its checkpoint.
#[test]
fn a_signal_stops_a_reload_point_waiting_for_an_edit() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("wait.lua");
    std::fs::write(
        &recipe,
        r#"local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 16 }, outputs = 10 },
  data = taper.data.digits{}:batch(32), watch = true,
}
for _ in run:epochs(1) do
  for b in run:batches() do
    run:step(b)
    if run.steps == 5 then
      run:log{ waiting = true }
      run:reload_point{ wait = 600 }
    end
  end
end
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let child = started_until_it_logs(&recipe, &out);
    let o = stopped_by(child, libc::SIGINT, "run:reload_point's wait");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    let (_, meta) = checkpoint::load(&out.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(meta.step, 5);
}

/// A run resumed into the middle of an epoch and stopped again before its
/// loop re-entered the epoch (a signal during the recipe's setup, where the
/// Lua hook sees it) keeps the place it was resumed from: the checkpoint it
/// writes is the same place, and the next resume ends with a straight
/// run's weights. (It was saved as the epoch before, complete, and the
/// next resume trained the epoch's first batches again.)
#[test]
fn a_resume_stopped_during_the_recipes_setup_keeps_its_place_in_the_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("hold.lua");
    std::fs::write(
        &recipe,
        r#"local cfg = taper.config{ hold = false, exit_at = 0 }
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 16 }, outputs = 10 },
  data = taper.data.digits{}:shuffle{ seed = 1 }:batch(32), seed = 1,
}
if cfg.hold then
  run:log{ holding = true }
  while true do end
end
for _ in run:epochs(3) do
  for b in run:batches() do
    run:step(b)
    if run.steps == cfg.exit_at then os.exit(3) end
  end
end
"#,
    )
    .unwrap();
    let train = |out: &Path, sets: &[&str]| {
        let mut a = vec!["train", s(&recipe), "--quiet", "--out", s(out)];
        for set in sets {
            a.extend(["--set", set]);
        }
        a.extend(["--resume", "auto"]);
        cmd(&a)
    };
    let straight = dir.path().join("straight");
    assert!(train(&straight, &[]).status().unwrap().success());
    let out = dir.path().join("out");
    // Stopped at step 50: epoch 2, after its 5th batch.
    assert_eq!(
        train(&out, &["exit_at=50"]).status().unwrap().code(),
        Some(3)
    );
    let mut child = train(&out, &["hold=true"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(&mut child, "the hold", || !records(&out, "log").is_empty());
    let o = stopped_by(child, libc::SIGINT, "the recipe's setup");
    assert_eq!(
        o.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let meta = checkpoint::read_meta(&out.join("checkpoint.safetensors")).unwrap();
    assert_eq!(
        (meta.step, meta.epoch, meta.epoch_steps, meta.epoch_complete),
        (50, 2, 5, false)
    );
    assert!(train(&out, &[]).status().unwrap().success());
    assert!(
        weights(&out.join("checkpoint.safetensors"))
            == weights(&straight.join("checkpoint.safetensors")),
        "weights differ"
    );
}

/// A run resumed (or reloaded) with fewer epochs than it has trained says
/// so, instead of ending at once without a word; with as many, it is a
/// finished run and says nothing.
#[test]
fn resuming_with_fewer_epochs_than_trained_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let args = |epochs: &'static str, resume: bool| {
        let mut a = recipe_args(&["scripts/digits.lua", "--set", epochs], &out, &[]);
        if resume {
            a.extend(["--resume", "auto"]);
        }
        cmd(&a).output().unwrap()
    };
    assert!(args("epochs=3", false).status.success());
    let fewer = args("epochs=2", true);
    let err = String::from_utf8_lossy(&fewer.stderr);
    assert!(fewer.status.success(), "{err}");
    assert!(
        err.contains("note: run 1 has trained 3 epochs, more than the 2 this loop asks for: it trains no more"),
        "{err}"
    );
    let same = args("epochs=3", true);
    assert!(!String::from_utf8_lossy(&same.stderr).contains("note: run 1 has trained"));
    assert_eq!(records(&out, "epoch").len(), 3);
}

/// A resume under another `--seed` says that what the seed draws (the
/// data's shuffles among it) follows the new one; the same seed says
/// nothing.
#[test]
fn resuming_under_another_seed_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let run = |epochs: &'static str, seed: &'static str| {
        let mut a = recipe_args(
            &["scripts/digits.lua", "--set", epochs],
            &out,
            &["--seed", seed],
        );
        a.extend(["--resume", "auto"]);
        let o = cmd(&a).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{err}");
        err
    };
    run("epochs=2", "0");
    let says = "note: the run's seed differs from the one";
    let other = run("epochs=3", "5");
    assert!(
        other.contains(says) && other.contains("a changed --seed reorders the data's shuffles too"),
        "{other}"
    );
    assert!(!other.contains("the epoch in progress"), "{other}");
    let same = run("epochs=4", "5");
    assert!(!same.contains(says), "{same}");
}

/// A checkpoint of a classifier keeps its class names: resuming on data
/// whose classes differ (a class folder renamed, so label 0 means another
/// class) is refused, naming the difference, and the checkpoint is kept;
/// on the data it was trained on, the run goes on.
#[test]
fn resuming_on_data_with_other_classes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("pets");
    for (split, class, n) in [
        ("train", "cat", 6),
        ("train", "dog", 6),
        ("val", "cat", 2),
        ("val", "dog", 2),
    ] {
        let folder = data.join(split).join(class);
        std::fs::create_dir_all(&folder).unwrap();
        for i in 0..n {
            let v = if class == "cat" { 40 } else { 200 } + i as u8;
            image::GrayImage::from_pixel(6, 6, image::Luma([v]))
                .save(folder.join(format!("{i}.png")))
                .unwrap();
        }
    }
    let out = dir.path().join("out");
    let set = format!("data={}", s(&data));
    let train = |epochs: &'static str| {
        let recipe = ["scripts/image_folder.lua", "--set", &set, "--set", "size=4"];
        let mut a = recipe_args(&recipe, &out, &["--set", epochs]);
        a.extend(["--resume", "auto"]);
        cmd(&a).output().unwrap()
    };
    assert!(train("epochs=1").status.success());
    let meta = checkpoint::read_meta(&out.join("checkpoint.safetensors")).unwrap();
    assert_eq!(meta.classes.unwrap(), ["cat", "dog"]);
    for split in ["train", "val"] {
        std::fs::rename(data.join(split).join("cat"), data.join(split).join("bird")).unwrap();
    }
    let o = train("epochs=2");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the data's classes (2) are not the checkpoint's (2): without `cat`, with `bird` besides; label 0 is `bird` in the data's and `cat` in the checkpoint's"),
        "{err}"
    );
    assert_eq!(records(&out, "epoch").len(), 1);
    for split in ["train", "val"] {
        std::fs::rename(data.join(split).join("bird"), data.join(split).join("cat")).unwrap();
    }
    let o = train("epochs=2");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(records(&out, "epoch").len(), 2);
}

#[test]
fn resume_arguments_and_run_folders_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let missing = dir.path().join("nope.safetensors");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--resume", s(&missing)],
            "no such checkpoint file or run folder",
        ),
        (
            vec!["--resume", s(&empty)],
            "the folder holds no checkpoint.safetensors",
        ),
    ];
    for (extra, says) in cases {
        let mut args = vec![
            "train",
            "scripts/digits.lua",
            "--quiet",
            "--set",
            "epochs=1",
        ];
        args.extend(extra);
        let o = cmd(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(!err.contains("traceback"), "{err}");
    }
    // A fresh run into a folder that holds a run is refused, and the run's
    // records are left as they were.
    let first = cmd(&train_args(&out, &["--set", "epochs=1"]))
        .output()
        .unwrap();
    assert!(first.status.success());
    let before = std::fs::read(out.join("metrics.jsonl")).unwrap();
    let o = cmd(&train_args(&out, &["--set", "epochs=1"]))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("the folder holds a run"), "{err}");
    assert_eq!(std::fs::read(out.join("metrics.jsonl")).unwrap(), before);
    // `--resume RUN_DIR` continues in that folder.
    let o = cmd(&[
        "train",
        "scripts/digits.lua",
        "--quiet",
        "--set",
        "epochs=2",
        "--resume",
        s(&out),
    ])
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (_, meta) = checkpoint::load(&out.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    assert_eq!((meta.epoch, meta.step), (2, 90));

    // A job killed before its first checkpoint reruns the same command with
    // `--resume auto`: it starts afresh in the folder, appending.
    let job = dir.path().join("job");
    std::fs::create_dir_all(&job).unwrap();
    std::fs::write(job.join("metrics.jsonl"), "{\"event\":\"config\"}\n").unwrap();
    let o = cmd(&train_args(
        &job,
        &["--set", "epochs=1", "--resume", "auto"],
    ))
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("holds no checkpoint") && err.contains("starting at step 0"),
        "says it starts over: {err}"
    );
    assert_eq!(records(&job, "config").len(), 2, "appended");

    // A recipe error before its run began (at `taper.run{}`, after its
    // config record) leaves records and no checkpoint: the same command,
    // fixed, runs there, its records after the attempt's.
    let typo = dir.path().join("typo");
    let o = cmd(&train_args(&typo, &["--set", "lr=-1"]))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(records(&typo, "config").len(), 1);
    let o = cmd(&train_args(&typo, &["--set", "epochs=1"]))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("the attempt before stopped before its run began; its records stay"),
        "{err}"
    );
    assert_eq!(records(&typo, "config").len(), 2, "the attempt's kept");
    assert_eq!(records(&typo, "run").len(), 1);

    // A run that began and was killed before its first checkpoint (its
    // `run` record and a step's, no checkpoint) is a run's records: a
    // fresh run is told how to go on, not written after them.
    let killed = dir.path().join("killed");
    std::fs::create_dir(&killed).unwrap();
    let began = "{\"event\":\"config\"}\n{\"event\":\"run\"}\n{\"event\":\"step\"}\n";
    std::fs::write(killed.join("metrics.jsonl"), began).unwrap();
    let o = cmd(&train_args(&killed, &["--set", "epochs=1"]))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("an earlier run's records (metrics.jsonl) but no checkpoint")
            && err.contains("--resume auto"),
        "{err}"
    );
}

/// `os.exit` in a recipe ends the run through the same path as a signal:
/// a checkpoint and the final records, then the exit code it was given.
#[test]
fn os_exit_in_a_recipe_writes_the_checkpoint_and_exits_with_its_code() {
    for (code, expected, reason) in [("4", 4, "exited"), ("", 0, "final")] {
        let dir = tempfile::tempdir().unwrap();
        let recipe = dir.path().join("exit.lua");
        std::fs::write(
            &recipe,
            format!(
                r#"local run = taper.run{{
  model = taper.model.mlp{{ inputs = 64, hidden = {{ 16 }}, outputs = 10 }},
  data = taper.data.digits{{ split = "train" }}:batch(32),
}}
for epoch in run:epochs(2) do
  for batch in run:batches() do
    run:step(batch)
    if run.steps == 3 then os.exit({code}) end
  end
end
"#
            ),
        )
        .unwrap();
        let out = dir.path().join("out");
        let o = cmd(&["train", s(&recipe), "--quiet", "--out", s(&out)])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(expected), "{err}");
        let (_, meta) =
            checkpoint::load(&out.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
        assert_eq!(meta.step, 3);
        let last = records(&out, "checkpoint").pop().unwrap();
        assert_eq!(last["reason"], reason, "{last}");
    }
}

/// The shipped pruning recipe, stopped in its second fine-tuning phase: the
/// resumed run (which runs the recipe's top level again) prunes each phase
/// once, and ends with the straight run's weights and masks.
#[test]
fn a_pruning_run_stopped_in_a_later_phase_resumes_to_the_same_weights() {
    let recipe = &[
        "scripts/digits_prune.lua",
        "--set",
        "epochs=2",
        "--set",
        "finetune=40",
    ];
    let dir = tempfile::tempdir().unwrap();
    let reference = weights(&straight_run(recipe, dir.path()));
    let out = dir.path().join("stopped");
    // Epoch 50: in the second phase (epochs 43 to 82).
    let end = stop_and_resume(
        recipe,
        &out,
        libc::SIGTERM,
        50,
        &["--checkpoint-every", "never"],
    );
    assert!(weights(&end) == reference, "weights or masks differ");
    let prunes = records(&out, "prune");
    assert_eq!(prunes.len(), 2, "each phase prunes once: {prunes:?}");
}

/// One taper at a time in a run folder: the same command started again
/// while the first still trains (a requeued job whose first copy lives) is
/// refused before it looks at the folder's checkpoints or changes anything,
/// and the first goes on; once the first has stopped, the same command
/// continues the run.
#[test]
fn a_second_taper_in_a_live_run_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let again = train_args(&out, &["--resume", "auto"]);
    let mut first = cmd(&again).stderr(Stdio::piped()).spawn().unwrap();
    wait_for_epochs(&mut first, &out, 2);
    // A damaged checkpoint, newer than any: a second taper must not look
    // at the folder's checkpoints (a resume sets damaged ones aside).
    let junk = out.join("checkpoint.step999.safetensors");
    std::fs::write(&junk, b"not a checkpoint").unwrap();
    let before = std::fs::read_dir(&out).unwrap().count();
    for args in [again.clone(), train_args(&out, &[])] {
        let o = cmd(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        let says = format!(
            "taper: --out {}: another taper is running in this folder (it holds a lock on metrics.jsonl); let it end or stop it, or choose another folder",
            s(&out)
        );
        assert_eq!(err.trim(), says);
    }
    assert!(first.try_wait().unwrap().is_none(), "the first run went on");
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), before);
    std::fs::remove_file(&junk).unwrap();
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(first.id() as i32, libc::SIGINT) }, 0);
    assert_eq!(wait(first).status.code(), Some(130));
    let o = cmd(&again).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let epochs: Vec<u64> = records(&out, "epoch")
        .iter()
        .map(|r| r["epoch"].as_u64().unwrap())
        .collect();
    assert_eq!(epochs, (1..=120).collect::<Vec<_>>());
}
