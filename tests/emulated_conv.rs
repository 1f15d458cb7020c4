//! `kernels/conv.cu` (the CNN's convolution and 2x2 max-pool on CUDA) run
//! on the CPU, compiled with g++ against `tests/emulate/cuda_emu.hpp`, as
//! `tests/emulated_kernels.rs` runs the other kernels: im2col in both of
//! the layouts `src/kernels/conv_cuda.rs` asks for, col2im, the channel
//! sum, the swap of the weight gradient's operand and the pool. The
//! products around them (cuBLAS's on a GPU) are made here in float64 from
//! the kernels' outputs, and the convolution they give is compared with
//! candle's `conv2d` and its gradients in float64. On a GPU,
//! `tests/cuda_kernels.rs` checks the whole op against the CPU.

#[path = "common/emulate.rs"]
mod emulate;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use candle_core::{DType, Device, Result, Tensor, Var};

use emulate::{build, f32s, rel, run_f32};

fn driver() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build("conv_main"))
}

fn f64_tensor(v: &[f32], shape: &[usize]) -> Result<Tensor> {
    Tensor::from_vec(v.to_vec(), shape, &Device::Cpu)?.to_dtype(DType::F64)
}

/// max |a - r| / max |scale|: an error against the magnitudes of the
/// terms `r` sums.
fn off_by(a: &[f32], r: &[f32], scale: &[f32]) -> f64 {
    let diff = a
        .iter()
        .zip(r)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs() as f64));
    diff / scale.iter().fold(1e-30f64, |m, v| m.max(v.abs() as f64))
}

/// The 2x2 max-pool of `x [planes, h, w]` and its input gradient for `dy`:
/// each window's first maximum, row by row, takes its gradient.
fn pool_reference(x: &[f32], dy: &[f32], (planes, h, w): (usize, usize, usize)) -> [Vec<f32>; 2] {
    let (h2, w2) = (h / 2, w / 2);
    let (mut y, mut dx) = (Vec::new(), vec![0f32; planes * h * w]);
    for plane in 0..planes {
        for i in 0..h2 {
            for j in 0..w2 {
                let at = [(0, 0), (0, 1), (1, 0), (1, 1)]
                    .map(|(a, b)| (plane * h + 2 * i + a) * w + 2 * j + b);
                let best = at[1..]
                    .iter()
                    .fold(at[0], |m, &q| if x[q] > x[m] { q } else { m });
                y.push(x[best]);
                dx[best] = dy[(plane * h2 + i) * w2 + j];
            }
        }
    }
    [y, dx]
}

