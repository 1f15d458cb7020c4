//! The CUDA path of the fused causal attention (`attention.rs` has the
//! algorithm and the CPU reference). The products are cuBLAS strided-batched
//! calls over the heads of one batch element, reading q, k and v where they
//! lie in `qkv` (heads `hd` apart, rows `3c` apart). The scores of one batch
//! element, `[heads, t, t]`, go to a scratch buffer that the next element
//! reuses (one stream, so in order) and that is freed with the op: nothing
//! of size `t x t` outlives it, and the backward recomputes the weights.
//! Unlike the CPU path the full square is multiplied, masked triangle
//! included; the row kernels (`kernels/attention.cu`) zero it.

use candle_core::cuda_backend::cudarc::cublas::{CudaBlas, Gemm};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{bail, CudaDevice, CudaStorage, Layout, Result, WithDType};

use super::attention::Dims;
use super::blas::{int, product, Mat};
use super::cuda::{alloc, kernel, row_groups, run, suffix, view, ATTENTION};

/// `kernel([weights,] buffer, cols, rows)` over rows of `cols`.
fn row_kernel<T: CudaDType + DeviceRepr + WithDType>(
    dev: &CudaDevice,
    name: &str,
    weights: Option<&CudaSlice<T>>,
    s: &mut CudaSlice<T>,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let f = kernel!(ATTENTION, dev, format!("{name}_{}", suffix(T::DTYPE)?));
    let (cols_i, rows_i) = (int(cols)?, int(rows)?);
    let mut b = f.builder();
    if let Some(p) = weights {
        b.arg(p);
    }
    b.arg(&mut *s).arg(&cols_i).arg(&rows_i);
    run(&mut b, row_groups(rows, cols))
}

/// The attention weights of every head of the batch element whose q
/// starts at `q`, into `p`.
fn weights<T: CudaDType + DeviceRepr + WithDType>(
    dev: &CudaDevice,
    blas: &CudaBlas,
    d: Dims,
    qkv: &CudaView<'_, T>,
    q: usize,
    p: &mut CudaSlice<T>,
) -> Result<()>
where
    CudaBlas: Gemm<T>,
{
    let (t, c) = (d.t, d.c());
    let head = |off| Mat::new(off, 3 * c, d.hd);
    let square = Mat::new(0, t, t * t);
    product(
        blas,
        d.heads,
        (t, t, d.hd),
        (d.scale() as f64, 0.0),
        (qkv, head(q)),
        (qkv, head(q + c).t()),
        (p, square),
    )?;
    row_kernel(dev, "causal_softmax", None, p, d.heads * t, t)
}

/// `qkv [b, t, 3c]` to `y [b, t, c]`.
pub(super) fn forward<T: CudaDType + DeviceRepr + WithDType>(
    s: &CudaStorage,
    l: &Layout,
    heads: usize,
) -> Result<CudaStorage>
where
    CudaBlas: Gemm<T>,
{
    let (b, d) = Dims::of(l, heads)?;
    let (t, c) = (d.t, d.c());
    let qkv = view::<T>(s, l, "attention")?;
    let dev = &s.device;
    let mut y = alloc::<T>(dev, b * t * c)?;
    if b * t > 0 {
        let blas = dev.cublas_handle();
        let mut p = alloc::<T>(dev, d.heads * t * t)?;
        for i in 0..b {
            let q = i * t * 3 * c;
            weights(dev, &blas, d, &qkv, q, &mut p)?;
            product(
                &blas,
                d.heads,
                (t, d.hd, t),
                (1.0, 0.0),
                (&p.slice(..), Mat::new(0, t, t * t)),
                (&qkv, Mat::new(q + 2 * c, 3 * c, d.hd)),
                (&mut y, Mat::new(i * t * c, c, d.hd)),
            )?;
        }
    }
    Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
}

/// `(qkv, dy)` to `dqkv`: `dV = P^T dY`, `dP = dY V^T`, `dS = P (dP -
/// rowsum(dP P))` in place, `dQ = scale dS K`, `dK = scale dS^T Q`.
pub(super) fn backward<T: CudaDType + DeviceRepr + WithDType>(
    (s1, l1): (&CudaStorage, &Layout),
    (s3, l3): (&CudaStorage, &Layout),
    heads: usize,
) -> Result<CudaStorage>
where
    CudaBlas: Gemm<T>,
{
    let (b, d) = Dims::of(l1, heads)?;
    let (t, c, hd) = (d.t, d.c(), d.hd);
    let qkv = view::<T>(s1, l1, "attention backward")?;
    let dy = view::<T>(s3, l3, "attention backward gradient")?;
    if dy.len() != b * t * c {
        bail!(
            "attention backward: a gradient of {} values for [{b}, {t}, {c}]",
            dy.len()
        )
    }
    let dev = &s1.device;
    let mut dqkv = alloc::<T>(dev, b * t * 3 * c)?;
    if b * t > 0 {
        let blas = dev.cublas_handle();
        let (mut p, mut dp) = (
            alloc::<T>(dev, d.heads * t * t)?,
            alloc::<T>(dev, d.heads * t * t)?,
        );
        let head = |off| Mat::new(off, 3 * c, hd);
        let square = Mat::new(0, t, t * t);
        for i in 0..b {
            let (q, g) = (i * t * 3 * c, Mat::new(i * t * c, c, hd));
            weights(dev, &blas, d, &qkv, q, &mut p)?;
            let pv = p.slice(..);
            product(
                &blas,
                heads,
                (t, hd, t),
                (1.0, 0.0),
                (&pv, square.t()),
                (&dy, g),
                (&mut dqkv, head(q + 2 * c)),
            )?;
            product(
                &blas,
                heads,
                (t, t, hd),
                (1.0, 0.0),
                (&dy, g),
                (&qkv, head(q + 2 * c).t()),
                (&mut dp, square),
            )?;
            row_kernel(
                dev,
                "causal_softmax_grad",
                Some(&p),
                &mut dp,
                d.heads * t,
                t,
            )?;
            let ds = dp.slice(..);
            let scale = d.scale() as f64;
            product(
                &blas,
                heads,
                (t, hd, t),
                (scale, 0.0),
                (&ds, square),
                (&qkv, head(q + c)),
                (&mut dqkv, head(q)),
            )?;
            product(
                &blas,
                heads,
                (t, hd, t),
                (scale, 0.0),
                (&ds, square.t()),
                (&qkv, head(q)),
                (&mut dqkv, head(q + c)),
            )?;
        }
    }
    Ok(CudaStorage::wrap_cuda_slice(dqkv, dev.clone()))
}
