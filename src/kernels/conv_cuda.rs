//! The CUDA path of the CNN's convolution (any square kernel and padding,
//! stride 1) and 2x2 max-pool (`conv.rs`, `conv_cpu.rs` and `pool.rs` have
//! the CPU references; `kernels/conv.cu` the kernels). With `k*k` taps a
//! channel and output planes `Ho x Wo`:
//!
//! - forward: the output starts as the bias planes, and one batched cuBLAS
//!   product per chunk of samples adds `W [O, C*k*k] col_b [C*k*k, Ho*Wo]`
//! - input gradient: `col_b = W^T dy_b` batched, then col2im
//! - weight gradient: one product over the whole chunk, `dy` as
//!   `[O, B*Ho*Wo]` times the chunk's im2col as `[C*k*k, B*Ho*Wo]`
//!   transposed, accumulated across chunks by cuBLAS's beta
//!
//! The im2col scratch is bounded ([`SCRATCH_VALUES`]): large images and
//! batches go through in chunks of samples rather than one buffer of
//! `B*C*k*k*Ho*Wo` values.

use candle_core::cuda_backend::cudarc::cublas::{CudaBlas, Gemm};
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use candle_core::cuda_backend::CudaDType;
use candle_core::{bail, CudaDevice, CudaStorage, Layout, Result, WithDType};

use super::blas::{int, product, Mat};
use super::conv::{input_grad_shapes, shapes, weight_grad_shapes, Conv};
use super::conv_cpu::Geometry;
use super::cuda::{alloc, elementwise, kernel, run, suffix, view, CONV};

/// The most values of im2col scratch (and permuted gradient) one chunk of
/// samples uses: 128 MiB in f32.
const SCRATCH_VALUES: usize = 1 << 25;

/// Samples per chunk when each takes `per` scratch values (at least one).
fn chunk(batch: usize, per: usize) -> usize {
    (SCRATCH_VALUES / per.max(1)).clamp(1, batch.max(1))
}

fn wrap<T: CudaDType + DeviceRepr>(s: CudaSlice<T>, dev: &CudaDevice) -> CudaStorage {
    CudaStorage::wrap_cuda_slice(s, dev.clone())
}

/// The kernels' `Geom`: the input planes, the kernel, the padding and the
/// output planes.
#[repr(C)]
#[derive(Clone, Copy)]
struct Geom {
    h: i32,
    w: i32,
    k: i32,
    p: i32,
    ho: i32,
    wo: i32,
}

// SAFETY: plain old data, laid out as the C struct.
unsafe impl DeviceRepr for Geom {}

impl Geom {
    fn of(g: &Geometry) -> Result<Self> {
        let (ho, wo) = g.out();
        Ok(Geom {
            h: int(g.h)?,
            w: int(g.w)?,
            k: int(g.k)?,
            p: int(g.p)?,
            ho: int(ho)?,
            wo: int(wo)?,
        })
    }
}

/// The sizes a convolution's CUDA path works in: the input plane, the
/// output plane and the taps (`C*k*k`).
fn sizes(g: &Geometry) -> (usize, usize, usize) {
    let (ho, wo) = g.out();
    (g.h * g.w, ho * wo, g.taps())
}

/// im2col of the `nb` samples in `x` into `col`, sample b's row r at
/// `b * sb + r * sr`.
fn im2col<T: CudaDType + DeviceRepr + WithDType>(
    dev: &CudaDevice,
    x: &CudaView<'_, T>,
    col: &mut CudaSlice<T>,
    (nb, g): (usize, &Geometry),
    (sb, sr): (usize, usize),
) -> Result<()> {
    let (_, ohw, taps) = sizes(g);
    let n = nb * taps * ohw;
    if n == 0 {
        return Ok(());
    }
    let f = kernel!(CONV, dev, format!("im2col_{}", suffix(T::DTYPE)?));
    let (c, geom) = (int(g.c)?, Geom::of(g)?);
    let mut args = f.builder();
    args.arg(x)
        .arg(col)
        .arg(&n)
        .arg(&c)
        .arg(&geom)
        .arg(&sb)
        .arg(&sr);
    run(&mut args, elementwise(n))
}

