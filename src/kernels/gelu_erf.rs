//! GELU with the exact erf (candle's `gelu_erf`, PyTorch's `GELU()`,
//! BERT's `hidden_act = "gelu"`), fused: one pass forward and one pass
//! backward over f32 CPU tensors, split across threads. candle's version
//! calls a scalar `erff` per element forward and composes its backward from
//! about eight tensor ops; in a profile of the MiniLM step the two `erff`
//! calls alone were 8% of the time.
//!
//! erf is a rational function (Eigen's fast erf for f32, clamped at ±4,
//! where erf is ±1 to f32 precision) and the derivative's Gaussian uses
//! `vexp::exp`: no libm call, so the loops vectorize. Other devices and
//! dtypes use candle's `gelu_erf`, which has a backward too.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Device, Layout, Result, Shape, Tensor};
use multiversion::multiversion;
use std::mem::MaybeUninit;

/// Elements per task: below this, threads cost more than they save.
const CHUNK: usize = 1 << 14;
const SQRT_HALF: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// `1 / sqrt(2 pi)`.
const INV_SQRT_2PI: f32 = 0.398_942_3;

/// `gelu_erf(x)` with a fused backward on f32 CPU tensors (where
/// [`super::fused`] is on); candle's elsewhere.
pub fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    if super::fused() && x.device().is_cpu() && x.dtype() == DType::F32 {
        x.contiguous()?.apply_op1(GeluErf)
    } else {
        x.gelu_erf()
    }
}

/// erf as a ratio of an odd and an even polynomial in `x`; ±1 from ±4 on,
/// so that GELU's far tails are exactly 0 and `x`.
#[inline(always)]
fn erf(z: f32) -> f32 {
    let x = z.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = x2 * -2.726_142_3e-10 + 2.770_681_4e-8;
    let p = x2 * p + -2.101_024e-6;
    let p = x2 * p + -5.692_506_4e-5;
    let p = x2 * p + -7.349_906_3e-4;
    let p = x2 * p + -2.954_6e-3;
    let p = x2 * p + -1.609_603_3e-2;
    let q = x2 * -1.456_607_2e-5 + -2.133_740_6e-4;
    let q = x2 * q + -1.682_827e-3;
    let q = x2 * q + -7.373_329_2e-3;
    let q = x2 * q + -1.426_474e-2;
    let r = x * p / q;
    // Selects, not branches: the loops stay vectorized.
    let r = if z >= 4.0 { 1.0 } else { r };
    if z <= -4.0 {
        -1.0
    } else {
        r
    }
}

#[inline(always)]
fn forward(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * SQRT_HALF))
}

/// `Φ(x) + x φ(x)`.
#[inline(always)]
fn derivative(x: f32) -> f32 {
    let cdf = 0.5 * (1.0 + erf(x * SQRT_HALF));
    cdf + x * INV_SQRT_2PI * super::vexp::exp(-0.5 * x * x)
}

/// `o = gelu_erf(x)`, every value of `o` written.
#[multiversion(targets("x86_64+avx2+fma"))]
fn forward_into(x: &[f32], o: &mut [MaybeUninit<f32>]) {
    for (o, &x) in o.iter_mut().zip(x) {
        o.write(forward(x));
    }
}

/// `o = g * gelu_erf'(x)`, every value of `o` written.
#[multiversion(targets("x86_64+avx2+fma"))]
fn backward_into(x: &[f32], g: &[f32], o: &mut [MaybeUninit<f32>]) {
    for ((o, &x), &g) in o.iter_mut().zip(x).zip(g) {
        o.write(g * derivative(x));
    }
}

struct GeluErf;

impl CustomOp1 for GeluErf {
    fn name(&self) -> &'static str {
        "taper-gelu-erf"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s, l, "gelu_erf")?;
        // SAFETY: forward_into writes every value of its chunk.
        let out = unsafe { super::par_map_written(x, CHUNK, forward_into) };
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        if !grad.device().same_device(&Device::Cpu) || grad.dtype() != DType::F32 {
            candle_core::bail!("gelu_erf backward: f32 on the CPU only");
        }
        Ok(Some(
            arg.contiguous()?
                .apply_op2_no_bwd(&grad.contiguous()?, &GeluErfGrad)?,
        ))
    }
}

/// `grad * gelu_erf'(x)`, in one pass.
struct GeluErfGrad;

impl CustomOp2 for GeluErfGrad {
    fn name(&self) -> &'static str {
        "taper-gelu-erf-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s1, l1, "gelu_erf backward")?;
        let g = super::f32_slice(s2, l2, "gelu_erf backward")?;
        // SAFETY: backward_into writes every value of its chunk.
        let out =
            unsafe { super::par_zip_written("gelu_erf backward", (x, g), CHUNK, backward_into)? };
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    /// GELU in float64, with libm's erf (musl's).
    fn gelu64(x: f64) -> f64 {
        0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
    }

    #[test]
    fn erf_is_close_to_f64_everywhere() {
        let mut worst = 0f64;
        for i in -80_000..=80_000 {
            let x = i as f32 * 1e-4;
            worst = worst.max((erf(x) as f64 - libm::erf(x as f64)).abs());
        }
        // Measured 4.2e-7, a few f32 ulps of 1.
        assert!(worst < 5e-7, "max |error| {worst}");
    }

    /// Forward against float64, and the fused backward against a float64
    /// central difference of float64 GELU.
    #[test]
    fn forward_and_backward_match_float64() -> Result<()> {
        let xs: Vec<f32> = (0..40_001).map(|i| (i as f32 - 20_000.0) * 6e-4).collect();
        let x = Var::from_vec(xs.clone(), xs.len(), &Device::Cpu)?;
        let y = gelu_erf(x.as_tensor())?;
        let got = y.to_vec1::<f32>()?;
        let grads = y.sum_all()?.backward()?;
        let dx = grads
            .get(x.as_tensor())
            .expect("a gradient")
            .to_vec1::<f32>()?;
        for (i, &x) in xs.iter().enumerate() {
            let x64 = x as f64;
            let want = gelu64(x64);
            // The polynomial's erf is within 4.2e-7, so 1 + erf near -1
            // (x from -5.7 to -3) is off by up to half of x times that:
            // 1.2e-6, where libm's erff is off by 1.6e-7.
            assert!(
                (got[i] as f64 - want).abs() <= 1.5e-6 + 1e-6 * want.abs(),
                "gelu_erf({x}): {} vs {want}",
                got[i]
            );
            let h = 1e-6;
            let d = (gelu64(x64 + h) - gelu64(x64 - h)) / (2.0 * h);
            assert!(
                (dx[i] as f64 - d).abs() <= 2e-6 + 2e-6 * d.abs(),
                "gelu_erf'({x}): {} vs {d}",
                dx[i]
            );
        }
        Ok(())
    }
}
