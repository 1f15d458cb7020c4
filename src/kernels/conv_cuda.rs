//! The CUDA path of the CNN's 3x3 convolution and 2x2 max-pool (`conv.rs`
//! and `pool.rs` have the CPU references; `kernels/conv.cu` the kernels):
//!
//! - forward: the output starts as the bias planes, and one batched cuBLAS
//!   product per chunk of samples adds `W [O, C*9] col_b [C*9, H*W]`
//! - input gradient: `col_b = W^T dy_b` batched, then col2im
//! - weight gradient: one product over the whole chunk, `dy` as
//!   `[O, B*H*W]` times the chunk's im2col as `[C*9, B*H*W]` transposed,
//!   accumulated across chunks by cuBLAS's beta
//!
//! The im2col scratch is bounded ([`SCRATCH_VALUES`]): large images and
//! batches go through in chunks of samples rather than one buffer of
//! `B*C*9*H*W` values.

use candle_core::cuda_backend::cudarc::cublas::{CudaBlas, Gemm};
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use candle_core::cuda_backend::CudaDType;
use candle_core::{bail, CudaDevice, CudaStorage, Layout, Result, WithDType};

use super::blas::{int, product, Mat};
use super::conv::THREE;
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

/// im2col of the `nb` samples in `x` into `col`, sample b's row r at
/// `b * sb + r * sr`.
#[allow(clippy::too_many_arguments)]
fn im2col<T: CudaDType + DeviceRepr + WithDType>(
    dev: &CudaDevice,
    x: &CudaView<'_, T>,
    col: &mut CudaSlice<T>,
    (nb, c, h, w): (usize, usize, usize, usize),
    (sb, sr): (usize, usize),
) -> Result<()> {
    let n = nb * c * 9 * h * w;
    if n == 0 {
        return Ok(());
    }
    let f = kernel!(CONV, dev, format!("im2col3_{}", suffix(T::DTYPE)?));
    let (c, h, w) = (int(c)?, int(h)?, int(w)?);
    let mut args = f.builder();
    args.arg(x)
        .arg(col)
        .arg(&n)
        .arg(&c)
        .arg(&h)
        .arg(&w)
        .arg(&sb)
        .arg(&sr);
    run(&mut args, elementwise(n))
}

/// `conv2d(x, w, padding 1) + b`: `[B, O, H, W]`.
pub(super) fn forward<T: CudaDType + DeviceRepr + WithDType>(
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
    (s3, l3): (&CudaStorage, &Layout),
) -> Result<CudaStorage>
where
    CudaBlas: Gemm<T>,
{
    let (bn, g, o) = super::conv::shapes(l1, l2, &THREE)?;
    let (c, h, wd) = (g.c, g.h, g.w);
    let (hw, c9) = (h * wd, c * 9);
    let (x, w, b) = (
        view::<T>(s1, l1, "conv input")?,
        view::<T>(s2, l2, "conv weight")?,
        view::<T>(s3, l3, "conv bias")?,
    );
    if b.len() != o {
        bail!("conv3x3: weight {:?}, bias {:?}", l2.dims(), l3.dims())
    }
    let dev = &s1.device;
    let n = bn * o * hw;
    let mut y = alloc::<T>(dev, n)?;
    if n == 0 {
        return Ok(wrap(y, dev));
    }
    let f = kernel!(CONV, dev, format!("bias_planes_{}", suffix(T::DTYPE)?));
    let (o_i, hw_i) = (int(o)?, int(hw)?);
    let mut args = f.builder();
    args.arg(&b).arg(&mut y).arg(&n).arg(&o_i).arg(&hw_i);
    run(&mut args, elementwise(n))?;
    if c9 == 0 {
        return Ok(wrap(y, dev));
    }
    let per = chunk(bn, c9 * hw);
    let mut col = alloc::<T>(dev, per * c9 * hw)?;
    let blas = dev.cublas_handle();
    for b0 in (0..bn).step_by(per) {
        let nb = per.min(bn - b0);
        let xs = x.slice(b0 * c * hw..(b0 + nb) * c * hw);
        im2col(dev, &xs, &mut col, (nb, c, h, wd), (c9 * hw, hw))?;
        product(
            &blas,
            nb,
            (o, hw, c9),
            (1.0, 1.0),
            (&w, Mat::new(0, c9, 0)),
            (&col.slice(..), Mat::new(0, hw, c9 * hw)),
            (&mut y, Mat::new(b0 * o * hw, hw, o * hw)),
        )?;
    }
    Ok(wrap(y, dev))
}

