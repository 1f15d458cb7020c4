//! Who can read what a run writes: every file (checkpoints, their sidecars,
//! records, exports) gets the mode the user's umask gives a new file, as
//! `torch.save` and every other tool's files do. safetensors writes through a
//! temporary file of mode 0600 (safetensors#782), which left checkpoints and
//! transformers exports readable by their owner alone: a teammate, or an
//! inference server under another user, could not load them.

use super::*;
use std::os::unix::fs::PermissionsExt;

/// Runs taper under `umask`, as a shell the user set it in would.
fn under_umask(umask: u32, args: &[&str]) {
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!("umask {umask:03o} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_taper"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Each regular file under `dir` with its permission bits.
fn modes(dir: &Path) -> Vec<(String, u32)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        if m.is_dir() {
            v.extend(modes(&e.path()));
        } else {
            v.push((
                e.path().display().to_string(),
                m.permissions().mode() & 0o777,
            ));
        }
    }
    v
}

#[test]
fn checkpoints_and_exports_get_the_umasks_mode() {
    let dir = tempfile::tempdir().unwrap();
    for umask in [0o022, 0o027] {
        let out = dir.path().join(format!("u{umask:03o}"));
        let short = ["--set", "epochs=1", "--set", "steps=3", "--set", "sample=0"];
        let mut args = recipe_args(&["scripts/shakespeare.lua"], &out, &short);
        args.extend(["--keep-checkpoints", "2", "--checkpoint-every", "1"]);
        under_umask(umask, &args);
        let hf = out.join("hf");
        under_umask(
            umask,
            &["export", s(&out), "--format", "hf", "--out", s(&hf)],
        );
        let gguf = out.join("model.gguf");
        under_umask(umask, &["export", s(&out), "--out", s(&gguf)]);

        let found = modes(&out);
        for want in ["checkpoint.safetensors", "checkpoint.json", "metrics.jsonl"] {
            assert!(found.iter().any(|(p, _)| p.ends_with(want)), "{found:?}");
        }
        assert!(hf.join("model.safetensors").exists(), "{found:?}");
        let wrong: Vec<_> = found
            .iter()
            .filter(|(_, m)| *m != 0o666 & !umask)
            .map(|(p, m)| format!("{p}: {m:03o}"))
            .collect();
        assert!(
            wrong.is_empty(),
            "under umask {umask:03o} files should be {:03o}: {wrong:?}",
            0o666 & !umask
        );
    }
}
