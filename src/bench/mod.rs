//! `taper bench`: benchmarks that print figures (never asserted in tests).
//! Machines are noisy, so each compares against a reference measured in the
//! same process, alternating, and reports medians and ratios.

/// Benchmarks print with this `println!`: a closed stdout (`taper bench oom
/// | head`) drops the line instead of panicking. Defined before the
/// submodules, so it is theirs too.
macro_rules! println {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

mod checkpoint;
mod data;
mod elementwise;
mod kernels;
mod oom;
mod plugin;
mod precision;
mod products;
mod quant;
mod ranks;
mod records;
mod reload;
mod step;

use std::sync::Arc;
use std::time::Instant;

use crate::data::{shakespeare, Pipeline};
use crate::engine::optim::{AdamWConfig, OptimSpec};
use crate::engine::{Gpt, ModelSpec, Trainer, TrainerOptions};
use crate::{Error, Host, HostOptions, Result};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub which: Which,
}

#[derive(clap::Subcommand, Debug)]
pub enum Which {
    /// Per-step cost of driving the training loop from Lua versus the same
    /// steps driven from Rust, on the Shakespeare GPT (scripts/shakespeare.lua's shape).
    LuaOverhead {
        /// Steps per measurement
        #[arg(long, default_value_t = 40, value_parser = at_least_one)]
        steps: usize,
        /// Alternating Rust/Lua measurements
        #[arg(long, default_value_t = 5, value_parser = at_least_one)]
        rounds: usize,
        #[arg(long, default_value_t = 64)]
        width: usize,
        #[arg(long, default_value_t = 2)]
        layers: usize,
        #[arg(long, default_value_t = 64)]
        context: usize,
    },
    /// Data pipeline throughput per source, and the share of step time spent
    /// waiting for data with and without prefetch.
    Data {
        /// Training steps for the data-wait measurement
        #[arg(long, default_value_t = 60, value_parser = at_least_one)]
        steps: usize,
    },
    /// What OOM recovery costs: time to the next successful step, and
    /// throughput under a memory limit that forces micro-batching.
    Oom {
        #[arg(long, default_value_t = 9, value_parser = at_least_one)]
        rounds: usize,
    },
    /// What periodic checkpoints cost on scripts/shakespeare.lua: a run with a
    /// checkpoint after every step against one without, alternating.
    Checkpoint {
        /// Training steps per run
        #[arg(long, default_value_t = 60, value_parser = at_least_one)]
        steps: usize,
        #[arg(long, default_value_t = 3, value_parser = at_least_one)]
        rounds: usize,
    },
    /// What the per-step `step` records cost: one record timed directly, and
    /// scripts/shakespeare.lua with a record every step against none.
    Records {
        /// Training steps per run
        #[arg(long, default_value_t = 60, value_parser = at_least_one)]
        steps: usize,
        #[arg(long, default_value_t = 3, value_parser = at_least_one)]
        rounds: usize,
    },
    /// Hot reload: milliseconds from saving a watched module to the run using
    /// it, and how long applying it pauses the run.
    Reload {
        /// Saves of the schedule module
        #[arg(long, default_value_t = 9, value_parser = at_least_one)]
        edits: usize,
        /// Milliseconds between saves
        #[arg(long, default_value_t = 400)]
        interval_ms: u64,
    },
    /// Nanoseconds per OOM-policy call: built-in Rust vs a native plugin vs a
    /// Lua function.
    Plugin {
        /// The plugin to call (an OOM policy)
        #[arg(long, default_value = "target/release/libtaper_adaptive_batch.so")]
        path: std::path::PathBuf,
        #[arg(long, default_value_t = 200_000)]
        calls: u64,
        #[arg(long, default_value_t = 7, value_parser = at_least_one)]
        rounds: usize,
    },
    /// taper's fused kernels vs candle's ops: GELU alone and whole GPT
    /// training steps, alternating in one process.
    Kernels {
        #[arg(long, default_value_t = 5, value_parser = at_least_one)]
        rounds: usize,
        /// Training steps per round
        #[arg(long, default_value_t = 5, value_parser = at_least_one)]
        steps: usize,
    },
    /// Step time, peak memory and bytes per parameter for each precision
    /// (f32, bf16, f16) and AdamW state format (f32, 8bit).
    Precision {
        #[arg(long, default_value_t = 10, value_parser = at_least_one)]
        steps: usize,
        /// Width of the second, wider GPT
        #[arg(long, default_value_t = 256)]
        width: usize,
        #[arg(long, default_value_t = 4)]
        layers: usize,
    },
    /// Training-step time (forward, backward, AdamW) on random data, with
    /// tokens/s, peak memory and MFU against a matmul measured in the same
    /// process, for comparison with benches/torch_step.py (same models and
    /// flags).
    Step(step::StepArgs),
    /// The matrix products of a GPT-2 small training step alone, as taper
    /// runs them (benches/torch_products.py: as PyTorch does).
    Products(products::ProductsArgs),
    /// The frozen products of a QLoRA step on the CPU (SmolLM2-135M's
    /// shapes): taper's tiles, candle's quantized matmul and an f32 product
    /// with the dequantized weight, alternating.
    Quant(quant::QuantArgs),
    /// The element-wise kernels of a GPT-2 small training step alone, each
    /// with the bytes it must move and the rate it moves them.
    Elementwise(elementwise::ElementwiseArgs),
    /// Data-parallel throughput: scripts/shakespeare.lua on 1, 2 and 4 MPI
    /// ranks (`taper launch`, a build with --features mpi) against one
    /// process, alternating; the global batch is fixed.
    Ranks {
        /// Rank counts to run
        #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
        ranks: Vec<usize>,
        /// Training steps per run
        #[arg(long, default_value_t = 60, value_parser = at_least_one)]
        steps: usize,
        #[arg(long, default_value_t = 3, value_parser = at_least_one)]
        rounds: usize,
        /// The global batch (windows of 64 characters)
        #[arg(long, default_value_t = 32)]
        batch: usize,
    },
}

