//! taper's CUDA kernels (and the cuBLAS-based causal attention) against
//! their CPU references (`cpu_fwd`), on random inputs, in f32, f16 and
//! bf16; the fused AdamW (f32 and 8-bit moments)
//! against the CPU optimizer; the digits MLP and CNN recipes trained on
//! the GPU in f32 and bf16; and QLoRA over a small llama GGUF file.
//!
//! Needs the `cuda` feature and a GPU (`scripts/gpu-check.sh` runs it on
//! the device machine):
//!
//!     cargo test --release --features cuda --test cuda_kernels
//!
//! The inputs of the low-precision runs are rounded to that precision first
//! and the CPU reference computes on the rounded values, so the bounds
//! measure what the kernel adds: f32 accumulation in a different order, and
//! the rounding of the output.
#![cfg(feature = "cuda")]

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor, Var};
use taper::engine::optim::offload::Place;
use taper::engine::optim::{AdamW, AdamWConfig, ClipScale, Optimizer, StateFormat};
use taper::kernels;

#[path = "common/tiny_llama.rs"]
mod tiny_llama;

fn gpu() -> Device {
    Device::new_cuda(0).expect("these tests need a CUDA GPU (see scripts/gpu-check.sh)")
}

/// Relative bound on |gpu - cpu| / max|cpu| per dtype.
fn bound(dt: DType) -> f64 {
    match dt {
        DType::F32 => 2e-5,
        DType::F16 => 2e-3,
        _ => 1.6e-2, // bf16: 8 bits of mantissa
    }
}

fn max_rel(gpu: &Tensor, cpu: &Tensor) -> Result<f64> {
    let a: Vec<f32> = gpu
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1()?;
    let b: Vec<f32> = cpu.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1e-30f32, |m, x| m.max(x.abs())) as f64;
    let diff = a
        .iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs() as f64));
    Ok(diff / scale)
}

/// `x` rounded to `dt` and back: the values both sides compute on.
fn rounded(x: &Tensor, dt: DType) -> Result<Tensor> {
    x.to_dtype(dt)?.to_dtype(DType::F32)
}

