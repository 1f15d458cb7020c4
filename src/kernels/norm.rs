//! The sum of a tensor's squares in f64, for the global gradient norm
//! (`engine::optim::grad_norm`): one pass over the values in their own
//! dtype, where the composed `to_dtype(F64).sqr().sum_all()` writes two
//! f64 copies of the tensor and reads them back. The sum's order is fixed
//! (CPU: chunks summed in order; CUDA: `kernels/norm.cu`, partial sums per
//! block, then one block), so the norm repeats bit for bit.
//!
//! Gradient clipping's factor is computed from that sum where it is
//! (`clip_factor`): on CUDA the update reads it from device memory, so the
//! step is queued without waiting to read the norm, as PyTorch's
//! `clip_grad_norm_` does.

use candle_core::{bail, CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Values per CPU task.
const CHUNK: usize = 1 << 14;

/// `sum(x^2)` in f64, a scalar on `x`'s device. f32, f16 and bf16 on the
/// CPU and on CUDA; elsewhere the composed ops.
pub fn sum_squares(x: &Tensor) -> Result<Tensor> {
    let fused = super::fused()
        && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
        && match x.device() {
            Device::Cpu => true,
            Device::Cuda(_) => cfg!(feature = "cuda"),
            Device::Metal(_) => false,
        };
    if fused {
        x.contiguous()?.apply_op1_no_bwd(&SumSquares)
    } else {
        x.to_dtype(DType::F64)?.sqr()?.sum_all()
    }
}

struct SumSquares;

/// [`sum_squares`] over all of `xs`, added: an f64 scalar on their device,
/// or None for no tensors. On CUDA each tensor's partial sums go to its
/// part of one buffer and one launch sums them all (`n + 1` launches for
/// `n` tensors, where summing each and adding the sums took `3n`); the
/// order is fixed, so the total repeats bit for bit. Elsewhere each sum is
/// added in turn.
pub fn sum_squares_all(xs: &[&Tensor]) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if let Some(first) = xs.first() {
        let one_pass = |x: &&Tensor| {
            x.device().is_cuda()
                && x.device().same_device(first.device())
                && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
        };
        if super::fused() && xs.iter().all(one_pass) {
            let xs = xs
                .iter()
                .map(|x| x.contiguous())
                .collect::<Result<Vec<_>>>()?;
            let sum = cuda::sum_squares_all(&xs)?;
            return Ok(Some(Tensor::from_storage(
                candle_core::Storage::Cuda(sum),
                (),
                candle_core::op::BackpropOp::none(),
                false,
            )));
        }
    }
    let mut total: Option<Tensor> = None;
    for x in xs {
        let s = sum_squares(x)?;
        total = Some(match total {
            Some(t) => (t + s)?,
            None => s,
        });
    }
    Ok(total)
}

/// Gradient clipping's factor from the sum of the gradients' squares:
/// `min(1, max_norm / (norm + 1e-6))`, as `torch.nn.utils.clip_grad_norm_`
/// computes it, in f64 then rounded to f32 (the dtype the update scales
/// f32 gradients in). A NaN norm gives 1 (the gradients are NaN anyway).
pub fn clip_factor_of(sum_squares: f64, max_norm: f64) -> f32 {
    let s = max_norm / (sum_squares.sqrt() + 1e-6);
    if s < 1.0 {
        s as f32
    } else {
        1.0
    }
}

/// [`clip_factor_of`] where `sum_squares` (an f64 scalar, as
/// [`sum_squares`] gives it) is: an f32 scalar on its device, computed
/// there (one thread on CUDA, `kernels/norm.cu`), bit for bit the same.
pub fn clip_factor(sum_squares: &Tensor, max_norm: f64) -> Result<Tensor> {
    if sum_squares.dtype() != DType::F64 || sum_squares.elem_count() != 1 {
        bail!(
            "clipping's factor: expected an f64 scalar, got {:?} {:?}",
            sum_squares.dtype(),
            sum_squares.shape()
        )
    }
    sum_squares
        .reshape(())?
        .apply_op1_no_bwd(&ClipFactor(max_norm))
}

struct ClipFactor(f64);