pub fn run(args: &BenchArgs) -> Result<()> {
    match &args.which {
        Which::LuaOverhead {
            steps,
            rounds,
            width,
            layers,
            context,
        } => lua_overhead(*steps, *rounds, *width, *layers, *context),
        Which::Step(a) => step::run(a),
        Which::Products(a) => products::run(a),
        Which::Quant(a) => quant::run(a),
        Which::Elementwise(a) => elementwise::run(a),
        Which::Ranks {
            ranks,
            steps,
            rounds,
            batch,
        } => ranks::run(ranks, *steps, *rounds, *batch),
        Which::Kernels { rounds, steps } => kernels::run(*rounds, *steps),
        Which::Data { steps } => data::run(*steps),
        Which::Precision {
            steps,
            width,
            layers,
        } => precision::run(*steps, *width, *layers),
        Which::Oom { rounds } => oom::run(*rounds),
        Which::Reload { edits, interval_ms } => reload::run(*edits, *interval_ms),
        Which::Checkpoint { steps, rounds } => checkpoint::run(*steps, *rounds),
        Which::Records { steps, rounds } => records::run(*steps, *rounds),
        Which::Plugin {
            path,
            calls,
            rounds,
        } => plugin::run(path, *calls, *rounds),
    }
}

/// The Shakespeare GPT of scripts/shakespeare.lua (width 64, 2 layers,
/// context 64) with AdamW: the model the data and OOM benchmarks train.
fn shakespeare_gpt(lr: f64) -> Result<Trainer> {
    let src = shakespeare("train", 64, None)?;
    let vocab = crate::data::Source::vocab(&src)
        .map(|v| v.len())
        .unwrap_or(0);
    let spec = Gpt {
        vocab,
        context: 64,
        width: 64,
        layers: 2,
        heads: 4,
        mlp: 4,
        dropout: 0.0,
        from: None,
        initial: None,
    };
    let optim = OptimSpec::AdamW(AdamWConfig {
        lr,
        ..Default::default()
    });
    Trainer::new(Arc::new(spec), &optim, TrainerOptions::default())
}