/// Runs `f` on CPU f32 (the reference) and on the GPU in `dt`, with the
/// gradient of `sum(f(x) * probe)` for each input; compares the outputs and
/// every gradient.
fn check(
    what: &str,
    dt: DType,
    inputs: &[Tensor],
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<()> {
    let gpu = gpu();
    let inputs: Vec<Tensor> = inputs
        .iter()
        .map(|x| rounded(x, dt))
        .collect::<Result<_>>()?;
    let cpu_vars: Vec<Var> = inputs.iter().map(Var::from_tensor).collect::<Result<_>>()?;
    let gpu_vars: Vec<Var> = inputs
        .iter()
        .map(|x| Var::from_tensor(&x.to_dtype(dt)?.to_device(&gpu)?))
        .collect::<Result<_>>()?;
    let ts = |v: &[Var]| v.iter().map(|v| v.as_tensor().clone()).collect::<Vec<_>>();
    let y_cpu = f(&ts(&cpu_vars))?;
    let y_gpu = f(&ts(&gpu_vars))?;
    let e = max_rel(&y_gpu, &y_cpu)?;
    assert!(e <= bound(dt), "{what} {dt:?} forward: {e:.2e}");
    let probe = rounded(&Tensor::randn(0f32, 1.0, y_cpu.shape(), &Device::Cpu)?, dt)?;
    let g_cpu = (y_cpu * &probe)?.sum_all()?.backward()?;
    // A loss comes back in f32 whatever the inputs' dtype.
    let g_gpu = (y_gpu.clone() * probe.to_dtype(y_gpu.dtype())?.to_device(&gpu)?)?
        .sum_all()?
        .backward()?;
    for (i, (c, g)) in cpu_vars.iter().zip(&gpu_vars).enumerate() {
        let (Some(gc), Some(gg)) = (g_cpu.get(c), g_gpu.get(g)) else {
            continue;
        };
        let e = max_rel(gg, gc)?;
        // Backward kernels round twice (the incoming gradient, then theirs).
        assert!(e <= 2.0 * bound(dt), "{what} {dt:?} gradient {i}: {e:.2e}");
    }
    println!("{what} {dt:?}: ok");
    Ok(())
}

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

fn randn(shape: &[usize], std: f32) -> Result<Tensor> {
    Tensor::randn(0f32, std, shape, &Device::Cpu)
}

#[test]
fn gelu_matches_the_cpu() -> Result<()> {
    for dt in DTYPES {
        // 16 bytes a thread, with a tail of one value; then a view that
        // starts 301 values into its buffer, off a 16-byte boundary, which
        // the kernel takes a value at a time.
        check("gelu", dt, &[randn(&[37, 301], 2.0)?], |x| {
            kernels::gelu(&x[0])
        })?;
        check("gelu (unaligned)", dt, &[randn(&[37, 301], 2.0)?], |x| {
            kernels::gelu(&x[0].narrow(0, 1, 36)?)
        })?;
    }
    Ok(())
}

/// The residual add: 16 bytes a thread with a tail of one value, then a
/// view off a 16-byte boundary, a value at a time.
#[test]
fn add_matches_the_cpu() -> Result<()> {
    for dt in DTYPES {
        let (a, b) = (randn(&[37, 301], 1.0)?, randn(&[37, 301], 1.0)?);
        check("add", dt, &[a.clone(), b.clone()], |t| {
            kernels::add(&t[0], &t[1])
        })?;
        check("add (unaligned)", dt, &[a, b], |t| {
            kernels::add(&t[0].narrow(0, 1, 36)?, &t[1].narrow(0, 0, 36)?)
        })?;
    }
    Ok(())
}

#[test]
fn softmax_matches_the_cpu() -> Result<()> {
    for dt in DTYPES {
        // Row lengths below, at and above one block of threads.
        for cols in [7, 64, 1000, 3000] {
            check("softmax", dt, &[randn(&[19, cols], 3.0)?], |x| {
                kernels::softmax_last_dim(&x[0])
            })?;
        }
    }
    Ok(())
}

#[test]
fn layer_norm_matches_the_cpu() -> Result<()> {
    for dt in DTYPES {
        // Rows of 7000 are too long for the one-pass backward's shared
        // accumulators and take the three-kernel one.
        for (rows, cols) in [(5, 48), (300, 256), (2100, 1030), (40, 7000)] {
            let x = (randn(&[rows, cols], 2.0)? + 0.5)?;
            let w = (randn(&[cols], 0.3)? + 1.0)?;
            let b = randn(&[cols], 0.3)?;
            check("layer_norm", dt, &[x, w, b], |t| {
                kernels::layer_norm(&t[0], &t[1], &t[2], 1e-5)
            })?;
        }
    }
    Ok(())
}

#[test]
fn rope_matches_the_cpu() -> Result<()> {
    let (t, d) = (13, 64);
    let ang: Vec<f32> = (0..t * d / 2).map(|k| k as f32 * 0.173).collect();
    let ang = Tensor::from_vec(ang, (t, d / 2), &Device::Cpu)?;
    for dt in DTYPES {
        let x = randn(&[2, 3, t, d], 1.0)?;
        let (cos, sin) = (ang.cos()?, ang.sin()?);
        check("rope", dt, &[x], |x| {
            let dev = x[0].device();
            kernels::rope_interleaved(&x[0], &cos.to_device(dev)?, &sin.to_device(dev)?)
        })?;
    }
    Ok(())
}

#[test]
fn chunked_cross_entropy_matches_the_cpu() -> Result<()> {
    // A vocabulary that ends inside a 16-byte pack of the padded rows.
    let (n, d, v) = (150, 32, 5001);
    let y: Vec<u32> = (0..n).map(|i| ((i * 7919) % v) as u32).collect();
    let y = Tensor::new(y, &Device::Cpu)?;
    for dt in DTYPES {
        for (chunk, eps) in [(64, 0.0), (150, 0.1)] {
            let (h, w) = (randn(&[n, d], 1.0)?, randn(&[v, d], 0.2)?);
            // f16 trains with a loss scale (the gradient of the scaled loss
            // keeps the per-row gradients, about 1/rows, out of f16's
            // subnormals); the check does the same.
            let scale = if dt == DType::F16 { 1024.0 } else { 1.0 };
            check("chunked cross-entropy", dt, &[h, w], |t| {
                let y = y.to_device(t[0].device())?;
                kernels::chunked_cross_entropy(&t[0], &t[1], &y, chunk, eps)? * scale
            })?;
        }
    }
    Ok(())
}

#[test]
fn embedding_matches_the_cpu() -> Result<()> {
    // Repeated ids, so that the backward's atomic adds meet.
    let ids: Vec<u32> = (0..3 * 50).map(|i| ((i * 7) % 97) as u32).collect();
    let ids = Tensor::from_vec(ids, (3, 50), &Device::Cpu)?;
    for dt in DTYPES {
        check("embedding", dt, &[randn(&[97, 40], 1.0)?], |t| {
            kernels::embedding(&t[0], &ids.to_device(t[0].device())?)
        })?;
    }
    Ok(())
}

#[test]
fn linear_matches_the_cpu() -> Result<()> {
    check_linear()
}

/// The forward through cuBLASLt, the bias in its epilogue (f16 and bf16;
/// f32 keeps cuBLAS), switched on for this test alone. A product cuBLASLt
/// refused would take cuBLAS and pass the comparison, so the test also
/// fails if cuBLASLt refused one.
#[test]
fn linear_through_cublaslt_matches_the_cpu() -> Result<()> {
    kernels::set_cublaslt(true);
    kernels::cublaslt_refused();
    let checked = check_linear();
    let refused = kernels::cublaslt_refused();
    kernels::set_cublaslt(false);
    checked?;
    assert!(!refused, "cuBLASLt refused a product (printed above)");
    Ok(())
}

fn check_linear() -> Result<()> {
    for dt in DTYPES {
        // Rows that are not a multiple of anything; GPT-2's MLP widths.
        for (rows, k, n) in [(37, 19, 23), (2 * 64, 768, 3072)] {
            let (x, w, b) = (
                randn(&[rows, k], 1.0)?,
                randn(&[n, k], 1.0 / (k as f32).sqrt())?,
                randn(&[n], 1.0)?,
            );
            check("linear", dt, &[x, w, b], |t| {
                kernels::linear(&t[0], &t[1], Some(&t[2]))
            })?;
        }
    }
    Ok(())
}

/// The cuBLAS path (products over the scores): with the tiled kernel, the
/// default for f16 and bf16, switched off (`flash_attention_matches_the_cpu`
/// checks that one).
#[test]
fn causal_attention_matches_the_cpu() -> Result<()> {
    kernels::set_flash(false);
    let checked = check_causal_attention();
    kernels::set_flash(true);
    checked
}

fn check_causal_attention() -> Result<()> {
    for dt in DTYPES {
        // One head at a tiny length; a length that is not a multiple of the
        // CPU's 64-row blocks; GPT-2's heads (12 of width 64); products
        // batched per head over the elements (the Shakespeare GPT's shape),
        // and per head over chunks of elements (`attention_plan.rs`).
        for (b, t, heads, hd) in [
            (2, 7, 1, 8),
            (3, 150, 4, 16),
            (2, 256, 12, 64),
            (32, 64, 4, 16),
            (5, 1024, 2, 16),
        ] {
            let qkv = randn(&[b, t, 3 * heads * hd], 1.0)?;
            check("causal attention", dt, &[qkv], |x| {
                kernels::causal_attention(&x[0], heads)
            })?;
        }
    }
    Ok(())
}

/// The tiled kernel of `kernels/flash.cu` (forward, and the two backward
/// kernels), against the CPU's fused attention in f32; partial tiles, every
/// head width it is built for, GPT-2's shape at its full context; warps of
/// 16 rows and of 32.
#[test]
fn flash_attention_matches_the_cpu() -> Result<()> {
    for (dt, rows) in [DType::F16, DType::BF16]
        .into_iter()
        .flat_map(|dt| [(dt, 16), (dt, 32)])
    {
        for (b, t, heads, hd) in [
            (2, 7, 1, 16),
            (3, 150, 4, 16),
            (2, 130, 2, 32),
            (2, 256, 12, 64),
            (1, 1024, 12, 64),
        ] {
            let qkv = randn(&[b, t, 3 * heads * hd], 1.0)?;
            let what = format!("flash attention, {rows} rows a warp");
            check(&what, dt, &[qkv], |x| {
                if x[0].device().is_cuda() {
                    kernels::flash_attention_rows(&x[0], heads, rows)
                } else {
                    kernels::causal_attention(&x[0], heads)
                }
            })?;
        }
    }
    Ok(())
}

/// No two blocks add into one value, so the flash gradients repeat bit for
/// bit (resumed and uninterrupted GPU runs depend on it), with warps of 16
/// rows and of 32.
#[test]
fn flash_attention_gradients_repeat_bit_for_bit() -> Result<()> {
    let gpu = gpu();
    let x = randn(&[2, 300, 3 * 4 * 64], 1.0)?
        .to_dtype(DType::BF16)?
        .to_device(&gpu)?;
    let probe = randn(&[2, 300, 4 * 64], 1.0)?
        .to_dtype(DType::BF16)?
        .to_device(&gpu)?;
    let grad = |rows| -> Result<Vec<f32>> {
        let v = Var::from_tensor(&x)?;
        let y = kernels::flash_attention_rows(v.as_tensor(), 4, rows)?;
        let g = (y * &probe)?.sum_all()?.backward()?;
        g.get(v.as_tensor())
            .expect("a gradient")
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1()
    };
    for rows in [16, 32] {
        let (a, b) = (grad(rows)?, grad(rows)?);
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
    Ok(())
}

/// The gradient norm's sum of squares (`kernels/norm.cu`) against the
/// CPU's within f64 rounding (the orders differ), in each dtype, of one
/// tensor and of several; and the same bits twice.
#[test]
fn sum_squares_matches_the_cpu_and_repeats() -> Result<()> {
    for n in [1, 255, 256 * 1024 + 17, 3_000_000] {
        let x = randn(&[n], 1.0)?;
        for dt in DTYPES {
            let (c, g) = (x.to_dtype(dt)?, x.to_dtype(dt)?.to_device(&gpu())?);
            let want = kernels::sum_squares(&c)?.to_scalar::<f64>()?;
            let got = kernels::sum_squares(&g)?.to_scalar::<f64>()?;
            assert!(
                ((got - want) / want).abs() < 1e-12,
                "{n} {dt:?}: {got} vs {want}"
            );
            let again = kernels::sum_squares(&g)?.to_scalar::<f64>()?;
            assert_eq!(got.to_bits(), again.to_bits(), "{n} {dt:?}: not repeatable");
        }
    }
    // Several tensors at once, as the clipping norm sums a model's
    // gradients: one buffer of partial sums (1047 of them), one launch to
    // add them.
    for dt in DTYPES {
        let sizes = [1, 300, 256 * 1024 + 999, 5000, 37];
        let cpu = sizes
            .iter()
            .map(|&n| randn(&[n], 1.0)?.to_dtype(dt))
            .collect::<Result<Vec<_>>>()?;
        let on_gpu = cpu
            .iter()
            .map(|x| x.to_device(&gpu()))
            .collect::<Result<Vec<_>>>()?;
        let sum = |xs: &[Tensor]| -> Result<f64> {
            let refs: Vec<&Tensor> = xs.iter().collect();
            kernels::sum_squares_all(&refs)?
                .expect("a sum")
                .to_scalar::<f64>()
        };
        let (want, got) = (sum(&cpu)?, sum(&on_gpu)?);
        assert!(
            ((got - want) / want).abs() < 1e-12,
            "{dt:?}: {got} vs {want}"
        );
        assert_eq!(
            got.to_bits(),
            sum(&on_gpu)?.to_bits(),
            "{dt:?}: not repeatable"
        );
    }
    Ok(())
}

/// Gradient clipping's factor computed on the GPU (`clip_factor` in
/// `kernels/norm.cu`) is the host's formula on the same sum, bit for bit:
/// clipped, not clipped, and a NaN norm; and the trainer's factor kept on
/// the GPU scales gradients as the same factor read on the host does.
#[test]
fn clip_factor_on_the_gpu_matches_the_host() -> Result<()> {
    for (n, max) in [(1000, 1e-3), (1000, 1e6), (256 * 1024 + 17, 1.0)] {
        let g = randn(&[n], 1.0)?.to_device(&gpu())?;
        let sum = kernels::sum_squares(&g)?;
        let got = kernels::clip_factor(&sum, max)?.to_scalar::<f32>()?;
        let want = kernels::clip_factor_of(sum.to_scalar::<f64>()?, max);
        assert_eq!(got.to_bits(), want.to_bits(), "{n}, max {max}");
    }
    let nan = Tensor::new(f64::NAN, &gpu())?;
    assert_eq!(kernels::clip_factor(&nan, 1.0)?.to_scalar::<f32>()?, 1.0);
    // The trainer's path: a tensor factor against the same factor read.
    let vars = vec![(
        "w".to_string(),
        Var::from_tensor(&randn(&[4099], 1.0)?.to_device(&gpu())?)?,
    )];
    let mut grads = candle_core::backprop::GradStore::default();
    grads.insert(
        vars[0].1.as_tensor(),
        randn(&[4099], 1.0)?.to_device(&gpu())?,
    );
    let kept = taper::engine::optim::clip_scale(&vars, &grads, 0.5, true)?;
    let read = taper::engine::optim::clip_scale(&vars, &grads, 0.5, false)?;
    assert!(matches!(kept, ClipScale::Device(_)));
    assert_eq!(kept.value()?.to_bits(), read.value()?.to_bits());
    let g = grads.get(vars[0].1.as_tensor()).unwrap().clone();
    let (a, b) = (kept.apply(g.clone())?, read.apply(g)?);
    let (a, b): (Vec<f32>, Vec<f32>) = (
        a.to_device(&Device::Cpu)?.to_vec1()?,
        b.to_device(&Device::Cpu)?.to_vec1()?,
    );
    assert!(
        a.iter().zip(&b).all(|(x, y)| x == y),
        "scaled gradients differ"
    );
    Ok(())
}

#[test]
fn conv_matches_the_cpu() -> Result<()> {
    // (batch, in, height, width, out): odd sizes with edges on every side;
    // the CNN's second layer. 3x3 with padding 1 (taper.model.cnn's
    // default), 5x5 without (PyTorch's CIFAR-10 tutorial net), and others.
    for dt in DTYPES {
        for (b, c, h, w, o) in [(3, 2, 7, 6, 5), (64, 8, 14, 14, 16)] {
            for (k, p) in [(3, 1), (5, 0), (1, 0), (4, 1), (7, 3)] {
                let x = randn(&[b, c, h, w], 1.0)?;
                let kw = randn(&[o, c, k, k], 1.0 / ((k * k * c) as f32).sqrt())?;
                let bias = randn(&[o], 0.5)?;
                check(
                    &format!("conv {k}x{k} padding {p}"),
                    dt,
                    &[x, kw, bias],
                    |t| kernels::conv2d(&t[0], &t[1], &t[2], p),
                )?;
            }
        }
    }
    // Samples in more than one chunk of im2col scratch (2^25 values), in f32.
    let (b, c, h, w, o) = (3, 64, 256, 256, 4);
    let x = randn(&[b, c, h, w], 1.0)?;
    let k = randn(&[o, c, 3, 3], 1.0 / (9.0 * c as f32).sqrt())?;
    check(
        "conv3x3, chunked",
        DType::F32,
        &[x, k, randn(&[o], 0.5)?],
        |t| kernels::conv3x3(&t[0], &t[1], &t[2]),
    )?;
    // The same for 5x5 without padding: the output planes are smaller than
    // the input's, so the chunks hold more samples.
    let x = randn(&[5, 32, 200, 200], 1.0)?;
    let k = randn(&[o, 32, 5, 5], 1.0 / (25.0 * 32.0f32).sqrt())?;
    check(
        "conv 5x5 padding 0, chunked",
        DType::F32,
        &[x, k, randn(&[o], 0.5)?],
        |t| kernels::conv2d(&t[0], &t[1], &t[2], 0),
    )
}

#[test]
fn max_pool_matches_the_cpu() -> Result<()> {
    // Odd rows and columns (dropped); the CNN's first pool. In f16 and bf16
    // rounding makes ties, which both sides give to the first maximum.
    for dt in DTYPES {
        for shape in [[2, 3, 7, 9], [64, 16, 28, 28]] {
            check("max-pool", dt, &[randn(&shape, 1.0)?], |x| {
                Ok(kernels::max_pool2x2(&x[0])?.expect("the fused pool on both devices"))
            })?;
        }
    }
    Ok(())
}

/// `steps` AdamW updates of one parameter on `dev` with the gradients
/// `grads`; returns the optimizer and the final weights.
fn adamw_run(
    dev: &Device,
    state: StateFormat,
    init: &Tensor,
    grads: &[Tensor],
) -> Result<(AdamW, Vec<f32>, Var)> {
    adamw_run_offloading(dev, state, init, grads, &[])
}

/// As [`adamw_run`], with the moments offloaded (or brought back) before
/// the steps `switch` names.
fn adamw_run_offloading(
    dev: &Device,
    state: StateFormat,
    init: &Tensor,
    grads: &[Tensor],
    switch: &[(usize, Option<Place>)],
) -> Result<(AdamW, Vec<f32>, Var)> {
    let cfg = AdamWConfig {
        lr: 1e-2,
        betas: (0.9, 0.95),
        weight_decay: 0.1,
        state,
        ..AdamWConfig::default()
    };
    let mut opt = AdamW::new(cfg);
    let var = Var::from_tensor(&init.to_device(dev)?)?;
    let vars = vec![("w".to_string(), var.clone())];
    for (step, g) in grads.iter().enumerate() {
        for (at, place) in switch {
            if *at == step {
                assert!(opt.set_offload(place.clone())?, "AdamW offloads");
            }
        }
        // d/dw sum(w * g) = g
        let loss = (var.as_tensor() * g.to_device(dev)?)?.sum_all()?;
        opt.step(&vars, &loss.backward()?)?;
    }
    let w = var.as_tensor().to_device(&Device::Cpu)?.to_vec1()?;
    Ok((opt, w, var))
}

#[test]
fn fused_adamw_matches_the_cpu_bit_for_bit() -> Result<()> {
    // More than one 256-value block, and a partial last block.
    let n = 3 * 4096 + 77;
    let init = randn(&[n], 1.0)?;
    let grads: Vec<Tensor> = (0..8).map(|_| randn(&[n], 1.0)).collect::<Result<_>>()?;
    for state in [StateFormat::F32, StateFormat::Q8] {
        let (cpu_opt, w_cpu, _) = adamw_run(&Device::Cpu, state, &init, &grads)?;
        let (gpu_opt, w_gpu, _) = adamw_run(&gpu(), state, &init, &grads)?;
        // Compiled with --fmad=false, the kernels round as the CPU does.
        let worst = w_cpu
            .iter()
            .zip(&w_gpu)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst == 0.0, "{state:?}: weights differ by up to {worst:e}");
        // The state, as checkpoints hold it, is the same too.
        let (sc, sg): (HashMap<_, _>, HashMap<_, _>) = (
            cpu_opt.state().into_iter().collect(),
            gpu_opt.state().into_iter().collect(),
        );
        assert_eq!(sc.len(), sg.len());
        for (k, c) in &sc {
            let g = &sg[k];
            let d = (c.to_dtype(DType::F64)? - g.to_dtype(DType::F64)?)?
                .abs()?
                .max_all()?;
            assert_eq!(d.to_scalar::<f64>()?, 0.0, "{state:?}: state {k}");
        }
    }
    Ok(())
}

/// Offloaded moments of a GPU parameter, in pinned host memory
/// (`offload = true`) or a mapped file (`offload = "dir"`), from the start
/// or moved there mid-run and back: the same weights and state as moments
/// on the device, bit for bit.
/// The one-pass mixed-precision update (`adamw_mixed_*` in
/// `kernels/adamw.cu`: low-precision gradient in, working copy out)
/// against the CPU's, bit for bit: weights, working copy and moments, with
/// and without clipping's factor.
#[test]
fn mixed_adamw_matches_the_cpu_bit_for_bit() -> Result<()> {
    use candle_core::backprop::GradStore;
    use std::collections::HashMap;
    let n = 3 * 4096 + 77;
    let init = randn(&[n], 1.0)?;
    let grads: Vec<Tensor> = (0..4).map(|_| randn(&[n], 1.0)).collect::<Result<_>>()?;
    // Clipping's factor by value, and as the trainer keeps it on CUDA: a
    // tensor on the device that the kernel reads there.
    for (dt, scale, kept) in [
        (DType::BF16, 1.0, false),
        (DType::F16, 0.37, false),
        (DType::BF16, 0.37, true),
    ] {
        // Weights, working copy, state.
        type Run = (Vec<f32>, Vec<f32>, Vec<(String, Tensor)>);
        let run = |dev: &Device| -> Result<Run> {
            let master = Var::from_tensor(&init.to_device(dev)?)?;
            let work = Var::from_tensor(&master.as_tensor().to_dtype(dt)?)?;
            let vars = vec![("w".to_string(), master.clone())];
            let works = HashMap::from([("w".to_string(), work.clone())]);
            let mut opt = AdamW::new(AdamWConfig {
                lr: 1e-2,
                weight_decay: 0.1,
                ..AdamWConfig::default()
            });
            for g in &grads {
                let mut store = GradStore::default();
                store.insert(master.as_tensor(), g.to_dtype(dt)?.to_device(dev)?);
                let scale = match kept {
                    true => ClipScale::Device(Tensor::new(scale as f32, dev)?),
                    false => ClipScale::Host(scale as f32),
                };
                let store = taper::engine::optim::mixed_grads(&opt, &vars, store, &scale, &works)?;
                let written = opt.step_mixed(&vars, &store, &scale, &works)?;
                assert!(written.contains("w"), "{dev:?}: not in one pass");
            }
            let mut state = opt.state();
            state.sort_by(|a, b| a.0.cmp(&b.0));
            let host = |t: &Tensor| -> Result<Vec<f32>> {
                t.to_device(&Device::Cpu)?
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1()
            };
            Ok((host(master.as_tensor())?, host(work.as_tensor())?, state))
        };
        let (wc, kc, sc) = run(&Device::Cpu)?;
        let (wg, kg, sg) = run(&gpu())?;
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same(&wc, &wg), "{dt:?} {kept}: weights differ");
        assert!(same(&kc, &kg), "{dt:?}: working copies differ");
        for ((k, c), (_, g)) in sc.iter().zip(&sg) {
            let (c, g): (Vec<f32>, Vec<f32>) = (
                c.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?,
                g.to_device(&Device::Cpu)?
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1()?,
            );
            assert!(same(&c, &g), "{dt:?}: state {k} differs");
        }
    }
    Ok(())
}

