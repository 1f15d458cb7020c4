//! `a + b` for two tensors of one shape: the residual adds of a GPT block,
//! and in the backward every node's second gradient added to its first
//! ([`install`]). On CUDA one kernel (`kernels/add.cu`) takes 16 bytes of
//! each input a thread at a time; candle's add takes a value a thread,
//! which keeps too few bytes in flight to fill an H100's memory bandwidth.
//! The sums are candle's bit for bit (an f16 or bf16 sum is exact in f32,
//! then rounded once). Elsewhere, and for strided inputs, this is candle's
//! add (already vectorized on the CPU).

use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

/// `a + b`, for tensors of the same shape and dtype.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.device().is_cuda()
        && super::covers(a)
        && a.shape() == b.shape()
        && a.dtype() == b.dtype()
        && a.is_contiguous()
        && b.is_contiguous()
    {
        a.apply_op2(b, Add)
    } else {
        a + b
    }
}

/// Makes candle's backward add a node's second gradient to its first with
/// [`add`] (the vendored candle's `set_accumulate_add`, vendor/README.md):
/// on GPT-2 small, the residual stream's 24 gradient sums a step and the
/// tied embedding's. Once per process; the trainer calls it.
pub fn install() {
    candle_core::backprop::set_accumulate_add(add);
}

struct Add;

impl CustomOp2 for Add {
    fn name(&self) -> &'static str {
        "taper-add"
    }

    /// f32, for completeness: [`add`] sends CPU tensors to candle's add.
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let a = super::f32_slice(s1, l1, "add")?;
        let b = super::f32_slice(s2, l2, "add")?;
        if a.len() != b.len() {
            bail!("add: {} and {} values", a.len(), b.len())
        }
        let out = a.iter().zip(b).map(|(x, y)| x + y).collect();
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let out = super::cuda::map2(&super::cuda::ADD, "add", (s1, l1), (s2, l2))?;
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        _a: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(grad.clone()), Some(grad.clone())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    /// The op itself (which CPU tensors do not reach through [`add`]):
    /// candle's sum, and the incoming gradient passed to both inputs.
    #[test]
    fn add_op_is_candles_sum_with_its_gradient() -> Result<()> {
        let dev = Device::Cpu;
        let a = Var::from_tensor(&Tensor::randn(0f32, 1.0, (5, 7), &dev)?)?;
        let b = Var::from_tensor(&Tensor::randn(0f32, 1.0, (5, 7), &dev)?)?;
        let y = a.as_tensor().apply_op2(b.as_tensor(), Add)?;
        let want = (a.as_tensor() + b.as_tensor())?;
        assert_eq!(y.to_vec2::<f32>()?, want.to_vec2::<f32>()?);
        let probe = Tensor::randn(0f32, 1.0, (5, 7), &dev)?;
        let g = (y * &probe)?.sum_all()?.backward()?;
        for v in [&a, &b] {
            let gv = g.get(v).expect("a gradient").to_dtype(DType::F32)?;
            assert_eq!(gv.to_vec2::<f32>()?, probe.to_vec2::<f32>()?);
        }
        Ok(())
    }
    /// With [`install`], a node read twice gets the sum of its two
    /// gradients, as with candle's own add.
    #[test]
    fn installed_add_sums_a_nodes_gradients() -> Result<()> {
        install();
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (4, 6), &dev)?)?;
        let (p, q) = (
            Tensor::randn(0f32, 1.0, (4, 6), &dev)?,
            Tensor::randn(0f32, 1.0, (4, 6), &dev)?,
        );
        // d/dx of sum(x p) + sum(x^2 q) = p + 2 x q.
        let y = ((x.as_tensor() * &p)?.sum_all()? + (x.as_tensor().sqr()? * &q)?.sum_all()?)?;
        let g = y.backward()?;
        let want = (&p + ((x.as_tensor() * 2.0)? * &q)?)?;
        let got = g.get(&x).expect("a gradient");
        let diff = (got - want)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-6, "{diff}");
        Ok(())
    }
}
