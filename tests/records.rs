//! What a run writes to `metrics.jsonl` without the recipe asking: `step`
//! records every `--log-every` steps (means over the steps since the last
//! one), even with `--quiet`, consistent with the epoch records; and how the
//! records wait out a full disk.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn train(out: &Path, extra: &[&str]) {
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args([
            "train",
            "scripts/digits.lua",
            "--set",
            "epochs=2",
            "--quiet",
            "--out",
        ])
        .arg(out)
        .args(extra)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        o.stdout.is_empty() && o.stderr.is_empty(),
        "--quiet says nothing"
    );
}

fn records(out: &Path, event: &str) -> Vec<Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["event"] == event)
        .collect()
}

#[test]
fn step_records_are_written_by_default_and_agree_with_the_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("default");
    train(&out, &[]);
    // 45 steps per epoch, a record every 10 steps.
    let steps = records(&out, "step");
    let at: Vec<u64> = steps.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(at, (1..=9).map(|i| i * 10).collect::<Vec<_>>());
    for r in &steps {
        for key in [
            "loss",
            "lr",
            "micro_batch",
            "batch",
            "step_s",
            "data_wait_s",
            "samples_per_s",
        ] {
            assert!(r[key].is_number(), "`{key}` in {r}");
        }
        assert_eq!(r["lr"], 0.003, "{r}");
        assert_eq!(r["steps"], 10, "{r}");
        // The last step's micro-batch: 32, or the short last batch (29).
        assert!(
            [32, 29].contains(&r["micro_batch"].as_u64().unwrap()),
            "{r}"
        );
        assert!(r["step_s"].as_f64().unwrap() > 0.0 && r["samples_per_s"].as_f64().unwrap() > 0.0);
        assert!(
            r.get("tokens_per_s").is_none(),
            "digits has one label per sample"
        );
    }

    // With a record every 5 steps, 9 windows fill each 45-step epoch: their
    // means, weighted by samples, are the epoch's mean loss.
    let out = dir.path().join("every5");
    train(&out, &["--log-every", "5"]);
    let steps = records(&out, "step");
    assert_eq!(steps.len(), 18);
    for (epoch, rec) in records(&out, "epoch").iter().enumerate() {
        let window = &steps[epoch * 9..epoch * 9 + 9];
        let samples: f64 = window
            .iter()
            .map(|r| r["batch"].as_f64().unwrap() * 5.0)
            .sum();
        let loss: f64 = window
            .iter()
            .map(|r| r["loss"].as_f64().unwrap() * r["batch"].as_f64().unwrap() * 5.0)
            .sum::<f64>()
            / samples;
        assert_eq!(samples as u64, rec["samples"].as_u64().unwrap());
        let epoch_loss = rec["loss"].as_f64().unwrap();
        assert!(
            (loss - epoch_loss).abs() < 1e-9 * epoch_loss,
            "{loss} vs {epoch_loss}"
        );
    }

    let out = dir.path().join("none");
    train(&out, &["--log-every", "0"]);
    assert!(records(&out, "step").is_empty());
}

/// A recipe that trains digits for two epochs and, at step `free_at`,
/// removes `metrics.jsonl` from its folder `out`.
const FREED: &str = r#"local cfg = taper.config{ out = "", free_at = 0 }
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 16 }, outputs = 10 },
  data = taper.data.digits{}:batch(32), seed = 1,
}
for _ in run:epochs(2) do
  for b in run:batches() do
    run:step(b)
    if run.steps == cfg.free_at then assert(os.remove(cfg.out .. "/metrics.jsonl")) end
  end
end
"#;

