//! Rotary position embedding, pairs interleaved (llama.cpp's layout for
//! llama GGUF files: `(x[2i], x[2i+1])` rotated by `pos * theta_i`), fused
//! with a backward. candle's `rope_i` records no backward (candle #2168).
//! The backward of a rotation is the opposite rotation.
//!
//! f32 on the CPU; elsewhere the composed differentiable version.

use candle_core::{bail, CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// `x [b, heads, t, d]` rotated with `cos`, `sin` of shape `[t, d / 2]`.
pub fn rope_interleaved(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if super::fused() && x.device().is_cpu() && x.dtype() == DType::F32 {
        let (_, _, t, d) = x.dims4()?;
        if cos.dims() != [t, d / 2] || sin.dims() != [t, d / 2] {
            bail!(
                "rope: cos/sin of shape {:?}, expected [{t}, {}]",
                cos.dims(),
                d / 2
            )
        }
        let flat =
            |z: &Tensor| -> Result<Vec<f32>> { z.to_dtype(DType::F32)?.flatten_all()?.to_vec1() };
        return x.contiguous()?.apply_op1(Rope {
            cos: flat(cos)?,
            sin: flat(sin)?,
            t,
            d,
            sign: 1.0,
        });
    }
    composed(x, cos, sin)
}

/// The same rotation from differentiable tensor ops (the reference).
pub fn composed(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (b, h, t, d) = x.dims4()?;
    let x = x.reshape((b, h, t, d / 2, 2))?;
    let (x0, x1) = (
        x.narrow(4, 0, 1)?.squeeze(4)?,
        x.narrow(4, 1, 1)?.squeeze(4)?,
    );
    let r0 = (x0.broadcast_mul(cos)? - x1.broadcast_mul(sin)?)?;
    let r1 = (x0.broadcast_mul(sin)? + x1.broadcast_mul(cos)?)?;
    Tensor::stack(&[r0, r1], 4)?.reshape((b, h, t, d))
}

struct Rope {
    cos: Vec<f32>,
    sin: Vec<f32>,
    t: usize,
    d: usize,
    /// 1 forward, -1 for the backward's opposite rotation.
    sign: f32,
}

impl Rope {
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let (t, d, half) = (self.t, self.d, self.d / 2);
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(t * d)
            .zip(x.par_chunks(t * d))
            .for_each(|(o, x)| {
                for p in 0..t {
                    let (c, s) = (&self.cos[p * half..][..half], &self.sin[p * half..][..half]);
                    let (o, x) = (&mut o[p * d..][..d], &x[p * d..][..d]);
                    for i in 0..half {
                        let (a, b) = (x[2 * i], x[2 * i + 1]);
                        let sn = self.sign * s[i];
                        o[2 * i] = a * c[i] - b * sn;
                        o[2 * i + 1] = a * sn + b * c[i];
                    }
                }
            });
        out
    }
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "taper-rope-interleaved"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s, l, "rope")?;
        Ok((CpuStorage::F32(self.apply(x)), l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let back = Rope {
            cos: self.cos.clone(),
            sin: self.sin.clone(),
            t: self.t,
            d: self.d,
            sign: -self.sign,
        };
        Ok(Some(grad.contiguous()?.apply_op1(back)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn fused_rope_matches_the_composed_one_in_float64() -> Result<()> {
        let dev = Device::Cpu;
        let (b, h, t, d) = (2, 3, 5, 8);
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (b, h, t, d), &dev)?)?;
        let ang: Vec<f32> = (0..t * d / 2).map(|k| (k as f32) * 0.31).collect();
        let ang = Tensor::from_vec(ang, (t, d / 2), &dev)?;
        let (cos, sin) = (ang.cos()?, ang.sin()?);
        let w = Tensor::randn(0f32, 1.0, (b, h, t, d), &dev)?;
        let y = rope_interleaved(x.as_tensor(), &cos, &sin)?;
        let g = (&y * &w)?.sum_all()?.backward()?;

        let f64v = |z: &Tensor| z.to_dtype(DType::F64).unwrap();
        let x2 = Var::from_tensor(&f64v(x.as_tensor()))?;
        let y2 = composed(x2.as_tensor(), &f64v(&cos), &f64v(&sin))?;
        let g2 = (&y2 * f64v(&w))?.sum_all()?.backward()?;
        let diff = |a: &Tensor, b: &Tensor| -> Result<f64> {
            (a.to_dtype(DType::F64)? - b)?
                .abs()?
                .max_all()?
                .to_scalar::<f64>()
        };
        assert!(diff(&y, &y2)? < 1e-5);
        assert!(
            diff(
                g.get(x.as_tensor()).unwrap(),
                g2.get(x2.as_tensor()).unwrap()
            )? < 1e-5
        );
        Ok(())
    }
}
