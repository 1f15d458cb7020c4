//! `taper bench products`: the matrix products of a GPT-2 small training
//! step, alone, as taper's step runs them: each block's four dense layers
//! (`kernels::linear` forward, `kernels::linear_grads` backward: two
//! products and the bias sum) and the tied head's three products (the
//! chunked cross-entropy's, on its padded head). `benches/torch_products.py`
//! times the same products as PyTorch's training step runs them, and prints
//! the same lines, so that the products' share of the gap to the card's
//! peak can be told from the element-wise work around them.

use candle_core::{DType, Device, Tensor};

use super::step::rate;
use crate::engine::parse_device;
use crate::Result;

#[derive(clap::Args, Debug)]
pub struct ProductsArgs {
    /// cpu, cuda, cuda:N or auto
    #[arg(long, default_value = "cuda")]
    pub device: String,
    /// f32, bf16 or f16: the products' dtype
    #[arg(long, default_value = "bf16")]
    pub precision: String,
    /// Rows of every product: the step's tokens (GPT-2's batch 8 x 1024)
    #[arg(long, default_value_t = 8192)]
    pub rows: usize,
    #[arg(long, default_value_t = 768)]
    pub width: usize,
    #[arg(long, default_value_t = 12)]
    pub layers: usize,
    #[arg(long, default_value_t = 50257)]
    pub vocab: usize,
    /// Calls per timing
    #[arg(long, default_value_t = 10)]
    pub reps: usize,
    /// Timings per product (the median is printed)
    #[arg(long, default_value_t = 5, value_parser = super::at_least_one)]
    pub rounds: usize,
}

/// One timed group of products: its name, how many times a step runs it,
/// and its FLOPs.
struct Group {
    name: String,
    per_step: usize,
    flops: f64,
    seconds: f64,
}

pub fn run(a: &ProductsArgs) -> Result<()> {
    let dev = parse_device(&a.device)?;
    let dtype = super::kernel_dtype(&a.precision, "products")?;
    let (r, w) = (a.rows, a.width);
    let mut groups = Vec::new();
    // The block's dense layers: (name, inputs, outputs).
    for (name, k, n) in [
        ("qkv", w, 3 * w),
        ("attn proj", w, w),
        ("mlp fc", w, 4 * w),
        ("mlp proj", 4 * w, w),
    ] {
        let x = randn(&[r, k], dtype, &dev)?;
        let wt = randn(&[n, k], dtype, &dev)?;
        let b = randn(&[n], dtype, &dev)?;
        let dy = randn(&[r, n], dtype, &dev)?;
        let flops = 2.0 * (r * k * n) as f64;
        let fwd = time(a, &dev, || {
            crate::kernels::linear(&x, &wt, Some(&b)).map(drop)
        })?;
        let bwd = time(a, &dev, || {
            crate::kernels::linear_grads(&x, &wt, &dy).map(drop)
        })?;
        groups.push(group(
            format!("{name} forward [{r}x{k}] x [{k}x{n}]"),
            a.layers,
            flops,
            fwd,
        ));
        groups.push(group(
            format!("{name} backward (dx, dw, db)"),
            a.layers,
            2.0 * flops,
            bwd,
        ));
    }
    // The tied head, as the chunked cross-entropy runs it in one chunk.
    let head = crate::kernels::padded_head(&randn(&[a.vocab, w], dtype, &dev)?)?;
    let v = head.dim(0)?;
    let h = randn(&[r, w], dtype, &dev)?;
    let dz = randn(&[r, v], dtype, &dev)?;
    let flops = 2.0 * (r * w * v) as f64;
    let ht = head.t()?;
    let fwd = time(a, &dev, || h.matmul(&ht).map(drop))?;
    let bwd = time(a, &dev, || {
        let dh = dz.matmul(&head)?;
        let dw = dz.t()?.matmul(&h)?;
        drop((dh, dw));
        Ok(())
    })?;
    groups.push(group(
        format!("head forward [{r}x{w}] x [{w}x{v}]"),
        1,
        flops,
        fwd,
    ));
    groups.push(group("head backward (dh, dw)".into(), 1, 2.0 * flops, bwd));
    // TAPER_CUBLASLT=1 (`kernels::set_cublaslt`): the dense forward
    // through cuBLASLt, the bias in its epilogue.
    let who = if crate::kernels::cublaslt() {
        "taper-cublaslt"
    } else {
        "taper"
    };
    report(who, &dev, dtype, &groups);
    Ok(())
}

fn randn(shape: &[usize], dtype: DType, dev: &Device) -> Result<Tensor> {
    Ok(Tensor::randn(0f32, 0.1, shape, dev)?.to_dtype(dtype)?)
}

fn group(name: String, per_step: usize, flops: f64, seconds: f64) -> Group {
    Group {
        name,
        per_step,
        flops,
        seconds,
    }
}

/// Median seconds per call of `f` (see [`super::time_calls`]).
fn time(a: &ProductsArgs, dev: &Device, f: impl FnMut() -> candle_core::Result<()>) -> Result<f64> {
    super::time_calls(dev, (a.reps, a.rounds), f)
}

/// One line per group, then the step's total; `benches/torch_products.py`
/// prints the same.
fn report(who: &str, dev: &Device, dtype: DType, groups: &[Group]) {
    let (mut secs, mut flops) = (0.0, 0.0);
    for g in groups {
        println!(
            "products {who} {:<48} {:>8.3} ms  {:>14}  x{}",
            g.name,
            g.seconds * 1e3,
            rate(g.flops / g.seconds),
            g.per_step
        );
        secs += g.seconds * g.per_step as f64;
        flops += g.flops * g.per_step as f64;
    }
    println!(
        "products {who} per step on {} {dtype:?}: {:.2} ms, {:.3} TFLOP at {}",
        crate::engine::describe_device(dev),
        secs * 1e3,
        flops / 1e12,
        rate(flops / secs)
    );
}
