//! NCCL for ranks on GPUs (`--features nccl`, with `cuda`): the gradient
//! bucket is summed on the device by NCCL, through cudarc as candle builds
//! it; everything else (the status all-reduce, broadcasts, barriers) goes
//! through the control world: MPI when a launcher started the ranks, or one
//! process alone (`taper train --collective nccl`: world size 1, the same
//! code path as several GPUs).
//!
//! Rank 0 makes NCCL's unique id and the control world broadcasts it. The
//! communicator itself is created at the first all-reduce, on the stream of
//! the tensors it sums (every rank reaches it at the same step).
//!
//! Unlike MPI's collectives, an NCCL call that waits for a dead rank is not
//! bounded by `--rank-timeout` (the control world's collectives, before
//! each all-reduce, are).

use std::sync::Mutex;

use candle_core::cuda_backend::cudarc::nccl::{Comm, Id, ReduceOp};
use candle_core::{bail, CpuStorage, CudaStorage, CustomOp1, Layout, Shape, Tensor};

use super::Collective;
use crate::{Error, Result};

pub struct Nccl {
    control: Box<dyn Collective>,
    id: Id,
    comm: Mutex<Option<Comm>>,
}

// SAFETY: the communicator is a handle that NCCL allows any thread to use,
// one call at a time; the mutex serializes its use (taper calls it from
// the training thread only).
unsafe impl Send for Nccl {}
// SAFETY: as above.
unsafe impl Sync for Nccl {}

fn nccl_err(what: &str, e: impl std::fmt::Debug) -> candle_core::Error {
    candle_core::Error::Msg(format!("NCCL {what}: {e:?}"))
}

impl Nccl {
    /// NCCL over `control`'s ranks; a collective call (every rank makes it).
    pub fn new(control: Box<dyn Collective>) -> Result<Nccl> {
        let mut bytes = Vec::new();
        if control.rank() == 0 {
            let id = Id::new().map_err(|e| nccl_err("unique id", e))?;
            bytes = id.internal().iter().map(|&c| c as u8).collect();
        }
        control.broadcast_bytes(0, &mut bytes)?;
        if bytes.len() != 128 {
            return Err(Error::Peer(format!(
                "rank 0 sent an NCCL id of {} bytes, not 128",
                bytes.len()
            )));
        }
        let mut internal = [0 as std::ffi::c_char; 128];
        for (d, s) in internal.iter_mut().zip(&bytes) {
            *d = *s as std::ffi::c_char;
        }
        Ok(Nccl {
            control,
            id: Id::uninit(internal),
            comm: Mutex::new(None),
        })
    }
}

/// The sum over the ranks of an f32 CUDA tensor, as a new tensor.
struct AllReduce<'a>(&'a Nccl);

impl CustomOp1 for AllReduce<'_> {
    fn name(&self) -> &'static str {
        "nccl-all-reduce"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        bail!("NCCL sums CUDA tensors: this one is on the CPU")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let dev = s.device.clone();
        let src = match l.contiguous_offsets() {
            Some((a, b)) => s.as_cuda_slice::<f32>()?.slice(a..b),
            None => bail!("NCCL all-reduce: expected a contiguous tensor"),
        };
        let mut dst = dev.alloc_zeros::<f32>(l.shape().elem_count())?;
        let mut comm = self.0.comm.lock().unwrap_or_else(|p| p.into_inner());
        if comm.is_none() {
            let (rank, size) = (self.0.control.rank(), self.0.control.size());
            let c = Comm::from_rank(dev.cuda_stream(), rank, size, self.0.id)
                .map_err(|e| nccl_err("communicator", e))?;
            *comm = Some(c);
        }
        let c = comm.as_ref().expect("created above");
        c.all_reduce(&src, &mut dst, &ReduceOp::Sum)
            .map_err(|e| nccl_err("all-reduce", e))?;
        Ok((CudaStorage::wrap_cuda_slice(dst, dev), l.shape().clone()))
    }
}

impl Collective for Nccl {
    fn rank(&self) -> usize {
        self.control.rank()
    }
    fn size(&self) -> usize {
        self.control.size()
    }
    fn describe(&self) -> String {
        format!("NCCL, control over {}", self.control.describe())
    }
    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()> {
        self.control.all_reduce_sum_f32(buf)
    }
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        self.control.all_reduce_sum_f64(buf)
    }
    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.control.broadcast_bytes(root, buf)
    }
    fn barrier(&self) -> Result<()> {
        self.control.barrier()
    }
    fn farewell(&self, limit: std::time::Duration) -> Result<()> {
        self.control.farewell(limit)
    }
    fn all_reduce_sum_tensor(&self, t: &Tensor) -> Result<Tensor> {
        if !t.device().is_cuda() {
            return super::host_all_reduce(self, t);
        }
        let dtype = t.dtype();
        let t = t.to_dtype(candle_core::DType::F32)?.contiguous()?;
        Ok(t.apply_op1_no_bwd(&AllReduce(self))?.to_dtype(dtype)?)
    }
}
