//! The `taper` command line: a thin layer over the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use taper::{Host, HostOptions};

#[global_allocator]
static ALLOC: taper::memory::CountingAlloc = taper::memory::CountingAlloc;

/// `println!` that drops the line when stdout is closed (`taper ... | head`)
/// instead of panicking.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

#[derive(Parser)]
#[command(
    name = "taper",
    version,
    about = "Train candle models from Lua recipes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct RecipeArgs {
    /// The recipe, e.g. scripts/digits.lua
    recipe: PathBuf,
    /// Override a `taper.config{}` value, typed by its default (repeatable): --set epochs=2
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_set)]
    set: Vec<(String, String)>,
}

#[derive(Subcommand)]
enum Command {
    /// Train: run the recipe and its loop.
    Train(TrainArgs),
    /// Train on N data-parallel ranks (MPI, `--features mpi`): runs `mpirun -n N
    /// taper train ARGS...`. Each rank trains on its shard of every batch; only
    /// rank 0 writes records and checkpoints, the others log to OUT/rank<R>.log.
    Launch {
        /// How many ranks
        #[arg(short = 'n', long = "ranks", value_name = "N")]
        n: usize,
        /// `taper train`'s arguments: the recipe, then its options
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Load and validate a recipe without training (its loop runs no epoch).
    Check {
        #[command(flatten)]
        recipe: RecipeArgs,
    },
    /// Estimate a recipe's memory per training step without training, and the
    /// largest micro-batch that fits under a limit.
    Plan {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// The memory limit to plan for (default: the recipe's mem_limit, if any)
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        mem_limit: Option<usize>,
        /// Safety margin: plan to use at most (1 - margin) of the limit
        #[arg(long, default_value_t = 0.1)]
        margin: f64,
    },
    /// Write one self-contained HTML report of runs: loss, evaluation,
    /// learning rate, throughput, and memory with OOMs, reloads and
    /// checkpoints marked. Several runs are overlaid.
    Report {
        /// Run folders (each holding a metrics.jsonl)
        #[arg(required = true, value_name = "RUN_DIR")]
        runs: Vec<PathBuf>,
        /// Where to write it [default: RUN_DIR/report.html for one run,
        /// report.html here for several]
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Write a checkpoint's model for other tools: a transformers GPT-2
    /// folder (hf), a llama.cpp GGUF file (gguf), or a QLoRA run's
    /// adapters as a llama.cpp LoRA adapter (gguf-lora).
    Export(ExportArgs),
    /// Generate text from a checkpoint of a sequence model (its vocabulary
    /// is in the checkpoint).
    Sample(SampleArgs),
    /// Benchmarks that print figures; see `taper bench --help`.
    Bench(taper::bench::BenchArgs),
    /// Native strategy plugins: inspect one, or start a new one.
    Plugin {
        #[command(subcommand)]
        cmd: PluginCmd,
    },
}

#[derive(clap::Args)]
struct TrainArgs {
    #[command(flatten)]
    recipe: RecipeArgs,
    /// auto (a GPU when the build has CUDA and one is present), cpu, cuda or cuda:N
    #[arg(long, default_value = "auto")]
    device: String,
    /// Mixed into every seed the recipe gives (init, shuffles, sampling)
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output folder for metrics.jsonl and checkpoints [default: runs/<recipe>-<UTC time>]
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue a run: a checkpoint file, a run folder (continued in place),
    /// or `auto`: the run in --out if it has a checkpoint, else a fresh start
    #[arg(long, value_name = "PATH|RUN_DIR|auto")]
    resume: Option<PathBuf>,
    /// No progress bar and no printed lines
    #[arg(long)]
    quiet: bool,
    /// Memory budget (e.g. 512MiB): exceeding it at a phase boundary is an OOM
    /// that the run's policy recovers from (on the CPU: the heap, counted)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    mem_limit: Option<usize>,
    /// Inject an OOM, e.g. "step=5,phase=backward" or "step=7,phase=forward,times=3" (repeatable)
    #[arg(long, value_name = "SPEC")]
    inject_oom: Vec<String>,
    /// Watch the recipe and the Lua modules it requires; apply edits at the
    /// end of the epoch (or at run:reload_point()) without stopping the run
    #[arg(long)]
    watch: bool,
    /// Save the checkpoint this often while training: steps (500) or time
    /// (90s, 10m); `never` for only at the end, on failure or on a signal
    /// [default: the recipe's checkpoint_every, else 5m]
    #[arg(long, value_name = "STEPS|TIME|never", value_parser = parse_every)]
    checkpoint_every: Option<EveryArg>,
    /// How many checkpoints of each run to keep: the newest, and older ones
    /// that --resume falls back to when the newest is damaged
    /// [default: the recipe's keep_checkpoints, else 2]
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    keep_checkpoints: Option<u32>,
    /// Write a `step` record (loss, lr, step time, throughput, memory)
    /// every N steps; 0 for none
    #[arg(long, value_name = "N", default_value_t = taper::host::DEFAULT_LOG_EVERY)]
    log_every: u64,
    /// Also write the records as TensorBoard event files (OUT/tensorboard/)
    #[arg(long)]
    tensorboard: bool,
    /// Under a data-parallel launcher: how long a rank waits for the others
    /// at a collective before it stops (a rank died or hangs): 90s, 10m
    #[arg(long, value_name = "TIME", value_parser = parse_timeout, default_value = "300s")]
    rank_timeout: std::time::Duration,
    /// How ranks sum gradients: auto (MPI under a launcher), or nccl (on the
    /// GPU, a build with --features nccl; alone, a world of one)
    #[arg(long, value_name = "auto|nccl", default_value = "auto", value_parser = taper::dist::Engine::parse)]
    collective: taper::dist::Engine,
}

#[derive(clap::Args)]
struct ExportArgs {
    /// A checkpoint, or a run folder (its newest valid checkpoint)
    checkpoint: PathBuf,
    /// gguf, hf or gguf-lora
    #[arg(long, default_value = "gguf")]
    format: String,
    /// GGUF weight type: f32, f16, q8_0 or q4_0
    #[arg(long = "type", default_value = "q8_0")]
    ty: String,
    /// With --format gguf on a QLoRA run: the base with the adapters merged in
    #[arg(long)]
    merge: bool,
    /// The file (gguf) or folder (hf) to write
    #[arg(long)]
    out: PathBuf,
}

#[derive(clap::Args)]
struct SampleArgs {
    /// A checkpoint, or a run folder (its newest valid checkpoint)
    checkpoint: PathBuf,
    /// Text to continue [default: a newline]
    #[arg(long, default_value = "\n", hide_default_value = true)]
    prompt: String,
    #[arg(long, default_value_t = 200)]
    tokens: usize,
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Subcommand)]
enum PluginCmd {
    /// Load a plugin and print its name, version, ABI and kinds.
    Info { path: PathBuf },
    /// Write a plugin crate (an OOM policy to start from) into DIR/NAME.
    New {
        name: String,
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// The taper-plugin crate to depend on [default: this checkout's plugins/abi]
        #[arg(long)]
        abi: Option<PathBuf>,
    },
}

fn plugin(cmd: PluginCmd) -> ExitCode {
    use taper::plugins::scaffold;
    let result = match cmd {
        PluginCmd::Info { path } => scaffold::info(&path).map(|s| print!("{s}")),
        PluginCmd::New { name, dir, abi } => {
            let abi =
                abi.unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins/abi"));
            scaffold::new_plugin(&name, &dir, &abi).map(|root| {
                say!("wrote {}", root.display());
                say!("build it: cd {} && cargo build --release", root.display());
            })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("taper: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn parse_set(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got `{s}`")),
    }
}

/// `taper plan`: runs the recipe without training, then prints each run's plan.
fn plan(recipe: &RecipeArgs, mem_limit: Option<usize>, margin: f64) -> ExitCode {
    use taper::memory::planner::human;
    let opts = HostOptions {
        check_only: true,
        overrides: recipe.set.clone(),
        ..HostOptions::default()
    };
    let result = Host::new(opts).and_then(|mut h| {
        h.run_file(&recipe.recipe)?;
        h.plans()
    });
    let plans = match result {
        Ok(p) => p,
        Err(e) => {
            eprintln!("taper: {}", taper::host::render_error(&e));
            return ExitCode::from(e.exit_code());
        }
    };
    for (i, p) in plans.iter().enumerate() {
        let q = &p.plan;
        say!("run {}: {} (batch {})", i + 1, p.model, q.batch);
        say!("  parameters        {:>12}", human(q.parameters));
        say!(
            "  gradients         {:>12} (an accumulator, when the batch is split)",
            human(q.gradients)
        );
        say!("  optimizer state   {:>12}", human(q.optimizer));
        say!(
            "  activations       {:>12} per sample + {} per step (measured on {} samples)",
            human(q.per_sample),
            human(q.per_step),
            taper::host::probe_sizes(q.batch)
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        say!(
            "  heap before training {:>9} (data, Lua, the model)",
            human(q.resident)
        );
        say!(
            "  estimated peak at micro-batch {}: {}",
            q.batch,
            human(q.peak(q.batch, false))
        );
        if let Some(limit) = mem_limit.or(p.limit) {
            match q.max_micro(limit, margin) {
                Some(m) if m >= q.batch => say!(
                    "  under {} with a {:.0}% margin: the whole batch fits",
                    human(limit),
                    margin * 100.0
                ),
                Some(m) => say!(
                    "  under {} with a {:.0}% margin: micro-batches of at most {m} (estimated peak {})",
                    human(limit),
                    margin * 100.0,
                    human(q.peak(m, false))
                ),
                None => say!(
                    "  under {}: does not fit even one sample at a time",
                    human(limit)
                ),
            }
        }
    }
    ExitCode::SUCCESS
}

/// `--checkpoint-every`: a period, or `never`.
#[derive(Clone)]
struct EveryArg(Option<taper::run::periodic::Every>);

fn parse_every(s: &str) -> Result<EveryArg, String> {
    taper::run::periodic::parse_period(s).map(EveryArg)
}

fn report(runs: &[PathBuf], out: Option<PathBuf>) -> ExitCode {
    let out = out.unwrap_or_else(|| match runs {
        [one] => one.join("report.html"),
        _ => PathBuf::from("report.html"),
    });
    match taper::report::write(runs, &out) {
        Ok(notes) => {
            for n in notes {
                eprintln!("taper: warning: {n}");
            }
            say!("report: {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("taper report: {e}");
            ExitCode::from(2)
        }
    }
}

fn parse_size(s: &str) -> Result<usize, String> {
    taper::host::parse_size(s)
}

/// A rank's start: one output folder (rank 0's), the others' lines into
/// their rank files; `--watch` is refused (ranks would reload at different
/// steps).
fn join_world(
    w: &dyn taper::dist::Collective,
    out: Option<PathBuf>,
    recipe: &Path,
    watch: bool,
) -> taper::Result<PathBuf> {
    if watch {
        return Err(taper::Error::Config(
            "--watch is not available with several ranks: they would apply an edit at different steps".into(),
        ));
    }
    let out = taper::dist::launch::agree_out(w, out.unwrap_or_else(|| default_out(recipe)))?;
    if w.rank() != 0 {
        taper::dist::launch::log_to_rank_file(&out, w.rank())?;
    }
    Ok(out)
}

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    match taper::run::periodic::Every::parse(s)? {
        taper::run::periodic::Every::Time(d) => Ok(d),
        taper::run::periodic::Every::Steps(n) => Ok(std::time::Duration::from_secs(n)),
    }
}

/// `taper launch`: the ranks under mpirun; its exit code is theirs.
fn launch(n: usize, args: &[String]) -> ExitCode {
    let recipe = args.iter().find(|a| !a.starts_with('-'));
    let out = default_out(Path::new(recipe.map_or("run", |r| r.as_str())));
    let status = std::env::current_exe()
        .map_err(|e| taper::Error::Config(format!("taper launch: {e}")))
        .and_then(|exe| taper::dist::launch::launch(n, &exe, args, &out));
    match status {
        Ok((s, _)) if s.success() => ExitCode::SUCCESS,
        // Stopped by a signal passed on to the ranks: 128 + its number, as
        // `taper train` exits.
        Ok((_, Some(sig))) => ExitCode::from((128 + sig).clamp(0, 255) as u8),
        Ok((s, None)) => ExitCode::from(s.code().map_or(1, |c| c.clamp(1, 255) as u8)),
        Err(e) => {
            eprintln!("taper: {e}");
            ExitCode::from(2)
        }
    }
}

fn default_out(recipe: &Path) -> PathBuf {
    let stem = recipe.file_stem().and_then(|s| s.to_str()).unwrap_or("run");
    PathBuf::from("runs").join(format!("{stem}-{}", taper::host::utc_stamp()))
}

/// Switches read from the environment, for measuring one change at a time.
fn read_switches() {
    // TAPER_FUSED_KERNELS=0 uses candle's ops instead of taper's fused ones.
    if std::env::var("TAPER_FUSED_KERNELS").as_deref() == Ok("0") {
        taper::kernels::set_fused(false);
    }
    // TAPER_FLASH_ATTENTION=1 uses the tiled attention kernel on CUDA.
    if std::env::var("TAPER_FLASH_ATTENTION").as_deref() == Ok("1") {
        taper::kernels::set_flash(true);
    }
    // TAPER_MALLOC_TUNING=0 keeps glibc's defaults (to measure the difference).
    if std::env::var("TAPER_MALLOC_TUNING").as_deref() != Ok("0") {
        taper::memory::tune_malloc();
    }
}

fn main() -> ExitCode {
    read_switches();
    match Cli::parse().command {
        Command::Train(args) => match train_options(args) {
            Ok((recipe, opts)) => run_recipe(&recipe, opts),
            Err(code) => code,
        },
        Command::Check { recipe } => {
            let opts = HostOptions {
                device: "cpu".into(),
                quiet: false,
                check_only: true,
                overrides: recipe.set.clone(),
                ..HostOptions::default()
            };
            run_recipe(&recipe.recipe, opts)
        }
        Command::Plan {
            recipe,
            mem_limit,
            margin,
        } => plan(&recipe, mem_limit, margin),
        Command::Plugin { cmd } => plugin(cmd),
        Command::Report { runs, out } => report(&runs, out),
        Command::Export(args) => export(args),
        Command::Sample(args) => sample(args),
        Command::Launch { n, args } => launch(n, &args),
        Command::Bench(args) => match taper::bench::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("taper bench: {e}");
                ExitCode::from(1)
            }
        },
    }
}