#[test]
fn offloaded_moments_match_device_moments_bit_for_bit() -> Result<()> {
    let n = 3 * 4096 + 77;
    let init = randn(&[n], 1.0)?;
    let grads: Vec<Tensor> = (0..8).map(|_| randn(&[n], 1.0)).collect::<Result<_>>()?;
    let (opt, straight, _) = adamw_run(&gpu(), StateFormat::F32, &init, &grads)?;
    let state: HashMap<_, _> = opt.state().into_iter().collect();
    let dir = tempfile::tempdir().map_err(candle_core::Error::wrap)?;
    let file = Place::Dir(dir.path().to_path_buf());
    for switch in [
        vec![(0, Some(Place::Host))],
        vec![(3, Some(Place::Host)), (6, None)],
        vec![(0, Some(file.clone()))],
        vec![(2, Some(file.clone())), (5, None)],
    ] {
        let (o, w, _) = adamw_run_offloading(&gpu(), StateFormat::F32, &init, &grads, &switch)?;
        assert_eq!(w, straight, "{switch:?}: weights");
        for (k, t) in o.state() {
            let d = (t.to_dtype(DType::F64)? - state[&k].to_dtype(DType::F64)?)?
                .abs()?
                .max_all()?;
            assert_eq!(d.to_scalar::<f64>()?, 0.0, "{switch:?}: state {k}");
        }
        println!("offload {switch:?}: ok");
    }
    Ok(())
}

