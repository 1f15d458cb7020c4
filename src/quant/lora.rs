//! Frozen quantized linear layers with low-rank adapters (QLoRA): the base
//! weight stays a candle `QTensor` (Q8_0, Q4_0, Q4_1, ...) and is never
//! trained; the adapters `A [r, in]` and `B [out, r]` are f32 variables.
//!
//! candle's quantized matmul records no backward, so gradients would stop at
//! every frozen layer and the adapters below it would train on a wrong
//! gradient. [`QLinear`] passes the gradient through: its backward
//! multiplies by the dequantized weight, which exists only during that call.

use std::sync::Arc;

use candle_core::quantized::{QStorage, QTensor};
use candle_core::{
    CpuStorage, CustomOp1, DType, Device, Layout, Module, Result, Shape, Storage, Tensor,
};

use crate::kernels::{dropout, Dropout};

/// `x @ W^T` with a frozen quantized `W [out, in]`, differentiable in `x`.
#[derive(Clone)]
pub struct QLinear {
    pub weight: Arc<QTensor>,
}

impl QLinear {
    /// The frozen `weight` on `dev`: shared as it is where it already lives
    /// (the file's weights are read onto the CPU, and cached there), its
    /// blocks copied as they are elsewhere, so that candle's CUDA kernels
    /// multiply by the file's own values; one copy a device, which every
    /// model built from the file shares (`super::device_copies`).
    pub fn on(weight: Arc<QTensor>, dev: &Device) -> Result<QLinear> {
        if weight.device().same_device(dev) {
            return Ok(QLinear { weight });
        }
        let target = format!("{:?}", dev.location());
        let weight = super::device_copies::shared(&*weight, &target, || {
            let storage = QStorage::from_data(weight.data()?, dev, weight.dtype())?;
            QTensor::new(storage, weight.shape())
        })?;
        Ok(QLinear { weight })
    }
}

struct Op(Arc<QTensor>);

impl CustomOp1 for Op {
    fn name(&self) -> &'static str {
        "taper-qlinear"
    }

    /// Q4_1 and Q8_0 weights through taper's tiles (`super::tiled`), which
    /// give candle's bits faster; anything else through candle's product.
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, k) = self.0.shape().dims2()?;
        if let (CpuStorage::F32(x), Some((start, end)), Some(&last)) =
            (s, l.contiguous_offsets(), l.dims().last())
        {
            if last == k && k > 0 {
                if let Some(y) = super::tiled::x_wt(&x[start..end], (end - start) / k, &self.0)? {
                    let mut dims = l.dims().to_vec();
                    *dims.last_mut().expect("checked rank") = n;
                    return Ok((CpuStorage::F32(y), Shape::from(dims)));
                }
            }
        }
        self.0.cpu_fwd(s, l)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.0.cuda_fwd(s, l)
    }

    /// On the CPU, the weight dequantized a block of rows at a time into a
    /// kept buffer (`super::dequant`); elsewhere, whole for the call.
    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        if let Some(dx) = cpu_dy_w(&self.0, grad)? {
            return Ok(Some(dx));
        }
        let w = self.0.dequantize(grad.device())?.to_dtype(grad.dtype())?;
        Ok(Some(grad.broadcast_matmul(&w)?))
    }
}

/// `grad W` through [`super::dequant::dy_w`], for an f32 gradient on the
/// CPU; None where that does not apply.
fn cpu_dy_w(q: &QTensor, grad: &Tensor) -> Result<Option<Tensor>> {
    let (n, k) = q.shape().dims2()?;
    if !grad.device().is_cpu() || grad.dtype() != DType::F32 || grad.dims().last() != Some(&n) {
        return Ok(None);
    }
    let grad = grad.contiguous()?;
    let rows = grad.elem_count() / n.max(1);
    let (storage, layout) = grad.storage_and_layout();
    let (Storage::Cpu(CpuStorage::F32(dy)), Some((start, end))) =
        (&*storage, layout.contiguous_offsets())
    else {
        return Ok(None);
    };
    let Some(dx) = super::dequant::dy_w(q, &dy[start..end], rows)? else {
        return Ok(None);
    };
    let mut dims = grad.dims().to_vec();
    *dims.last_mut().expect("checked rank") = k;
    Ok(Some(Tensor::from_vec(dx, dims, grad.device())?))
}

