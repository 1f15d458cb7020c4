//! SIGUSR1 asks for a checkpoint and no stop, as Slurm sends it ahead of a
//! job's time limit (`#SBATCH --signal=USR1@90`), before the SIGTERM and
//! the SIGKILL that end the job.

use super::*;

/// Sends SIGUSR1 to `child` and waits for the `SIGUSR1` checkpoint record
/// it asks for; returns that record.
fn asked_for_a_checkpoint(child: &mut Child, out: &Path) -> Value {
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) }, 0);
    let asked = || {
        records(out, "checkpoint")
            .into_iter()
            .find(|r| r["reason"] == "SIGUSR1")
    };
    wait_until(child, "the SIGUSR1 checkpoint", || asked().is_some());
    asked().unwrap()
}

/// The digits run into `out`, asked for a checkpoint in its fourth epoch;
/// the run, and the checkpoint's record.
fn saved_while_training(out: &Path, extra: &[&str]) -> (Child, Value) {
    let mut child = cmd(&train_args(out, extra))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_epochs(&mut child, out, 3);
    let saved = asked_for_a_checkpoint(&mut child, out);
    (child, saved)
}

#[test]
fn sigusr1_saves_a_checkpoint_and_the_run_goes_on_to_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    let reference = weights(&straight(dir.path()));
    // No periodic checkpoints: whatever is saved, SIGUSR1 asked for.
    let never = ["--checkpoint-every", "never"];

    // Asked for a checkpoint, the run trains to its end as if never asked.
    let out = dir.path().join("on");
    let (child, saved) = saved_while_training(&out, &never);
    let o = wait(child);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!("taper: SIGUSR1: step {}: saved ", saved["step"])),
        "{err}"
    );
    assert!(weights(&out.join("checkpoint.safetensors")) == reference);

    // Then killed, it resumes from that checkpoint to the same weights.
    let out = dir.path().join("killed");
    let (mut child, saved) = saved_while_training(&out, &never);
    child.kill().unwrap();
    assert_eq!(wait(child).status.code(), None);
    let mut again = train_args(&out, &never);
    again.extend(["--resume", "auto"]);
    let o = cmd(&again).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let runs = records(&out, "run");
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1]["step"], saved["step"], "resumed elsewhere");
    assert!(weights(&out.join("checkpoint.safetensors")) == reference);
}
