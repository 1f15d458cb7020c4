//! The `taper` command line: a thin layer over the library.

use std::process::ExitCode;

use clap::Parser;
use taper::HostOptions;

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

mod cli;

use cli::args::{Cli, Command};
use cli::commands::{classify, export, launch, plan, plugin, report, sample};
use cli::train::{run_recipe, train_options};

/// Switches read from the environment, for measuring one change at a time.
fn read_switches() {
    // TAPER_FUSED_KERNELS=0 uses candle's ops instead of taper's fused ones.
    if std::env::var("TAPER_FUSED_KERNELS").as_deref() == Ok("0") {
        taper::kernels::set_fused(false);
    }
    // TAPER_FLASH_ATTENTION=0 uses cuBLAS products over the scores on CUDA
    // instead of the tiled attention kernel (=1, the default).
    match std::env::var("TAPER_FLASH_ATTENTION").as_deref() {
        Ok("0") => taper::kernels::set_flash(false),
        Ok("1") => taper::kernels::set_flash(true),
        _ => {}
    }
    // TAPER_FLASH_ROWS=32 gives each warp of the tiled attention 32 rows
    // instead of 16 (the default).
    if let Ok(rows) = std::env::var("TAPER_FLASH_ROWS") {
        match rows.as_str() {
            "16" => taper::kernels::set_flash_rows(16).expect("16 is taken"),
            "32" => taper::kernels::set_flash_rows(32).expect("32 is taken"),
            _ => {
                taper::tell!("taper: TAPER_FLASH_ROWS={rows}: warps take 16 or 32 rows; keeping 16")
            }
        }
    }
    // TAPER_CUBLASLT=1 runs the dense layer's forward on CUDA through
    // cuBLASLt, the bias in the product's epilogue (=0, the default: cuBLAS
    // onto the bias rows).
    match std::env::var("TAPER_CUBLASLT").as_deref() {
        Ok("0") => taper::kernels::set_cublaslt(false),
        Ok("1") => taper::kernels::set_cublaslt(true),
        _ => {}
    }
    // TAPER_MALLOC_TUNING=0 keeps glibc's defaults (to measure the difference).
    if std::env::var("TAPER_MALLOC_TUNING").as_deref() != Ok("0") {
        taper::memory::tune_malloc();
    }
}

fn main() -> ExitCode {
    read_switches();
    // TAPER_CPU_WORKERS=0 runs the command on the main thread instead of a
    // worker of the CPU thread pool (to measure the difference).
    if std::env::var("TAPER_CPU_WORKERS").as_deref() == Ok("0") {
        command()
    } else {
        taper::engine::run_on_workers(command)
    }
}

fn command() -> ExitCode {
    match Cli::parse().command {
        Command::Train(args) => match train_options(args) {
            Ok((recipe, opts, _lock)) => run_recipe(&recipe, opts),
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
        Command::Classify(args) => classify(args),
        Command::Launch { n, args } => launch(n, &args),
        Command::Bench(args) => match taper::bench::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                taper::tell!("taper bench: {e}");
                ExitCode::from(1)
            }
        },
    }
}
