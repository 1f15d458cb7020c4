//! `taper bench quant`: the frozen products of a QLoRA step on the CPU, one
//! block of SmolLM2-135M (`scripts/smollm2_qlora.lua`'s model) with its
//! GGUF file's weight type, three ways, alternating in each round:
//! - `taper`: `QLinear`'s forward, taper's tiles (`quant::tiled`);
//! - `candle`: candle's quantized matmul, a dot product per output;
//! - `f32`: the weight dequantized once, outside the timing, and an f32
//!   product: what PEFT runs on a CPU (`benches/peft_qlora_step.py`), with
//!   four times the weight's bytes resident.
//!
//! Each line gives the median milliseconds per call and the rate in
//! multiply-adds counted twice, as FLOP/s.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use super::step::rate;
use crate::quant::lora::QLinear;
use crate::{Error, Result};

#[derive(clap::Args, Debug)]
pub struct QuantArgs {
    /// Input rows of every product: the step's tokens (the recipe's 4 x 64)
    #[arg(long, default_value_t = 256)]
    pub rows: usize,
    /// The weights' type: q4_1 (SmolLM2's file), q4_0, q5_0, q5_1 or q8_0
    /// (the k-quants' 256-value blocks do not divide SmolLM2's width, 576)
    #[arg(long, default_value = "q4_1")]
    pub dtype: String,
    /// Calls per timing
    #[arg(long, default_value_t = 10)]
    pub reps: usize,
    /// Rounds, each timing every way once (the median is printed)
    #[arg(long, default_value_t = 5, value_parser = super::at_least_one)]
    pub rounds: usize,
}

/// SmolLM2-135M's projections: (name, inputs, outputs); a block has each
/// once, gate and up twice.
const SHAPES: [(&str, usize, usize, usize); 5] = [
    ("q, o", 576, 576, 2),
    ("k, v", 576, 192, 2),
    ("gate, up", 576, 1536, 2),
    ("down", 1536, 576, 1),
    ("head (tied, Q8_0 in the file)", 576, 49152, 0),
];

pub fn run(a: &QuantArgs) -> Result<()> {
    let dtype = parse_dtype(&a.dtype)?;
    let dev = Device::Cpu;
    let x_all = Tensor::randn(0f32, 1.0, (a.rows, 1536), &dev)?;
    let ways = ["taper", "candle", "f32"];
    let mut block = [0.0f64; 3];
    let mut block_flops = 0.0;
    for (name, k, n, per_block) in SHAPES {
        let wdtype = if per_block == 0 {
            GgmlDType::Q8_0
        } else {
            dtype
        };
        let w = Tensor::randn(0f32, 0.05, (n, k), &dev)?;
        let q = Arc::new(QTensor::quantize(&w, wdtype)?);
        let ours = QLinear { weight: q.clone() };
        let theirs = QMatMul::QTensor(q.clone());
        let wf = q.dequantize(&dev)?.t()?;
        let x = x_all.narrow(1, 0, k)?.contiguous()?;
        let calls: [&dyn Fn() -> candle_core::Result<Tensor>; 3] =
            [&|| ours.forward(&x), &|| theirs.forward(&x), &|| {
                x.matmul(&wf)
            }];
        let mut times = vec![Vec::new(); 3];
        for f in &calls {
            f()?;
        }
        for _ in 0..a.rounds.max(1) {
            for (f, times) in calls.iter().zip(&mut times) {
                let t = std::time::Instant::now();
                for _ in 0..a.reps.max(1) {
                    f()?;
                }
                times.push(t.elapsed().as_secs_f64() / a.reps.max(1) as f64);
            }
        }
        let flops = 2.0 * (a.rows * k * n) as f64;
        for (i, (way, times)) in ways.iter().zip(&mut times).enumerate() {
            let s = super::median(times);
            println!(
                "quant {way:<6} {name:<30} [{}x{k}] x {wdtype:?} [{n}x{k}]^T {:>8.3} ms {:>14}",
                a.rows,
                s * 1e3,
                rate(flops / s)
            );
            block[i] += s * per_block as f64;
        }
        block_flops += flops * per_block as f64;
    }
    for (way, s) in ways.iter().zip(block) {
        println!(
            "quant {way:<6} a block's frozen forward: {:.3} ms at {} ({} threads)",
            s * 1e3,
            rate(block_flops / s),
            candle_core::utils::get_num_threads()
        );
    }
    Ok(())
}

fn parse_dtype(s: &str) -> Result<GgmlDType> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "q4_0" => GgmlDType::Q4_0,
        "q4_1" => GgmlDType::Q4_1,
        "q5_0" => GgmlDType::Q5_0,
        "q5_1" => GgmlDType::Q5_1,
        "q8_0" => GgmlDType::Q8_0,
        other => {
            return Err(Error::Config(format!(
                "--dtype {other}: expected q4_0, q4_1, q5_0, q5_1 or q8_0"
            )))
        }
    })
}