/// `dx_b = col2im(W^T dy_b)` from `dy [B, O, H, W]` and `w [O, C, 3, 3]`.
pub(super) fn input_grad<T: CudaDType + DeviceRepr + ValidAsZeroBits + WithDType>(
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
) -> Result<CudaStorage>
where
    CudaBlas: Gemm<T>,
{
    let (bn, o, g) = super::conv::input_grad_shapes(l1, l2, &THREE)?;
    let (c, h, wd) = (g.c, g.h, g.w);
    let (hw, c9) = (h * wd, c * 9);
    let (dy, w) = (
        view::<T>(s1, l1, "conv output gradient")?,
        view::<T>(s2, l2, "conv weight")?,
    );
    let dev = &s1.device;
    if o == 0 || bn * c * hw == 0 {
        return Ok(wrap(super::cuda::zeros::<T>(dev, bn * c * hw)?, dev));
    }
    let mut dx = alloc::<T>(dev, bn * c * hw)?;
    let per = chunk(bn, c9 * hw);
    let mut col = alloc::<T>(dev, per * c9 * hw)?;
    let blas = dev.cublas_handle();
    let f = kernel!(CONV, dev, format!("col2im3_{}", suffix(T::DTYPE)?));
    let (h_i, w_i) = (int(h)?, int(wd)?);
    for b0 in (0..bn).step_by(per) {
        let nb = per.min(bn - b0);
        product(
            &blas,
            nb,
            (c9, hw, o),
            (1.0, 0.0),
            (&w, Mat::new(0, c9, 0).t()),
            (&dy, Mat::new(b0 * o * hw, hw, o * hw)),
            (&mut col, Mat::new(0, hw, c9 * hw)),
        )?;
        let n = nb * c * hw;
        let mut out = dx.slice_mut(b0 * c * hw..(b0 + nb) * c * hw);
        let mut args = f.builder();
        args.arg(&col).arg(&mut out).arg(&n).arg(&h_i).arg(&w_i);
        run(&mut args, elementwise(n))?;
    }
    Ok(wrap(dx, dev))
}

/// `dW = sum_b dy_b col_b^T` from `x [B, C, H, W]` and `dy [B, O, H, W]`.
pub(super) fn weight_grad<T: CudaDType + DeviceRepr + ValidAsZeroBits + WithDType>(
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
) -> Result<CudaStorage>
where
    CudaBlas: Gemm<T>,
{
    let bn = l1.shape().dims4()?.0;
    let (g, o) = super::conv::weight_grad_shapes(l1, l2, &THREE)?;
    let (c, h, wd) = (g.c, g.h, g.w);
    let (hw, c9) = (h * wd, c * 9);
    let (x, dy) = (
        view::<T>(s1, l1, "conv input")?,
        view::<T>(s2, l2, "conv output gradient")?,
    );
    let dev = &s1.device;
    if bn * hw == 0 || o * c9 == 0 {
        return Ok(wrap(super::cuda::zeros::<T>(dev, o * c9)?, dev));
    }
    let mut dw = alloc::<T>(dev, o * c9)?;
    let per = chunk(bn, (c9 + o) * hw);
    let mut col = alloc::<T>(dev, per * c9 * hw)?;
    let mut dyt = alloc::<T>(dev, per * o * hw)?;
    let blas = dev.cublas_handle();
    let swap = kernel!(CONV, dev, format!("swap01_{}", suffix(T::DTYPE)?));
    for b0 in (0..bn).step_by(per) {
        let nb = per.min(bn - b0);
        let xs = x.slice(b0 * c * hw..(b0 + nb) * c * hw);
        // The chunk as [C*9, nb*H*W] and dy as [O, nb*H*W].
        im2col(dev, &xs, &mut col, (nb, c, h, wd), (hw, nb * hw))?;
        let n = nb * o * hw;
        let dys = dy.slice(b0 * o * hw..(b0 + nb) * o * hw);
        let (nb_i, o_i, hw_i) = (int(nb)?, int(o)?, int(hw)?);
        let mut args = swap.builder();
        args.arg(&dys)
            .arg(&mut dyt)
            .arg(&n)
            .arg(&nb_i)
            .arg(&o_i)
            .arg(&hw_i);
        run(&mut args, elementwise(n))?;
        let k = nb * hw;
        product(
            &blas,
            1,
            (o, c9, k),
            (1.0, if b0 == 0 { 0.0 } else { 1.0 }),
            (&dyt.slice(..), Mat::new(0, k, 0)),
            (&col.slice(..), Mat::new(0, k, 0).t()),
            (&mut dw, Mat::new(0, c9, 0)),
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