/// Records that cannot be written (here `metrics.jsonl` is a link to
/// `/dev/full`: a real ENOSPC on every write, no mount needed) wait in
/// memory while the run trains on, with one warning; once the file can be
/// written (the link removed at step 35: the next attempt opens the path
/// afresh), they are written in order, with a second warning, and the run
/// ends well with every record.
#[test]
fn records_wait_out_a_full_disk_and_are_written_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("freed.lua");
    std::fs::write(&recipe, FREED).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::os::unix::fs::symlink("/dev/full", out.join("metrics.jsonl")).unwrap();
    let set_out = format!("out={}", out.display());
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(["train", recipe.to_str().unwrap(), "--quiet", "--out"])
        .arg(&out)
        .args(["--set", &set_out, "--set", "free_at=35"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let metrics = out.join("metrics.jsonl");
    let warned: Vec<&str> = err.lines().collect();
    assert_eq!(
        warned,
        [
            format!("taper: warning: the records cannot be written to {}: No space left on device (os error 28); training goes on, and they wait in memory (up to 64 MiB) until the disk has room", metrics.display()),
            format!("taper: warning: the records are written to {} again (5 waited)", metrics.display()),
        ],
        "{err}"
    );
    // Every record, whole and in order: the config and run records, the
    // step records from 10 (the three before step 35 waited), the epochs.
    let all: Vec<Value> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let events: Vec<&str> = all.iter().map(|r| r["event"].as_str().unwrap()).collect();
    assert_eq!(&events[..3], ["config", "run", "step"]);
    let steps: Vec<u64> = records(&out, "step")
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, (1..=9).map(|i| i * 10).collect::<Vec<_>>());
    assert_eq!(records(&out, "epoch").len(), 2);
    assert_eq!(records(&out, "checkpoint")[0]["step"], 90);
}

/// A record cut short by the disk filling during its write is taken back,
/// so that the file holds whole records only. The file-size limit
/// (`RLIMIT_FSIZE`, SIGXFSZ ignored) stops a write part of the way, as a
/// full disk does, and for good: the final checkpoint cannot be written
/// either, and the run ends (exit 1) saying how many records could not be.
#[test]
fn a_record_cut_short_by_a_full_disk_is_taken_back() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    const LIMIT: u64 = 2500;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_taper"));
    cmd.args([
        "train",
        "scripts/digits.lua",
        "--set",
        "epochs=2",
        "--quiet",
        "--out",
    ])
    .arg(&out)
    .args(["--checkpoint-every", "never"])
    .current_dir(env!("CARGO_MANIFEST_DIR"));
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: libc::RLIM_INFINITY,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("records cannot be written") && err.contains("File too large"),
        "{err}"
    );
    assert!(
        err.contains("the final records: ")
            && err.contains(" entries could not be written: File too large"),
        "{err}"
    );
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    assert!(
        text.len() as u64 <= LIMIT && text.len() > 1000,
        "{} bytes",
        text.len()
    );
    assert!(text.ends_with('\n'), "a record cut short: {text}");
    for line in text.lines() {
        serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    }
}

/// A sequence model's `tokens_per_s` counts each sample's positions up to
/// its last labelled one: a conversation's padding (labelled -100) is not a
/// token, as TRL's `num_tokens` counts the attention mask. Both rates are
/// over the same wall clock, so their ratio is the tokens per sample.
#[test]
fn tokens_per_second_leave_out_the_padding_after_the_last_label() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("padded.lua");
    // Sample b of 8 labels positions 1 to b of 12: 1 + ... + 8 = 36 tokens.
    std::fs::write(
        &recipe,
        r#"
local gen = taper.data.generator(function(epoch)
  local n = 0
  return function()
    n = n + 1
    if n > 4 then return nil end
    local x, y = {}, {}
    for b = 1, 8 do
      x[b], y[b] = {}, {}
      for t = 1, 12 do
        x[b][t] = (b + t) % 10
        y[b][t] = t <= b and (b + t + 1) % 10 or -100
      end
    end
    return { x = x, y = y, x_type = "u32" }
  end
end)
local run = taper.run{
  model = taper.model.gpt{ vocab = 10, context = 12, width = 16, layers = 1, heads = 2 },
  data = gen,
}
for _ in run:epochs(1) do
  for b in run:batches() do run:step(b) end
end
"#,
    )
    .unwrap();
    let out = dir.path().join("run");
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(["train", "--quiet", "--log-every", "1", "--out"])
        .arg(&out)
        .arg(&recipe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let steps = records(&out, "step");
    assert_eq!(steps.len(), 4);
    for r in &steps {
        let per = r["tokens_per_s"].as_f64().unwrap() / r["samples_per_s"].as_f64().unwrap();
        assert!(
            (per - 36.0 / 8.0).abs() < 1e-9,
            "{per} tokens per sample: {r}"
        );
    }
}