/// `conv2d(x, w, padding) + b`: `[B, O, Ho, Wo]`.
pub(super) fn forward<T: CudaDType + DeviceRepr + WithDType>(
    op: &Conv,
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
    (s3, l3): (&CudaStorage, &Layout),
) -> Result<CudaStorage>
where
    CudaBlas: Gemm<T>,
{
    let (bn, g, o) = shapes(l1, l2, op)?;
    let (hw, ohw, taps) = sizes(&g);
    let c = g.c;
    let (x, w, b) = (
        view::<T>(s1, l1, "conv input")?,
        view::<T>(s2, l2, "conv weight")?,
        view::<T>(s3, l3, "conv bias")?,
    );
    if b.len() != o {
        bail!("conv2d: weight {:?}, bias {:?}", l2.dims(), l3.dims())
    }
    let dev = &s1.device;
    let n = bn * o * ohw;
    let mut y = alloc::<T>(dev, n)?;
    if n == 0 {
        return Ok(wrap(y, dev));
    }
    let f = kernel!(CONV, dev, format!("bias_planes_{}", suffix(T::DTYPE)?));
    let (o_i, ohw_i) = (int(o)?, int(ohw)?);
    let mut args = f.builder();
    args.arg(&b).arg(&mut y).arg(&n).arg(&o_i).arg(&ohw_i);
    run(&mut args, elementwise(n))?;
    if taps == 0 {
        return Ok(wrap(y, dev));
    }
    let per = chunk(bn, taps * ohw);
    let mut col = alloc::<T>(dev, per * taps * ohw)?;
    let blas = dev.cublas_handle();
    for b0 in (0..bn).step_by(per) {
        let nb = per.min(bn - b0);
        let xs = x.slice(b0 * c * hw..(b0 + nb) * c * hw);
        im2col(dev, &xs, &mut col, (nb, &g), (taps * ohw, ohw))?;
        product(
            &blas,
            nb,
            (o, ohw, taps),
            (1.0, 1.0),
            (&w, Mat::new(0, taps, 0)),
            (&col.slice(..), Mat::new(0, ohw, taps * ohw)),
            (&mut y, Mat::new(b0 * o * ohw, ohw, o * ohw)),
        )?;
    }
    Ok(wrap(y, dev))
}

/// `dx_b = col2im(W^T dy_b)` from `dy [B, O, Ho, Wo]` and `w [O, C, k, k]`.
pub(super) fn input_grad<T: CudaDType + DeviceRepr + ValidAsZeroBits + WithDType>(
    op: &Conv,
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
) -> Result<CudaStorage>
where
    CudaBlas: Gemm<T>,
{
    let (bn, o, g) = input_grad_shapes(l1, l2, op)?;
    let (hw, ohw, taps) = sizes(&g);
    let c = g.c;
    let (dy, w) = (
        view::<T>(s1, l1, "conv output gradient")?,
        view::<T>(s2, l2, "conv weight")?,
    );
    let dev = &s1.device;
    if o == 0 || ohw == 0 || bn * c * hw == 0 {
        return Ok(wrap(super::cuda::zeros::<T>(dev, bn * c * hw)?, dev));
    }
    let mut dx = alloc::<T>(dev, bn * c * hw)?;
    let per = chunk(bn, taps * ohw);
    let mut col = alloc::<T>(dev, per * taps * ohw)?;
    let blas = dev.cublas_handle();
    let f = kernel!(CONV, dev, format!("col2im_{}", suffix(T::DTYPE)?));
    let geom = Geom::of(&g)?;
    for b0 in (0..bn).step_by(per) {
        let nb = per.min(bn - b0);
        product(
            &blas,
            nb,
            (taps, ohw, o),
            (1.0, 0.0),
            (&w, Mat::new(0, taps, 0).t()),
            (&dy, Mat::new(b0 * o * ohw, ohw, o * ohw)),
            (&mut col, Mat::new(0, ohw, taps * ohw)),
        )?;
        let n = nb * c * hw;
        let mut out = dx.slice_mut(b0 * c * hw..(b0 + nb) * c * hw);
        let mut args = f.builder();
        args.arg(&col).arg(&mut out).arg(&n).arg(&geom);
        run(&mut args, elementwise(n))?;
    }
    Ok(wrap(dx, dev))
}

