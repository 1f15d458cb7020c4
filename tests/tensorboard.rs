//! `--tensorboard` event files, read back by the real tools: tbparse over
//! TensorBoard's own event reader (PyPI, in the test virtualenv that
//! scripts/fetch-data.sh makes), which checks each record's CRC. Every
//! scalar must equal its record in `metrics.jsonl`, across a resume.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const READ: &str = r#"
import json, sys
from tbparse import SummaryReader
df = SummaryReader(sys.argv[1]).scalars
print(json.dumps([[r.tag, int(r.step), float(r.value)] for r in df.itertuples()]))
"#;

fn python() -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let py = root.join(".venv-test/bin/python");
    let has = |py: &Path| {
        Command::new(py)
            .args(["-c", "import tbparse"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !has(&py) {
        let ok = Command::new("bash")
            .arg("scripts/fetch-data.sh")
            .current_dir(root)
            .status()
            .unwrap()
            .success();
        assert!(
            ok && has(&py),
            "no tbparse: run `bash scripts/fetch-data.sh`"
        );
    }
    py
}

fn train(out: &Path, extra: &[&str]) {
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args([
            "train",
            "scripts/digits.lua",
            "--quiet",
            "--tensorboard",
            "--log-every",
            "5",
        ])
        .arg("--out")
        .arg(out)
        .args(extra)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn tensorboard_scalars_read_back_with_tbparse_equal_the_records() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    train(
        &out,
        &[
            "--set",
            "epochs=2",
            "--inject-oom",
            "step=12,phase=backward",
        ],
    );
    train(&out, &["--set", "epochs=3", "--resume", "auto"]);
    let files = std::fs::read_dir(out.join("tensorboard")).unwrap().count();
    assert_eq!(files, 2, "one event file per process");

    let o = Command::new(&py)
        .args(["-c", READ])
        .arg(out.join("tensorboard"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let scalars: Vec<(String, u64, f64)> = serde_json::from_slice(&o.stdout).unwrap();
    let find = |tag: &str, step: u64| -> Vec<f64> {
        scalars
            .iter()
            .filter(|(t, s, _)| t == tag && *s == step)
            .map(|(_, _, v)| *v)
            .collect()
    };
    let records: Vec<Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-30);
    let mut checked = 0;
    for r in &records {
        let step = r["step"].as_u64().unwrap();
        let pairs: &[(&str, &str)] = match r["event"].as_str().unwrap() {
            "step" => &[
                ("train/loss", "loss"),
                ("train/lr", "lr"),
                ("train/samples_per_s", "samples_per_s"),
            ],
            "epoch" => &[("epoch/loss", "loss")],
            "eval" => &[
                ("eval/test/loss", "loss"),
                ("eval/test/accuracy", "accuracy"),
            ],
            "oom" => &[("oom/micro_batch", "new_micro_batch")],
            _ => &[],
        };
        for (tag, key) in pairs {
            let want = r[key].as_f64().unwrap();
            let got = find(tag, step);
            assert_eq!(got.len(), 1, "{tag} at step {step}: {got:?}");
            assert!(
                close(got[0], want),
                "{tag} at step {step}: {} vs {want}",
                got[0]
            );
            checked += 1;
        }
    }
    // 3 epochs of 45 steps, a step record every 5: 27 of them, 3 scalars each.
    assert_eq!(
        scalars.iter().filter(|(t, _, _)| t == "train/loss").count(),
        27
    );
    assert!(checked > 27 * 3 + 3, "{checked} scalars checked");
}
