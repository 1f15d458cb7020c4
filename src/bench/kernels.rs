//! `taper bench kernels`: taper's fused kernels against candle's ops in the
//! same process, alternating: GELU, softmax and layer norm (forward +
//! backward) alone, the AdamW update, the chunked cross-entropy and the
//! causal attention (time and peak memory), and whole
//! training steps of the two GPTs (the step benchmark's, which
//! benches/torch_step.py mirrors, and the Shakespeare one).

use std::time::Instant;

use candle_core::{Device, Tensor, Var};

use super::median;
use super::step::random_batch;
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
        "  {what:<50} fused {:>8.2} ms   candle {:>8.2} ms   candle/fused {:.2}x",
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

    adamw_step(rounds)?;
    lm_head(rounds)?;
    attention(rounds)?;

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

/// One AdamW update of 4M parameters (8 tensors of 512 x 1024): the fused
/// in-place kernel vs the composed tensor ops.
fn adamw_step(rounds: usize) -> Result<()> {
    use crate::engine::optim::{AdamW, AdamWConfig, Optimizer};
    let dev = Device::Cpu;
    let vars: Vec<(String, Var)> = (0..8)
        .map(|i| {
            Ok((
                format!("w{i}"),
                Var::from_tensor(&Tensor::randn(0f32, 1.0, (512, 1024), &dev)?)?,
            ))
        })
        .collect::<Result<_>>()?;
    let loss = vars
        .iter()
        .map(|(_, v)| v.as_tensor().sqr()?.sum_all())
        .try_fold(Tensor::new(0f32, &dev)?, |a, b| a + b?)?;
    let grads = loss.backward()?;
    let mut fused = AdamW::new(AdamWConfig::default()).with_fused(true);
    let mut composed = AdamW::new(AdamWConfig::default()).with_fused(false);
    let time = |opt: &mut AdamW| -> Result<f64> {
        let t = Instant::now();
        opt.step(&vars, &grads)?;
        Ok(t.elapsed().as_secs_f64())
    };
    time(&mut fused)?;
    time(&mut composed)?;
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        on.push(time(&mut fused)?);
        off.push(time(&mut composed)?);
    }
    report(
        "AdamW update, 4.2M parameters",
        (median(&mut on), median(&mut off)),
    );
    Ok(())
}

/// Language-model head and cross-entropy, forward + backward, for 4096
/// positions (batch 32 x context 128), width 128: the full logits vs the
/// chunked kernel (512 positions per block). Time and the heap's peak.
fn lm_head(rounds: usize) -> Result<()> {
    use crate::kernels::chunked_cross_entropy;
    let dev = Device::Cpu;
    let n = 32 * 128;
    for vocab in [8192, 32768] {
        let h = Var::from_tensor(&Tensor::randn(0f32, 1.0, (n, 128), &dev)?)?;
        let w = Var::from_tensor(&(Tensor::randn(0f32, 1.0, (vocab, 128), &dev)? * 0.05)?)?;
        let y = Tensor::from_vec(
            (0..n as u32)
                .map(|i| (i * 7919) % vocab as u32)
                .collect::<Vec<_>>(),
            n,
            &dev,
        )?;
        let run = |fused: bool| {
            timed_peak(|| {
                let loss = if fused {
                    chunked_cross_entropy(h.as_tensor(), w.as_tensor(), &y, 512, 0.0)?
                } else {
                    let logits = h.as_tensor().matmul(&w.as_tensor().t()?)?;
                    crate::engine::loss::CrossEntropy::default().loss(&logits, &y)?
                };
                let g = loss.backward()?;
                std::hint::black_box(g.get(w.as_tensor()).map(|g| g.dims().len()));
                Ok(())
            })
        };
        run(true)?;
        run(false)?;
        let (times, peaks) = compare_with_peak(rounds, run)?;
        report(
            &format!("LM head + cross-entropy, 4096 x 128, vocab {vocab}"),
            times,
        );
        report_peak(("chunked", "full logits"), peaks);
    }
    Ok(())
}

/// Seconds and peak heap growth of `f`.
fn timed_peak(f: impl FnOnce() -> Result<()>) -> Result<(f64, usize)> {
    use crate::memory::HostMemory;
    let base = HostMemory::current();
    HostMemory::reset_peak();
    let t = Instant::now();
    f()?;
    Ok((
        t.elapsed().as_secs_f64(),
        HostMemory::peak().saturating_sub(base),
    ))
}

/// `run(true)` against `run(false)`, alternating: the medians of their
/// times and the largest of their peaks.
fn compare_with_peak(
    rounds: usize,
    mut run: impl FnMut(bool) -> Result<(f64, usize)>,
) -> Result<((f64, f64), (usize, usize))> {
    let (mut on, mut off, mut peak_on, mut peak_off) = (Vec::new(), Vec::new(), 0, 0);
    for _ in 0..rounds {
        let (t, p) = run(true)?;
        on.push(t);
        peak_on = peak_on.max(p);
        let (t, p) = run(false)?;
        off.push(t);
        peak_off = peak_off.max(p);
    }
    Ok(((median(&mut on), median(&mut off)), (peak_on, peak_off)))
}

/// The peaks under `report`'s line, when the heap is counted.
fn report_peak((on, off): (&str, &str), (peak_on, peak_off): (usize, usize)) {
    if crate::memory::HostMemory::is_counting() {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        println!(
            "  {:<50} {on} peak {:>6.1} MiB   {off} {:>6.1} MiB   {off}/{on} {:.1}x",
            "",
            mib(peak_on),
            mib(peak_off),
            peak_off as f64 / peak_on.max(1) as f64
        );
    }
}

/// The fused causal attention against the composed ops, forward and
/// backward from the `qkv` projection: the step benchmark's GPT (batch 32,
/// context 128, 4 heads of 32) and one GPT-2 sample (context 1024, 12 heads
/// of 64).
fn attention(rounds: usize) -> Result<()> {
    use crate::kernels::causal_attention;
    let dev = Device::Cpu;
    for (b, t, heads, hd) in [(32, 128, 4, 32), (1, 1024, 12, 64)] {
        let c = heads * hd;
        let qkv = Var::from_tensor(&Tensor::randn(0f32, 1.0, (b, t, 3 * c), &dev)?)?;
        let run = |fused: bool| {
            set_fused(fused);
            timed_peak(|| {
                let y = causal_attention(qkv.as_tensor(), heads)?;
                let g = y.sum_all()?.backward()?;
                std::hint::black_box(g.get(qkv.as_tensor()).map(|g| g.dims().len()));
                Ok(())
            })
        };
        let compared = compare_with_peak(rounds, run);
        set_fused(true);
        let (times, peaks) = compared?;
        report(
            &format!("causal attention + backward, {b} x {t}, {heads} x {hd}"),
            times,
        );
        report_peak(("fused", "candle"), peaks);
    }
    Ok(())
}
