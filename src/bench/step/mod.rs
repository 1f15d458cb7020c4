//! `taper bench step`: one model's training step on random data, the
//! figures `benches/torch_step.py` prints for the same model in PyTorch:
//! milliseconds per step (median), tokens (or samples) per second, peak
//! memory (the CUDA pool's high-water mark, as `max_memory_allocated`; the
//! heap on the CPU), and MFU: model FLOPs per second over the FLOP rate of
//! a large matmul in the same dtype, measured in the same process.

use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};

mod cnn;

use super::{adamw, median};
use crate::data::Batch;
use crate::engine::precision::Precision;
use crate::engine::rng::Rng;
use crate::engine::{parse_device, Gpt, Mlp, ModelSpec, Trainer, TrainerOptions};
use crate::memory::{device as devmem, HostMemory};
use crate::run::CHECK_WEIGHTS_EVERY;
use crate::{Error, Result};

#[derive(clap::Args, Debug)]
pub struct StepArgs {
    /// mlp (784-256-10, batch 128), cnn (28x28, 3x3 conv 8 and 16 channels
    /// with 2x2 max-pools, dense 64, batch 64), cnn-rgb (scripts/image_folder.lua's
    /// CNN on 3x64x64 photos: conv 16 and 32 channels, dense 128, batch 64),
    /// lenet (PyTorch's CIFAR-10 tutorial net: 3x32x32, 5x5 conv 6 and 16
    /// channels without padding, dense 120 and 84, batch 64), mnist
    /// (PyTorch's MNIST example net: 3x3 conv 32 and 64 channels without
    /// padding, one max-pool after the second, dense 128, batch 64), gpt (4
    /// layers, 4 heads, width 128, context 128, batch 32), shakespeare (scripts/shakespeare.lua's GPT:
    /// width 64, 2 layers, context 64, batch 32) or gpt2 (GPT-2 small: 124M
    /// parameters, context 1024, batch 8)
    #[arg(long, default_value = "mlp")]
    pub model: String,
    #[arg(long, default_value_t = 30, value_parser = super::at_least_one)]
    pub steps: usize,
    /// cpu, cuda, cuda:N or auto
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// f32, bf16 or f16 (mixed precision, f32 master weights)
    #[arg(long, default_value = "f32")]
    pub precision: String,
    /// Override the model's batch size
    #[arg(long)]
    pub batch: Option<usize>,
    /// Language models: override the context length (the batch's sequence
    /// length too)
    #[arg(long)]
    pub context: Option<usize>,
    /// Language models: the LM head's cross-entropy in chunks of this many
    /// rows (0: full logits)
    #[arg(long, default_value_t = 0)]
    pub chunk: usize,
    /// Also time the same steps with taper's fused kernels off
    #[arg(long)]
    pub compare_unfused: bool,
    /// Also time the same steps with the other causal attention (CUDA, f16
    /// or bf16): cuBLAS products over the scores (`fused,cublas-attention`)
    /// when the tiled kernel (`fused,flash`, the default) is on, and the
    /// other way round
    #[arg(long)]
    pub compare_attention: bool,
    /// GPTs: recompute every n-th block's activations in the backward (0:
    /// none), as `recompute = n` does
    #[arg(long, default_value_t = 0)]
    pub recompute: usize,
    /// Keep AdamW's moments offloaded (host memory: pinned on CUDA), as
    /// `offload = true` does
    #[arg(long)]
    pub offload: bool,
    /// Leave out the timing of the divergence check's pass over the weights
    /// (for a profile that should hold the steps' kernels only)
    #[arg(long)]
    pub no_weights_check: bool,
}

/// A model, a batch of random data, and its FLOPs per training step.
struct Workload {
    spec: Arc<dyn ModelSpec>,
    batch: Batch,
    /// Tokens (language models) or samples per step.
    items: usize,
    /// GPTs: (layers, context, width), for attention's FLOPs and the
    /// position table, which does no multiply-adds.
    gpt: Option<(usize, usize, usize)>,
    /// Training FLOPs per item when 6 N does not count them (convolutions
    /// use each weight at every position).
    per_item: Option<f64>,
}

impl Workload {
    /// Training FLOPs per step for `params` parameters: nanoGPT's
    /// estimate_mfu (PaLM, appendix B): 6 N per token for the weights (N
    /// without the position table) plus 12 L T d for attention.
    fn flops(&self, params: usize) -> f64 {
        let per_item = match (self.per_item, self.gpt) {
            (Some(f), _) => f,
            (None, Some((l, t, d))) => 6.0 * (params - t * d) as f64 + 12.0 * (l * t * d) as f64,
            (None, None) => 6.0 * params as f64,
        };
        per_item * self.items as f64
    }
}