/// `dW = sum_b dy_b col_b^T` from `x [B, C, H, W]` and `dy [B, O, Ho, Wo]`.
pub(super) fn weight_grad<T: CudaDType + DeviceRepr + ValidAsZeroBits + WithDType>(
    op: &Conv,
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
) -> Result<CudaStorage>
where
    CudaBlas: Gemm<T>,
{
    let bn = l1.shape().dims4()?.0;
    let (g, o) = weight_grad_shapes(l1, l2, op)?;
    let (hw, ohw, taps) = sizes(&g);
    let c = g.c;
    let (x, dy) = (
        view::<T>(s1, l1, "conv input")?,
        view::<T>(s2, l2, "conv output gradient")?,
    );
    let dev = &s1.device;
    if bn * ohw == 0 || o * taps == 0 {
        return Ok(wrap(super::cuda::zeros::<T>(dev, o * taps)?, dev));
    }
    let mut dw = alloc::<T>(dev, o * taps)?;
    let per = chunk(bn, (taps + o) * ohw);
    let mut col = alloc::<T>(dev, per * taps * ohw)?;
    let mut dyt = alloc::<T>(dev, per * o * ohw)?;
    let blas = dev.cublas_handle();
    let swap = kernel!(CONV, dev, format!("swap01_{}", suffix(T::DTYPE)?));
    for b0 in (0..bn).step_by(per) {
        let nb = per.min(bn - b0);
        let xs = x.slice(b0 * c * hw..(b0 + nb) * c * hw);
        // The chunk as [C*k*k, nb*Ho*Wo] and dy as [O, nb*Ho*Wo].
        im2col(dev, &xs, &mut col, (nb, &g), (ohw, nb * ohw))?;
        let n = nb * o * ohw;
        let dys = dy.slice(b0 * o * ohw..(b0 + nb) * o * ohw);
        let (nb_i, o_i, ohw_i) = (int(nb)?, int(o)?, int(ohw)?);
        let mut args = swap.builder();
        args.arg(&dys)
            .arg(&mut dyt)
            .arg(&n)
            .arg(&nb_i)
            .arg(&o_i)
            .arg(&ohw_i);
        run(&mut args, elementwise(n))?;
        let k = nb * ohw;
        product(
            &blas,
            1,
            (o, taps, k),
            (1.0, if b0 == 0 { 0.0 } else { 1.0 }),
            (&dyt.slice(..), Mat::new(0, k, 0)),
            (&col.slice(..), Mat::new(0, k, 0).t()),
            (&mut dw, Mat::new(0, taps, 0)),
        )?;
    }
    Ok(wrap(dw, dev))
}

/// `dy [B, O, H, W]` summed to `[O]`.
pub(super) fn channel_sum<T: CudaDType + DeviceRepr + ValidAsZeroBits + WithDType>(
    s: &CudaStorage,
    l: &Layout,
) -> Result<CudaStorage> {
    let (bn, o, h, w) = l.shape().dims4()?;
    let dy = view::<T>(s, l, "conv output gradient")?;
    let dev = &s.device;
    if o == 0 || bn * h * w == 0 {
        return Ok(wrap(super::cuda::zeros::<T>(dev, o)?, dev));
    }
    let out = alloc::<T>(dev, o)?;
    let f = kernel!(CONV, dev, format!("channel_sum_{}", suffix(T::DTYPE)?));
    let (b_i, o_i, hw_i) = (int(bn)?, int(o)?, int(h * w)?);
    let mut args = f.builder();
    args.arg(&dy).arg(&out).arg(&b_i).arg(&o_i).arg(&hw_i);
    let cfg = LaunchConfig {
        grid_dim: (o as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    run(&mut args, cfg)?;
    Ok(wrap(out, dev))
}

/// 2x2 max-pooling of `x [B, C, H, W]`: `[B, C, H/2, W/2]`.
pub(super) fn max_pool<T: CudaDType + DeviceRepr + WithDType>(
    s: &CudaStorage,
    l: &Layout,
) -> Result<CudaStorage> {
    let (b, c, h, w) = l.shape().dims4()?;
    let x = view::<T>(s, l, "max-pool input")?;
    let dev = &s.device;
    let n = b * c * (h / 2) * (w / 2);
    let y = alloc::<T>(dev, n)?;
    if n > 0 {
        let f = kernel!(CONV, dev, format!("max_pool_fwd_{}", suffix(T::DTYPE)?));
        let (h_i, w_i) = (int(h)?, int(w)?);
        let mut args = f.builder();
        args.arg(&x).arg(&y).arg(&n).arg(&h_i).arg(&w_i);
        run(&mut args, elementwise(n))?;
    }
    Ok(wrap(y, dev))
}

/// The max-pool's input gradient from `x [B, C, H, W]` and `dy`.
pub(super) fn max_pool_grad<T: CudaDType + DeviceRepr + WithDType>(
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let (b, c, h, w) = super::pool::grad_dims(l1, l2)?;
    let (x, dy) = (
        view::<T>(s1, l1, "max-pool input")?,
        view::<T>(s2, l2, "max-pool gradient")?,
    );
    let dev = &s1.device;
    let n = b * c * h * w;
    let dx = alloc::<T>(dev, n)?;
    if n > 0 {
        let f = kernel!(CONV, dev, format!("max_pool_bwd_{}", suffix(T::DTYPE)?));
        let (h_i, w_i) = (int(h)?, int(w)?);
        let mut args = f.builder();
        args.arg(&x).arg(&dy).arg(&dx).arg(&n).arg(&h_i).arg(&w_i);
        run(&mut args, elementwise(n))?;
    }
    Ok(wrap(dx, dev))
}