/// Trains `scripts/shakespeare.lua` for `steps` steps (one epoch, no
/// sample) into `dir` with `opts` for the rest; returns the whole run's
/// seconds and its epoch's (from the epoch record).
fn shakespeare_run(
    dir: &std::path::Path,
    steps: usize,
    opts: crate::HostOptions,
) -> Result<(f64, f64)> {
    let opts = crate::HostOptions {
        out_dir: Some(dir.to_path_buf()),
        overrides: [
            ("steps", steps.to_string()),
            ("epochs", "1".into()),
            ("sample", "0".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
        ..opts
    };
    let start = std::time::Instant::now();
    crate::Host::new(opts)?.run_file(std::path::Path::new("scripts/shakespeare.lua"))?;
    let total = start.elapsed().as_secs_f64();
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap_or_default();
    let epoch = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|r| r["event"] == "epoch")
        .and_then(|r| r["seconds"].as_f64())
        .unwrap_or(total);
    Ok((total, epoch))
}

/// A count of steps, rounds or edits: 0 would leave nothing to time.
fn at_least_one(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The dtype a `--precision` (f32, bf16, f16) runs its tensors in, for the
/// benchmarks that time kernels alone (`what` names the one asking).
fn kernel_dtype(precision: &str, what: &str) -> Result<candle_core::DType> {
    let p = crate::engine::precision::Precision::parse(precision).ok_or_else(|| {
        crate::Error::Config(format!("bench {what}: unknown precision {precision}"))
    })?;
    Ok(p.low().unwrap_or(candle_core::DType::F32))
}

/// Median seconds per call of `f` over `rounds` timings of `reps` calls
/// each (after one untimed call), with the device synchronized around each
/// timing: for ops that queue work on a GPU.
fn time_calls(
    dev: &candle_core::Device,
    (reps, rounds): (usize, usize),
    mut f: impl FnMut() -> candle_core::Result<()>,
) -> Result<f64> {
    f()?;
    dev.synchronize()?;
    let mut times = Vec::new();
    for _ in 0..rounds.max(1) {
        let t = std::time::Instant::now();
        for _ in 0..reps.max(1) {
            f()?;
        }
        dev.synchronize()?;
        times.push(t.elapsed().as_secs_f64() / reps.max(1) as f64);
    }
    Ok(median(&mut times))
}

fn adamw() -> OptimSpec {
    OptimSpec::AdamW(AdamWConfig {
        lr: 3e-3,
        ..Default::default()
    })
}

/// Seconds per step of `steps` steps driven from Rust.
fn rust_loop(spec: &Gpt, data: &Pipeline, steps: usize) -> Result<f64> {
    let mut trainer = Trainer::new(Arc::new(spec.clone()), &adamw(), TrainerOptions::default())?;
    let mut epoch = data.epoch(1, 32, 0);
    let t = Instant::now();
    for _ in 0..steps {
        let batch = epoch
            .next()
            .ok_or_else(|| Error::Data("bench: out of data".into()))??;
        trainer.train_step(&batch)?;
    }
    Ok(t.elapsed().as_secs_f64() / steps as f64)
}

/// Seconds per step of the same steps driven by a Lua recipe.
fn lua_loop(spec: &Gpt, steps: usize) -> Result<f64> {
    let mut host = Host::new(HostOptions::default())?;
    let src = format!(
        r#"
        local data = taper.data.shakespeare{{ context = {ctx} }}:shuffle{{ seed = 1 }}:batch(32)
        local run = taper.run{{
          model = taper.model.gpt{{ vocab = {vocab}, context = {ctx}, width = {w}, layers = {l}, heads = 4 }},
          optim = taper.optim.adamw{{ lr = 3e-3 }}, data = data,
        }}
        for epoch in run:epochs(1) do
          local t0, n = taper.clock(), 0
          for batch in run:batches() do
            run:step(batch)
            n = n + 1
            if n == {steps} then break end
          end
          elapsed = taper.clock() - t0
        end
        "#,
        ctx = spec.context,
        vocab = spec.vocab,
        w = spec.width,
        l = spec.layers,
        steps = steps
    );
    host.run_source("bench.lua", &src)?;
    let elapsed: f64 = host.globals()?.get("elapsed")?;
    Ok(elapsed / steps as f64)
}

fn lua_overhead(
    steps: usize,
    rounds: usize,
    width: usize,
    layers: usize,
    context: usize,
) -> Result<()> {
    let source = shakespeare("train", context, None)?;
    let vocab = crate::data::Source::vocab(&source)
        .map(|v| v.len())
        .unwrap_or(0);
    let spec = Gpt {
        vocab,
        context,
        width,
        layers,
        heads: 4,
        mlp: 4,
        dropout: 0.0,
        from: None,
        initial: None,
    };
    let data = Pipeline::new(Arc::new(source)).shuffle(1).batch(32, false);
    println!(
        "lua-overhead: {} , batch 32, {steps} steps x {rounds} rounds",
        spec.describe()
    );
    rust_loop(&spec, &data, 3)?; // warm up
    let (mut rs, mut ls) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let r = rust_loop(&spec, &data, steps)?;
        let l = lua_loop(&spec, steps)?;
        println!(
            "  round {round}: rust {:.3} ms/step, lua {:.3} ms/step",
            r * 1e3,
            l * 1e3
        );
        rs.push(r);
        ls.push(l);
    }
    let (r, l) = (median(&mut rs), median(&mut ls));
    let call = lua_call_cost()?;
    println!(
        "median: rust {:.3} ms/step, lua {:.3} ms/step, lua/rust = {:.4} ({:+.2}% per step)",
        r * 1e3,
        l * 1e3,
        l / r,
        (l / r - 1.0) * 100.0
    );
    // The step loop makes three calls into Rust per step: the batch
    // iterator, run:set_lr (a schedule in Lua) and run:step.
    println!(
        "one Lua->Rust method call: {:.3} us; 3 per step = {:.5}% of a {:.1} ms step",
        call * 1e6,
        3.0 * call / r * 100.0,
        r * 1e3
    );
    Ok(())
}

/// Seconds per call of a cheap run method from Lua (dispatch, argument
/// conversion, RefCell borrow): the per-call overhead of the host.
fn lua_call_cost() -> Result<f64> {
    let mut host = Host::new(HostOptions::default())?;
    host.run_source(
        "calls.lua",
        r#"
        local run = taper.run{ model = taper.model.mlp{ inputs = 2, outputs = 2 } }
        local n = 1000000
        local t0 = taper.clock()
        for i = 1, n do run:set_lr(1e-3) end
        per_call = (taper.clock() - t0) / n
        "#,
    )?;
    Ok(host.globals()?.get("per_call")?)
}
