//! AdamW under mixed precision in one pass: the f32 master weights and
//! moments are updated from the gradient in the working copy's dtype (bf16
//! or f16), times a factor (gradient clipping's, or 1), and the working
//! copy is written from the new weights, rounded. The values are those of
//! the unfused sequence (cast the gradient to f32, scale it, the fused
//! update, cast the weights back), bit for bit, without its f32 gradient
//! and low-precision weight copies: 6 bytes a parameter less traffic and
//! no f32 copy of the gradients in memory.
//!
//! On CUDA one kernel does it all (`adamw_mixed_*` in `kernels/adamw.cu`);
//! on the CPU the update, then the rounding into the working copy.

use std::cell::RefCell;

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, DType, InplaceOp2, InplaceOp3, Layout, Result, Tensor};
use half::{bf16, f16};
use rayon::prelude::*;

use super::adamw::AdamWStep;
use super::device_state::DeviceMoments;

/// The factor the gradient is multiplied by (gradient clipping's).
#[derive(Clone, Copy)]
pub enum Factor<'a> {
    Value(f32),
    /// One f32 value on the weights' device: on CUDA the kernel reads it
    /// there, so nothing waits for it to be computed.
    At(&'a Tensor),
}

/// Where the f32 moments are.
pub enum MixedMoments<'a> {
    Host(&'a mut [f32], &'a mut [f32]),
    Device(&'a mut DeviceMoments),
}

/// Updates `theta` (f32) and `moments` from `g * scale` (`g` in the dtype
/// of `work`, bf16 or f16) and writes `work`, of `theta`'s shape, from the
/// new `theta`.
pub fn adamw_mixed(
    theta: &Tensor,
    g: &Tensor,
    scale: Factor<'_>,
    moments: MixedMoments<'_>,
    work: &Tensor,
    h: &AdamWStep,
) -> Result<()> {
    if theta.dtype() != DType::F32
        || !matches!(work.dtype(), DType::BF16 | DType::F16)
        || g.dtype() != work.dtype()
        || g.shape() != theta.shape()
        || work.shape() != theta.shape()
    {
        bail!(
            "adamw (mixed): f32 weights {:?}, a gradient {:?} {:?} and a working copy {:?} {:?}",
            theta.shape(),
            g.dtype(),
            g.shape(),
            work.dtype(),
            work.shape()
        )
    }
    let g = g.contiguous()?;
    let (scale, scale_at) = match scale {
        Factor::Value(s) => (s, None),
        Factor::At(t) if theta.device().is_cpu() => (t.to_scalar::<f32>()?, None),
        Factor::At(t) => {
            if t.dtype() != DType::F32
                || t.elem_count() != 1
                || !t.device().same_device(theta.device())
            {
                bail!(
                    "adamw (mixed): clipping's factor must be one f32 value on the weights' device"
                )
            }
            (1.0, Some(t))
        }
    };
    let op = Mixed {
        scale,
        scale_at,
        h: *h,
        moments: RefCell::new(moments),
    };
    theta.inplace_op3(&g, work, &op)?;
    if theta.device().is_cpu() {
        work.inplace_op2(theta, &Round)?;
    }
    Ok(())
}

struct Mixed<'a> {
    scale: f32,
    /// The factor in device memory instead of `scale` (CUDA).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    scale_at: Option<&'a Tensor>,
    h: AdamWStep,
    moments: RefCell<MixedMoments<'a>>,
}

/// `theta`'s values in place, after checking the layout.
fn values<'a>(theta: &'a mut [f32], l: &Layout, n: usize) -> Result<&'a mut [f32]> {
    match l.contiguous_offsets() {
        Some((a, b)) if b - a == n => Ok(&mut theta[a..b]),
        Some((a, b)) => bail!("adamw (mixed): {} weights but {n} gradients", b - a),
        None => bail!("adamw (mixed): expected contiguous weights"),
    }
}

/// The CPU update of one chunk, `g` already in f32.
fn update(theta: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], h: &AdamWStep) {
    for i in 0..theta.len() {
        let (mi, vi) = h.moments(m[i], v[i], g[i]);
        m[i] = mi;
        v[i] = vi;
        theta[i] = h.apply(theta[i], mi, vi);
    }
}

/// Values per rayon task, and per f32 buffer of converted gradients.
const CHUNK: usize = 1 << 14;