#[test]
fn device_8bit_state_survives_a_checkpoint_round_trip() -> Result<()> {
    let n = 2 * 4096;
    let init = randn(&[n], 1.0)?;
    let grads: Vec<Tensor> = (0..6).map(|_| randn(&[n], 1.0)).collect::<Result<_>>()?;
    let (_, straight, _) = adamw_run(&gpu(), StateFormat::Q8, &init, &grads)?;
    let (opt, _, var) = adamw_run(&gpu(), StateFormat::Q8, &init, &grads[..3])?;
    let saved: HashMap<String, Tensor> = opt.state().into_iter().collect();
    assert!(saved.contains_key("m8.w") && saved.contains_key("v8max.w"));
    let cfg = AdamWConfig {
        lr: 1e-2,
        betas: (0.9, 0.95),
        weight_decay: 0.1,
        state: StateFormat::Q8,
        ..AdamWConfig::default()
    };
    let mut resumed = AdamW::new(cfg);
    resumed.load_state(&saved)?;
    let vars = vec![("w".to_string(), var.clone())];
    for g in &grads[3..] {
        let loss = (var.as_tensor() * g.to_device(&gpu())?)?.sum_all()?;
        resumed.step(&vars, &loss.backward()?)?;
    }
    let w: Vec<f32> = var.as_tensor().to_device(&Device::Cpu)?.to_vec1()?;
    assert_eq!(w, straight, "a resumed run continues exactly");
    Ok(())
}