impl CustomOp1 for ClipFactor {
    fn name(&self) -> &'static str {
        "taper-clip-factor"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F64(v) = s else {
            bail!("clipping's factor: expected f64")
        };
        let f = clip_factor_of(v[l.start_offset()], self.0);
        Ok((CpuStorage::F32(vec![f]), Shape::from(())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((cuda::clip_factor(s, l, self.0)?, Shape::from(())))
    }
}

fn chunked<T: Copy + Sync>(v: &[T], f: impl Fn(T) -> f64 + Sync) -> f64 {
    let parts: Vec<f64> = v
        .par_chunks(CHUNK)
        .map(|c| c.iter().map(|&x| f(x) * f(x)).sum())
        .collect();
    parts.iter().sum()
}

impl CustomOp1 for SumSquares {
    fn name(&self) -> &'static str {
        "taper-sum-squares"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let Some((a, b)) = l.contiguous_offsets() else {
            bail!("sum of squares: expected a contiguous tensor")
        };
        let sum = match s {
            CpuStorage::F32(v) => chunked(&v[a..b], f64::from),
            CpuStorage::F16(v) => chunked(&v[a..b], f64::from),
            CpuStorage::BF16(v) => chunked(&v[a..b], f64::from),
            _ => bail!("sum of squares: takes f32, f16 or bf16"),
        };
        Ok((CpuStorage::F64(vec![sum]), Shape::from(())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use cuda::sum_squares;
        let out = super::cuda::by_float!(s, sum_squares(s, l))?;
        Ok((out, Shape::from(())))
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, CudaViewMut, DeviceRepr, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda_backend::CudaDType;
    use candle_core::WithDType;
    use candle_core::{bail, CudaDevice, CudaStorage, Device, Layout, Result, Storage, Tensor};

    use super::super::cuda::{alloc, kernel, run, suffix, view, NORM};

    /// Partial sums of at most this many blocks of 256 threads.
    const BLOCKS: usize = 1024;

    /// Blocks (and partial sums) for `n` values.
    fn blocks(n: usize) -> usize {
        n.div_ceil(256).clamp(1, BLOCKS)
    }

    fn config(blocks: usize, threads: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The partial sums of `x`'s squares, one per block, into `part`.
    fn part_sums<T: CudaDType + DeviceRepr + WithDType>(
        s: &CudaStorage,
        l: &Layout,
        part: &mut CudaViewMut<'_, f64>,
    ) -> Result<()> {
        let x = view::<T>(s, l, "sum of squares")?;
        let n = x.len();
        let f = kernel!(
            NORM,
            &s.device,
            format!("sum_squares_part_{}", suffix(T::DTYPE)?)
        );
        let mut b = f.builder();
        b.arg(&x).arg(&n).arg(part);
        run(&mut b, config(blocks(n), 256))
    }

    /// The sum of `part`, in order, by one block.
    fn finish(dev: &CudaDevice, part: &CudaSlice<f64>) -> Result<CudaStorage> {
        let out = alloc::<f64>(dev, 1)?;
        let f = kernel!(NORM, dev, "sum_squares_finish");
        let count = i32::try_from(part.len())
            .map_err(|_| candle_core::Error::Msg("sum of squares: too many partial sums".into()))?;
        let mut b = f.builder();
        b.arg(part).arg(&count).arg(&out);
        // One block of 1024 threads: each thread adds every 1024th part.
        run(&mut b, config(1, 1024))?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }

    pub(super) fn sum_squares<T: CudaDType + DeviceRepr + WithDType>(
        s: &CudaStorage,
        l: &Layout,
    ) -> Result<CudaStorage> {
        let mut part = alloc::<f64>(&s.device, blocks(l.shape().elem_count()))?;
        part_sums::<T>(s, l, &mut part.slice_mut(..))?;
        finish(&s.device, &part)
    }

    /// `super::sum_squares_all` for contiguous tensors on one device.
    pub(super) fn sum_squares_all(xs: &[Tensor]) -> Result<CudaStorage> {
        let Some(Device::Cuda(dev)) = xs.first().map(|x| x.device().clone()) else {
            bail!("sum of squares: expected CUDA tensors")
        };
        let total: usize = xs.iter().map(|x| blocks(x.elem_count())).sum();
        let mut part = alloc::<f64>(&dev, total)?;
        let mut at = 0;
        for x in xs {
            let n = blocks(x.elem_count());
            let (storage, l) = x.storage_and_layout();
            let Storage::Cuda(s) = &*storage else {
                bail!("sum of squares: expected CUDA tensors")
            };
            let mut dst = part.slice_mut(at..at + n);
            super::super::cuda::by_float!(s, part_sums(s, l, &mut dst))?;
            at += n;
        }
        finish(&dev, &part)
    }

    /// `clip_factor` of `kernels/norm.cu`: one thread.
    pub(super) fn clip_factor(s: &CudaStorage, l: &Layout, max_norm: f64) -> Result<CudaStorage> {
        let sum = view::<f64>(s, l, "clipping's factor")?;
        let dev = &s.device;
        let out = alloc::<f32>(dev, 1)?;
        let f = kernel!(NORM, dev, "clip_factor");
        let mut b = f.builder();
        b.arg(&sum).arg(&max_norm).arg(&out);
        let one = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        run(&mut b, one)?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the composed f64 sum, for each dtype, across chunk edges.
    #[test]
    fn matches_the_composed_sum_in_f64() -> Result<()> {
        let n = 2 * CHUNK + 333;
        let v: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
            .collect();
        let x = Tensor::from_vec(v, n, &Device::Cpu)?;
        for dt in [DType::F32, DType::F16, DType::BF16] {
            let x = x.to_dtype(dt)?;
            let got = sum_squares(&x)?.to_scalar::<f64>()?;
            let want = x
                .to_dtype(DType::F64)?
                .sqr()?
                .sum_all()?
                .to_scalar::<f64>()?;
            assert!(
                ((got - want) / want).abs() < 1e-12,
                "{dt:?}: {got} vs {want}"
            );
        }
        Ok(())
    }
}
