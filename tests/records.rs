//! What a run writes to `metrics.jsonl` without the recipe asking: `step`
//! records every `--log-every` steps (means over the steps since the last
//! one), even with `--quiet`, consistent with the epoch records.

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
