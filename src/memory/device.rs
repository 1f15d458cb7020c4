//! Device memory on CUDA: what the driver reports (used, free, total),
//! returning the memory pool's cached blocks to the driver after an OOM,
//! and a ballast that makes `--mem-limit` a real limit on a GPU (the rest of
//! the card is reserved at start, so a recipe meant for a 16 GiB card can be
//! rehearsed on an 80 GiB one, with real CUDA OOMs to recover from).
//!
//! On the CPU every function here is a no-op: host memory is the counting
//! allocator's business (`memory::counting`).

use candle_core::{Device, Tensor};

use crate::Result;

/// Device memory as the driver reports it, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    pub free: usize,
    pub total: usize,
}

impl DeviceMemory {
    pub fn used(&self) -> usize {
        self.total.saturating_sub(self.free)
    }
}

/// Used, free and total memory of `device`; None on the CPU (or when the
/// driver does not answer).
pub fn info(device: &Device) -> Option<DeviceMemory> {
    #[cfg(feature = "cuda")]
    if let Ok(cuda) = device.as_cuda_device() {
        let (free, total) = cuda.cuda_stream().context().mem_get_info().ok()?;
        return Some(DeviceMemory { free, total });
    }
    let _ = device;
    None
}

/// The device memory pool's own figures (candle allocates every tensor
/// from the context's default pool), in bytes: what it holds from the
/// driver, and what of that is handed out to live tensors. The difference
/// is cached free blocks: what fragmentation or caching keeps from a
/// larger allocation until a trim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolMemory {
    pub reserved: usize,
    pub used: usize,
}

/// The pool's figures now; None on the CPU (or when the driver does not
/// answer).
pub fn pool(device: &Device) -> Option<PoolMemory> {
    #[cfg(feature = "cuda")]
    if let Ok(cuda) = device.as_cuda_device() {
        use candle_core::cuda_backend::cudarc::driver::{result, sys};
        use sys::CUmemPool_attribute::{
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
        };
        let ctx = cuda.cuda_stream().context().clone();
        ctx.bind_to_thread().ok()?;
        let (mut reserved, mut used): (u64, u64) = (0, 0);
        // SAFETY: a live context's default pool; both attributes are u64.
        unsafe {
            let pool = result::device::get_default_mem_pool(ctx.cu_device()).ok()?;
            for (attr, out) in [
                (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &mut reserved),
                (CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &mut used),
            ] {
                result::mem_pool::get_attribute(
                    pool,
                    attr,
                    out as *mut u64 as *mut std::ffi::c_void,
                )
                .ok()?;
            }
        }
        return Some(PoolMemory {
            reserved: reserved as usize,
            used: used as usize,
        });
    }
    let _ = device;
    None
}

/// After an OOM, once the failed attempt's tensors are dropped: wait for
/// the device, then give the pool's unused blocks back to the driver, so
/// that the retry starts from a clean pool.
pub fn trim(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let Ok(cuda) = device.as_cuda_device() {
        use candle_core::cuda_backend::cudarc::driver::result;
        device.synchronize()?;
        let ctx = cuda.cuda_stream().context().clone();
        let err = |e: candle_core::cuda_backend::cudarc::driver::DriverError| {
            crate::Error::Device(format!("trimming the CUDA memory pool: {e:?}"))
        };
        ctx.bind_to_thread().map_err(err)?;
        // SAFETY: the device comes from a live context; trimming only
        // releases blocks the pool does not use.
        unsafe {
            let pool = result::device::get_default_mem_pool(ctx.cu_device()).map_err(err)?;
            result::mem_pool::trim_to(pool, 0).map_err(err)?;
        }
        return Ok(());
    }
    let _ = device;
    Ok(())
}

/// The most bytes the device's memory pool has handed out (candle
/// allocates every tensor from it) since the last [`reset_pool_peak`]: the
/// counterpart of `torch.cuda.max_memory_allocated`. None on the CPU.
pub fn pool_peak(device: &Device) -> Option<usize> {
    #[cfg(feature = "cuda")]
    if let Ok(cuda) = device.as_cuda_device() {
        use candle_core::cuda_backend::cudarc::driver::{result, sys};
        let ctx = cuda.cuda_stream().context().clone();
        ctx.bind_to_thread().ok()?;
        let mut high: u64 = 0;
        // SAFETY: a live context's default pool; USED_MEM_HIGH is a u64.
        unsafe {
            let pool = result::device::get_default_mem_pool(ctx.cu_device()).ok()?;
            result::mem_pool::get_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                &mut high as *mut u64 as *mut std::ffi::c_void,
            )
            .ok()?;
        }
        return Some(high as usize);
    }
    let _ = device;
    None
}

/// Starts a new peak window for [`pool_peak`] (after a sync, so that the
/// work in flight is counted in the old one).
pub fn reset_pool_peak(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let Ok(cuda) = device.as_cuda_device() {
        use candle_core::cuda_backend::cudarc::driver::{result, sys};
        device.synchronize()?;
        let ctx = cuda.cuda_stream().context().clone();
        let err = |e: candle_core::cuda_backend::cudarc::driver::DriverError| {
            crate::Error::Device(format!("resetting the CUDA pool's peak: {e:?}"))
        };
        ctx.bind_to_thread().map_err(err)?;
        let mut zero: u64 = 0;
        // SAFETY: as in pool_peak; the driver accepts only 0 for this attribute.
        unsafe {
            let pool = result::device::get_default_mem_pool(ctx.cu_device()).map_err(err)?;
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                &mut zero as *mut u64 as *mut std::ffi::c_void,
            )
            .map_err(err)?;
        }
        return Ok(());
    }
    let _ = device;
    Ok(())
}

/// Memory reserved so that at most `limit` bytes stay usable; dropped with
/// the host.
pub struct Ballast {
    _held: Option<Tensor>,
    /// Bytes reserved.
    pub bytes: usize,
}

/// Reserves all of `device`'s free memory but `limit` bytes. On the CPU
/// (or when less than `limit` is free) nothing is reserved.
pub fn ballast(device: &Device, limit: usize) -> Result<Ballast> {
    let Some(mem) = info(device) else {
        return Ok(Ballast {
            _held: None,
            bytes: 0,
        });
    };
    let bytes = mem.free.saturating_sub(limit);
    if bytes == 0 {
        return Ok(Ballast {
            _held: None,
            bytes: 0,
        });
    }
    let held = Tensor::zeros(bytes, candle_core::DType::U8, device)?;
    device.synchronize()?;
    Ok(Ballast {
        _held: Some(held),
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_has_no_device_memory_to_manage() {
        assert_eq!(info(&Device::Cpu), None);
        trim(&Device::Cpu).unwrap();
        assert_eq!(ballast(&Device::Cpu, 1 << 20).unwrap().bytes, 0);
    }
}
