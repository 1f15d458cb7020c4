//! taper's CUDA kernels run on the CPU: the same sources, compiled with
//! g++ against the stand-ins in `tests/emulate/` (a fiber per CUDA thread,
//! a warp at a time between barriers for `__syncthreads` and `__syncwarp`,
//! and the tensor-core product of `kernels/mma.cuh` in f32), for machines
//! without a GPU. On a GPU,
//! `tests/cuda_kernels.rs` checks the same kernels for real; this catches
//! indexing, masking, barrier and rounding mistakes before one is lent.
//! - `kernels/flash.cu` (forward and both backward kernels) against the
//!   attention in float64;
//! - `adamw_mixed_bf16` of `kernels/adamw.cu` against the CPU's one-pass
//!   update, bit for bit;
//! - `kernels/norm.cu`'s sum of squares (one tensor or several) against
//!   the CPU's, and its clipping factor against the host's formula;
//! - `kernels/ce.cu`'s fused cross-entropy loss and gradient against
//!   float64, and its `scale_by` bit for bit.
//! - `kernels/rows.cu`'s one-pass layer-norm backward and
//!   `kernels/dense.cu`'s bias gradient, both ending in `sum_chunks`
//!   (`kernels/common.cuh`), against float64.
//! - `kernels/gelu.cu` and `kernels/add.cu`, 16 bytes a thread and a
//!   value at a time, against float64.
//! - `kernels/rows.cu`'s softmax and `kernels/attention.cu`'s causal one,
//!   forward and backward, against float64.
//! - `kernels/embedding.cu`'s gradient and `kernels/rope.cu`, against
//!   float64.

#[path = "common/emulate.rs"]
mod emulate;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use candle_core::{DType, Device, Result, Tensor, Var};
use taper::kernels::adamw::AdamWStep;
use taper::kernels::adamw_mixed::{adamw_mixed, Factor, MixedMoments};
use taper::kernels::causal_attention;

use emulate::{build, f32s, rel, run_f32, stored};

fn driver() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build("flash_main"))
}

