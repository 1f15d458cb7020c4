//! A run in a container with a memory limit (a real cgroup, made here)
//! keeps under it: the planner picks micro-batches that fit, so a batch
//! that would need more than the limit trains to the same loss, where
//! without it the kernel kills the process. Outside a container the
//! machine's memory is the limit: a small machine is made as LXCFS makes
//! one, a cgroup's limit with a `/proc/meminfo` of that size mounted over
//! the real one in the process's own mount namespace.
//!
//! Making a cgroup needs root and a writable cgroup hierarchy (v1's memory
//! controller, or v2 with `memory` in the parent's subtree_control), and a
//! mount namespace `unshare -m`. Where there is none the test says so and
//! passes, unless TAPER_REQUIRE_CGROUP=1 (`.ci/run` sets it): then it fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{bail, Context, Result};

mod common;

/// A memory cgroup made for one test, removed when dropped.
struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    /// A child of this process's memory cgroup with `limit` bytes.
    fn new(name: &str, limit: u64) -> Result<Cgroup> {
        let text = std::fs::read_to_string("/proc/self/cgroup")?;
        let (root, own, file) = match text
            .lines()
            .filter_map(|l| l.split_once(':')?.1.split_once(':'))
            .find(|(c, _)| c.split(',').any(|c| c == "memory"))
        {
            Some((c, path)) => (
                Path::new("/sys/fs/cgroup").join(c),
                path,
                "memory.limit_in_bytes",
            ),
            None => {
                let path = text
                    .lines()
                    .find_map(|l| l.strip_prefix("0::"))
                    .context("no cgroup")?;
                (PathBuf::from("/sys/fs/cgroup"), path, "memory.max")
            }
        };
        let mut parent = root.join(own.trim_start_matches('/'));
        if !parent.is_dir() {
            parent = root;
        }
        let dir = parent.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        let group = Cgroup { dir };
        std::fs::write(group.dir.join(file), limit.to_string())
            .with_context(|| format!("setting {file}"))?;
        // No swap to page out to (v1: the memory+swap limit; v2: swap.max).
        for (f, v) in [
            ("memory.memsw.limit_in_bytes", limit.to_string()),
            ("memory.swap.max", "0".into()),
        ] {
            if group.dir.join(f).exists() {
                std::fs::write(group.dir.join(f), v).with_context(|| format!("setting {f}"))?;
            }
        }
        Ok(group)
    }

    /// Runs `taper` with `args` inside the cgroup.
    fn run(&self, args: &[&str]) -> Result<Output> {
        let procs = self.dir.join("cgroup.procs");
        let script = format!("echo $$ > '{}' && exec \"$@\"", procs.display());
        Ok(Command::new("sh")
            .args(["-c", &script, "sh", env!("CARGO_BIN_EXE_taper")])
            .args(args)
            .output()?)
    }
}

impl Cgroup {
    /// Runs `taper` with `args` inside the cgroup, on a machine whose
    /// `/proc/meminfo` is `meminfo` (a bind mount in a mount namespace of
    /// its own, as LXCFS gives a container).
    fn run_on_machine(&self, meminfo: &Path, args: &[&str]) -> Result<Output> {
        self.on_machine(meminfo, env!("CARGO_BIN_EXE_taper"), args)
    }

