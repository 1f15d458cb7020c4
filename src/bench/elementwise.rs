//! `taper bench elementwise`: the element-wise kernels of a GPT-2 small
//! training step alone, at its shapes (8 x 1024 tokens, width 768), each
//! with the bytes it must move at least (its inputs read once and its
//! outputs written once) and the rate it moves them: layer norm forward
//! and backward, GELU forward and backward, the residual add, the bias
//! gradient at each of the block's four widths, the cross-entropy's loss
//! and logit gradient over the head's logits (in place, one pass to read
//! and one to read and write), and the mixed-precision AdamW update over
//! all the weights at once. These kernels are bound by
//! memory, so the rate against the card's (an H100 SXM moves about 3.35
//! TB/s) says how much each could still gain; the last line weighs each by
//! how often a step runs it. `taper bench products` does the same for the
//! products.

use candle_core::{DType, Device, Tensor};

use crate::engine::parse_device;
use crate::kernels::adamw::AdamWStep;
use crate::kernels::adamw_mixed::{adamw_mixed, Factor, MixedMoments};
use crate::kernels::device_state::DeviceMoments;
use crate::{Error, Result};

#[derive(clap::Args, Debug)]
pub struct ElementwiseArgs {
    /// cpu, cuda, cuda:N or auto
    #[arg(long, default_value = "cuda")]
    pub device: String,
    /// f32, bf16 or f16: the activations' dtype (AdamW's working copy too)
    #[arg(long, default_value = "bf16")]
    pub precision: String,
    /// Rows: the step's tokens (GPT-2's batch 8 x 1024)
    #[arg(long, default_value_t = 8192)]
    pub rows: usize,
    #[arg(long, default_value_t = 768)]
    pub width: usize,
    /// The vocabulary of the cross-entropy's logits (GPT-2's 50257; rows
    /// are padded to a multiple of 64, as the chunked cross-entropy pads
    /// them on CUDA)
    #[arg(long, default_value_t = 50_257)]
    pub vocab: usize,
    /// Weights the AdamW update covers (GPT-2 small's 124M)
    #[arg(long, default_value_t = 124_439_808)]
    pub params: usize,
    /// Calls per timing
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Timings per kernel (the median is printed)
    #[arg(long, default_value_t = 5, value_parser = super::at_least_one)]
    pub rounds: usize,
}

