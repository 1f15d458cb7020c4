//! AdamW state that lives on a CUDA device and is updated there by the
//! fused kernels in `kernels/adamw.cu`: f32 moments ([`DeviceMoments`]) or
//! blockwise 8-bit ones ([`DeviceMoments8`]). The optimizer owns these
//! buffers, as it owns the host moments of the CPU path, and passes the
//! weights in place through candle's in-place op; a step allocates nothing.
//!
//! Offloaded moments of a CUDA parameter live in page-locked host memory
//! ([`PinnedMoments`]), so that their copies to the device and back go by
//! DMA with no staging buffer, queued with the update on the device's stream
//! without a host wait.
//!
//! Without the `cuda` feature the types are uninhabited: the optimizer only
//! asks for them for CUDA parameters, which such a build cannot have.

#[cfg(feature = "cuda")]
pub(crate) use imp::Hyper;
pub use imp::{DeviceMoments, DeviceMoments8, PinnedMoments};

#[cfg(feature = "cuda")]
mod imp {
    use std::cell::RefCell;

    use candle_core::backend::BackendDevice;
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, CudaView, CudaViewMut, DeviceRepr, LaunchConfig, PinnedHostSlice, PushKernelArg,
    };
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{bail, CudaDevice, CudaStorage, Device, InplaceOp2, Layout, Result, Tensor};

    use super::super::adamw::AdamWStep;
    use super::super::cuda::{alloc, elementwise, kernel, run, view, ADAMW};
    use super::super::quant8::{self, Blockwise, BLOCK};

    /// The kernels' `Hyper` struct.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub(crate) struct Hyper {
        beta1: f32,
        beta2: f32,
        one_minus_beta1: f32,
        one_minus_beta2: f32,
        eps: f32,
        decay: f32,
        step_size: f32,
        sqrt_bc2: f32,
    }

    // SAFETY: plain old data, laid out as the C struct.
    unsafe impl DeviceRepr for Hyper {}

    impl From<&AdamWStep> for Hyper {
        fn from(h: &AdamWStep) -> Self {
            Hyper {
                beta1: h.beta1,
                beta2: h.beta2,
                one_minus_beta1: h.one_minus_beta1,
                one_minus_beta2: h.one_minus_beta2,
                eps: h.eps,
                decay: h.decay,
                step_size: h.step_size,
                sqrt_bc2: h.sqrt_bc2,
            }
        }
    }

    type Update<'a> =
        dyn FnMut(&mut CudaViewMut<'_, f32>, &CudaView<'_, f32>, &CudaDevice) -> Result<()> + 'a;

    /// Calls `f(weights, gradient, device)` on the storage of an f32 CUDA
    /// tensor, which it updates in place.
    struct Op<'a> {
        f: RefCell<Box<Update<'a>>>,
    }

    impl InplaceOp2 for Op<'_> {
        fn name(&self) -> &'static str {
            "taper-adamw-cuda"
        }

        fn cpu_fwd(
            &self,
            _: &mut candle_core::CpuStorage,
            _: &Layout,
            _: &candle_core::CpuStorage,
            _: &Layout,
        ) -> Result<()> {
            bail!("adamw: device moments for a CPU parameter")
        }

        fn cuda_fwd(
            &self,
            dst: &mut CudaStorage,
            dst_l: &Layout,
            gs: &CudaStorage,
            gl: &Layout,
        ) -> Result<()> {
            let Some((a, b)) = dst_l.contiguous_offsets() else {
                bail!("adamw: expected contiguous weights")
            };
            let g = view::<f32>(gs, gl, "adamw gradient")?;
            if g.len() != b - a {
                bail!("adamw: {} weights but {} gradients", b - a, g.len())
            }
            let dev = dst.device.clone();
            let theta = dst.as_cuda_slice_mut::<f32>()?;
            let mut theta = theta.slice_mut(a..b);
            (self.f.borrow_mut())(&mut theta, &g, &dev)
        }
    }

    fn update<'a>(
        theta: &Tensor,
        g: &Tensor,
        f: impl FnMut(&mut CudaViewMut<'_, f32>, &CudaView<'_, f32>, &CudaDevice) -> Result<()> + 'a,
    ) -> Result<()> {
        let g = g.to_dtype(candle_core::DType::F32)?.contiguous()?;
        let op = Op {
            f: RefCell::new(Box::new(f)),
        };
        theta.inplace_op2(&g, &op)
    }

    fn cuda(device: &Device) -> Result<CudaDevice> {
        Ok(device.as_cuda_device()?.clone())
    }

    /// f32 moments on the device.
    pub struct DeviceMoments {
        dev: CudaDevice,
        m: CudaSlice<f32>,
        v: CudaSlice<f32>,
    }

    impl DeviceMoments {
        pub fn from_host(device: &Device, m: &[f32], v: &[f32]) -> Result<Self> {
            let dev = cuda(device)?;
            Ok(DeviceMoments {
                m: dev.clone_htod(m)?,
                v: dev.clone_htod(v)?,
                dev,
            })
        }

        /// Both moments, copied to the host (a device sync).
        pub fn to_host(&self) -> Result<(Vec<f32>, Vec<f32>)> {
            Ok((self.dev.clone_dtoh(&self.m)?, self.dev.clone_dtoh(&self.v)?))
        }

        /// Both moments, for an update in place (`adamw_mixed`).
        pub(in crate::kernels) fn buffers(&mut self) -> (&mut CudaSlice<f32>, &mut CudaSlice<f32>) {
            (&mut self.m, &mut self.v)
        }

        /// The device they live on.
        pub fn device(&self) -> Device {
            Device::Cuda(self.dev.clone())
        }

        /// One AdamW update of the f32 CUDA tensor `theta`, in place.
        pub fn step(&mut self, theta: &Tensor, g: &Tensor, h: &AdamWStep) -> Result<()> {
            let hyper = Hyper::from(h);
            let (m, v) = (&mut self.m, &mut self.v);
            update(theta, g, |theta, g, dev| {
                let n = g.len();
                if m.len() != n || v.len() != n {
                    bail!(
                        "adamw: {n} gradients but {} and {} moments",
                        m.len(),
                        v.len()
                    )
                }
                if n == 0 {
                    return Ok(());
                }
                let f = kernel!(ADAMW, dev, "adamw_f32");
                let mut b = f.builder();
                b.arg(theta)
                    .arg(g)
                    .arg(&mut *m)
                    .arg(&mut *v)
                    .arg(&n)
                    .arg(&hyper);
                run(&mut b, elementwise(n))
            })
        }
    }

    /// Blockwise 8-bit moments on the device: codes and per-block maxima,
    /// as [`Blockwise`] holds them on the host.
    pub struct DeviceMoments8 {
        dev: CudaDevice,
        qm: CudaSlice<u8>,
        am: CudaSlice<f32>,
        qv: CudaSlice<u8>,
        av: CudaSlice<f32>,
        tables: CudaSlice<f32>,
    }

    impl DeviceMoments8 {
        pub fn from_host(device: &Device, m: &Blockwise, v: &Blockwise) -> Result<Self> {
            let dev = cuda(device)?;
            if !m.signed || v.signed || m.len() != v.len() {
                bail!("adamw8: expected a signed first and an unsigned second moment of one size")
            }
            Ok(DeviceMoments8 {
                qm: dev.clone_htod(&m.codes)?,
                am: dev.clone_htod(&m.absmax)?,
                qv: dev.clone_htod(&v.codes)?,
                av: dev.clone_htod(&v.absmax)?,
                tables: dev.clone_htod(&quant8::device_tables())?,
                dev,
            })
        }

        /// Both moments, copied to the host (a device sync).
        pub fn to_host(&self) -> Result<(Blockwise, Blockwise)> {
            let d = &self.dev;
            Ok((
                Blockwise {
                    signed: true,
                    codes: d.clone_dtoh(&self.qm)?,
                    absmax: d.clone_dtoh(&self.am)?,
                },
                Blockwise {
                    signed: false,
                    codes: d.clone_dtoh(&self.qv)?,
                    absmax: d.clone_dtoh(&self.av)?,
                },
            ))
        }

        /// One 8-bit AdamW update of the f32 CUDA tensor `theta`, in place:
        /// a block of threads per block of [`BLOCK`] values.
        pub fn step(&mut self, theta: &Tensor, g: &Tensor, h: &AdamWStep) -> Result<()> {
            let hyper = Hyper::from(h);
            let s = self;
            let (qm, am, qv, av, tables) = (&mut s.qm, &mut s.am, &mut s.qv, &mut s.av, &s.tables);
            update(theta, g, |theta, g, dev| {
                let n = g.len();
                if qm.len() != n || am.len() != n.div_ceil(BLOCK) {
                    bail!(
                        "adamw8: {n} gradients but {} codes and {} blocks",
                        qm.len(),
                        am.len()
                    )
                }
                if n == 0 {
                    return Ok(());
                }
                let f = kernel!(ADAMW, dev, "adamw8_f32");
                let mut b = f.builder();
                b.arg(theta).arg(g);
                b.arg(&mut *qm).arg(&mut *am).arg(&mut *qv).arg(&mut *av);
                b.arg(tables).arg(&n).arg(&hyper);
                let cfg = LaunchConfig {
                    grid_dim: (n.div_ceil(BLOCK) as u32, 1, 1),
                    block_dim: (BLOCK as u32, 1, 1),
                    shared_mem_bytes: 0,
                };
                run(&mut b, cfg)
            })
        }
    }
    /// Page-locked host memory for a CUDA parameter's offloaded f32
    /// moments (`Offloaded` splits it into `m` and `v`), and the device
    /// whose stream copies to and from it.
    pub struct PinnedMoments {
        host: PinnedHostSlice<f32>,
        dev: CudaDevice,
    }

    impl PinnedMoments {
        /// `n` zeroed values, pinned for `device`'s context.
        pub fn zeros(device: &Device, n: usize) -> Result<Self> {
            let dev = cuda(device)?;
            let ctx = dev.cuda_stream().context().clone();
            // Flags 0: cached, not write-combined, memory (checkpoints read
            // it on the host).
            // SAFETY: every value is written (zeros) before anything reads.
            let mut buf = unsafe { ctx.alloc_pinned_with_flags::<f32>(n.max(1), 0) }.w()?;
            buf.as_mut_slice().w()?.fill(0.0);
            Ok(PinnedMoments { host: buf, dev })
        }

        /// One AdamW update of the f32 CUDA tensor `theta` with these
        /// moments: copied by DMA into a device buffer, updated there by the
        /// fused kernel and copied back, all queued on the device's stream.
        /// The host does not wait; its next read of the values does.
        pub fn step(&mut self, theta: &Tensor, g: &Tensor, h: &AdamWStep) -> Result<()> {
            let hyper = Hyper::from(h);
            let pinned = &mut self.host;
            update(theta, g, |theta, g, dev| {
                let n = g.len();
                if n == 0 {
                    return Ok(());
                }
                if pinned.len() != 2 * n {
                    bail!(
                        "adamw: {n} gradients but {} offloaded moments",
                        pinned.len()
                    )
                }
                let stream = dev.cuda_stream();
                let mut both = alloc::<f32>(dev, 2 * n)?;
                stream.memcpy_htod(&*pinned, &mut both).w()?;
                {
                    let (mut m, mut v) = both.split_at_mut(n);
                    let f = kernel!(ADAMW, dev, "adamw_f32");
                    let mut b = f.builder();
                    b.arg(theta).arg(g).arg(&mut m).arg(&mut v);
                    b.arg(&n).arg(&hyper);
                    run(&mut b, elementwise(n))?;
                }
                stream.memcpy_dtoh(&both, pinned).w()
            })
        }

        /// The values, once the copies queued on the device's stream are
        /// done. (cudarc's own wait, on the buffer's event, does nothing
        /// with candle's single stream: the event is never recorded, and a
        /// read here raced the last update's copy back. Seen on an H100 as
        /// stale moments after a move back from host memory.)
        pub fn values(&self) -> Result<&[f32]> {
            self.dev.synchronize()?;
            self.host.as_slice().w()
        }

        pub fn values_mut(&mut self) -> Result<&mut [f32]> {
            self.dev.synchronize()?;
            self.host.as_mut_slice().w()
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{bail, Device, Result, Tensor};

    use super::super::adamw::AdamWStep;
    use super::super::quant8::Blockwise;

    /// f32 moments on a CUDA device (none in this build).
    pub enum DeviceMoments {}

    impl DeviceMoments {
        pub fn from_host(_: &Device, _: &[f32], _: &[f32]) -> Result<Self> {
            bail!("this taper was built without CUDA")
        }
        pub fn to_host(&self) -> Result<(Vec<f32>, Vec<f32>)> {
            match *self {}
        }
        pub fn step(&mut self, _: &Tensor, _: &Tensor, _: &AdamWStep) -> Result<()> {
            match *self {}
        }
        pub fn device(&self) -> Device {
            match *self {}
        }
    }

    /// Offloaded moments in page-locked host memory (none in this build).
    pub enum PinnedMoments {}

    impl PinnedMoments {
        pub fn zeros(_: &Device, _: usize) -> Result<Self> {
            bail!("this taper was built without CUDA")
        }
        pub fn step(&mut self, _: &Tensor, _: &Tensor, _: &AdamWStep) -> Result<()> {
            match *self {}
        }
        pub fn values(&self) -> Result<&[f32]> {
            match *self {}
        }
        pub fn values_mut(&mut self) -> Result<&mut [f32]> {
            match *self {}
        }
    }

    /// Blockwise 8-bit moments on a CUDA device (none in this build).
    pub enum DeviceMoments8 {}

    impl DeviceMoments8 {
        pub fn from_host(_: &Device, _: &Blockwise, _: &Blockwise) -> Result<Self> {
            bail!("this taper was built without CUDA")
        }
        pub fn to_host(&self) -> Result<(Blockwise, Blockwise)> {
            match *self {}
        }
        pub fn step(&mut self, _: &Tensor, _: &Tensor, _: &AdamWStep) -> Result<()> {
            match *self {}
        }
    }
}
