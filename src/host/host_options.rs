//! How a host runs recipes: the options `taper train` and `taper check`
//! set, and the defaults an embedder gets.

use std::path::PathBuf;

use crate::{Error, Result};

/// Steps per `step` record unless `--log-every` says: cheap (see `taper
/// bench records`), and fine enough for a loss curve.
pub const DEFAULT_LOG_EVERY: u64 = 10;

/// How a host runs recipes. `Default` suits embedding: CPU, seed 0, no output
/// folder, quiet.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    pub device: String,
    /// Mixed into every seed a recipe gives (init, shuffles, sampling).
    pub seed: u64,
    /// Receives `metrics.jsonl` and final or failure checkpoints.
    pub out_dir: Option<PathBuf>,
    /// Restore the first run the recipe creates from this checkpoint.
    pub resume: Option<PathBuf>,
    /// The run folder being continued (`--resume RUN_DIR|auto`): the runs
    /// after the first resume from their own newest checkpoint in it.
    pub resume_folder: Option<PathBuf>,
    /// No progress bar and no printed lines.
    pub quiet: bool,
    /// Load and validate only: `run:epochs()` yields no epoch.
    pub check_only: bool,
    /// `--set key=value` overrides for `taper.config`.
    pub overrides: Vec<(String, String)>,
    /// A memory budget in bytes for every run (soft OOM above it).
    pub mem_limit: Option<usize>,
    /// Injected OOM faults, `step=5,phase=backward[,times=2]`, for every run.
    pub inject_oom: Vec<String>,
    /// Watch the recipe and its modules; apply edits at safe points.
    pub watch: bool,
    /// Write each run's checkpoint this often while it trains (and at its
    /// end, on a failure, a stop or a signal, always): `Some(None)` for
    /// never; None for the recipe's `checkpoint_every`, else every 5 minutes.
    pub checkpoint_every: Option<Option<crate::run::periodic::Every>>,
    /// How many checkpoints of each run to keep; None for the recipe's
    /// `keep_checkpoints`, else 2.
    pub keep_checkpoints: Option<usize>,
    /// Write a `step` record every this many steps (0: none).
    pub log_every: u64,
    /// Also write the records' scalars as TensorBoard event files
    /// (`out_dir/tensorboard/`).
    pub tensorboard: bool,
    /// Append to `out_dir`'s records even when not resuming: `--resume auto`
    /// found no checkpoint there (a job killed before its first one), so the
    /// run starts afresh in the same folder.
    pub reuse_out: bool,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            device: "cpu".into(),
            seed: 0,
            out_dir: None,
            resume: None,
            resume_folder: None,
            quiet: true,
            check_only: false,
            overrides: Vec::new(),
            mem_limit: None,
            inject_oom: Vec::new(),
            watch: false,
            checkpoint_every: None,
            keep_checkpoints: None,
            log_every: DEFAULT_LOG_EVERY,
            tensorboard: false,
            reuse_out: false,
        }
    }
}

/// Options that are wrong before anything runs: an injection that does not
/// parse, a budget without the counting allocator to measure it.
pub(super) fn check_options(opts: &HostOptions) -> Result<()> {
    for spec in &opts.inject_oom {
        crate::memory::inject::Injection::parse(spec)
            .map_err(|e| Error::Config(format!("--inject-oom {spec}: {e}")))?;
    }
    if opts.mem_limit.is_some() && !crate::memory::HostMemory::is_counting() {
        return Err(Error::Config(
            "--mem-limit needs taper::memory::CountingAlloc as the global allocator".into(),
        ));
    }
    Ok(())
}