impl Module for QLinear {
    /// In f32; an f16 or bf16 input is widened for the product and the
    /// output narrowed back, each step with its backward. On CUDA candle's
    /// quantized product gives f32 whatever it takes; on the CPU the wide
    /// input takes taper's tiles.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let op = Op(self.weight.clone());
        match x.dtype() {
            DType::F32 => x.contiguous()?.apply_op1(op),
            dt => x.to_dtype(DType::F32)?.apply_op1(op)?.to_dtype(dt),
        }
    }
}

/// A frozen quantized layer plus a trained low-rank update:
/// `y = x W^T + (alpha / r) (x A^T) B^T`, with `B` starting at zero so the
/// adapted model starts as the base model (as PEFT's LoRA).
pub struct LoraLinear {
    pub base: QLinear,
    pub a: Tensor,
    pub b: Tensor,
    pub scale: f64,
}

impl LoraLinear {
    /// `forward` with `drop` applied to the adapter's input in training, as
    /// PEFT's `lora_dropout`: `x W^T + (alpha / r) (drop(x) A^T) B^T`
    /// (`first`: the batch's place of `x`'s first sample).
    pub fn forward_drawn(
        &self,
        x: &Tensor,
        drop: Option<&Dropout>,
        first: usize,
    ) -> Result<Tensor> {
        let y = self.base.forward(x)?;
        let low = dropout(x, drop, first)?.broadcast_matmul(&self.a.t()?)?;
        let up = low.broadcast_matmul(&self.b.t()?)?;
        y + (up * self.scale)?
    }
}