    /// `program` with `args` as [`Cgroup::run_on_machine`] runs taper.
    fn on_machine(&self, meminfo: &Path, program: &str, args: &[&str]) -> Result<Output> {
        let procs = self.dir.join("cgroup.procs");
        let script = format!(
            "echo $$ > '{}' && exec unshare -m sh -c \
             'mount --bind \"$0\" /proc/meminfo && exec \"$@\"' \"$@\"",
            procs.display()
        );
        Ok(Command::new("sh")
            .args(["-c", &script, "sh"])
            .arg(meminfo)
            .arg(program)
            .args(args)
            .output()?)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn cgroup_or_skip(name: &str, limit: u64) -> Result<Option<Cgroup>> {
    match Cgroup::new(name, limit) {
        Ok(g) => Ok(Some(g)),
        Err(e) if std::env::var("TAPER_REQUIRE_CGROUP").as_deref() != Ok("1") => {
            eprintln!("SKIPPED: cannot make a memory cgroup here ({e:#})");
            Ok(None)
        }
        Err(e) => Err(e.context("TAPER_REQUIRE_CGROUP=1 and no memory cgroup")),
    }
}

const MIB: u64 = 1 << 20;

/// The shipped Shakespeare GPT at a batch of 1024 windows: about 900 MiB of
/// heap for a whole-batch step.
fn shakespeare(out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "train",
        "scripts/shakespeare.lua",
        "--set",
        "batch=1024",
        "--set",
        "steps=3",
        "--set",
        "epochs=1",
        "--set",
        "sample=0",
        "--log-every",
        "1",
        "--out",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(out.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn train_loss(out: &Path) -> Result<f64> {
    let epochs = common::records(out, "epoch");
    let last = epochs.last().context("no epoch record")?;
    last["loss"].as_f64().context("no loss")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn a_batch_larger_than_the_containers_limit_trains_in_micro_batches_to_the_same_loss() -> Result<()>
{
    let Some(group) = cgroup_or_skip("taper-fits", 300 * MIB)? else {
        return Ok(());
    };
    let tmp = tempfile::tempdir()?;
    let (inside, free) = (tmp.path().join("inside"), tmp.path().join("free"));
    let args = shakespeare(&inside, &[]);
    let o = group.run(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
    let said = text(&o);
    if !o.status.success() {
        bail!(
            "the run under a 300 MiB container limit failed ({:?}):\n{said}",
            o.status
        );
    }
    assert!(
        said.contains("the container's limit is 300.0 MiB"),
        "{said}"
    );
    assert!(said.contains("it runs in micro-batches of"), "{said}");
    // `taper plan` in the same container says whose limit it plans under.
    let o = group.run(&["plan", "scripts/shakespeare.lua", "--set", "batch=1024"])?;
    let said = text(&o);
    assert!(o.status.success(), "{said}");
    assert!(
        said.contains("the container's limit is 300.0 MiB (")
            && said.contains("micro-batches of at most"),
        "{said}"
    );

    // The same run with no limit: one whole batch a step.
    let args = shakespeare(&free, &[]);
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(&args)
        .output()?;
    assert!(o.status.success(), "{}", text(&o));
    let steps = common::records(&inside, "step");
    let micro = steps
        .iter()
        .filter_map(|s| s["micro_batch"].as_u64())
        .max()
        .context("no step record with a micro-batch")?;
    assert!(micro < 1024, "micro-batch {micro}");
    let run = &common::records(&inside, "run")[0];
    assert_eq!(run["container_limit"].as_u64(), Some(300 * MIB), "{run}");
    assert_eq!(run["micro_batch_ceiling"].as_u64(), Some(micro), "{run}");
    let (a, b) = (train_loss(&inside)?, train_loss(&free)?);
    assert!(
        (a - b).abs() < 1e-3 * b,
        "loss {a} in micro-batches, {b} whole"
    );
    // Under the limit: the heap's peak, and the process's (the cgroup's).
    let peak = common::records(&inside, "epoch")[0]["memory_peak"]
        .as_u64()
        .context("memory_peak")?;
    assert!(peak < 300 * MIB, "heap peak {peak}");
    Ok(())
}

#[test]
fn without_the_plan_the_same_run_is_killed_by_the_limit() -> Result<()> {
    // The control: the limit in the test above is real. A --mem-limit far
    // above it replaces the container's budget, and the whole batch runs.
    let Some(group) = cgroup_or_skip("taper-killed", 300 * MIB)? else {
        return Ok(());
    };
    let tmp = tempfile::tempdir()?;
    let args = shakespeare(tmp.path(), &["--mem-limit", "64GiB"]);
    let o = group.run(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(o.status.signal(), Some(9), "{:?}: {}", o.status, text(&o));
    Ok(())
}

/// An evaluation batch past the limit (every held-out window, 1,562, in one
/// batch) goes in pieces no larger than the planned micro-batch, and gives
/// the unlimited evaluation's loss. Before, the kernel killed the run
/// inside `run:evaluate` (exit 137).
#[test]
fn an_evaluation_batch_past_the_limit_is_evaluated_in_pieces() -> Result<()> {
    let Some(group) = cgroup_or_skip("taper-eval", 300 * MIB)? else {
        return Ok(());
    };
    let tmp = tempfile::tempdir()?;
    let (inside, free) = (tmp.path().join("inside"), tmp.path().join("free"));
    let args = |out: &Path| -> Vec<String> {
        let mut a = vec!["train".to_string(), "scripts/shakespeare.lua".into()];
        for set in [
            "steps=2",
            "epochs=1",
            "sample=0",
            "val_batch=4096",
            "val_windows=4096",
        ] {
            a.extend(["--set".to_string(), set.into()]);
        }
        a.extend(["--out".to_string(), out.display().to_string()]);
        a
    };
    let a = args(&inside);
    let o = group.run(&a.iter().map(String::as_str).collect::<Vec<_>>())?;
    if !o.status.success() {
        bail!(
            "the evaluation under 300 MiB failed ({:?}):\n{}",
            o.status,
            text(&o)
        );
    }
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(args(&free))
        .output()?;
    assert!(o.status.success(), "{}", text(&o));
    // One evaluation, after the epoch: its samples are the 64 positions of
    // each window.
    let evals = |out: &Path| -> Vec<(f64, u64)> {
        common::records(out, "eval")
            .iter()
            .map(|e| {
                (
                    e["loss"].as_f64().unwrap_or(f64::NAN),
                    e["samples"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    };
    let (ours, theirs) = (evals(&inside), evals(&free));
    assert_eq!(ours.len(), theirs.len());
    assert_eq!(ours[0].1, 1562 * 64);
    for ((a, n), (b, m)) in ours.iter().zip(&theirs) {
        assert_eq!(n, m);
        assert!((a - b).abs() <= 1e-5 * b, "loss {a} in pieces, {b} whole");
    }
    Ok(())
}

/// A machine of 600 MiB (no swap), 40 MiB of it held by other processes,
/// and no container limit below it: the run plans under the machine's
/// memory and trains the batch of 1024 in micro-batches to the whole
/// batch's loss; with `--mem-limit 64GiB` in place of that budget the
/// machine's limit kills it.
#[test]
fn on_a_machine_smaller_than_the_batch_a_run_trains_in_micro_batches() -> Result<()> {
    let Some(group) = cgroup_or_skip("taper-machine", 600 * MIB)? else {
        return Ok(());
    };
    let tmp = tempfile::tempdir()?;
    let meminfo = tmp.path().join("meminfo");
    std::fs::write(
        &meminfo,
        "MemTotal:         614400 kB\nMemFree:          520000 kB\n\
         MemAvailable:     573440 kB\nSwapTotal:             0 kB\n",
    )?;
    let seen = group.on_machine(&meminfo, "cat", &["/proc/meminfo"]);
    let unshared = seen.as_ref().is_ok_and(|o| {
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("614400 kB")
    });
    if !unshared {
        let why = seen.map_or_else(|e| e.to_string(), |o| text(&o));
        if std::env::var("TAPER_REQUIRE_CGROUP").as_deref() == Ok("1") {
            bail!("TAPER_REQUIRE_CGROUP=1 and no mount namespace: {why}");
        }
        eprintln!("SKIPPED: cannot mount a /proc/meminfo of our own ({why})");
        return Ok(());
    }
    let (inside, free) = (tmp.path().join("inside"), tmp.path().join("free"));
    let args = shakespeare(&inside, &[]);
    let o = group.run_on_machine(
        &meminfo,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    )?;
    let said = text(&o);
    assert!(o.status.success(), "{:?}:\n{said}", o.status);
    assert!(
        said.contains(
            "memory: the machine's memory is 600.0 MiB (/proc/meminfo; 560.0 MiB available)"
        ) && said.contains("it runs in micro-batches of"),
        "{said}"
    );
    let run = &common::records(&inside, "run")[0];
    assert_eq!(run["machine_memory"].as_u64(), Some(600 * MIB), "{run}");
    assert!(run.get("container_limit").is_none(), "{run}");
    let micro = common::records(&inside, "step")
        .iter()
        .filter_map(|s| s["micro_batch"].as_u64())
        .max()
        .context("no step record with a micro-batch")?;
    assert!(micro < 1024, "micro-batch {micro}");
    assert_eq!(run["micro_batch_ceiling"].as_u64(), Some(micro), "{run}");
    // `taper plan` on that machine names it.
    let o = group.run_on_machine(
        &meminfo,
        &["plan", "scripts/shakespeare.lua", "--set", "batch=1024"],
    )?;
    assert!(
        o.status.success() && text(&o).contains("the machine's memory is 600.0 MiB ("),
        "{}",
        text(&o)
    );

    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(shakespeare(&free, &[]))
        .output()?;
    assert!(o.status.success(), "{}", text(&o));
    let (a, b) = (train_loss(&inside)?, train_loss(&free)?);
    assert!(
        (a - b).abs() < 1e-3 * b,
        "loss {a} in micro-batches, {b} whole"
    );

    // The control: the machine's 600 MiB is real.
    let killed = tmp.path().join("killed");
    let args = shakespeare(&killed, &["--mem-limit", "64GiB"]);
    let o = group.run_on_machine(
        &meminfo,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    )?;
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(o.status.signal(), Some(9), "{:?}: {}", o.status, text(&o));
    Ok(())
}
