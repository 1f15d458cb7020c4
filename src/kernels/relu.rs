//! ReLU with its backward as one pass each way, on the CPU in f32. candle's
//! backward for `relu` is four: a tensor of zeros, `x >= 0` into a byte
//! mask (a loop that pushes one value at a time), the mask cast back to
//! f32, and the product with the gradient; in the CNN step they were a
//! twentieth of the time. The results are candle's bit for bit: `max(x, 0)`
//! forward, and `g * (x >= 0 ? 1 : 0)` backward, so the gradient passes at
//! `x = 0` (and `-0`), a NaN input stops it, and the product keeps the
//! zeros' signs. Elsewhere (CUDA, other dtypes) candle's `relu`.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use multiversion::multiversion;
use std::mem::MaybeUninit;

/// Elements per task: below this, threads cost more than they save.
const CHUNK: usize = 1 << 14;

/// `max(x, 0)`, with a one-pass backward on the CPU in f32.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    if super::covers(x) && x.device().is_cpu() {
        x.contiguous()?.apply_op1(Relu)
    } else {
        x.relu()
    }
}

/// `o = max(x, 0)`, every value of `o` written.
#[multiversion(targets("x86_64+avx2+fma"))]
fn forward_into(x: &[f32], o: &mut [MaybeUninit<f32>]) {
    for (o, &x) in o.iter_mut().zip(x) {
        o.write(x.max(0.0));
    }
}

/// `o = g * (x >= 0)`, every value of `o` written.
#[multiversion(targets("x86_64+avx2+fma"))]
fn backward_into(x: &[f32], g: &[f32], o: &mut [MaybeUninit<f32>]) {
    for ((o, &x), &g) in o.iter_mut().zip(x).zip(g) {
        o.write(g * if x >= 0.0 { 1.0 } else { 0.0 });
    }
}

struct Relu;

impl CustomOp1 for Relu {
    fn name(&self) -> &'static str {
        "taper-relu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s, l, "relu")?;
        // SAFETY: forward_into writes every value of its chunk.
        let out = unsafe { super::par_map_written(x, CHUNK, forward_into) };
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let g = grad.contiguous()?;
        Ok(Some(arg.contiguous()?.apply_op2_no_bwd(&g, &ReluGrad)?))
    }
}

/// `grad * (x >= 0)`, in one pass.
struct ReluGrad;

impl CustomOp2 for ReluGrad {
    fn name(&self) -> &'static str {
        "taper-relu-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s1, l1, "relu backward")?;
        let g = super::f32_slice(s2, l2, "relu backward")?;
        // SAFETY: backward_into writes every value of its chunk.
        let out = unsafe { super::par_zip_written("relu backward", (x, g), CHUNK, backward_into)? };
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Forward and backward against candle's relu, bit for bit, on values
    /// that include both zeros, NaN and infinities, in more than one chunk
    /// and from a strided view.
    #[test]
    fn matches_candles_relu_bit_for_bit() -> Result<()> {
        let dev = Device::Cpu;
        let n = 7 * (3 * CHUNK / 7 + 4);
        let mut xs: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 2003) as f32 / 100.0 - 10.0)
            .collect();
        xs[..6].copy_from_slice(&[
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -1e-40,
        ]);
        let gs: Vec<f32> = (0..n)
            .map(|i| {
                if i % 5 == 0 {
                    -1.5
                } else {
                    ((i * 31) % 97) as f32 - 48.0
                }
            })
            .collect();
        let g = Tensor::from_vec(gs, (n / 7, 7), &dev)?.t()?;
        let x = Var::from_tensor(&Tensor::from_vec(xs, (n / 7, 7), &dev)?.t()?)?;
        let bits = |t: &Tensor| -> Result<Vec<u32>> {
            Ok(t.flatten_all()?
                .to_vec1::<f32>()?
                .iter()
                .map(|v| v.to_bits())
                .collect())
        };
        let ours = relu(x.as_tensor())?;
        let theirs = x.as_tensor().relu()?;
        assert_eq!(bits(&ours)?, bits(&theirs)?, "forward");
        let d_ours = (&ours * &g)?.sum_all()?.backward()?;
        let d_theirs = (&theirs * &g)?.sum_all()?.backward()?;
        let (a, b) = (
            d_ours.get(&x).expect("a gradient"),
            d_theirs.get(&x).expect("a gradient"),
        );
        assert_eq!(bits(a)?, bits(b)?, "backward");
        Ok(())
    }
}
