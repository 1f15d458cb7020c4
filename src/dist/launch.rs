//! `taper launch -n N RECIPE ...`: starts N ranks of `taper train` under the
//! system's `mpirun`, and what a rank does at its start (one output folder,
//! rank 0's; the others' lines in `rank<R>.log` there).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::Collective;
use crate::{Error, Result};

/// Runs `exe train ARGS` as `n` ranks under `mpirun` and waits for it. A
/// signal to the launcher (Ctrl-C, SIGTERM) is passed on to every rank
/// once: each stops at its step boundary, rank 0 writes its checkpoint, and
/// they leave together. When a rank dies, Open MPI's mpirun sends
/// SIGTERM to the others too, and SIGKILL a second later (its
/// `odls_base_sigkill_timeout`; raising it made Open MPI 4.1.4's mpirun
/// hang here): a checkpoint that takes longer is cut short, and the last
/// periodic one stands, since checkpoints are renamed into place. A
/// SIGUSR1 is passed on each time: rank 0 saves a checkpoint and the run
/// goes on. Returns mpirun's status, and the signal passed on, if any.
pub fn launch(
    n: usize,
    exe: &Path,
    train_args: &[String],
    out: &Path,
) -> Result<(ExitStatus, Option<i32>)> {
    if n == 0 {
        return Err(Error::Config("taper launch: -n must be at least 1".into()));
    }
    let version = Command::new("mpirun")
        .arg("--version")
        .output()
        .map_err(|e| {
            Error::Config(format!(
                "taper launch needs `mpirun` on the PATH (Debian: openmpi-bin): {e}"
            ))
        })?;
    let open_mpi = String::from_utf8_lossy(&version.stdout).contains("Open MPI");
    let mut cmd = Command::new("mpirun");
    cmd.arg("-n").arg(n.to_string());
    if open_mpi {
        // More ranks than cores is allowed (a scaling run on a laptop);
        // ranks are not pinned to one core each, since each runs threads.
        cmd.args(["--oversubscribe", "--bind-to", "none"]);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            cmd.arg("--allow-run-as-root");
        }
    }
    // The cores are shared out between the ranks unless told otherwise.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        cmd.env("RAYON_NUM_THREADS", (cores / n).max(1).to_string());
    }
    cmd.arg(exe).arg("train").args(train_args);
    if !names_out(train_args) {
        cmd.arg("--out").arg(out);
    }
    // Its own process group: a Ctrl-C at the terminal reaches the launcher
    // only, which passes it on once (two would make mpirun kill at once).
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let got = Arc::new(AtomicI32::new(0));
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        let got = got.clone();
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            signal_hook::low_level::register(sig, move || got.store(sig, Ordering::SeqCst))
                .map_err(|e| Error::Config(format!("taper launch: signals: {e}")))?;
        }
    }
    let saves = Arc::new(AtomicU64::new(0));
    {
        let saves = saves.clone();
        // SAFETY: the handler only increments an atomic.
        unsafe {
            signal_hook::low_level::register(libc::SIGUSR1, move || {
                saves.fetch_add(1, Ordering::SeqCst);
            })
            .map_err(|e| Error::Config(format!("taper launch: signals: {e}")))?;
        }
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::Config(format!("taper launch: cannot start mpirun: {e}")))?;
    let mut passed = false;
    let mut saves_passed = 0;
    loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| Error::Config(format!("taper launch: {e}")))?
        {
            let sig = got.load(Ordering::SeqCst);
            return Ok((status, passed.then_some(sig)));
        }
        let sig = got.load(Ordering::SeqCst);
        if sig != 0 && !passed {
            // To the ranks themselves: each stops at its step boundary and
            // they leave together. Signalled, mpirun would send them
            // SIGTERM and SIGKILL a second later.
            to_ranks(child.id(), sig);
            passed = true;
        }
        let asked = saves.load(Ordering::SeqCst);
        if asked > saves_passed {
            to_ranks(child.id(), libc::SIGUSR1);
            saves_passed = asked;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `sig` to the ranks mpirun (`pid`) started, or to mpirun while it
/// has started none.
fn to_ranks(pid: u32, sig: i32) {
    let ranks = children(pid);
    let to = if ranks.is_empty() { vec![pid] } else { ranks };
    for pid in to {
        // SAFETY: signalling processes this launcher started.
        unsafe { libc::kill(pid as i32, sig) };
    }
}

/// The processes whose parent is `pid` (the ranks mpirun started on this
/// machine), from /proc.
fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let child: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
        // `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
        let ppid: u32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        (ppid == pid).then_some(child)
    })
    .collect()
}

/// Whether `taper train`'s arguments choose the output folder: `--out`, or
/// `--resume RUN_DIR`, which continues in that folder (as `taper train`
/// does). Otherwise the launcher gives the ranks a new one.
pub fn names_out(train_args: &[String]) -> bool {
    let value = |flag: &str| {
        let eq = format!("{flag}=");
        let mut args = train_args.iter();
        std::iter::from_fn(move || loop {
            let a = args.next()?;
            if a == flag {
                return args.next().cloned();
            }
            if let Some(v) = a.strip_prefix(&eq) {
                return Some(v.to_string());
            }
        })
        .last()
    };
    value("--out").is_some() || value("--resume").is_some_and(|r| Path::new(&r).is_dir())
}

/// The output folder every rank uses: rank 0's choice.
pub fn agree_out(w: &dyn Collective, mine: PathBuf) -> Result<PathBuf> {
    let mut bytes = mine.to_string_lossy().into_owned().into_bytes();
    w.broadcast_bytes(0, &mut bytes)?;
    Ok(PathBuf::from(String::from_utf8_lossy(&bytes).into_owned()))
}

/// Sends this process's stdout and stderr to `OUT/rank<R>.log` (ranks
/// other than 0: only rank 0 prints, and writes records and checkpoints).
pub fn log_to_rank_file(out: &Path, rank: usize) -> Result<PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let path = out.join(format!("rank{rank}.log"));
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| Error::io(&path, e))?;
    for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        // SAFETY: dup2 onto the standard descriptors; `f` stays open
        // until the duplicates are made.
        if unsafe { libc::dup2(f.as_raw_fd(), fd) } < 0 {
            return Err(Error::io(&path, std::io::Error::last_os_error()));
        }
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::names_out;

    #[test]
    fn the_arguments_choose_the_folder_with_out_or_a_run_folder_to_resume() {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path().display().to_string();
        let file = dir.path().join("checkpoint.safetensors");
        std::fs::write(&file, b"").unwrap();
        let file = file.display().to_string();
        let cases: &[(&[&str], bool)] = &[
            (&["r.lua", "--out", "x"], true),
            (&["r.lua", "--out=x", "--quiet"], true),
            (&["r.lua", "--resume", &run_dir], true),
            (&["r.lua", &format!("--resume={run_dir}")], true),
            (&["r.lua", "--resume", &file], false),
            (&["r.lua", "--resume", "auto"], false),
            (&["r.lua", "--set", "out=x"], false),
            (&["r.lua"], false),
        ];
        for (args, names) in cases {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            assert_eq!(names_out(&args), *names, "{args:?}");
        }
    }
}