/// Runs the emulated kernels on random `qkv` and `dy` rounded to `dtype`,
/// and compares `y` and `dqkv` with composed attention in float64 on the
/// same rounded values. `misaligned` places the inputs off a 16-byte
/// boundary, where the kernels load a value at a time.
fn check(
    b: usize,
    t: usize,
    heads: usize,
    hd: usize,
    dtype: DType,
    misaligned: bool,
    warp_rows: usize,
) -> Result<()> {
    let c = heads * hd;
    let round = |x: Tensor| x.to_dtype(dtype)?.to_dtype(DType::F64);
    let qkv = round(Tensor::randn(0f32, 1.0, (b, t, 3 * c), &Device::Cpu)?)?;
    let dy = round(Tensor::randn(0f32, 1.0, (b, t, c), &Device::Cpu)?)?;

    let dir = tempfile::tempdir().expect("temporary directory");
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    let bytes: Vec<u8> = [f32s(&qkv)?, f32s(&dy)?]
        .concat()
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(&input, bytes).expect("writing the input");
    let name = if dtype == DType::F16 { "f16" } else { "bf16" };

    let x = Var::from_tensor(&qkv)?;
    let y64 = causal_attention(x.as_tensor(), heads)?;
    let grads = (&y64 * &dy)?.sum_all()?.backward()?;
    let dx = grads.get(x.as_tensor()).expect("a gradient for qkv");
    let lse64 = log_sum_exp(&qkv, heads)?;

    // The tiles' asynchronous copies land as late as the hardware may land
    // them (when their thread waits), then as early (when queued): a
    // missing barrier before a tile is read shows in the first, one before
    // a buffer is refilled in the second (kernels/cp_async.cuh).
    for copies in ["late", "early"] {
        let o = Command::new(driver())
            .args([b, t, heads, hd].map(|n| n.to_string()))
            .arg(name)
            .arg(&input)
            .arg(&output)
            .args(misaligned.then_some("misaligned"))
            .args((warp_rows == 32).then_some("r32"))
            .env("CUDA_EMU_COPIES", copies)
            .output()
            .expect("running flash_main");
        assert!(
            o.status.success(),
            "flash_main: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let got: Vec<f32> = std::fs::read(&output)
            .expect("reading the output")
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let (n, rows) = (b * t * c, b * heads * t);
        assert_eq!(got.len(), n + rows + 3 * n, "output values");
        let (y, rest) = got.split_at(n);
        let (lse, dqkv) = rest.split_at(rows);

        // Bounds as tests/cuda_kernels.rs sets them for the GPU: 8 bits of
        // mantissa for bf16, 11 for f16; gradients round twice.
        let bound = if dtype == DType::F16 { 2e-3 } else { 1.6e-2 };
        let (ey, el, ed) = (
            rel(y, &f32s(&y64)?),
            rel(lse, &f32s(&lse64)?),
            rel(dqkv, &f32s(dx)?),
        );
        let what = format!(
            "b {b}, t {t}, {heads} heads of {hd}, {dtype:?}, misaligned {misaligned}, {warp_rows} rows a warp, copies {copies}"
        );
        assert!(ey <= bound, "{what}: output off by {ey:.2e}");
        assert!(el <= 1e-5, "{what}: log-sum-exp off by {el:.2e}");
        assert!(ed <= 2.0 * bound, "{what}: gradient off by {ed:.2e}");
        println!("{what}: y {ey:.1e}, lse {el:.1e}, dqkv {ed:.1e}");
    }
    Ok(())
}

/// Each query row's log-sum-exp of its scaled, causally masked scores,
/// `[b, heads, t]`, in float64.
fn log_sum_exp(qkv: &Tensor, heads: usize) -> Result<Tensor> {
    let (b, t, c3) = qkv.dims3()?;
    let hd = c3 / 3 / heads;
    let qkv = qkv.reshape((b, t, 3, heads, hd))?;
    let part = |i: usize| {
        qkv.narrow(2, i, 1)?
            .squeeze(2)?
            .transpose(1, 2)?
            .contiguous()
    };
    let (q, k) = (part(0)?, part(1)?);
    let mask = taper::kernels::causal_mask(t, DType::F64, &Device::Cpu)?;
    let s = (q.matmul(&k.t()?)? / (hd as f64).sqrt())?.broadcast_add(&mask)?;
    let m = s.max_keepdim(3)?;
    let sum = s.broadcast_sub(&m)?.exp()?.sum_keepdim(3)?;
    (sum.log()? + m)?.squeeze(3)
}

/// Partial last tiles (150 = 2 x 64 + 22, 130, 97), exactly one tile, a
/// single position; every head width the kernels are built for; both
/// dtypes; both ways of loading a tile; warps of 16 rows and of 32 (each
/// test case runs both). The emulated cp.async copies land
/// only when their thread waits for them (`kernels/cp_async.cuh`), so a
/// tile read before its wait, or refilled while it is read, fails here; a
/// missing barrier before a buffer is refilled does not (the late copies
/// hide it).
#[test]
fn flash_kernels_match_float64_attention() -> Result<()> {
    for warp_rows in [16, 32] {
        check(2, 150, 3, 16, DType::BF16, false, warp_rows)?;
        check(1, 130, 2, 64, DType::BF16, false, warp_rows)?;
        check(2, 64, 2, 32, DType::F16, false, warp_rows)?;
        check(1, 97, 1, 64, DType::F16, false, warp_rows)?;
        check(1, 1, 1, 16, DType::BF16, false, warp_rows)?;
        check(1, 100, 2, 32, DType::BF16, true, warp_rows)?;
    }
    Ok(())
}

/// `adamw_mixed_bf16` as the GPU runs it, against the CPU's one-pass
/// update (`kernels::adamw_mixed`), bit for bit: weights, moments and the
/// working copy, over three steps, with and without clipping's factor
/// (passed by value, or read from memory as the trainer keeps it on
/// CUDA), including zero and negative-zero gradients; four values a thread,
/// and (in the last case, the arrays one value off alignment) one.
#[test]
fn mixed_adamw_kernel_matches_the_cpu_bit_for_bit() -> Result<()> {
    let exe = build("adamw_main");
    let n = 3 * 256 + 77;
    let theta0: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    // The factor by value, or read from memory (`kept`: as the trainer
    // keeps clipping's factor on CUDA; the value passed is then ignored).
    for (scale, kept) in [(1.0f32, false), (0.37, false), (0.37, true)] {
        let theta = Var::from_vec(theta0.clone(), n, &Device::Cpu)?;
        let work = Var::from_tensor(&theta.as_tensor().to_dtype(DType::BF16)?)?;
        let (mut m, mut v) = (vec![0f32; n], vec![0f32; n]);
        // The emulated kernel's state, carried from step to step.
        let (mut et, mut em, mut ev) = (theta0.clone(), vec![0f32; n], vec![0f32; n]);
        for t in 1..=3u64 {
            let g: Vec<f32> = (0..n)
                .map(|i| match i % 97 {
                    0 => 0.0,
                    1 => -0.0,
                    _ => ((i as u64 * 104_729 + t * 31) % 997) as f32 / 300.0 - 1.6,
                })
                .collect();
            let g = Tensor::from_vec(g, n, &Device::Cpu)?.to_dtype(DType::BF16)?;
            let h = AdamWStep::new(1e-2, (0.9, 0.95), 1e-8, 0.1, t);
            let held = Tensor::new(scale, &Device::Cpu)?;
            let factor = match kept {
                true => Factor::At(&held),
                false => Factor::Value(scale),
            };
            adamw_mixed(
                theta.as_tensor(),
                &g,
                factor,
                MixedMoments::Host(&mut m, &mut v),
                work.as_tensor(),
                &h,
            )?;

            let dir = tempfile::tempdir().expect("temporary directory");
            let (input, output) = (dir.path().join("in"), dir.path().join("out"));
            let mut bytes = (n as u64).to_le_bytes().to_vec();
            let (by_value, at) = if kept { (5.0f32, scale) } else { (scale, 0.0) };
            bytes.extend(by_value.to_le_bytes());
            bytes.extend(u32::from(kept).to_le_bytes());
            bytes.extend(at.to_le_bytes());
            let hyper = [
                h.beta1,
                h.beta2,
                h.one_minus_beta1,
                h.one_minus_beta2,
                h.eps,
                h.decay,
                h.step_size,
                h.sqrt_bc2,
            ];
            let gbits: Vec<u16> = g
                .to_vec1::<half::bf16>()?
                .iter()
                .map(|x| x.to_bits())
                .collect();
            bytes.extend(hyper.iter().chain(&et).flat_map(|x| x.to_le_bytes()));
            bytes.extend(gbits.iter().flat_map(|x| x.to_le_bytes()));
            bytes.extend(em.iter().chain(&ev).flat_map(|x| x.to_le_bytes()));
            std::fs::write(&input, bytes).expect("writing the input");
            let o = Command::new(&exe)
                .arg(&input)
                .arg(&output)
                .args(kept.then_some("misaligned"))
                .output()
                .expect("running adamw_main");
            assert!(
                o.status.success(),
                "adamw_main: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            let out = std::fs::read(&output).expect("reading the output");
            assert_eq!(out.len(), n * 14, "output bytes");
            let f = |k: usize| -> Vec<f32> {
                out[k * 4 * n..(k + 1) * 4 * n]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect()
            };
            (et, em, ev) = (f(0), f(1), f(2));
            let ework: Vec<u16> = out[12 * n..]
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();

            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let cpu_theta: Vec<f32> = theta.as_tensor().to_vec1()?;
            let cpu_work: Vec<u16> = work
                .as_tensor()
                .to_vec1::<half::bf16>()?
                .iter()
                .map(|x| x.to_bits())
                .collect();
            assert_eq!(
                bits(&et),
                bits(&cpu_theta),
                "weights, scale {scale} {kept}, step {t}"
            );
            assert_eq!(bits(&em), bits(&m), "first moment, scale {scale}, step {t}");
            assert_eq!(
                bits(&ev),
                bits(&v),
                "second moment, scale {scale}, step {t}"
            );
            assert_eq!(ework, cpu_work, "working copy, scale {scale}, step {t}");
        }
    }
    Ok(())
}

/// `kernels/norm.cu` as `kernels::sum_squares_all` launches it on CUDA
/// (each tensor's partial sums, up to 1024 blocks' worth, into its part of
/// one buffer, then one block of 1024 threads sums the buffer) against the
/// CPU's sum, within f64 rounding (the orders differ). Then its
/// `clip_factor` on that sum against the host's formula, bit for bit:
/// clipped, not clipped, and a NaN norm (a factor of 1).
#[test]
fn sum_squares_and_clip_factor_kernels_match_the_cpu() -> Result<()> {
    let exe = build("norm_main");
    let big = 256 * 1024 + 999;
    // One value; one partial block; the most blocks; several tensors whose
    // partial sums (1047) outnumber the finishing block's threads; a NaN.
    for (sizes, max, nan) in [
        (vec![1usize], 1e-6f64, false),
        (vec![300], 1e6, false),
        (vec![big], 100.0, false),
        (vec![1, 300, big, 5000, 37], 100.0, false),
        (vec![5, 7], 1.0, true),
    ] {
        let xs: Vec<Vec<f32>> = sizes
            .iter()
            .enumerate()
            .map(|(k, &n)| {
                (0..n)
                    .map(|i| ((i * 7919 + k * 31) % 1000) as f32 / 250.0 - 2.0)
                    .collect()
            })
            .collect();
        let mut xs = xs;
        if nan {
            xs[1][3] = f32::NAN;
        }
        let tensors = xs
            .iter()
            .map(|x| Tensor::from_vec(x.clone(), x.len(), &Device::Cpu))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let want = taper::kernels::sum_squares_all(&refs)?
            .expect("a sum")
            .to_scalar::<f64>()?;
        let dir = tempfile::tempdir().expect("temporary directory");
        let (input, output) = (dir.path().join("in"), dir.path().join("out"));
        let mut bytes = (xs.len() as u64).to_le_bytes().to_vec();
        bytes.extend(max.to_le_bytes());
        for x in &xs {
            bytes.extend((x.len() as u64).to_le_bytes());
            bytes.extend(x.iter().flat_map(|v| v.to_le_bytes()));
        }
        std::fs::write(&input, bytes).expect("writing the input");
        let o = Command::new(&exe)
            .arg(&input)
            .arg(&output)
            .output()
            .expect("running norm_main");
        assert!(
            o.status.success(),
            "norm_main: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let out = std::fs::read(&output).expect("reading the output");
        let got = f64::from_le_bytes(out[..8].try_into().expect("8 bytes"));
        let factor = f32::from_le_bytes(out[8..12].try_into().expect("4 bytes"));
        if nan {
            assert!(got.is_nan() && want.is_nan(), "{sizes:?}: {got} vs {want}");
            assert_eq!(factor, 1.0, "a NaN norm");
        } else {
            assert!(
                ((got - want) / want).abs() < 1e-12,
                "{sizes:?}: {got} vs {want}"
            );
            let host = taper::kernels::clip_factor_of(got, max);
            assert_eq!(factor.to_bits(), host.to_bits(), "{sizes:?}, max {max}");
        }
    }
    Ok(())
}

/// `kernels/ce.cu`'s fused loss and gradient (`ce_loss_grad`, the chunked
/// cross-entropy's forward when a backward follows) against the loss and
/// logit gradient in float64 on the same rounded logits: rows longer than a
/// block (1500 values over 1024 threads) and short ones, padding past the
/// vocabulary (a zero gradient whatever it holds), label smoothing, and a
/// target outside the vocabulary (a NaN loss and gradient); `ce_loss`
/// and `ce_grad` (the loss alone, the gradient for an incoming gradient)
/// on the same rows. Rows of whole
/// 16-byte packs (1500 and 100 f32 values, 1504 of either dtype) with the
/// vocabulary ending inside a pack, rows that are not (1500 and 100 bf16
/// values), and whole packs off a 16-byte boundary (`shift`). Then
/// `scale_by` on that gradient, bit for bit against the f32 product
/// rounded to the storage type.
#[test]
fn fused_cross_entropy_kernels_match_float64() -> Result<()> {
    let exe = build("ce_main");
    for bf16 in [false, true] {
        for (rows, cols, live, eps, shift) in [
            (3u32, 1500u32, 1500u32, 0.0f32, 0u32),
            (6, 100, 77, 0.1, 0),
            (4, 1504, 1499, 0.1, 0),
            (4, 1504, 1499, 0.0, 1),
        ] {
            let round = |x: f32| stored(x, bf16);
            let z: Vec<f32> = (0..rows * cols)
                .map(|i| {
                    round(
                        ((i * 7919 % 1000) as f32 / 125.0 - 4.0)
                            * if i % cols >= live { 50.0 } else { 1.0 },
                    )
                })
                .collect();
            let mut y: Vec<u32> = (0..rows).map(|r| (r * 31 + 5) % live).collect();
            y[1] = live; // outside the vocabulary
            y[rows as usize - 1] = live - 1; // in the last pack
            let (scale, g) = (1.0 / 4096.0f32, 0.37f32);
            let mut bytes = Vec::new();
            for v in [bf16 as u32, rows, cols, live, shift] {
                bytes.extend(v.to_le_bytes());
            }
            for v in [eps, scale, g] {
                bytes.extend(v.to_le_bytes());
            }
            bytes.extend(z.iter().flat_map(|v| v.to_le_bytes()));
            bytes.extend(y.iter().flat_map(|v| v.to_le_bytes()));
            let out = run_f32(&exe, "ce_main", &bytes);
            let (rows_u, cols_u, live_u) = (rows as usize, cols as usize, live as usize);
            let n = rows_u * cols_u;
            assert_eq!(out.len(), 2 * rows_u + 3 * n);
            let (loss, rest) = out.split_at(rows_u);
            let (dz, rest) = rest.split_at(n);
            let (scaled, rest) = rest.split_at(n);
            let (loss_only, grad_only) = rest.split_at(rows_u);
            // ce_loss gives ce_loss_grad's losses bit for bit (the same
            // pass over the row).
            for (r, (a, b)) in loss.iter().zip(loss_only).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "row {r}: ce_loss {b} vs ce_loss_grad {a}"
                );
            }
            let what =
                format!("bf16 {bf16}, rows of {cols} ({live} live), eps {eps}, shift {shift}");
            let (mut want_dz, mut got_dz, mut got_g) = (Vec::new(), Vec::new(), Vec::new());
            for r in 0..rows_u {
                let row: Vec<f64> = z[r * cols_u..r * cols_u + live_u]
                    .iter()
                    .map(|&v| v as f64)
                    .collect();
                let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
                let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
                let mean = row.iter().sum::<f64>() / live as f64;
                let target = y[r] as usize;
                let d = &dz[r * cols_u..(r + 1) * cols_u];
                let dg = &grad_only[r * cols_u..(r + 1) * cols_u];
                for d in [d, dg] {
                    assert!(
                        d[live_u..].iter().all(|&v| v == 0.0),
                        "{what}: row {r}'s padding"
                    );
                }
                if target >= live_u {
                    assert!(loss[r].is_nan(), "{what}: row {r}'s loss {}", loss[r]);
                    for d in [d, dg] {
                        assert!(d[..live_u].iter().all(|v| v.is_nan()), "{what}: row {r}");
                    }
                    continue;
                }
                let want = lse - (1.0 - eps as f64) * row[target] - eps as f64 * mean;
                assert!(
                    ((loss[r] as f64 - want) / want).abs() < 1e-5,
                    "{what}: row {r}'s loss {} vs {want}",
                    loss[r]
                );
                for (i, &v) in row.iter().enumerate() {
                    let onehot = if i == target { 1.0 - eps as f64 } else { 0.0 };
                    let w = ((v - lse).exp() - eps as f64 / live as f64 - onehot) * scale as f64;
                    want_dz.push(w as f32);
                    got_dz.push(d[i]);
                    got_g.push(dg[i] / g);
                }
            }
            let bound = if bf16 { 8e-3 } else { 1e-5 };
            let e = rel(&got_dz, &want_dz);
            assert!(e < bound, "{what}: gradient off by {e:.2e}");
            let e = rel(&got_g, &want_dz);
            assert!(e < bound, "{what}: ce_grad's gradient off by {e:.2e}");
            for (i, (&s, &d)) in scaled.iter().zip(dz).enumerate() {
                let want = round(d * g);
                assert!(
                    s.to_bits() == want.to_bits() || (s.is_nan() && want.is_nan()),
                    "{what}: scaled value {i}: {s} vs {want}"
                );
            }
        }
    }
    Ok(())
}

/// The layer norm's forward and one-pass backward (`layer_norm_bwd` in
/// `kernels/rows.cu`, then `sum_chunks` over its blocks) and the dense
/// layer's bias rows and bias gradient (`kernels/dense.cu`) against
/// float64 on the same rounded values (the bias rows bit for bit): rows
/// that do not fill the last block or warp, rows that are not a multiple
/// of 32 long, every warp count the launcher picks (8 for rows up to 768,
/// down to 1 for rows of 6144), rows of whole 16-byte packs and rows that
/// are not (36 bf16 values, 1001 of either), f32 and bf16.
#[test]
fn layer_norm_and_bias_sums_match_float64() -> Result<()> {
    let exe = build("rows_main");
    let eps = 1e-5f32;
    // rows, cols, warps, rows per block (as layer_norm_bwd_plan picks them
    // for these shapes), rows per chunk of the bias sums.
    for (rows, cols, warps, per, col_per) in [
        (70u32, 96u32, 8u32, 32u32, 32u32),
        (33, 36, 8, 32, 32),
        (45, 768, 8, 32, 7),
        (21, 1001, 4, 16, 32),
        (9, 6144, 1, 4, 4),
    ] {
        for bf16 in [false, true] {
            let round = |x: f32| stored(x, bf16);
            let (r, c) = (rows as usize, cols as usize);
            let wave = |i: usize, k: usize, s: f32| round(((i * k % 997) as f32 / 997.0 - 0.4) * s);
            let x: Vec<f32> = (0..r * c).map(|i| wave(i, 7919, 3.0) + 0.5).collect();
            let w: Vec<f32> = (0..c).map(|i| wave(i, 613, 2.0)).collect();
            let g: Vec<f32> = (0..r * c).map(|i| wave(i, 4481, 1.0)).collect();
            let bias: Vec<f32> = (0..c).map(|i| wave(i, 389, 1.0)).collect();
            let mut bytes = Vec::new();
            for v in [bf16 as u32, rows, cols, warps, per, col_per] {
                bytes.extend(v.to_le_bytes());
            }
            bytes.extend(eps.to_le_bytes());
            for v in [&x, &w, &g, &bias] {
                bytes.extend(v.iter().flat_map(|v| v.to_le_bytes()));
            }
            let out = run_f32(&exe, "rows_main", &bytes);
            assert_eq!(out.len(), 4 * r * c + 4 * c);
            let (dx, rest) = out.split_at(r * c);
            let (dwb, rest) = rest.split_at(2 * c);
            let (colsum, rest) = rest.split_at(c);
            let (y, rest) = rest.split_at(r * c);
            let (packed_sum, bias_rows) = rest.split_at(c);
            for (i, v) in bias_rows.iter().enumerate() {
                let want = bias[i % c];
                assert!(
                    v.to_bits() == want.to_bits(),
                    "rows {rows} x {cols}, bf16 {bf16}: bias row value {i}: {v} vs {want}"
                );
            }
            // float64 reference.
            let (mut want_dx, mut dw, mut db) = (Vec::new(), vec![0f64; c], vec![0f64; c]);
            let mut want_y = Vec::new();
            for i in 0..r {
                let xr: Vec<f64> = x[i * c..(i + 1) * c].iter().map(|&v| v as f64).collect();
                let gr: Vec<f64> = g[i * c..(i + 1) * c].iter().map(|&v| v as f64).collect();
                let mean = xr.iter().sum::<f64>() / c as f64;
                let var = xr.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / c as f64;
                let rstd = 1.0 / (var + eps as f64).sqrt();
                let xh: Vec<f64> = xr.iter().map(|v| (v - mean) * rstd).collect();
                let gw: Vec<f64> = (0..c).map(|k| gr[k] * w[k] as f64).collect();
                let a = gw.iter().sum::<f64>() / c as f64;
                let b = (0..c).map(|k| gw[k] * xh[k]).sum::<f64>() / c as f64;
                for k in 0..c {
                    want_y.push((xh[k] * w[k] as f64 + bias[k] as f64) as f32);
                    want_dx.push((rstd * (gw[k] - a - xh[k] * b)) as f32);
                    dw[k] += gr[k] * xh[k];
                    db[k] += gr[k];
                }
            }
            let what = format!("rows {rows} x {cols}, {warps} warps, bf16 {bf16}");
            let bound = if bf16 { 8e-3 } else { 2e-5 };
            let as32 = |v: &[f64]| v.iter().map(|&v| v as f32).collect::<Vec<_>>();
            let e = rel(y, &want_y);
            assert!(e < bound, "{what}: y off by {e:.2e}");
            let e = rel(dx, &want_dx);
            assert!(e < bound, "{what}: dx off by {e:.2e}");
            let e = rel(&dwb[..c], &as32(&dw));
            assert!(e < bound, "{what}: dw off by {e:.2e}");
            let e = rel(&dwb[c..], &as32(&db));
            assert!(e < bound, "{what}: db off by {e:.2e}");
            let e = rel(colsum, &as32(&db));
            assert!(e < bound, "{what}: bias sums off by {e:.2e}");
            let e = rel(packed_sum, &as32(&db));
            assert!(e < bound, "{what}: bias sums (packed) off by {e:.2e}");
        }
    }
    Ok(())
}

/// GELU forward and backward (`kernels/gelu.cu`) against float64 on the
/// same rounded values, and the residual add (`kernels/add.cu`) against
/// the sum rounded once: 16 bytes a thread where the buffers are aligned,
/// with a tail that is not a whole pack, and a value at a time where they
/// are not (the values one element in), f32 and bf16.
#[test]
fn gelu_and_add_kernels_match_float64() -> Result<()> {
    let exe = build("gelu_main");
    for (n, shift) in [(4103u32, 0u32), (4103, 1), (5, 0)] {
        for bf16 in [false, true] {
            let round = |x: f32| stored(x, bf16);
            let x: Vec<f32> = (0..n)
                .map(|i| round((i * 7919 % 4001) as f32 / 500.0 - 4.0))
                .collect();
            let g: Vec<f32> = (0..n)
                .map(|i| round((i * 613 % 997) as f32 / 997.0 - 0.5))
                .collect();
            let mut bytes = Vec::new();
            for v in [bf16 as u32, n, shift] {
                bytes.extend(v.to_le_bytes());
            }
            for v in [&x, &g] {
                bytes.extend(v.iter().flat_map(|v| v.to_le_bytes()));
            }
            let out = run_f32(&exe, "gelu_main", &bytes);
            let (y, rest) = out.split_at(n as usize);
            let (d, sum) = rest.split_at(n as usize);
            for (i, ((&s, &a), &b)) in sum.iter().zip(&x).zip(&g).enumerate() {
                let want = round(a + b);
                assert!(
                    s.to_bits() == want.to_bits(),
                    "{n} values {shift} in, bf16 {bf16}: sum {i}: {s} vs {want}"
                );
            }
            let (k0, k1) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715);
            let (mut want_y, mut want_d) = (Vec::new(), Vec::new());
            for (&v, &gv) in x.iter().zip(&g) {
                let v = v as f64;
                let t = (k0 * (v + k1 * v * v * v)).tanh();
                want_y.push((0.5 * v * (1.0 + t)) as f32);
                let slope =
                    0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k0 * (1.0 + 3.0 * k1 * v * v);
                want_d.push((gv as f64 * slope) as f32);
            }
            let what = format!("{n} values {shift} in, bf16 {bf16}");
            let bound = if bf16 { 8e-3 } else { 2e-6 };
            // Every value, not only the largest error relative to the
            // largest value: a value the kernel skipped would be 0 here.
            for (i, (a, b)) in y
                .iter()
                .zip(&want_y)
                .chain(d.iter().zip(&want_d))
                .enumerate()
            {
                assert!(
                    (a - b).abs() <= bound * (1.0 + b.abs()),
                    "{what}: value {i}: {a} vs {b}"
                );
            }
        }
    }
    Ok(())
}