fn gpt_workload(spec: Gpt, b: usize, rng: &mut Rng) -> Result<Workload> {
    let (t, v) = (spec.context, spec.vocab);
    let ids: Vec<u32> = (0..b * (t + 1)).map(|_| rng.below(v) as u32).collect();
    let all = Tensor::from_vec(ids, (b, t + 1), &Device::Cpu)?;
    Ok(Workload {
        batch: Batch {
            x: all.narrow(1, 0, t)?,
            y: all.narrow(1, 1, t)?.contiguous()?,
            indices: (0..b).collect(),
        },
        items: b * t,
        gpt: Some((spec.layers, t, spec.width)),
        per_item: None,
        spec: Arc::new(spec),
    })
}

/// The `gpt` workload's model and batch (shared with `bench kernels`).
pub(super) fn random_batch(model: &str, rng: &mut Rng) -> Result<(Arc<dyn ModelSpec>, Batch)> {
    let w = workload(model, None, None, rng)?;
    Ok((w.spec, w.batch))
}

/// Whether `model` counts samples (the MLP and the CNNs), not tokens.
fn per_sample(model: &str) -> bool {
    matches!(model, "mlp" | "cnn" | "cnn-rgb" | "lenet" | "mnist")
}

fn workload(
    model: &str,
    batch: Option<usize>,
    context: Option<usize>,
    rng: &mut Rng,
) -> Result<Workload> {
    if context.is_some() && per_sample(model) {
        return Err(Error::Config(format!(
            "bench step: --context applies to the language models (gpt, shakespeare, gpt2), not `{model}`"
        )));
    }
    let gpt = |vocab, default_context, width, layers, heads| Gpt {
        vocab,
        context: context.unwrap_or(default_context),
        width,
        layers,
        heads,
        mlp: 4,
        dropout: 0.0,
        from: None,
        initial: None,
    };
    match model {
        "mlp" => {
            let (b, n) = (batch.unwrap_or(128), 784);
            let x: Vec<f32> = (0..b * n).map(|_| rng.normal() as f32).collect();
            let y: Vec<u32> = (0..b).map(|_| rng.below(10) as u32).collect();
            let spec = Mlp {
                inputs: n,
                hidden: vec![256],
                outputs: 10,
                activation: Default::default(),
                dropout: 0.0,
            };
            Ok(Workload {
                batch: Batch {
                    x: Tensor::from_vec(x, (b, n), &Device::Cpu)?,
                    y: Tensor::from_vec(y, b, &Device::Cpu)?,
                    indices: (0..b).collect(),
                },
                items: b,
                gpt: None,
                per_item: None,
                spec: Arc::new(spec),
            })
        }
        "cnn" => cnn::workload(&cnn::CNN, batch.unwrap_or(64), rng),
        "cnn-rgb" => cnn::workload(&cnn::CNN_RGB, batch.unwrap_or(64), rng),
        "lenet" => cnn::workload(&cnn::LENET, batch.unwrap_or(64), rng),
        "mnist" => cnn::workload(&cnn::MNIST, batch.unwrap_or(64), rng),
        "gpt" => gpt_workload(gpt(65, 128, 128, 4, 4), batch.unwrap_or(32), rng),
        "shakespeare" => gpt_workload(gpt(65, 64, 64, 2, 4), batch.unwrap_or(32), rng),
        "gpt2" => gpt_workload(gpt(50257, 1024, 768, 12, 12), batch.unwrap_or(8), rng),
        other => Err(Error::Config(format!(
            "bench step: unknown model `{other}`: use mlp, cnn, cnn-rgb, lenet, mnist, gpt, shakespeare or gpt2"
        ))),
    }
}

