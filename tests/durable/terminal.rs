//! A run in a terminal that closes (a window shut, an ssh connection lost):
//! the interactive shell that started it passes its SIGHUP on to its jobs,
//! the kernel sends the foreground job another when the shell exits, and
//! every write to the terminal fails from then on. The run must still stop
//! at a step boundary, write its checkpoint and exit with 129; started under
//! `nohup`, it must go on to its end.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use candle_core::Device;
use taper::engine::checkpoint;

use super::{records, s, DEADLINE};

/// An interactive bash on a new pseudo-terminal, as a terminal window
/// starts one, given `line` to run. The terminal's output is read (and
/// dropped) until [`Terminal::close`], which closes its master end: the
/// kernel then hangs the terminal up.
struct Terminal {
    bash: Child,
    closing: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
}

impl Terminal {
    fn open(line: &str) -> Terminal {
        let (mut master, mut slave) = (0, 0);
        // SAFETY: openpty writes two new descriptors into the two ints; the
        // name, termios and window size may be null.
        let opened = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(opened, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both descriptors are new and owned here alone.
        let (mut master, slave) =
            unsafe { (File::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        // bash must not inherit the master end: the terminal hangs up when
        // the last copy of it is closed.
        // SAFETY: fcntl on a descriptor this function owns.
        unsafe { libc::fcntl(master.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
        let mut c = Command::new("bash");
        c.args(["--norc", "--noprofile", "-i"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("PS1", "$ ")
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        // SAFETY: setsid and ioctl are async-signal-safe: bash leads a new
        // session whose controlling terminal is the new one (stdin).
        unsafe {
            c.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let bash = c.spawn().unwrap();
        drop(c);
        writeln!(master, "{line}").unwrap();
        let closing = Arc::new(AtomicBool::new(false));
        let stop = closing.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 1 << 16];
            while !stop.load(Ordering::SeqCst) {
                let mut fd = libc::pollfd {
                    fd: master.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd, for a descriptor this thread owns.
                if unsafe { libc::poll(&mut fd, 1, 50) } > 0 && master.read(&mut buf).is_err() {
                    return;
                }
            }
            // Dropping `master` here closes the terminal.
        });
        Terminal {
            bash,
            closing,
            reader: Some(reader),
        }
    }

    /// Closes the terminal and waits for its shell to end.
    fn close(mut self) {
        self.closing.store(true, Ordering::SeqCst);
        self.reader.take().unwrap().join().unwrap();
        let start = Instant::now();
        while self.bash.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < DEADLINE, "bash outlived its terminal");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// `command` as a line for the terminal's shell: run by `sh`, which
/// outlives the hangup (its trap ignores nothing that `command` inherits)
/// and writes the command's exit code to `rc`.
fn with_exit_code(command: &str, rc: &Path) -> String {
    format!("sh -c 'trap : HUP; {command}; echo $? > {}'", s(rc))
}

/// Waits for the exit code that [`with_exit_code`] writes.
fn exit_code(rc: &Path) -> i32 {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(rc) {
            if text.ends_with('\n') {
                return text.trim().parse().unwrap();
            }
        }
        assert!(start.elapsed() < DEADLINE, "the command did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `out` holds a step record.
fn wait_for_steps(out: &Path) {
    let start = Instant::now();
    while records(out, "step").is_empty() {
        assert!(start.elapsed() < DEADLINE, "no step record");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The shipped Shakespeare recipe, trained in a terminal (its progress bar
/// drawn there), which is then closed.
#[test]
fn a_closed_terminal_stops_the_run_with_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (out, rc) = (dir.path().join("out"), dir.path().join("rc"));
    let command = format!(
        "{} train scripts/shakespeare.lua --set epochs=50 --set sample=0 --out {}",
        env!("CARGO_BIN_EXE_taper"),
        s(&out)
    );
    let terminal = Terminal::open(&with_exit_code(&command, &rc));
    wait_for_steps(&out);
    terminal.close();
    assert_eq!(exit_code(&rc), 129, "SIGHUP's code");
    let saved = records(&out, "checkpoint");
    let last = saved.last().expect("no checkpoint record");
    assert_eq!(last["reason"], "interrupted", "{saved:?}");
    let (_, meta) = checkpoint::load(&out.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(meta.step, last["step"].as_u64().unwrap());
    assert!(meta.step > 0 && meta.step < 50 * 440, "step {}", meta.step);
}

/// `nohup taper train ...`: the run goes on to its end after the terminal
/// it was started from closes.
#[test]
fn a_run_under_nohup_outlives_its_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let (out, rc) = (dir.path().join("out"), dir.path().join("rc"));
    let command = format!(
        "nohup {} train scripts/shakespeare.lua --set epochs=3 --set steps=100 --set sample=0 --out {} > {} 2>&1",
        env!("CARGO_BIN_EXE_taper"),
        s(&out),
        s(&dir.path().join("log")),
    );
    let terminal = Terminal::open(&with_exit_code(&command, &rc));
    wait_for_steps(&out);
    terminal.close();
    assert!(
        records(&out, "epoch").len() < 3,
        "the run ended before its terminal closed"
    );
    assert_eq!(exit_code(&rc), 0);
    let saved = records(&out, "checkpoint");
    assert_eq!(saved.last().unwrap()["reason"], "final", "{saved:?}");
    assert_eq!(records(&out, "epoch").len(), 3);
    let (_, meta) = checkpoint::load(&out.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(meta.step, 300);
}