/// The row softmax (`kernels/rows.cu`) and the causal attention's in-place
/// softmax (`kernels/attention.cu`), forward and backward, against float64
/// on the same rounded values: rows shorter than a warp, a warp's and
/// eight-row blocks' worth, and rows long enough for a block each (3000, a
/// block of 1024 threads and its shared-memory sums), f32 and bf16. Above
/// the causal rows' diagonal the weights and their gradients are 0 exactly.
#[test]
fn softmax_kernels_match_float64() -> Result<()> {
    let exe = build("softmax_main");
    for (rows, cols) in [(19usize, 7usize), (19, 64), (9, 1000), (5, 3000)] {
        for bf16 in [false, true] {
            let round = |x: f32| stored(x, bf16);
            let n = rows * cols;
            let wave = |i: usize, k: usize, s: f32| round(((i * k % 997) as f32 / 997.0 - 0.5) * s);
            let x: Vec<f32> = (0..n).map(|i| wave(i, 7919, 6.0)).collect();
            let g: Vec<f32> = (0..n).map(|i| wave(i, 4481, 2.0)).collect();
            let mut bytes = Vec::new();
            for v in [bf16 as u32, rows as u32, cols as u32] {
                bytes.extend(v.to_le_bytes());
            }
            for v in [&x, &g] {
                bytes.extend(v.iter().flat_map(|v| v.to_le_bytes()));
            }
            let out = run_f32(&exe, "softmax_main", &bytes);
            assert_eq!(out.len(), 4 * n);
            let (y, rest) = out.split_at(n);
            let (dx, rest) = rest.split_at(n);
            let (p, dp) = rest.split_at(n);
            // float64 references; each backward from the forward the kernel
            // gave (as the GPU's backward reads it), over the row's live part.
            let softmax = |row: &[f32]| -> Vec<f64> {
                let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                let e: Vec<f64> = row.iter().map(|&v| (v as f64 - m).exp()).collect();
                let s: f64 = e.iter().sum();
                e.iter().map(|v| v / s).collect()
            };
            let backward = |w: &[f32], g: &[f32]| -> Vec<f64> {
                let dot: f64 = w.iter().zip(g).map(|(&a, &b)| a as f64 * b as f64).sum();
                w.iter()
                    .zip(g)
                    .map(|(&a, &b)| a as f64 * (b as f64 - dot))
                    .collect()
            };
            let (mut want_y, mut want_dx, mut want_p, mut want_dp) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for r in 0..rows {
                let span = r * cols..(r + 1) * cols;
                want_y.extend(softmax(&x[span.clone()]));
                want_dx.extend(backward(&y[span.clone()], &g[span.clone()]));
                let live = r % cols + 1;
                let at = r * cols;
                want_p.extend(softmax(&x[at..at + live]));
                want_p.extend(std::iter::repeat_n(0.0, cols - live));
                want_dp.extend(backward(&p[at..at + live], &g[at..at + live]));
                want_dp.extend(std::iter::repeat_n(0.0, cols - live));
                for i in at + live..at + cols {
                    assert!(
                        p[i].to_bits() == 0 && dp[i].to_bits() == 0,
                        "rows {rows} x {cols}, bf16 {bf16}: value {i} above the diagonal: {} {}",
                        p[i],
                        dp[i]
                    );
                }
            }
            let what = format!("rows {rows} x {cols}, bf16 {bf16}");
            let bound = if bf16 { 8e-3 } else { 1e-5 };
            let as32 = |v: &[f64]| v.iter().map(|&v| v as f32).collect::<Vec<_>>();
            for (name, got, want) in [
                ("softmax", y, &want_y),
                ("softmax backward", dx, &want_dx),
                ("causal softmax", p, &want_p),
                ("causal softmax backward", dp, &want_dp),
            ] {
                let e = rel(got, &as32(want));
                assert!(e < bound, "{what}: {name} off by {e:.2e}");
                println!("{what}: {name} {e:.1e}");
            }
        }
    }
    Ok(())
}

