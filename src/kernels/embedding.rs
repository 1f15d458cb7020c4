//! An embedding lookup whose backward adds each row's gradient into its
//! table row directly (`kernels/embedding.cu` on CUDA, with f32 atomics).
//! `Tensor::embedding`'s backward is candle's `index_add`, whose CUDA
//! kernel took 4.3 ms of a 77 ms GPT-2 step (`scripts/gpu-check.sh
//! profile`); this one's work is one pass over the gradient.
//!
//! f32 on the CPU; f32, f16 and bf16 on CUDA; otherwise `Tensor::embedding`.

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

use super::ce_rows::u32_slice;

/// The rows of `table [vocab, d]` at `ids` (u32, any shape): `[ids.., d]`.
pub fn embedding(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let mut shape = ids.dims().to_vec();
    shape.push(table.dim(1)?);
    if !super::covers(table) || ids.dtype() != DType::U32 || table.rank() != 2 {
        return table.embedding(&ids.flatten_all()?)?.reshape(shape);
    }
    let ids = ids.flatten_all()?.contiguous()?;
    // The lookup itself records no graph: `Lookup` gives it its gradient.
    let rows = table.detach().index_select(&ids, 0)?;
    let op = Lookup {
        ids,
        vocab: table.dim(0)?,
    };
    table.apply_op2(&rows, op)?.reshape(shape)
}

/// Passes the looked-up rows through; its backward is [`GradAdd`].
struct Lookup {
    ids: Tensor,
    vocab: usize,
}

impl CustomOp2 for Lookup {
    fn name(&self) -> &'static str {
        "taper-embedding"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        rows: &CpuStorage,
        l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Ok((rows.try_clone(l)?, l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        rows: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((rows.try_clone(l)?, l.shape().clone()))
    }

    fn bwd(
        &self,
        _table: &Tensor,
        _rows: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let op = GradAdd { vocab: self.vocab };
        let dtable = grad.contiguous()?.apply_op2_no_bwd(&self.ids, &op)?;
        Ok((Some(dtable), None))
    }
}

/// `(g [n, d], ids [n]) -> [vocab, d]`: row `ids[i]` gets `g[i]` added.
struct GradAdd {
    vocab: usize,
}

impl CustomOp2 for GradAdd {
    fn name(&self) -> &'static str {
        "taper-embedding-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = super::f32_slice(s1, l1, "embedding gradient")?;
        let ids = u32_slice(s2, l2)?;
        let d = super::rows::last_dim(l1);
        if ids.len() * d != g.len() {
            bail!(
                "embedding gradient: {} rows for {} ids",
                g.len() / d,
                ids.len()
            )
        }
        let mut out = vec![0f32; self.vocab * d];
        for (row, &id) in g.chunks(d).zip(ids) {
            if let Some(dst) = out.get_mut(id as usize * d..(id as usize + 1) * d) {
                dst.iter_mut().zip(row).for_each(|(o, &x)| *o += x);
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((self.vocab, d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::cuda::by_float;
        let d = super::rows::last_dim(l1);
        let out = by_float!(s1, grad_cuda(self.vocab, (s1, l1), (s2, l2)))?;
        Ok((out, Shape::from((self.vocab, d))))
    }
}

#[cfg(feature = "cuda")]
fn grad_cuda<T>(
    vocab: usize,
    (s1, l1): (&candle_core::CudaStorage, &Layout),
    (s2, l2): (&candle_core::CudaStorage, &Layout),
) -> Result<candle_core::CudaStorage>
where
    T: candle_core::cuda_backend::CudaDType
        + candle_core::cuda_backend::cudarc::driver::DeviceRepr
        + candle_core::WithDType,
{
    use super::cuda::{alloc, elementwise, kernel, run, suffix, view, EMBEDDING as M};
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    let d = super::rows::last_dim(l1);
    let g = view::<T>(s1, l1, "embedding gradient")?;
    let ids = view::<u32>(s2, l2, "embedding ids")?;
    if ids.len() * d != g.len() {
        bail!(
            "embedding gradient: {} rows for {} ids",
            g.len() / d,
            ids.len()
        )
    }
    let dev = &s1.device;
    let sfx = suffix(T::DTYPE)?;
    let acc = super::cuda::zeros::<f32>(dev, vocab * d)?;
    let (n, d_i, vocab_u) = (ids.len() as u64, d as i32, vocab as u32);
    if ids.len() * d > 0 {
        let f = kernel!(M, dev, format!("embedding_grad_add_{sfx}"));
        let mut b = f.builder();
        b.arg(&g)
            .arg(&ids)
            .arg(&acc)
            .arg(&n)
            .arg(&d_i)
            .arg(&vocab_u);
        run(&mut b, elementwise(g.len()))?;
    }
    let out = alloc::<T>(dev, vocab * d)?;
    if vocab * d > 0 {
        let total = (vocab * d) as u64;
        let f = kernel!(M, dev, format!("embedding_grad_round_{sfx}"));
        let mut b = f.builder();
        b.arg(&acc).arg(&out).arg(&total);
        run(&mut b, elementwise(vocab * d))?;
    }
    Ok(candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Forward and the table's gradient against `Tensor::embedding` in f64,
    /// with repeated ids.
    #[test]
    fn matches_index_select_in_float64() -> Result<()> {
        let dev = Device::Cpu;
        let (vocab, d) = (11, 6);
        let vals: Vec<f32> = (0..vocab * d)
            .map(|i| ((i * 37) % 23) as f32 / 7.0 - 1.5)
            .collect();
        let table = Var::from_tensor(&Tensor::from_vec(vals, (vocab, d), &dev)?)?;
        let ids = Tensor::new(&[[3u32, 0, 3, 10], [7, 3, 1, 0]], &dev)?;
        let probe = Tensor::randn(0f32, 1.0, (2, 4, d), &dev)?;
        let y = embedding(table.as_tensor(), &ids)?;
        assert_eq!(y.dims(), &[2, 4, d]);
        let g = (&y * &probe)?.sum_all()?.backward()?;

        let t64 = Var::from_tensor(&table.as_tensor().to_dtype(DType::F64)?)?;
        let y64 = t64
            .as_tensor()
            .embedding(&ids.flatten_all()?)?
            .reshape((2, 4, d))?;
        let g64 = (&y64 * probe.to_dtype(DType::F64)?)?
            .sum_all()?
            .backward()?;
        let diff = |a: &Tensor, b: &Tensor| -> Result<f64> {
            (a.to_dtype(DType::F64)? - b)?
                .abs()?
                .flatten_all()?
                .max(0)?
                .to_scalar::<f64>()
        };
        assert!(diff(&y, &y64)? < 1e-6);
        let e = diff(
            g.get(&table).expect("gradient"),
            g64.get(&t64).expect("gradient"),
        )?;
        assert!(e < 1e-5, "table gradient off by {e}");
        Ok(())
    }
}