/// The main job on the GPU, and its CNN twin: the digits recipes to the
/// same bar as on the CPU.
#[test]
fn digits_trains_on_the_gpu_in_f32_and_bf16() -> anyhow::Result<()> {
    for recipe in ["digits.lua", "digits_cnn.lua"] {
        for precision in ["f32", "bf16"] {
            let accuracy = train_on_the_gpu(recipe, precision)?;
            println!("{recipe} on cuda, {precision}: {:.2}%", 100.0 * accuracy);
            assert!(
                accuracy >= 0.95,
                "{recipe}, {precision}: held-out accuracy {accuracy}"
            );
        }
    }
    Ok(())
}

/// A run on the GPU stops at the step where it diverges, as on the CPU:
/// the loss is read every step there too, and the weights check (every 10
/// steps) runs on the device.
#[test]
fn a_diverging_run_stops_on_the_gpu_at_that_step() -> anyhow::Result<()> {
    for precision in ["f32", "bf16"] {
        let e =
            train_with("digits.lua", precision, &[("lr", "1e30")]).expect_err("lr 1e30 diverges");
        let msg = taper::host::render_error(&e);
        println!("digits on cuda, {precision}, lr 1e30: {msg}");
        assert!(
            msg.contains("is NaN: the training diverged"),
            "{precision}: {msg}"
        );
        assert_eq!(e.exit_code(), 1);
    }
    Ok(())
}

