//! `taper bench kernels`: taper's fused kernels against candle's ops in the
//! same process, alternating: GELU, softmax and layer norm (forward +
//! backward) alone, and whole
//! training steps of the two GPTs (the step benchmark's, which
//! benches/torch_step.py mirrors, and the Shakespeare one).

use std::time::Instant;

use candle_core::{Device, Tensor, Var};

use super::{median, random_batch};
use crate::engine::rng::Rng;
use crate::engine::{Trainer, TrainerOptions};
use crate::kernels::{gelu, layer_norm, set_fused, softmax_last_dim};
use crate::Result;

fn pass(x: &Var, op: &dyn Fn(&Tensor) -> candle_core::Result<Tensor>) -> Result<f64> {
    let t = Instant::now();
    let y = op(x.as_tensor())?;
    let g = y.sum_all()?.backward()?;
    std::hint::black_box(g.get(x.as_tensor()).map(|g| g.dims().len()));
    Ok(t.elapsed().as_secs_f64())
}

/// Median seconds of `f` with the fused kernels and without, alternating
/// rounds so that both see the same machine.
fn compare(rounds: usize, mut f: impl FnMut() -> Result<f64>) -> Result<(f64, f64)> {
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        set_fused(true);
        on.push(f()?);
        set_fused(false);
        off.push(f()?);
    }
    set_fused(true);
    Ok((median(&mut on), median(&mut off)))
}

fn report(what: &str, (on, off): (f64, f64)) {
    println!(
        "  {what:<44} fused {:>8.2} ms   candle {:>8.2} ms   candle/fused {:.2}x",
        on * 1e3,
        off * 1e3,
        off / on
    );
}

pub fn run(rounds: usize, steps: usize) -> Result<()> {
    println!(
        "fused kernels vs candle ops (CPU, {} threads; medians of {rounds} alternating rounds):",
        candle_core::utils::get_num_threads()
    );
    // The GPT's MLP activations: batch 32 x context 128 x 512.
    let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (32 * 128, 512), &Device::Cpu)?)?;
    let gelu_op = |t: &Tensor| gelu(t);
    pass(&x, &gelu_op)?;
    let r = compare(rounds, || pass(&x, &gelu_op))?;
    report("GELU forward + backward, 4096 x 512", r);
    // Attention scores: batch 32 x 4 heads x 128 x 128 is 128 x 128 x 128.
    let att = Var::from_tensor(&Tensor::randn(0f32, 1.0, (128, 128, 128), &Device::Cpu)?)?;
    let softmax_op = |t: &Tensor| softmax_last_dim(t);
    let r = compare(rounds, || pass(&att, &softmax_op))?;
    report("softmax forward + backward, 128 x 128 x 128", r);
    let h = Var::from_tensor(&Tensor::randn(0f32, 1.0, (32 * 128, 128), &Device::Cpu)?)?;
    let w = Tensor::ones(128, candle_core::DType::F32, &Device::Cpu)?;
    let b = Tensor::zeros(128, candle_core::DType::F32, &Device::Cpu)?;
    let ln_op = |t: &Tensor| layer_norm(t, &w, &b, 1e-5);
    let r = compare(rounds, || pass(&h, &ln_op))?;
    report("layer norm forward + backward, 4096 x 128", r);

    let (spec, batch) = random_batch("gpt", &mut Rng::new(0))?;
    let gpt = Trainer::new(spec, &super::adamw(), TrainerOptions::default())?;
    let src = crate::data::shakespeare("train", 64, None)?;
    let data = crate::data::Pipeline::new(std::sync::Arc::new(src))
        .shuffle(1)
        .batch(32, false);
    let small_batch = data
        .epoch(1, 32, 0)
        .next()
        .ok_or_else(|| crate::Error::Data("no Shakespeare batch".into()))??;
    let small = super::shakespeare_gpt(1e-3)?;
    for (mut t, batch) in [(gpt, batch), (small, small_batch)] {
        for _ in 0..2 {
            t.train_step(&batch)?;
        }
        let r = compare(rounds, || {
            let s = Instant::now();
            for _ in 0..steps {
                t.train_step(&batch)?;
            }
            Ok(s.elapsed().as_secs_f64() / steps as f64)
        })?;
        report(&format!("train step, {}", t.spec().describe()), r);
    }
    Ok(())
}
