//! Stopping a run on a signal. SIGINT (Ctrl-C), SIGTERM and SIGHUP ask the
//! run to stop at its next step boundary: the step in progress finishes,
//! then the run writes its checkpoint and its final records and exits with
//! 128 + the signal's number (130, 143, 129). A second SIGINT or SIGTERM
//! exits at once; a second SIGHUP does not (a closing terminal sends two).
//!
//! The request is a process-wide flag: [`Run::step`](super::Run::step)
//! checks it before each step, an evaluation before each of its batches,
//! `run:generate` before each token, `data:standardize()` before each
//! chunk, `run:reload_point{ wait }` every 100 ms, and the Lua bindings check it from a hook every few thousand Lua
//! instructions, so a recipe stuck in a loop that never steps is stopped
//! too.
//!
//! SIGUSR1 asks for a checkpoint and no stop: each run saves after its next
//! step and goes on. Slurm sends it ahead of a job's time limit
//! (`#SBATCH --signal=USR1@90`); its default action would end the process
//! with nothing saved since the last periodic checkpoint.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

use crate::{Error, Result};

/// The signal that asked for a stop; 0 for none.
static REQUESTED: AtomicI32 = AtomicI32::new(0);

/// Set for a rank of a data-parallel run: a second signal does not exit at
/// once (mpirun sends SIGTERM twice when it ends a job, and rank 0 is then
/// writing its checkpoint).
static PATIENT: AtomicBool = AtomicBool::new(false);

/// How many checkpoints were asked for (SIGUSR1s) since the process began.
static SAVES: AtomicU64 = AtomicU64::new(0);

const SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// A second signal waits for the stop like the first (see `PATIENT`).
pub fn set_patient() {
    PATIENT.store(true, Ordering::SeqCst);
}

/// Installs the handlers (the CLI does; an embedder may). A SIGHUP or
/// SIGUSR1 that the process was started ignoring (`nohup taper train ...`)
/// stays ignored: a run started so goes on when its terminal closes.
pub fn install() -> std::io::Result<()> {
    if !started_ignoring(libc::SIGUSR1) {
        // SAFETY: the handler only increments an atomic.
        unsafe {
            signal_hook::low_level::register(libc::SIGUSR1, || {
                SAVES.fetch_add(1, Ordering::SeqCst);
            })?;
        }
    }
    for sig in SIGNALS {
        if sig == libc::SIGHUP && started_ignoring(sig) {
            continue;
        }
        // SAFETY: the handler does only async-signal-safe work: atomic
        // loads and a compare-exchange, and `_exit` on a second signal.
        unsafe {
            signal_hook::low_level::register(sig, move || {
                // The first signal names the exit code.
                let first = REQUESTED
                    .compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok();
                // A hangup is never a reason to hurry: a closing terminal
                // sends two (the shell passes its SIGHUP on to its jobs,
                // then the kernel sends the foreground job another when the
                // shell exits), and the run must still write its checkpoint.
                if !first && sig != libc::SIGHUP && !PATIENT.load(Ordering::SeqCst) {
                    libc::_exit(128 + sig);
                }
            })?;
        }
    }
    Ok(())
}

/// Whether `sig`'s disposition is "ignore", as `nohup` leaves SIGHUP for the
/// command it starts.
fn started_ignoring(sig: i32) -> bool {
    // SAFETY: a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Asks for a stop as the signal `sig` would (`os.exit` in a recipe, tests).
pub fn request(sig: i32) {
    REQUESTED.store(sig, Ordering::SeqCst);
}

/// Asks for a checkpoint as SIGUSR1 does (tests, embedders).
pub fn request_save() {
    SAVES.fetch_add(1, Ordering::SeqCst);
}

/// How many checkpoints were asked for so far: a run that has seen fewer
/// saves after its next step.
pub fn save_requests() -> u64 {
    SAVES.load(Ordering::SeqCst)
}

/// The signal that asked for a stop, if one did.
pub fn requested() -> Option<i32> {
    match REQUESTED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// An error when a stop was asked for: the run stops here.
pub fn check() -> Result<()> {
    match requested() {
        Some(sig) => Err(Error::Interrupted(sig)),
        None => Ok(()),
    }
}

/// `SIGTERM`, for messages.
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGUSR1 => "SIGUSR1".into(),
        other => format!("signal {other}"),
    }
}