/// FLOP/s of an n x n x n matmul in `dtype` on `dev`: the ceiling MFU is
/// measured against (median of several).
fn matmul_ceiling(dev: &Device, dtype: DType) -> Result<f64> {
    let n = if dev.is_cpu() { 1024 } else { 8192 };
    let a = Tensor::randn(0f32, 1.0, (n, n), dev)?.to_dtype(dtype)?;
    let b = Tensor::randn(0f32, 1.0, (n, n), dev)?.to_dtype(dtype)?;
    let mut times = Vec::new();
    for i in 0..8 {
        dev.synchronize()?;
        let t = Instant::now();
        let c = a.matmul(&b)?;
        dev.synchronize()?;
        drop(c);
        if i >= 2 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(2.0 * (n as f64).powi(3) / median(&mut times))
}

/// Median seconds per step and peak bytes over `steps` steps.
fn time_steps(trainer: &mut Trainer, batch: &Batch, steps: usize) -> Result<(f64, Option<usize>)> {
    let dev = trainer.device().clone();
    for _ in 0..3 {
        trainer.train_step(batch)?;
    }
    devmem::reset_pool_peak(&dev)?;
    HostMemory::reset_peak();
    let mut times = Vec::new();
    for _ in 0..steps {
        let t = Instant::now();
        // Returns the loss as a number: a device sync per step, as the
        // PyTorch reference's loss.item().
        trainer.train_step(batch)?;
        times.push(t.elapsed().as_secs_f64());
    }
    let peak = match devmem::pool_peak(&dev) {
        Some(p) => Some(p),
        None if HostMemory::is_counting() => Some(HostMemory::peak()),
        None => None,
    };
    Ok((median(&mut times), peak))
}

/// Median seconds of the run's check that the weights are finite (see
/// `Run::step`), which a run pays once every [`CHECK_WEIGHTS_EVERY`] steps.
fn time_weights_check(trainer: &Trainer) -> Result<f64> {
    let mut times = Vec::new();
    for i in 0..7 {
        let t = Instant::now();
        trainer.params().all_finite()?;
        if i >= 2 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(median(&mut times))
}

pub(super) fn rate(flops: f64) -> String {
    if flops >= 1e12 {
        format!("{:.1} TFLOP/s", flops / 1e12)
    } else {
        format!("{:.1} GFLOP/s", flops / 1e9)
    }
}

/// `fused` or `unfused`, with the attention path where there is a choice
/// and the memory actions on: `fused,flash,recompute=1,offload`.
fn variant(fused: bool, flash: Option<bool>, a: &StepArgs) -> String {
    let mut v = String::from(if fused { "fused" } else { "unfused" });
    match flash {
        Some(true) if fused => v += ",flash",
        Some(false) if fused => v += ",cublas-attention",
        _ => {}
    }
    if a.recompute > 0 {
        v += &format!(",recompute={}", a.recompute);
    }
    if a.offload {
        v += ",offload";
    }
    v
}

pub fn run(a: &StepArgs) -> Result<()> {
    let dev = parse_device(&a.device)?;
    let precision = Precision::parse(&a.precision).ok_or_else(|| {
        Error::Config(format!(
            "bench step: unknown precision `{}`: use f32, bf16 or f16",
            a.precision
        ))
    })?;
    let w = workload(&a.model, a.batch, a.context, &mut Rng::new(0))?;
    let opts = || TrainerOptions {
        device: dev.clone(),
        loss: crate::engine::loss::Loss::CrossEntropy(crate::engine::loss::CrossEntropy {
            chunk: a.chunk,
            ..Default::default()
        }),
        ..TrainerOptions::default()
    };
    let ceiling = matmul_ceiling(&dev, precision.low().unwrap_or(DType::F32))?;
    // (fused, flash) pairs; the flash switch as the binary set it first.
    // The tiled attention runs only in the GPTs, on CUDA, in f16 or bf16.
    let flash = crate::kernels::flash();
    let flash_applies = dev.is_cuda() && precision.low().is_some() && w.gpt.is_some();
    let mut modes = vec![(true, flash)];
    if a.compare_attention {
        if flash_applies {
            modes.push((true, !flash));
        } else {
            eprintln!(
                "bench step: --compare-attention needs a GPT on CUDA in f16 or bf16; skipped"
            );
        }
    }
    if a.compare_unfused {
        modes.push((false, false));
    }
    let first = modes[0];
    for (fused, flash_on) in modes {
        crate::kernels::set_fused(fused);
        crate::kernels::set_flash(flash_on);
        let mut trainer = Trainer::new(w.spec.clone(), &adamw(), opts())?;
        trainer.set_precision(precision)?;
        trainer.set_recompute(a.recompute)?;
        trainer.set_offload(a.offload)?;
        let (secs, peak) = time_steps(&mut trainer, &w.batch, a.steps)?;
        let params = trainer.params().num_params();
        let achieved = w.flops(params) / secs;
        println!(
            "step {} on {} {} {}: {:.2} ms/step, {:.0} {}/s, peak {}, {} = MFU {:.1}% of a measured {} matmul ({} parameters, {} steps)",
            a.model,
            crate::engine::describe_device(&dev),
            precision.name(),
            variant(fused, flash_applies.then_some(flash_on), a),
            secs * 1e3,
            w.items as f64 / secs,
            if per_sample(&a.model) { "samples" } else { "tokens" },
            peak.map_or("n/a".into(), |p| format!("{:.1} MiB", p as f64 / (1 << 20) as f64)),
            rate(achieved),
            100.0 * achieved / ceiling,
            rate(ceiling),
            params,
            a.steps,
        );
        if (fused, flash_on) == first && !a.no_weights_check {
            let check = time_weights_check(&trainer)?;
            println!(
                "  weights check: {:.2} ms, once every {CHECK_WEIGHTS_EVERY} steps: {:.2}% of this step's time",
                check * 1e3,
                100.0 * check / (secs * CHECK_WEIGHTS_EVERY as f64),
            );
        }
    }
    crate::kernels::set_fused(true);
    crate::kernels::set_flash(flash);
    Ok(())
}
