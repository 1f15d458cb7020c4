//! `x + b` for `x [.., n]` and a bias `b [n]`, fused, with a backward whose
//! bias gradient is a column sum split across threads. candle's
//! `broadcast_add` backward sums the gradient with its generic strided
//! reduction: in a profile of the GPT training step (`perf record` of
//! `taper bench step --model gpt`) that `sum_keepdim` took 15% of the step.
//!
//! f32 on the CPU; elsewhere candle's `broadcast_add` (on CUDA its
//! reduction is a kernel of its own).

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};
use std::mem::MaybeUninit;

use super::rows::{last_dim, ROWS};

/// `x + b`, broadcasting the bias over every row of `x`.
pub fn bias_add(x: &Tensor, b: &Tensor) -> Result<Tensor> {
    let fits = b.rank() == 1 && x.rank() >= 1 && x.dims().last() == b.dims().first();
    if super::fused()
        && fits
        && x.device().is_cpu()
        && x.dtype() == DType::F32
        && b.dtype() == DType::F32
    {
        x.contiguous()?.apply_op2(&b.contiguous()?, BiasAdd)
    } else {
        x.broadcast_add(b)
    }
}

struct BiasAdd;

impl CustomOp2 for BiasAdd {
    fn name(&self) -> &'static str {
        "taper-bias-add"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s1, l1, "bias add")?;
        let b = super::f32_slice(s2, l2, "bias add bias")?;
        let n = last_dim(l1);
        if b.len() != n {
            bail!("bias add: rows of {n} but a bias of {}", b.len())
        }
        let fill = |i: usize, o: &mut [MaybeUninit<f32>]| {
            let x = &x[i * n * ROWS..][..o.len()];
            for (o, x) in o.chunks_mut(n).zip(x.chunks(n)) {
                for ((o, &x), &b) in o.iter_mut().zip(x).zip(b) {
                    o.write(x + b);
                }
            }
        };
        // SAFETY: `fill` writes every value of its rows: each row of `x`
        // has n values, as does the bias.
        let out = unsafe { super::par_written(x.len(), n * ROWS, fill) };
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let db = grad.contiguous()?.apply_op1_no_bwd(&ColumnSum)?;
        Ok((Some(grad.clone()), Some(db)))
    }
}

/// The bias gradient alone: `g [.., n]` summed over every row, `[n]`,
/// recording no graph (`taper bench elementwise` times it). f32 on the
/// CPU, f32/f16/bf16 on CUDA.
pub fn bias_grad(g: &Tensor) -> Result<Tensor> {
    g.contiguous()?.apply_op1_no_bwd(&ColumnSum)
}

/// The sum over all rows, `[.., n] -> [n]`.
pub(super) struct ColumnSum;

impl CustomOp1 for ColumnSum {
    fn name(&self) -> &'static str {
        "taper-column-sum"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let g = super::f32_slice(s, l, "bias add backward")?;
        let n = last_dim(l);
        // Blocks of ROWS rows summed across threads, then in block order.
        let sums = super::sum_in_order(g.len().div_ceil((n * ROWS).max(1)), n, |block| {
            let mut acc = vec![0f32; n];
            for row in g[block * n * ROWS..].chunks(n).take(ROWS) {
                acc.iter_mut().zip(row).for_each(|(a, &v)| *a += v);
            }
            acc
        });
        Ok((CpuStorage::F32(sums), Shape::from(n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::dense_cuda::column_sum;
        let sums = super::cuda::by_float!(s, column_sum(s, l))?;
        Ok((sums, Shape::from(last_dim(l))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Forward and both gradients against candle's broadcast_add in f64.
    #[test]
    fn matches_broadcast_add_in_float64() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (3, 700, 33), &dev)?)?;
        let b = Var::from_tensor(&Tensor::randn(0f32, 1.0, 33, &dev)?)?;
        let probe = Tensor::randn(0f32, 1.0, (3, 700, 33), &dev)?;
        let y = bias_add(x.as_tensor(), b.as_tensor())?;
        let g = (&y * &probe)?.sum_all()?.backward()?;

        let f64v = |t: &Tensor| t.to_dtype(DType::F64);
        let (x2, b2) = (
            Var::from_tensor(&f64v(x.as_tensor())?)?,
            Var::from_tensor(&f64v(b.as_tensor())?)?,
        );
        let y2 = x2.as_tensor().broadcast_add(b2.as_tensor())?;
        let g2 = (&y2 * f64v(&probe)?)?.sum_all()?.backward()?;
        let diff = |a: &Tensor, b: &Tensor| -> Result<f64> {
            (f64v(a)? - b)?.abs()?.max_all()?.to_scalar::<f64>()
        };
        assert!(diff(&y, &y2)? < 1e-6);
        assert!(diff(g.get(&x).unwrap(), g2.get(&x2).unwrap())? < 1e-6);
        // 2100 rows summed in f32: a few ulps of the sum's size.
        assert!(diff(g.get(&b).unwrap(), g2.get(&b2).unwrap())? < 2e-4);
        Ok(())
    }
}
