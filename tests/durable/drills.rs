//! Drills: a run stopped at random moments, 20 times, by SIGTERM, SIGINT or
//! SIGKILL, and rerun each time with the same command and `--resume auto`
//! (as a preemptible job is), ends with the weights of a run never stopped,
//! bitwise. After each stop the folder is checked: a signal loses no step, a
//! kill at most `--checkpoint-every` steps. The moments are random; a failure
//! names the seed, and `TAPER_DRILL_SEED=N` replays it.

use std::time::{SystemTime, UNIX_EPOCH};

use super::*;

const STOPS: usize = 20;

/// xorshift64: enough for random moments.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn drill_seed() -> u64 {
    std::env::var("TAPER_DRILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

/// The largest step any record in `out` mentions: steps the run took.
fn recorded_step(out: &Path) -> u64 {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|r| r["step"].as_u64())
        .max()
        .unwrap_or(0)
}

fn checkpoint_step(out: &Path) -> u64 {
    checkpoint::read_meta(&out.join("checkpoint.safetensors")).map_or(0, |m| m.step)
}

/// Stops the digits run with `signal` 20 times at random moments, checking
/// what each stop left; `every` is its `--checkpoint-every` in steps.
fn drill(signal: i32, every: u64) {
    let dir = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let reference = weights(&straight(dir.path()));
    // Moments within the first 80% of a straight run's time, summed over all
    // stops, so the run is still going at the 20th.
    let span_ms = (start.elapsed().as_millis() as u64 * 4 / 5 / STOPS as u64).max(10);
    let seed = drill_seed();
    let mut rng = Rng(seed | 1);
    let why = |what: String| format!("signal {signal}, TAPER_DRILL_SEED={seed}: {what}");
    let out = dir.path().join("drill");
    let every_arg = every.to_string();
    let args = train_args(
        &out,
        &["--checkpoint-every", &every_arg, "--resume", "auto"],
    );
    let mut saved = 0;
    for stop in 1..=STOPS {
        let mut command = cmd(&args);
        // A background job of a script starts with SIGINT ignored (so CI
        // runs these tests), and a stop before taper's handlers are in
        // place would then be lost; at a terminal it finds the default
        // action, which the checks below expect.
        // SAFETY: signal(2) is async-signal-safe, as pre_exec requires.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                Ok(())
            });
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let delay = span_ms / 5 + rng.below(span_ms * 4 / 5);
        std::thread::sleep(Duration::from_millis(delay));
        // SAFETY: a plain kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let o = wait(child);
        let err = String::from_utf8_lossy(&o.stderr);
        let (took, kept) = (recorded_step(&out), checkpoint_step(&out));
        let at = format!("stop {stop} after {delay} ms, step {took}, checkpoint at {kept}: {err}");
        assert!(kept >= saved, "{}", why(format!("went back: {at}")));
        if o.status.success() {
            // The run ended before the signal: the stops were spaced by the
            // straight run's time, and a loaded machine can make that run
            // slower than the stopped ones. Enough stops were made to count.
            assert!(stop > STOPS / 4, "{}", why(format!("ended early: {at}")));
            assert_eq!(kept, took, "{}", why(format!("lost a step: {at}")));
            break;
        }
        if signal == libc::SIGKILL {
            assert_eq!(o.status.code(), None, "{}", why(at.clone()));
            // (A kill between a save and its record leaves the checkpoint
            // ahead of the records.)
            assert!(
                took.saturating_sub(kept) <= every,
                "{}",
                why(format!("lost more: {at}"))
            );
        } else {
            use std::os::unix::process::ExitStatusExt;
            // Before its handlers were in place the default action ended it.
            let early = o.status.signal() == Some(signal) && took == saved;
            assert!(
                early || o.status.code() == Some(128 + signal),
                "{}",
                why(at.clone())
            );
            assert_eq!(kept, took, "{}", why(format!("lost a step: {at}")));
        }
        saved = kept;
    }
    let o = cmd(&args).output().unwrap();
    assert!(
        o.status.success(),
        "{}",
        why(String::from_utf8_lossy(&o.stderr).into_owned())
    );
    assert!(
        weights(&out.join("checkpoint.safetensors")) == reference,
        "{}",
        why("the weights differ from a straight run's".into())
    );
    // Each epoch's record, the interrupted ones included, says what a
    // straight run's says: its mean loss and samples (not the part after
    // the last resume). A kill repeats what came after the last checkpoint,
    // an epoch's record too, which must be the same again: one is kept.
    let epochs = |out: &Path| -> Vec<(Value, Value, Value)> {
        let mut all: Vec<(Value, Value, Value)> = records(out, "epoch")
            .into_iter()
            .map(|r| (r["epoch"].clone(), r["loss"].clone(), r["samples"].clone()))
            .collect();
        if signal == libc::SIGKILL {
            all.dedup_by(|b, a| a.0 == b.0 && a.1 == b.1 && a.2 == b.2);
        }
        all
    };
    let (got, want) = (epochs(&out), epochs(&dir.path().join("straight")));
    assert!(
        got == want,
        "{}",
        why(format!("epoch records {got:?}, a straight run's {want:?}"))
    );
    // What is left in the folder: no temporary file, the default two
    // checkpoints, sidecars that agree with them.
    let mut kept = 0;
    for e in std::fs::read_dir(&out).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!name.ends_with(".tmp"), "{}", why(format!("left {name}")));
        if name.ends_with(".safetensors") {
            kept += 1;
            let side: checkpoint::CheckpointMeta =
                serde_json::from_str(&std::fs::read_to_string(p.with_extension("json")).unwrap())
                    .unwrap();
            assert_eq!(side, checkpoint::read_meta(&p).unwrap(), "{}", why(name));
        }
    }
    assert!(kept <= 2, "{}", why(format!("{kept} checkpoints kept")));
}

#[test]
fn sigterm_20_times_at_random_moments_loses_nothing() {
    drill(libc::SIGTERM, 1000);
}

#[test]
fn sigint_20_times_at_random_moments_loses_nothing() {
    drill(libc::SIGINT, 1000);
}

#[test]
fn sigkill_20_times_at_random_moments_loses_at_most_the_checkpoint_period() {
    drill(libc::SIGKILL, 10);
}