/// One geometry: `x [b, c, h, w]`, a `k x k` kernel with `p` zeros a side,
/// 4 output channels, values rounded to `dtype`.
fn check(
    dtype: DType,
    (b, c, h, w): (usize, usize, usize, usize),
    k: usize,
    p: usize,
) -> Result<()> {
    let dev = Device::Cpu;
    let o = 4;
    let (ho, wo) = (h + 2 * p + 1 - k, w + 2 * p + 1 - k);
    let (taps, ohw, hw) = (c * k * k, ho * wo, h * w);
    let round = |t: Tensor| t.to_dtype(dtype)?.to_dtype(DType::F64);
    let x = Var::from_tensor(&round(Tensor::randn(0f32, 1.0, (b, c, h, w), &dev)?)?)?;
    let kw = Var::from_tensor(&round(Tensor::randn(0f32, 1.0, (o, c, k, k), &dev)?)?)?;
    let dy = round(Tensor::randn(0f32, 1.0, (b, o, ho, wo), &dev)?)?;
    let pool_dy = round(Tensor::randn(0f32, 1.0, (b, c, h / 2, w / 2), &dev)?)?;
    let w2 = kw.as_tensor().reshape((o, taps))?;
    // col2im's input as the backward makes it: W^T dy_b, a sample at a time
    // (rounded to the storage type, as cuBLAS writes it).
    let col_in = round(
        w2.t()?
            .broadcast_matmul(&dy.reshape((b, o, ohw))?)?
            .contiguous()?,
    )?;

    let bf16 = dtype == DType::BF16;
    let mut bytes: Vec<u8> = [u32::from(bf16), b as u32, c as u32, h as u32, w as u32]
        .into_iter()
        .chain([k as u32, p as u32])
        .flat_map(u32::to_le_bytes)
        .collect();
    for t in [x.as_tensor(), &col_in, &pool_dy] {
        bytes.extend(f32s(t)?.iter().flat_map(|v| v.to_le_bytes()));
    }
    let out = run_f32(driver(), "conv_main", &bytes);
    let sizes = [
        b * taps * ohw,
        b * taps * ohw,
        b * c * hw,
        c,
        b * c * hw,
        b * c * (h / 2) * (w / 2),
        b * c * hw,
    ];
    assert_eq!(out.len(), sizes.iter().sum::<usize>(), "output values");
    let mut parts = Vec::new();
    let mut rest = &out[..];
    for n in sizes {
        let (a, r) = rest.split_at(n);
        parts.push(a);
        rest = r;
    }
    let [col, col_t, dx, sums, swapped, pooled, pool_dx] = parts[..] else {
        unreachable!("seven parts")
    };

    // candle's convolution and its gradients in float64.
    let y64 = x.as_tensor().conv2d(kw.as_tensor(), p, 1, 1, 1)?;
    let g = (&y64 * &dy)?.sum_all()?.backward()?;
    let (dx64, dw64) = (g.get(&x).expect("dx"), g.get(&kw).expect("dw"));
    let what = format!("{dtype:?}, {b}x{c}x{h}x{w}, {k}x{k} padding {p}");

    // The forward's product on each sample's im2col: W [O, taps] col_b.
    let y = w2.broadcast_matmul(&f64_tensor(col, &[b, taps, ohw])?)?;
    let e = rel(&f32s(&y)?, &f32s(&y64)?);
    assert!(e < 1e-6, "{what}: forward off by {e:.1e}");
    // The weight gradient's one product: dy as [O, B*Ho*Wo] times the
    // im2col of the batch as [taps, B*Ho*Wo], transposed.
    let dy_t = dy
        .reshape((b, o, ohw))?
        .transpose(0, 1)?
        .reshape((o, b * ohw))?;
    let dw = dy_t.matmul(&f64_tensor(col_t, &[taps, b * ohw])?.t()?)?;
    let e = rel(&f32s(&dw)?, &f32s(dw64)?);
    assert!(e < 1e-6, "{what}: weight gradient off by {e:.1e}");
    // col2im and the channel sum add in f32 and round once to the storage
    // type: their errors are measured against the sums of the terms'
    // magnitudes (a sum that cancels to near 0 keeps the terms' rounding),
    // within what n f32 additions may round (a wrong index is off by ~1).
    let bound = if bf16 { 1.6e-2 } else { 1e-5 };
    let abs = |t: &Tensor| -> Result<Var> { Var::from_tensor(&t.abs()?) };
    let (xa, ka) = (abs(x.as_tensor())?, abs(kw.as_tensor())?);
    let ga = (xa.as_tensor().conv2d(ka.as_tensor(), p, 1, 1, 1)? * dy.abs()?)?
        .sum_all()?
        .backward()?;
    let dx_terms = f32s(ga.get(&xa).expect("dx of magnitudes"))?;
    let e = off_by(dx, &f32s(dx64)?, &dx_terms);
    assert!(e < bound, "{what}: input gradient off by {e:.1e}");
    let sums64 = x.as_tensor().sum((0, 2, 3))?;
    let e = off_by(
        sums,
        &f32s(&sums64)?,
        &f32s(&xa.as_tensor().sum((0, 2, 3))?)?,
    );
    assert!(e < bound, "{what}: channel sums off by {e:.1e}");
    let want = f32s(&x.as_tensor().transpose(0, 1)?)?;
    assert_eq!(swapped, &want[..], "{what}: swap01");

    let [py, pdx] = pool_reference(&f32s(x.as_tensor())?, &f32s(&pool_dy)?, (b * c, h, w));
    assert_eq!(pooled, &py[..], "{what}: max-pool");
    assert_eq!(pool_dx, &pdx[..], "{what}: max-pool gradient");
    println!("{what}: ok");
    Ok(())
}

/// Every (kernel, padding) pair the CPU's test takes (1 to 7, even and odd,
/// no padding to more than the kernel's half), at odd sizes (edges on every
/// side, an odd row and column the pool drops), in f32 and bf16, and one
/// size where a batch's values outnumber the emulated grid's threads many
/// times over.
#[test]
fn conv_kernels_match_candle_in_float64() -> Result<()> {
    for (k, p) in [
        (3, 1),
        (5, 0),
        (5, 2),
        (1, 0),
        (3, 0),
        (4, 1),
        (7, 3),
        (2, 3),
    ] {
        check(DType::F32, (3, 2, 7, 6), k, p)?;
    }
    check(DType::BF16, (3, 2, 7, 6), 5, 0)?;
    check(DType::BF16, (2, 3, 9, 8), 3, 1)?;
    check(DType::F32, (4, 3, 32, 32), 5, 0)
}