/// The embedding lookup's gradient (`kernels/embedding.cu`: each row's
/// gradient added into its table row with atomics, then rounded) and the
/// rotary position embedding (`kernels/rope.cu`), forward and back, against
/// float64 on the same rounded values, f32 and bf16: ids that repeat, a
/// table row no id names (0 exactly), and ids past the table, which add
/// nothing (the forward's lookup reports them).
#[test]
fn embedding_gradient_and_rope_kernels_match_float64() -> Result<()> {
    let exe = build("lookup_main");
    let (n, d, vocab, bh, t, half) = (37usize, 24usize, 11usize, 3usize, 5usize, 4usize);
    // Row 7 is never named; 11 and u32::MAX are past the table.
    let ids: Vec<u32> = (0..n as u32)
        .map(|i| match i % 9 {
            5 => 11,
            8 => u32::MAX,
            _ => (i * 5 % 11 + (i * 5 % 11 == 7) as u32) % 11,
        })
        .collect();
    assert!(!ids.contains(&7) && ids.iter().filter(|&&i| i == 3).count() > 1);
    for bf16 in [false, true] {
        let round = |x: f32| stored(x, bf16);
        let wave = |i: usize, k: usize, s: f32| ((i * k % 997) as f32 / 997.0 - 0.5) * s;
        let g: Vec<f32> = (0..n * d).map(|i| round(wave(i, 4481, 2.0))).collect();
        let nx = bh * t * 2 * half;
        let x: Vec<f32> = (0..nx).map(|i| round(wave(i, 7919, 4.0))).collect();
        let angle = |p: usize, i: usize| p as f64 / 10000f64.powf(i as f64 / half as f64);
        let cos: Vec<f32> = (0..t * half)
            .map(|k| angle(k / half, k % half).cos() as f32)
            .collect();
        let sin: Vec<f32> = (0..t * half)
            .map(|k| angle(k / half, k % half).sin() as f32)
            .collect();
        let mut bytes = Vec::new();
        for v in [bf16 as usize, n, d, vocab, bh, t, half] {
            bytes.extend((v as u32).to_le_bytes());
        }
        bytes.extend(g.iter().flat_map(|v| v.to_le_bytes()));
        bytes.extend(ids.iter().flat_map(|v| v.to_le_bytes()));
        for v in [&x, &cos, &sin] {
            bytes.extend(v.iter().flat_map(|v| v.to_le_bytes()));
        }
        let out = run_f32(&exe, "lookup_main", &bytes);
        assert_eq!(out.len(), vocab * d + 2 * nx);
        let (table, rest) = out.split_at(vocab * d);
        let (y, back) = rest.split_at(nx);

        let mut want_table = vec![0f64; vocab * d];
        for (i, &id) in ids.iter().enumerate() {
            if (id as usize) < vocab {
                for j in 0..d {
                    want_table[id as usize * d + j] += g[i * d + j] as f64;
                }
            }
        }
        assert!(table[7 * d..8 * d].iter().all(|v| v.to_bits() == 0));
        // Each pair (a, b) turned by its position's angle; back, by minus it.
        let turn = |v: &[f32], sign: f64| -> Vec<f32> {
            let mut o = vec![0f32; v.len()];
            for k in 0..v.len() / 2 {
                let (i, p) = (k % half, (k / half) % t);
                let (c, s) = (cos[p * half + i] as f64, sign * sin[p * half + i] as f64);
                let (a, b) = (v[2 * k] as f64, v[2 * k + 1] as f64);
                o[2 * k] = (a * c - b * s) as f32;
                o[2 * k + 1] = (a * s + b * c) as f32;
            }
            o
        };
        let bound = if bf16 { 8e-3 } else { 1e-6 };
        let as32 = |v: &[f64]| v.iter().map(|&v| v as f32).collect::<Vec<_>>();
        for (name, got, want) in [
            ("embedding gradient", table, as32(&want_table)),
            ("rope", y, turn(&x, 1.0)),
            ("rope back", back, turn(y, -1.0)),
        ] {
            let e = rel(got, &want);
            assert!(e < bound, "bf16 {bf16}: {name} off by {e:.2e}");
            println!("bf16 {bf16}: {name} {e:.1e}");
        }
    }
    Ok(())
}