impl Module for LoraLinear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_drawn(x, None, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::GgmlDType;
    use candle_core::{DType, Device, Var};

    /// `std * sin(k * step)` over a shape: spread-out values, the same every run.
    fn fixed<S: Into<candle_core::Shape>>(shape: S, std: f32, step: f32) -> Result<Tensor> {
        let shape = shape.into();
        let v: Vec<f32> = (0..shape.elem_count())
            .map(|k| std * (k as f32 * step).sin())
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu)
    }

    /// Q4_1's dot product with its 8-bit input (Q8_1), which the vendored
    /// candle runs with AVX2 where the CPU has it, against its scalar
    /// version and against a float64 sum over the dequantized blocks.
    #[test]
    fn q4_1_dot_product_matches_its_scalar_version_and_float64() {
        use candle_core::quantized::k_quants::{BlockQ4_1, BlockQ8_1, GgmlType};
        for (blocks, step) in [(2, 0.377f32), (18, 0.0731), (48, 1.913)] {
            let n = blocks * 32;
            let w: Vec<f32> = (0..n)
                .map(|k| 0.3 * (k as f32 * step).sin() + 0.05)
                .collect();
            let x: Vec<f32> = (0..n).map(|k| 2.0 * (k as f32 * 0.519).cos()).collect();
            let mut wq = vec![BlockQ4_1::zeros(); blocks];
            let mut xq = vec![BlockQ8_1::zeros(); blocks];
            BlockQ4_1::from_float(&w, &mut wq);
            BlockQ8_1::from_float(&x, &mut xq);
            let (mut wd, mut xd) = (vec![0f32; n], vec![0f32; n]);
            BlockQ4_1::to_float(&wq, &mut wd);
            BlockQ8_1::to_float(&xq, &mut xd);
            let exact: f64 = wd.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
            let scale: f64 = wd
                .iter()
                .zip(&xd)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let fast = BlockQ4_1::vec_dot(n, &wq, &xq) as f64;
            let slow = BlockQ4_1::vec_dot_unopt(n, &wq, &xq) as f64;
            // Both take the minimum's term through Q8_1's sum stored in f16.
            for (name, v) in [("vec_dot", fast), ("vec_dot_unopt", slow)] {
                let e = (v - exact).abs() / scale;
                assert!(e < 1e-3, "{blocks} blocks: {name} {v} against {exact}: {e}");
            }
            let e = (fast - slow).abs() / scale;
            assert!(
                e < 1e-6,
                "{blocks} blocks: {fast} against the scalar {slow}: {e}"
            );
        }
    }

    /// Forward, input gradient and adapter gradients against the same layer
    /// computed in float64 from the dequantized weight.
    #[test]
    fn matches_a_dequantized_float64_layer() -> Result<()> {
        let dev = Device::Cpu;
        let (i, o, r) = (64, 48, 4);
        let w: Vec<f32> = (0..o * i)
            .map(|k| ((k as f32) * 0.377).sin() * 0.2)
            .collect();
        let w = Tensor::from_vec(w, (o, i), &dev)?;
        // With `lora_dropout`, its mask multiplies the adapter's input only
        // (the batch's samples 1 and 2: `first` = 1).
        let drop = Dropout::new(0.3, 5, 2, 9);
        let cases = [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4_1]
            .into_iter()
            .flat_map(|d| [(d, None), (d, drop.as_ref())]);
        for (dtype, drop) in cases {
            let q = Arc::new(QTensor::quantize(&w, dtype)?);
            let wd = q.dequantize(&dev)?;
            // Fixed inputs: candle's randn is unseeded, and with some draws
            // Q4_1's error came out just above the bound.
            let x = Var::from_tensor(&fixed((2, 3, i), 1.0, 0.731)?)?;
            let a = Var::from_tensor(&fixed((r, i), 0.1, 0.513)?)?;
            let b = Var::from_tensor(&fixed((o, r), 0.1, 0.291)?)?;
            let layer = LoraLinear {
                base: QLinear { weight: q.clone() },
                a: a.as_tensor().clone(),
                b: b.as_tensor().clone(),
                scale: 2.0,
            };
            let y = layer.forward_drawn(x.as_tensor(), drop, 1)?;
            let g = (y.sqr()?.sum_all()? * 0.5)?.backward()?;

            let f64v = |t: &Tensor| Var::from_tensor(&t.to_dtype(DType::F64).unwrap()).unwrap();
            let (x2, a2, b2) = (
                f64v(x.as_tensor()),
                f64v(a.as_tensor()),
                f64v(b.as_tensor()),
            );
            let w2 = wd.to_dtype(DType::F64)?;
            let kept = match drop {
                Some(d) => (x2.as_tensor() * d.mask(1, &[2, 3, i], &dev)?.to_dtype(DType::F64)?)?,
                None => x2.as_tensor().clone(),
            };
            let y2 = (x2.as_tensor().broadcast_matmul(&w2.t()?)?
                + (kept
                    .broadcast_matmul(&a2.as_tensor().t()?)?
                    .broadcast_matmul(&b2.as_tensor().t()?)?
                    * 2.0)?)?;
            let g2 = (y2.sqr()?.sum_all()? * 0.5)?.backward()?;
            let rel = |p: &Tensor, q: &Tensor| -> Result<f64> {
                let p: Vec<f64> = p.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?;
                let q: Vec<f64> = q.flatten_all()?.to_vec1()?;
                let m = q.iter().fold(0f64, |m, v| m.max(v.abs()));
                Ok(p.iter()
                    .zip(&q)
                    .fold(0f64, |e, (u, v)| e.max((u - v).abs()))
                    / m)
            };
            // The quantized matmul quantizes x to 8 bits on the way in (as
            // llama.cpp does): relative errors of 1e-3 to 4e-3 here.
            let ry = rel(&y, &y2)?;
            assert!(ry < 1e-2, "{dtype:?} forward {ry}");
            if drop.is_some() {
                // The mask moved the output: against the reference without
                // it, the error is far above the quantization's.
                let plain = layer.forward(x.as_tensor())?;
                assert!(
                    rel(&plain, &y2)? > 0.05,
                    "{dtype:?}: the mask changed nothing"
                );
            }
            for (name, p, q) in [
                ("x", g.get(x.as_tensor()), g2.get(x2.as_tensor())),
                ("a", g.get(a.as_tensor()), g2.get(a2.as_tensor())),
                ("b", g.get(b.as_tensor()), g2.get(b2.as_tensor())),
            ] {
                let e = rel(p.expect("gradient"), q.expect("gradient"))?;
                assert!(e < 1e-2, "{dtype:?} {drop:?} d{name}: {e}");
            }
        }
        Ok(())
    }
}
