//! `taper bench precision`: step time, peak memory and bytes per parameter
//! for each precision and AdamW state format, on the Shakespeare GPT of
//! scripts/shakespeare.lua and on a wider one where the parameters weigh
//! more than the activations. Against the ZeRO paper's 16 bytes per
//! parameter for mixed-precision Adam (2 + 2 for fp16 weights and gradients,
//! 4 + 4 + 4 for the fp32 master and both moments).

use std::sync::Arc;
use std::time::Instant;

use crate::data::{shakespeare, Pipeline, Source};
use crate::engine::optim::{AdamWConfig, OptimSpec, StateFormat};
use crate::engine::precision::Precision;
use crate::engine::{Gpt, Trainer, TrainerOptions};
use crate::memory::HostMemory;
use crate::{Error, Result};

const CONFIGS: [(Precision, StateFormat); 5] = [
    (Precision::F32, StateFormat::F32),
    (Precision::F32, StateFormat::Q8),
    (Precision::Bf16, StateFormat::F32),
    (Precision::Bf16, StateFormat::Q8),
    (Precision::F16, StateFormat::F32),
];

pub fn run(steps: usize, width: usize, layers: usize) -> Result<()> {
    if !HostMemory::is_counting() {
        return Err(Error::Config(
            "bench precision: needs the counting allocator (run the taper binary)".into(),
        ));
    }
    let src = shakespeare("train", 64, None)?;
    let vocab = src.vocab().map(|v| v.len()).unwrap_or(0);
    let data = Pipeline::new(Arc::new(src)).shuffle(1).batch(32, false);
    println!(
        "bench precision: AdamW, batch 32, context 64, {steps} steps per configuration (after 2 warm-up steps)"
    );
    for (w, l) in [(64, 2), (width, layers)] {
        let spec = Gpt {
            vocab,
            context: 64,
            width: w,
            layers: l,
            heads: 4,
            mlp: 4,
            dropout: 0.0,
            from: None,
            initial: None,
        };
        println!("\nGPT width {w}, {l} layers:");
        println!(
            "{:>9} {:>6} {:>9} {:>10} {:>11} {:>11} {:>11} {:>13}",
            "precision",
            "state",
            "ms/step",
            "params",
            "state B/p",
            "model B/p",
            "resident B/p",
            "step peak"
        );
        for (p, state) in CONFIGS {
            measure(&spec, &data, p, state, steps)?;
        }
    }
    println!(
        "\nmodel B/p: bytes per parameter of master weights + low-precision copy + gradients (at the optimizer: \
         low-precision and f32) + optimizer state; ZeRO's mixed-precision Adam: 16.\n\
         resident B/p: measured, the heap held between steps (weights, working copy, optimizer state) per parameter.\n\
         step peak: the heap's peak during a step above its level before it (activations, gradients, temporaries)."
    );
    Ok(())
}

fn measure(
    spec: &Gpt,
    data: &Pipeline,
    p: Precision,
    state: StateFormat,
    steps: usize,
) -> Result<()> {
    let optim = OptimSpec::AdamW(AdamWConfig {
        lr: 1e-3,
        state,
        ..Default::default()
    });
    let mut batches = data.epoch(1, 32, 0);
    let start = HostMemory::current();
    let mut t = Trainer::new(Arc::new(spec.clone()), &optim, TrainerOptions::default())?;
    t.set_precision(p)?;
    let mut next = || {
        batches
            .next()
            .ok_or_else(|| Error::Data("bench: out of data".into()))?
    };
    for _ in 0..2 {
        t.train_step(&next()?)?;
    }
    // Measured: what stays allocated between steps (masters, working copy,
    // optimizer state, model structures).
    let resident = HostMemory::current().saturating_sub(start);
    let (mut peak, mut times) = (0usize, Vec::with_capacity(steps));
    for _ in 0..steps {
        let batch = next()?;
        let before = HostMemory::current();
        HostMemory::reset_peak();
        let t0 = Instant::now();
        t.train_step(&batch)?;
        times.push(t0.elapsed().as_secs_f64());
        peak = peak.max(HostMemory::peak().saturating_sub(before));
    }
    let n = t.params().num_params();
    let state_bytes = t.optimizer_state_bytes();
    let low = p.low().map_or(0, |d| d.size_in_bytes());
    // Masters (4) + working copy + its gradients + the f32 gradients the
    // optimizer reads (under f32 these are the same tensor) + state.
    let grads = if low > 0 { low + 4 } else { 4 };
    let model_bytes = n * (4 + low + grads) + state_bytes;
    println!(
        "{:>9} {:>6} {:>9.2} {:>10} {:>11.2} {:>11.2} {:>11.2} {:>9.1} MiB",
        p.name(),
        match state {
            StateFormat::F32 => "f32",
            StateFormat::Q8 => "8bit",
        },
        super::median(&mut times) * 1e3,
        n,
        state_bytes as f64 / n as f64,
        model_bytes as f64 / n as f64,
        resident as f64 / n as f64,
        peak as f64 / (1 << 20) as f64
    );
    Ok(())
}
