//! GELU, tanh approximation (candle's `gelu`, PyTorch's
//! `GELU(approximate="tanh")`), fused: one pass forward and one pass
//! backward over f32 CPU tensors, split across threads. candle's version
//! runs a scalar `tanhf` per element forward and about ten separate tensor
//! ops backward; in a profile of the Shakespeare GPT step it was the largest
//! item after the matmuls.
//!
//! The CPU implementation is the reference for the CUDA kernel in
//! `kernels/gelu.cu` (f32, f16 and bf16). Other devices and dtypes use
//! candle's `gelu`, which has a backward too.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use multiversion::multiversion;
use std::mem::MaybeUninit;

const K0: f32 = 0.797_884_6; // sqrt(2 / pi)
const K1: f32 = 0.044_715;
/// Elements per task: below this, threads cost more than they save.
const CHUNK: usize = 1 << 14;

/// `gelu(x)` with a fused backward where [`super::covers`] says; candle's
/// elsewhere.
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    if super::covers(x) {
        x.contiguous()?.apply_op1(Gelu)
    } else {
        x.gelu()
    }
}

/// tanh as a rational function (the approximation Eigen uses for f32),
/// clamped where tanh is 1 to f32 precision. No libm call, so the loops
/// around it vectorize. Max error against f64 tanh: see the tests.
#[inline(always)]
fn tanh(x: f32) -> f32 {
    let x = x.clamp(-7.905_311, 7.905_311);
    let x2 = x * x;
    let p = x2 * -2.760_768_5e-16 + 2.000_188e-13;
    let p = x2 * p + -8.604_672e-11;
    let p = x2 * p + 5.122_297e-8;
    let p = x2 * p + 1.485_722_4e-5;
    let p = x2 * p + 6.372_619_3e-4;
    let p = x2 * p + 4.893_524_6e-3;
    let q = x2 * 1.198_258_4e-6 + 1.185_347e-4;
    let q = x2 * q + 2.268_434_6e-3;
    let q = x2 * q + 4.893_525e-3;
    x * p / q
}

#[inline(always)]
fn forward(x: f32) -> f32 {
    let t = tanh(K0 * (x + K1 * x * x * x));
    0.5 * x * (1.0 + t)
}

#[inline(always)]
fn derivative(x: f32) -> f32 {
    let x2 = x * x;
    let t = tanh(K0 * x * (1.0 + K1 * x2));
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * K0 * (1.0 + 3.0 * K1 * x2)
}

/// `o = gelu(x)`, every value of `o` written.
#[multiversion(targets("x86_64+avx2+fma"))]
fn forward_into(x: &[f32], o: &mut [MaybeUninit<f32>]) {
    for (o, &x) in o.iter_mut().zip(x) {
        o.write(forward(x));
    }
}

/// `o = g * gelu'(x)`, every value of `o` written.
#[multiversion(targets("x86_64+avx2+fma"))]
fn backward_into(x: &[f32], g: &[f32], o: &mut [MaybeUninit<f32>]) {
    for ((o, &x), &g) in o.iter_mut().zip(x).zip(g) {
        o.write(g * derivative(x));
    }
}

struct Gelu;

impl CustomOp1 for Gelu {
    fn name(&self) -> &'static str {
        "taper-gelu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s, l, "gelu")?;
        // SAFETY: forward_into writes every value of its chunk.
        let out = unsafe { super::par_map_written(x, CHUNK, forward_into) };
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let out = super::cuda::map1(&super::cuda::GELU, "gelu_fwd", s, l)?;
        Ok((out, l.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(gelu_grad(arg, grad)?))
    }
}

/// GELU's backward alone: `grad * gelu'(x)`, recording no graph (`taper
/// bench elementwise` times it). f32 on the CPU, f32/f16/bf16 on CUDA.
pub fn gelu_grad(x: &Tensor, grad: &Tensor) -> Result<Tensor> {
    x.contiguous()?
        .apply_op2_no_bwd(&grad.contiguous()?, &GeluGrad)
}

/// `grad * gelu'(x)`, in one pass.
struct GeluGrad;

impl CustomOp2 for GeluGrad {
    fn name(&self) -> &'static str {
        "taper-gelu-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s1, l1, "gelu backward")?;
        let g = super::f32_slice(s2, l2, "gelu backward")?;
        // SAFETY: backward_into writes every value of its chunk.
        let out = unsafe { super::par_zip_written("gelu backward", (x, g), CHUNK, backward_into)? };
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
        let out = super::cuda::map2(&super::cuda::GELU, "gelu_bwd", (s1, l1), (s2, l2))?;
        Ok((out, l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn gelu64(x: f64) -> f64 {
        let k0 = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (k0 * (x + 0.044715 * x.powi(3))).tanh())
    }

    #[test]
    fn tanh_is_close_to_f64_everywhere() {
        let mut worst = 0f64;
        for i in -200_000..=200_000 {
            let x = i as f32 * 1e-4;
            worst = worst.max((tanh(x) as f64 - (x as f64).tanh()).abs());
        }
        // Measured 4.3e-7, about 4 f32 ulps of 1, near the clamp.
        assert!(worst < 5e-7, "max |error| {worst}");
    }

    /// Forward against float64, and the fused backward against a float64
    /// central difference of float64 GELU.
    #[test]
    fn forward_and_backward_match_float64() -> Result<()> {
        let xs: Vec<f32> = (0..40_001).map(|i| (i as f32 - 20_000.0) * 6e-4).collect();
        let x = Var::from_vec(xs.clone(), xs.len(), &Device::Cpu)?;
        let y = gelu(x.as_tensor())?;
        let got = y.to_vec1::<f32>()?;
        let grads = y.sum_all()?.backward()?;
        let dx = grads
            .get(x.as_tensor())
            .expect("a gradient")
            .to_vec1::<f32>()?;
        for (i, &x) in xs.iter().enumerate() {
            let x64 = x as f64;
            let want = gelu64(x64);
            assert!(
                (got[i] as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "gelu({x})"
            );
            let h = 1e-6;
            let d = (gelu64(x64 + h) - gelu64(x64 - h)) / (2.0 * h);
            // Below about -4.85, tanh is clamped to -1 (f32 cannot tell it
            // from -1 there) and the derivative's tail, at most about
            // -4e-6 and falling fast, reads as 0.
            assert!(
                (dx[i] as f64 - d).abs() <= 5e-6 + 2e-6 * d.abs(),
                "gelu'({x}): {} vs {d}",
                dx[i]
            );
        }
        Ok(())
    }

    #[test]
    fn agrees_with_candles_gelu_on_strided_input() -> Result<()> {
        let x = Tensor::randn(0f32, 2.0, (64, 48), &Device::Cpu)?.t()?;
        let ours = gelu(&x)?;
        let theirs = x.gelu()?;
        let d = (ours - theirs)?
            .abs()?
            .max_keepdim(0)?
            .max(1)?
            .to_vec1::<f32>()?[0];
        assert!(d < 1e-5, "{d}");
        Ok(())
    }
}
