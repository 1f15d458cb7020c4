//! The CUDA path of the fused causal attention (`attention.rs` has the
//! algorithm and the CPU reference): the launches that `attention_plan.rs`
//! lists, run. The products are cuBLAS strided-batched calls over groups of
//! (element, head) pairs, reading q, k and v where they lie in `qkv`. A
//! group's scores, `[count, t, t]`, go to a scratch buffer that the next
//! group reuses (one stream, so in order) and that is freed with the op:
//! nothing of size `t x t` outlives it, and the backward recomputes the
//! weights. Unlike the CPU path the full square is multiplied, masked
//! triangle included; the row kernels (`kernels/attention.cu`) zero it.

use candle_core::cuda_backend::cudarc::cublas::{CudaBlas, Gemm};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{bail, CudaDevice, CudaStorage, Layout, Result, WithDType};

use super::attention::Dims;
use super::attention_plan::{self, Buf, Plan, Step};
use super::blas::{int, product};
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

/// What the plan reads on the device: its inputs and scratch.
struct Bufs<'a, T> {
    qkv: CudaView<'a, T>,
    dy: Option<CudaView<'a, T>>,
    p: Option<CudaSlice<T>>,
    dp: Option<CudaSlice<T>>,
}

impl<T> Bufs<'_, T> {
    fn read(&self, b: Buf) -> Result<CudaView<'_, T>> {
        let v = match b {
            Buf::Qkv => Some(self.qkv.slice(..)),
            Buf::Dy => self.dy.as_ref().map(|v| v.slice(..)),
            Buf::P => self.p.as_ref().map(|s| s.slice(..)),
            Buf::Dp => self.dp.as_ref().map(|s| s.slice(..)),
            Buf::Out => None,
        };
        v.ok_or_else(|| candle_core::Error::Msg(format!("attention: the plan reads {b:?}")))
    }

    /// A scratch buffer, out of `self` while it is written.
    fn take(&mut self, b: Buf) -> Result<CudaSlice<T>> {
        let s = match b {
            Buf::P => self.p.take(),
            Buf::Dp => self.dp.take(),
            _ => None,
        };
        s.ok_or_else(|| candle_core::Error::Msg(format!("attention: the plan writes {b:?}")))
    }
}

/// Runs `plan` over rows of `t`, writing `out`.
fn execute<T: CudaDType + DeviceRepr + WithDType>(
    dev: &CudaDevice,
    plan: &Plan,
    t: usize,
    bufs: &mut Bufs<'_, T>,
    out: &mut CudaSlice<T>,
) -> Result<()>
where
    CudaBlas: Gemm<T>,
{
    let blas = dev.cublas_handle();
    for step in &plan.steps {
        match *step {
            Step::Product {
                batch,
                mnk,
                alpha,
                a: (ab, am),
                b: (bb, bm),
                c: (cb, cm),
            } => {
                let mut scratch = match cb {
                    Buf::Out => None,
                    _ => Some(bufs.take(cb)?),
                };
                let (a, b) = (bufs.read(ab)?, bufs.read(bb)?);
                let c = match scratch.as_mut() {
                    Some(s) => s,
                    None => &mut *out,
                };
                product(&blas, batch, mnk, (alpha, 0.0), (&a, am), (&b, bm), (c, cm))?;
                match cb {
                    Buf::P => bufs.p = scratch,
                    Buf::Dp => bufs.dp = scratch,
                    _ => {}
                }
            }
            Step::Softmax { rows } => {
                let p = bufs.p.as_mut().expect("the plan's weights");
                row_kernel(dev, "causal_softmax", None, p, rows, t)?;
            }
            Step::SoftmaxGrad { rows } => {
                let (Some(p), Some(dp)) = (bufs.p.as_ref(), bufs.dp.as_mut()) else {
                    bail!("attention: the plan's weights and their gradient")
                };
                row_kernel(dev, "causal_softmax_grad", Some(p), dp, rows, t)?;
            }
        }
    }
    Ok(())
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
    let dev = &s.device;
    let mut y = alloc::<T>(dev, b * d.t * d.c())?;
    if b * d.t > 0 {
        let plan = attention_plan::forward(b, d);
        let mut bufs = Bufs {
            qkv: view::<T>(s, l, "attention")?,
            dy: None,
            p: Some(alloc::<T>(dev, plan.scratch)?),
            dp: None,
        };
        execute(dev, &plan, d.t, &mut bufs, &mut y)?;
    }
    Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
}

/// `(qkv, dy)` to `dqkv` (`attention_plan::backward`).
pub(super) fn backward<T: CudaDType + DeviceRepr + WithDType>(
    (s1, l1): (&CudaStorage, &Layout),
    (s3, l3): (&CudaStorage, &Layout),
    heads: usize,
) -> Result<CudaStorage>
where
    CudaBlas: Gemm<T>,
{
    let (b, d) = Dims::of(l1, heads)?;
    let (t, c) = (d.t, d.c());
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
        let plan = attention_plan::backward(b, d);
        let mut bufs = Bufs {
            qkv: view::<T>(s1, l1, "attention backward")?,
            dy: Some(dy),
            p: Some(alloc::<T>(dev, plan.scratch)?),
            dp: Some(alloc::<T>(dev, plan.scratch)?),
        };
        execute(dev, &plan, t, &mut bufs, &mut dqkv)?;
    }
    Ok(CudaStorage::wrap_cuda_slice(dqkv, dev.clone()))
}