/// `taper export`.
fn export(a: ExportArgs) -> ExitCode {
    use taper::interop::saved::export_checkpoint;
    match export_checkpoint(&a.checkpoint, &a.out, &a.format, &a.ty, a.merge) {
        Ok(w) => {
            say!(
                "exported {} ({}{}): {} bytes",
                a.out.display(),
                a.format,
                w.detail,
                w.bytes
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("taper export: {e}");
            ExitCode::from(2)
        }
    }
}

/// `taper sample`.
fn sample(a: SampleArgs) -> ExitCode {
    use taper::interop::saved::sample_checkpoint;
    match sample_checkpoint(&a.checkpoint, &a.prompt, a.tokens, a.temperature, a.seed) {
        Ok(text) => {
            say!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("taper sample: {e}");
            ExitCode::from(2)
        }
    }
}

/// `taper train`'s host options: the output folder (a data-parallel rank
/// joins rank 0's), what to resume from, and the flags. Bad input is told
/// here, before anything runs, as the exit code to leave with.
fn train_options(a: TrainArgs) -> Result<(PathBuf, HostOptions), ExitCode> {
    let told = |e: taper::Error| {
        eprintln!("taper: {e}");
        ExitCode::from(e.exit_code())
    };
    // `--resume RUN_DIR` continues in that folder unless --out says
    // otherwise; `--resume auto` continues in --out if it holds a run.
    let mut out = a.out.or_else(|| a.resume.clone().filter(|r| r.is_dir()));
    // One of several data-parallel ranks (mpirun, taper launch)?
    let world = taper::dist::init(
        a.rank_timeout,
        taper::run::interrupt::requested,
        a.collective,
    )
    .map_err(|e| {
        eprintln!("taper: {e}");
        ExitCode::from(2)
    })?;
    if let Some(w) = world {
        taper::run::interrupt::set_patient();
        out = Some(join_world(w, out.take(), &a.recipe.recipe, a.watch).map_err(told)?);
    }
    let writer = taper::dist::rank() == 0;
    let auto = a.resume.as_deref() == Some(Path::new("auto"));
    // The folder whose later runs (a distilled student) resume too.
    let folder = match a.resume.as_deref() {
        Some(_) if auto => out.clone(),
        Some(r) if r.is_dir() => Some(r.to_path_buf()),
        _ => None,
    };
    // A checkpoint that cannot be resumed from is bad input: said before
    // anything runs.
    let resume = a
        .resume
        .map(|arg| taper::engine::checkpoint::resolve_resume(&arg, out.as_deref()))
        .transpose()
        .map_err(|e| {
            eprintln!("taper: {e}");
            ExitCode::from(2)
        })?
        .flatten()
        .map(|(path, notes)| {
            for n in notes {
                eprintln!("taper: warning: {n}");
            }
            path
        });
    let opts = HostOptions {
        device: a.device,
        seed: a.seed,
        // Only rank 0 of a data-parallel run writes records and checkpoints.
        out_dir: Some(out.unwrap_or_else(|| default_out(&a.recipe.recipe))).filter(|_| writer),
        resume,
        resume_folder: folder,
        // The other ranks write to their log files, not a terminal.
        quiet: a.quiet && writer,
        check_only: false,
        overrides: a.recipe.set.clone(),
        mem_limit: a.mem_limit,
        inject_oom: a.inject_oom,
        watch: a.watch,
        checkpoint_every: a.checkpoint_every.map(|e| e.0),
        keep_checkpoints: a.keep_checkpoints.map(|k| k as usize),
        log_every: a.log_every,
        tensorboard: a.tensorboard && writer,
        reuse_out: auto,
    };
    Ok((a.recipe.recipe, opts))
}

/// Runs a recipe (`train` or `check`) and says how it ended.
fn run_recipe(recipe: &Path, opts: HostOptions) -> ExitCode {
    let check = opts.check_only;
    let quiet = opts.quiet;
    if !check {
        // Ctrl-C, SIGTERM, SIGHUP: stop at the next step with a checkpoint.
        if let Err(e) = taper::run::interrupt::install() {
            eprintln!("taper: cannot handle signals ({e}): a signal will end the run without a checkpoint");
        }
    }
    let mut host = match Host::new(opts) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("taper: {}", taper::host::render_error(&e));
            return ExitCode::from(e.exit_code());
        }
    };
    match host.run_file(recipe) {
        Ok(report) => {
            // Every rank completed: MPI can end (after a failure a rank may
            // be gone, and the launcher ends the others).
            taper::dist::finish();
            if check {
                say!("{}: ok", recipe.display());
            } else if let (false, Some(m)) = (quiet, report.metrics) {
                say!("metrics: {}", m.display());
                for c in host.checkpoints() {
                    say!("checkpoint: {}", c.display());
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => ended(&host, &e),
    }
}

/// A run that ended early: a failure, a signal or `os.exit`. Says where its
/// checkpoints are, and how to continue.
fn ended(host: &Host, e: &taper::Error) -> ExitCode {
    // A signal or os.exit is an ending, not a failure: no traceback.
    let told = match (e.interrupted(), e.exited()) {
        (Some(sig), _) => taper::Error::Interrupted(sig).to_string(),
        (_, Some(code)) => taper::Error::Exited(code).to_string(),
        _ => taper::host::render_error(e),
    };
    eprintln!("taper: {told}");
    if let (Some(w), Some(_)) = (taper::dist::world(), e.interrupted()) {
        // Every rank was asked to stop: they leave together, once
        // rank 0 has written its checkpoint.
        let _ = w.farewell(std::time::Duration::from_secs(60));
    }
    let ending = e.exit_code() == 3 || e.interrupted().is_some();
    if taper::dist::rank() != 0 {
        // Rank 0 writes the run's checkpoints.
    } else if host.checkpoints().is_empty() && ending {
        // Nothing to continue from, and nothing lost: no step was taken.
        eprintln!("taper: no checkpoint: the run had taken no step");
    }
    for c in host.checkpoints() {
        let folder = c.parent().unwrap_or(Path::new("."));
        eprintln!(
            "taper: checkpoint written to {} (continue with --resume {})",
            c.display(),
            folder.display()
        );
    }
    ExitCode::from(e.exit_code())
}