/// Trains `scripts/<recipe>` on the GPU; its last held-out accuracy.
fn train_on_the_gpu(recipe: &str, precision: &str) -> anyhow::Result<f64> {
    Ok(train_with(recipe, precision, &[])?)
}

fn train_with(recipe: &str, precision: &str, set: &[(&str, &str)]) -> taper::Result<f64> {
    let dir = tempfile::tempdir().map_err(|e| taper::Error::io("tempdir", e))?;
    let mut overrides = vec![
        ("epochs".into(), "10".into()),
        ("precision".into(), precision.into()),
    ];
    overrides.extend(set.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let opts = taper::HostOptions {
        device: "cuda".into(),
        out_dir: Some(dir.path().to_path_buf()),
        overrides,
        ..taper::HostOptions::default()
    };
    let mut host = taper::Host::new(opts)?;
    // Run from the repository root on the GPU machine, where the build
    // machine's path does not exist.
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(recipe);
    let path = if built.exists() {
        built
    } else {
        std::path::Path::new("scripts").join(recipe)
    };
    let report = host.run_file(&path)?;
    let ev = report.runs[0]
        .last_eval
        .clone()
        .expect("the recipe evaluates");
    Ok(ev.accuracy)
}

/// QLoRA on the GPU: a small llama written by the test (Q4_1 projections, a
/// Q8_0 head tied to the embedding, grouped-query heads) trains through a
/// recipe with the chunked loss as on the CPU, in f32 and bf16. On CUDA
/// candle's kernels multiply by the file's blocks, rounding the input to 8
/// bits as the CPU's tiles do, and the backward multiplies by the
/// dequantized weight.
#[test]
fn a_written_llama_trains_on_the_gpu_as_on_the_cpu() -> anyhow::Result<()> {
    let cpu = tiny_llama::train("cpu", "f32")?;
    for (precision, bound) in [("f32", 2e-2), ("bf16", 3e-2)] {
        let gpu = tiny_llama::train("cuda", precision)?;
        println!("tiny llama QLoRA, held-out loss before -> after: cpu f32 {cpu:?}, cuda {precision} {gpu:?}");
        assert!(
            (gpu.0 - cpu.0).abs() < 1e-2 * cpu.0,
            "{precision}, before training: {} on the GPU, {} on the CPU",
            gpu.0,
            cpu.0
        );
        assert!(
            (gpu.1 - cpu.1).abs() < bound * cpu.1,
            "{precision}, after 64 steps: {} on the GPU, {} on the CPU",
            gpu.1,
            cpu.1
        );
    }
    Ok(())
}