pub fn run(a: &ElementwiseArgs) -> Result<()> {
    let dev = parse_device(&a.device)?;
    let dtype = super::kernel_dtype(&a.precision, "elementwise")?;
    let (r, w) = (a.rows, a.width);
    let size = dtype.size_in_bytes();
    let t = |shape: &[usize]| -> Result<Tensor> {
        Ok(Tensor::randn(0f32, 1.0, shape, &dev)?.to_dtype(dtype)?)
    };
    let time = |f: &mut dyn FnMut() -> candle_core::Result<()>| {
        super::time_calls(&dev, (a.reps, a.rounds), f)
    };
    let mut lines: Vec<(String, f64, usize, usize)> = Vec::new();

    let (x, g) = (t(&[r, w])?, t(&[r, w])?);
    if !crate::kernels::covers(&x) {
        return Err(Error::Config(format!(
            "bench elementwise: taper's kernels do not take {dtype:?} on {} (f32 on the CPU; \
             f32, f16 or bf16 on CUDA)",
            crate::engine::describe_device(&dev)
        )));
    }
    let (lw, lb) = (t(&[w])?, t(&[w])?);
    let s = time(&mut || crate::kernels::layer_norm(&x, &lw, &lb, 1e-5).map(drop))?;
    lines.push((
        format!("layer norm forward [{r}x{w}]"),
        s,
        2 * r * w * size,
        25,
    ));
    let s = time(&mut || crate::kernels::layer_norm_grad(&x, &lw, &g, 1e-5).map(drop))?;
    lines.push((
        "layer norm backward (dx, dw, db)".into(),
        s,
        3 * r * w * size,
        25,
    ));
    let s = time(&mut || crate::kernels::add(&x, &g).map(drop))?;
    // 24 in the forward, and about as many gradient sums in the backward.
    lines.push((format!("add [{r}x{w}]"), s, 3 * r * w * size, 49));

    let (h, gh) = (t(&[r, 4 * w])?, t(&[r, 4 * w])?);
    let s = time(&mut || crate::kernels::gelu(&h).map(drop))?;
    lines.push((
        format!("GELU forward [{r}x{}]", 4 * w),
        s,
        2 * r * 4 * w * size,
        12,
    ));
    let s = time(&mut || crate::kernels::gelu_grad(&h, &gh).map(drop))?;
    lines.push(("GELU backward".into(), s, 3 * r * 4 * w * size, 12));

    // The bias gradients of qkv, the attention's projection, the MLP's two
    // layers (a column sum each, as the dense layer's backward runs it).
    for (name, n) in [
        ("qkv", 3 * w),
        ("proj", w),
        ("mlp fc", 4 * w),
        ("mlp proj", w),
    ] {
        let dy = t(&[r, n])?;
        let s = time(&mut || crate::kernels::bias_grad(&dy).map(drop))?;
        lines.push((
            format!("bias gradient, {name} [{r}x{n}]"),
            s,
            r * n * size,
            12,
        ));
    }

    // The head's logits, turned into their gradient in place: the calls
    // after the first see gradients, which cost the kernel the same.
    let cols = a.vocab.next_multiple_of(64);
    let z = t(&[r, cols])?;
    let ids: Vec<u32> = (0..r).map(|i| (i * 7919 % a.vocab.max(1)) as u32).collect();
    let ids = Tensor::new(ids, &dev)?;
    let s = time(&mut || crate::kernels::rows_loss_and_grad(&z, &ids, a.vocab).map(drop))?;
    lines.push((
        format!("cross-entropy loss and gradient [{r}x{cols}]"),
        s,
        2 * r * cols * size,
        1,
    ));

    if let Some(line) = adamw(a, &dev, dtype)? {
        lines.push(line);
    }

    let who = crate::engine::describe_device(&dev);
    let (mut step_s, mut step_bytes) = (0.0, 0.0);
    for (name, secs, bytes, per_step) in &lines {
        println!(
            "elementwise {name:<44} {:>8.3} ms  {:>7.0} GB/s  x{per_step}",
            secs * 1e3,
            *bytes as f64 / secs / 1e9
        );
        step_s += secs * *per_step as f64;
        step_bytes += (*bytes * *per_step) as f64;
    }
    println!(
        "elementwise per step on {who} {dtype:?}: {:.2} ms for {:.2} GB ({:.0} GB/s)",
        step_s * 1e3,
        step_bytes / 1e9,
        step_bytes / step_s / 1e9
    );
    Ok(())
}

/// The mixed-precision AdamW update (f32 weights and moments, a gradient
/// and working copy in `dtype`) over `a.params` weights as one tensor: 28
/// bytes a weight under bf16 or f16. None under f32 (that update is
/// another kernel).
fn adamw(
    a: &ElementwiseArgs,
    dev: &Device,
    dtype: DType,
) -> Result<Option<(String, f64, usize, usize)>> {
    if dtype == DType::F32 {
        return Ok(None);
    }
    let p = a.params;
    let theta = Tensor::randn(0f32, 0.02, p, dev)?;
    let grad = Tensor::randn(0f32, 0.01, p, dev)?.to_dtype(dtype)?;
    let work = theta.to_dtype(dtype)?;
    let h = AdamWStep::new(1e-4, (0.9, 0.95), 1e-8, 0.1, 1);
    let zeros = vec![0f32; p];
    let secs = if dev.is_cuda() {
        let mut moments = DeviceMoments::from_host(dev, &zeros, &zeros)?;
        super::time_calls(dev, (a.reps, a.rounds), || {
            let m = MixedMoments::Device(&mut moments);
            adamw_mixed(&theta, &grad, Factor::Value(1.0), m, &work, &h)
        })?
    } else {
        let (mut m, mut v) = (zeros.clone(), zeros);
        super::time_calls(dev, (a.reps, a.rounds), || {
            let mm = MixedMoments::Host(&mut m, &mut v);
            adamw_mixed(&theta, &grad, Factor::Value(1.0), mm, &work, &h)
        })?
    };
    Ok(Some((
        format!("AdamW (mixed) over {p} weights"),
        secs,
        p * (4 * 3 * 2 + 2 * dtype.size_in_bytes()),
        1,
    )))
}
