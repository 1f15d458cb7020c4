//! Rotary position embedding, pairs interleaved (llama.cpp's layout for
//! llama GGUF files: `(x[2i], x[2i+1])` rotated by `pos * theta_i`), fused
//! with a backward. candle's `rope_i` records no backward (candle #2168).
//! The backward of a rotation is the opposite rotation.
//!
//! f32 on the CPU, f32/f16/bf16 on CUDA (`kernels/rope.cu`); elsewhere the
//! composed differentiable version. The angles (`cos`, `sin`) are f32
//! inputs of the op, so they stay on the device.

use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// `x [b, heads, t, d]` rotated with `cos`, `sin` of shape `[t, d / 2]`.
pub fn rope_interleaved(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if super::covers(x) {
        let (_, _, t, d) = x.dims4()?;
        if d % 2 != 0 || cos.dims() != [t, d / 2] || sin.dims() != [t, d / 2] {
            bail!(
                "rope: head size {d} with cos/sin of shape {:?}, expected an even size and [{t}, {}]",
                cos.dims(),
                d / 2
            )
        }
        let f32c = |z: &Tensor| z.to_dtype(DType::F32)?.contiguous();
        return x
            .contiguous()?
            .apply_op3(&f32c(cos)?, &f32c(sin)?, Rope { t, d, sign: 1.0 });
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

#[derive(Clone, Copy)]
struct Rope {
    t: usize,
    d: usize,
    /// 1 forward, -1 for the backward's opposite rotation.
    sign: f32,
}

impl Rope {
    fn apply(&self, x: &[f32], cos: &[f32], sin: &[f32]) -> Vec<f32> {
        let (t, d, half) = (self.t, self.d, self.d / 2);
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(t * d)
            .zip(x.par_chunks(t * d))
            .for_each(|(o, x)| {
                for p in 0..t {
                    let (c, s) = (&cos[p * half..][..half], &sin[p * half..][..half]);
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

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "taper-rope-interleaved"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s1, l1, "rope")?;
        let cos = super::f32_slice(s2, l2, "rope cos")?;
        let sin = super::f32_slice(s3, l3, "rope sin")?;
        Ok((CpuStorage::F32(self.apply(x, cos, sin)), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::cuda::by_float;
        let out = by_float!(s1, rope_cuda(self, (s1, l1), (s2, l2), (s3, l3)))?;
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let back = Rope {
            sign: -self.sign,
            ..*self
        };
        let dx = grad.contiguous()?.apply_op3(cos, sin, back)?;
        Ok((Some(dx), None, None))
    }
}

#[cfg(feature = "cuda")]
fn rope_cuda<T>(
    op: &Rope,
    (s1, l1): (&candle_core::CudaStorage, &Layout),
    (s2, l2): (&candle_core::CudaStorage, &Layout),
    (s3, l3): (&candle_core::CudaStorage, &Layout),
) -> Result<candle_core::CudaStorage>
where
    T: candle_core::cuda_backend::CudaDType
        + candle_core::cuda_backend::cudarc::driver::DeviceRepr
        + candle_core::WithDType,
{
    use super::cuda::{alloc, elementwise, kernel, run, suffix, view, ROPE};
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    let x = view::<T>(s1, l1, "rope")?;
    let (cos, sin) = (
        view::<f32>(s2, l2, "rope cos")?,
        view::<f32>(s3, l3, "rope sin")?,
    );
    let half = op.d / 2;
    if cos.len() != op.t * half || sin.len() != op.t * half || x.len() % (op.t * op.d) != 0 {
        bail!(
            "rope: {} values, {} angles for t {} and d {}",
            x.len(),
            cos.len(),
            op.t,
            op.d
        )
    }
    let dev = &s1.device;
    let out = alloc::<T>(dev, x.len())?;
    let pairs = x.len() / 2;
    if pairs > 0 {
        let f = kernel!(ROPE, dev, format!("rope_i_{}", suffix(T::DTYPE)?));
        let (t, half) = (op.t as i32, half as i32);
        let mut b = f.builder();
        b.arg(&x).arg(&cos).arg(&sin).arg(&out);
        b.arg(&pairs).arg(&t).arg(&half).arg(&op.sign);
        run(&mut b, elementwise(pairs))?;
    }
    Ok(candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone()))
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
