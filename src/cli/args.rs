//! The command line's declarations (clap) and its value parsers.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "taper",
    version,
    about = "Train candle models from Lua recipes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Args)]
pub struct RecipeArgs {
    /// The recipe, e.g. scripts/digits.lua
    pub recipe: PathBuf,
    /// Override a `taper.config{}` value, typed by its default (repeatable): --set epochs=2
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_set)]
    pub set: Vec<(String, String)>,
}

#[derive(Subcommand)]
pub enum Command {
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
    /// folder (hf), a llama.cpp GGUF file (gguf), a QLoRA run's adapters as
    /// a llama.cpp LoRA adapter (gguf-lora) or a PEFT adapter folder (peft),
    /// or an MLP or CNN classifier as an ONNX model for onnxruntime (onnx).
    Export(ExportArgs),
    /// Generate text from a checkpoint of a sequence model (its vocabulary
    /// is in the checkpoint).
    Sample(SampleArgs),
    /// Classify image files, CSV rows or array samples with a checkpoint of
    /// a model trained on an image folder, a CSV file or arrays (its class
    /// names, and how it read its inputs, are in the checkpoint).
    Classify(ClassifyArgs),
    /// Benchmarks that print figures; see `taper bench --help`.
    Bench(taper::bench::BenchArgs),
    /// Native strategy plugins: inspect one, or start a new one.
    Plugin {
        #[command(subcommand)]
        cmd: PluginCmd,
    },
}

#[derive(clap::Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub recipe: RecipeArgs,
    /// auto (a GPU when the build has CUDA and one is present), cpu, cuda or cuda:N
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Mixed into every seed the recipe gives (init, shuffles, sampling)
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output folder for metrics.jsonl and checkpoints [default: runs/<recipe>-<UTC time>]
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue a run: a checkpoint file, a run folder (continued in place),
    /// or `auto`: the run in --out if it has a checkpoint, else a fresh start
    #[arg(long, value_name = "PATH|RUN_DIR|auto")]
    pub resume: Option<PathBuf>,
    /// No progress bar and no printed lines
    #[arg(long)]
    pub quiet: bool,
    /// Memory budget (e.g. 512MiB): exceeding it at a phase boundary is an OOM
    /// that the run's policy recovers from (on the CPU: the heap, counted)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub mem_limit: Option<usize>,
    /// Inject an OOM, e.g. "step=5,phase=backward" or "step=7,phase=forward,times=3" (repeatable)
    #[arg(long, value_name = "SPEC")]
    pub inject_oom: Vec<String>,
    /// Watch the recipe and the Lua modules it requires; apply edits at the
    /// end of the epoch (or at run:reload_point()) without stopping the run
    #[arg(long)]
    pub watch: bool,
    /// Save the checkpoint this often while training: steps (500) or time
    /// (90s, 10m); `never` for only at the end, on failure, on a signal, or
    /// when SIGUSR1 asks [default: the recipe's checkpoint_every, else 5m]
    #[arg(long, value_name = "STEPS|TIME|never", value_parser = parse_every)]
    pub checkpoint_every: Option<EveryArg>,
    /// How many checkpoints of each run to keep: the newest, and older ones
    /// that --resume falls back to when the newest is damaged
    /// [default: the recipe's keep_checkpoints, else 2]
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    pub keep_checkpoints: Option<u32>,
    /// Write a `step` record (loss, lr, step time, throughput, memory)
    /// every N steps; 0 for none
    #[arg(long, value_name = "N", default_value_t = taper::host::DEFAULT_LOG_EVERY)]
    pub log_every: u64,
    /// Also write the records as TensorBoard event files (OUT/tensorboard/)
    #[arg(long)]
    pub tensorboard: bool,
    /// Under a data-parallel launcher: how long a rank waits for the others
    /// at a collective before it stops (a rank died or hangs): 90s, 10m
    #[arg(long, value_name = "TIME", value_parser = parse_timeout, default_value = "300s")]
    pub rank_timeout: std::time::Duration,
    /// How ranks sum gradients: auto (MPI under a launcher), or nccl (on the
    /// GPU, a build with --features nccl; alone, a world of one)
    #[arg(long, value_name = "auto|nccl", default_value = "auto", value_parser = taper::dist::Engine::parse)]
    pub collective: taper::dist::Engine,
}

#[derive(clap::Args)]
pub struct ExportArgs {
    /// A checkpoint, or a run folder (its newest valid checkpoint)
    pub checkpoint: PathBuf,
    /// gguf, hf, gguf-lora, peft (a QLoRA run's adapters, for PEFT and
    /// transformers) or onnx (an MLP or CNN classifier, for onnxruntime)
    #[arg(long, default_value = "gguf")]
    pub format: String,
    /// GGUF weight type: f32, f16, q8_0, q4_0 or q4_1 [default: q8_0]
    #[arg(long = "type")]
    pub ty: Option<String>,
    /// With --format gguf on a QLoRA run: the base with the adapters merged in
    /// (what gguf means for a llama run in any case; only a llama takes it)
    #[arg(long)]
    pub merge: bool,
    /// The file (gguf, onnx) or folder (hf, peft) to write
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(clap::Args)]
pub struct ClassifyArgs {
    /// A checkpoint, or a run folder (its newest valid checkpoint)
    pub checkpoint: PathBuf,
    /// Image files, or folders (the images in them), for a run on an image
    /// folder; CSV files (a line per row), for a run on a CSV file; .npy,
    /// .npz or .safetensors files (a line per sample), for a run on arrays
    #[arg(required_unless_present = "text", conflicts_with = "text")]
    pub images: Vec<PathBuf>,
    /// A text to classify, for a run on a CSV file's texts (repeat it for
    /// several: a line each, `text 1: ...`)
    #[arg(long)]
    pub text: Vec<String>,
    /// Each `--text`'s second text, for a run on text pairs (as many as
    /// `--text`, in order)
    #[arg(long, requires = "text")]
    pub pair: Vec<String>,
    /// How many classes to print for each image, most likely first
    /// [default: 1; for a multi-label run, every label]
    #[arg(long)]
    pub top: Option<usize>,
}

#[derive(clap::Args)]
pub struct SampleArgs {
    /// A checkpoint, or a run folder (its newest valid checkpoint)
    pub checkpoint: PathBuf,
    /// Text to continue [default: a newline]
    #[arg(
        long,
        default_value = "\n",
        hide_default_value = true,
        conflicts_with = "chat"
    )]
    pub prompt: String,
    /// A user's message to a run on chats (taper.data.chat): prints the
    /// model's reply, the message rendered with the run's chat template
    #[arg(long)]
    pub chat: Option<String>,
    #[arg(long, default_value_t = 200)]
    pub tokens: usize,
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Subcommand)]
pub enum PluginCmd {
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

pub fn parse_set(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got `{s}`")),
    }
}

/// `--checkpoint-every`: a period, or `never`.
#[derive(Clone)]
pub struct EveryArg(pub Option<taper::run::periodic::Every>);

pub fn parse_every(s: &str) -> Result<EveryArg, String> {
    taper::run::periodic::parse_period(s).map(EveryArg)
}

pub fn parse_size(s: &str) -> Result<usize, String> {
    taper::host::parse_size(s)
}

pub fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    match taper::run::periodic::Every::parse(s)? {
        taper::run::periodic::Every::Time(d) => Ok(d),
        taper::run::periodic::Every::Steps(n) => Ok(std::time::Duration::from_secs(n)),
    }
}
