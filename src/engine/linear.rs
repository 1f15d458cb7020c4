//! A dense layer `y = x W^T + b`, as candle_nn's `Linear` but computed by
//! `kernels::linear`: one fused op on the CPU (f32), and elsewhere a 2-D
//! matmul over the input's rows plus `kernels::bias_add`, whose backward
//! sums the bias gradient in one parallel pass (candle's `broadcast_add`
//! backward used its generic strided reduction: 15% of the GPT step on the
//! CPU).

use candle_core::{Module, Result, Tensor};

#[derive(Clone, Debug)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    /// `weight [out, in]`, `bias [out]`.
    /// The weight and the bias (if any).
    pub fn tensors(&self) -> Vec<Tensor> {
        std::iter::once(self.weight.clone())
            .chain(self.bias.clone())
            .collect()
    }

    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Linear { weight, bias }
    }
}

/// The same parameters (and so the same initialization and names).
impl From<candle_nn::Linear> for Linear {
    fn from(l: candle_nn::Linear) -> Self {
        Linear::new(l.weight().clone(), l.bias().cloned())
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        crate::kernels::linear(x, &self.weight, self.bias.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    /// Forward and gradients against candle_nn's Linear on a 3-D input.
    #[test]
    fn matches_candle_nns_linear() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (4, 9, 16), &dev)?)?;
        let w = Var::from_tensor(&Tensor::randn(0f32, 0.3, (12, 16), &dev)?)?;
        let b = Var::from_tensor(&Tensor::randn(0f32, 0.3, 12, &dev)?)?;
        let probe = Tensor::randn(0f32, 1.0, (4, 9, 12), &dev)?;
        let ours = Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone()));
        let theirs = candle_nn::Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone()));
        let (y1, y2) = (ours.forward(&x)?, theirs.forward(&x)?);
        assert_eq!(y1.dims(), &[4, 9, 12]);
        let g1 = (&y1 * &probe)?.sum_all()?.backward()?;
        let g2 = (&y2 * &probe)?.sum_all()?.backward()?;
        let diff = |a: &Tensor, b: &Tensor| -> Result<f32> {
            (a - b)?
                .abs()?
                .flatten_all()?
                .max(0)?
                .to_dtype(DType::F32)?
                .to_scalar()
        };
        assert!(diff(&y1, &y2)? < 1e-5);
        for v in [&x, &w, &b] {
            assert!(diff(g1.get(v).unwrap(), g2.get(v).unwrap())? < 1e-4);
        }
        Ok(())
    }
}