impl InplaceOp3 for Mixed<'_> {
    fn name(&self) -> &'static str {
        "taper-adamw-mixed"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<()> {
        let CpuStorage::F32(theta) = dst else {
            bail!("adamw (mixed): expected f32 weights")
        };
        let mut moments = self.moments.borrow_mut();
        let MixedMoments::Host(m, v) = &mut *moments else {
            bail!("adamw (mixed): device moments for a CPU parameter")
        };
        let Some((a, b)) = gl.contiguous_offsets() else {
            bail!("adamw (mixed): expected a contiguous gradient")
        };
        let n = b - a;
        if m.len() != n || v.len() != n {
            bail!(
                "adamw (mixed): {n} gradients but {} and {} moments",
                m.len(),
                v.len()
            )
        }
        let theta = values(theta, dl, n)?;
        let (h, scale) = (&self.h, self.scale);
        // Gradient clipping scales the f32 gradient as candle's affine op
        // does: x * mul + add (so a -0 gradient becomes +0).
        let f = |x: f32| if scale == 1.0 { x } else { x * scale + 0.0 };
        let chunks = theta
            .par_chunks_mut(CHUNK)
            .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)));
        match gs {
            CpuStorage::BF16(g) => {
                chunks
                    .zip(g[a..b].par_chunks(CHUNK))
                    .for_each(|((t, (m, v)), g)| {
                        let g: Vec<f32> = g.iter().map(|x| f(x.to_f32())).collect();
                        update(t, &g, m, v, h)
                    })
            }
            CpuStorage::F16(g) => {
                chunks
                    .zip(g[a..b].par_chunks(CHUNK))
                    .for_each(|((t, (m, v)), g)| {
                        let g: Vec<f32> = g.iter().map(|x| f(x.to_f32())).collect();
                        update(t, &g, m, v, h)
                    })
            }
            other => bail!("adamw (mixed): a {:?} gradient", other.dtype()),
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        dl: &Layout,
        gs: &candle_core::CudaStorage,
        gl: &Layout,
        ws: &candle_core::CudaStorage,
        wl: &Layout,
    ) -> Result<()> {
        let mut moments = self.moments.borrow_mut();
        let MixedMoments::Device(d) = &mut *moments else {
            bail!("adamw (mixed): host moments for a CUDA parameter")
        };
        let (m, v) = d.buffers();
        let hyper = super::device_state::Hyper::from(&self.h);
        // The factor's storage, read-locked for the launch.
        let at = self.scale_at.map(|t| t.storage_and_layout());
        let at = match &at {
            Some((st, l)) => match &**st {
                candle_core::Storage::Cuda(s) => {
                    Some(super::cuda::view::<f32>(s, l, "clipping's factor")?)
                }
                _ => bail!("adamw (mixed): clipping's factor is not on the GPU"),
            },
            None => None,
        };
        let scale = (self.scale, at.as_ref());
        match gs.dtype() {
            DType::BF16 => cuda::launch::<bf16>(dst, dl, (gs, gl), (ws, wl), (m, v), scale, hyper),
            DType::F16 => cuda::launch::<f16>(dst, dl, (gs, gl), (ws, wl), (m, v), scale, hyper),
            other => bail!("adamw (mixed): a {other:?} gradient"),
        }
    }
}

/// The working copy from the updated weights, rounded to nearest even (as
/// `to_dtype` rounds).
struct Round;

impl InplaceOp2 for Round {
    fn name(&self) -> &'static str {
        "taper-adamw-mixed-round"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dl: &Layout,
        ts: &CpuStorage,
        tl: &Layout,
    ) -> Result<()> {
        let theta = super::f32_slice(ts, tl, "adamw (mixed) weights")?;
        let Some((a, b)) = dl.contiguous_offsets() else {
            bail!("adamw (mixed): expected a contiguous working copy")
        };
        if b - a != theta.len() {
            bail!(
                "adamw (mixed): {} weights for a working copy of {}",
                theta.len(),
                b - a
            )
        }
        match dst {
            CpuStorage::BF16(w) => w[a..b]
                .par_chunks_mut(CHUNK)
                .zip(theta.par_chunks(CHUNK))
                .for_each(|(w, t)| {
                    w.iter_mut()
                        .zip(t)
                        .for_each(|(w, &t)| *w = bf16::from_f32(t))
                }),
            CpuStorage::F16(w) => w[a..b]
                .par_chunks_mut(CHUNK)
                .zip(theta.par_chunks(CHUNK))
                .for_each(|(w, t)| {
                    w.iter_mut()
                        .zip(t)
                        .for_each(|(w, &t)| *w = f16::from_f32(t))
                }),
            other => bail!("adamw (mixed): a {:?} working copy", other.dtype()),
        }
        Ok(())
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, CudaView, DeviceRepr, PushKernelArg,
    };
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{bail, CudaStorage, Layout, Result, WithDType};

    use super::super::cuda::{elementwise, kernel, run, suffix, view, ADAMW};
    use super::super::device_state::Hyper;

    /// `adamw_mixed_{f16,bf16}` over one parameter.
    pub(super) fn launch<T: CudaDType + DeviceRepr + WithDType>(
        dst: &mut CudaStorage,
        dl: &Layout,
        (gs, gl): (&CudaStorage, &Layout),
        (ws, wl): (&CudaStorage, &Layout),
        (m, v): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        (scale, scale_at): (f32, Option<&CudaView<'_, f32>>),
        hyper: Hyper,
    ) -> Result<()> {
        let g = view::<T>(gs, gl, "adamw (mixed) gradient")?;
        let work = view::<T>(ws, wl, "adamw (mixed) working copy")?;
        let n = g.len();
        let Some((a, b)) = dl.contiguous_offsets() else {
            bail!("adamw (mixed): expected contiguous weights")
        };
        if b - a != n || work.len() != n || m.len() != n || v.len() != n {
            bail!(
                "adamw (mixed): {} weights, {n} gradients, a working copy of {} and {} moments",
                b - a,
                work.len(),
                m.len()
            )
        }
        if n == 0 {
            return Ok(());
        }
        let dev = dst.device.clone();
        let theta = dst.as_cuda_slice_mut::<f32>()?;
        let mut theta = theta.slice_mut(a..b);
        let f = kernel!(ADAMW, dev, format!("adamw_mixed_{}", suffix(T::DTYPE)?));
        let mut args = f.builder();
        // The working copy comes in as candle's shared view, and the kernel
        // writes it: device memory that no host reference reads, on the
        // one stream that orders every use of it.
        // No factor in device memory: a null pointer (`scale` is used).
        let null = 0u64;
        args.arg(&mut theta).arg(&g).arg(&scale);
        match scale_at {
            Some(at) => args.arg(at),
            None => args.arg(&null),
        };
        args.arg(&mut *m)
            .arg(&mut *v)
            .arg(&work)
            .arg(&n)
            .arg(&hyper);
        // Four values a thread (the kernel's packs).
        run(&mut args, elementwise(n.div_ceil(4)))
    }
}
