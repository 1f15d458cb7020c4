//! Gradient clipping by the global norm, as `torch.nn.utils.clip_grad_norm_`
//! does it. On CUDA the factor stays on the device ([`ClipScale::Device`]):
//! the update reads it there, so a clipped step is queued without waiting
//! for the backward to finish and the norm to be read, as PyTorch queues
//! it. On the CPU, where reading it costs nothing, it is read.

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

use crate::kernels::{clip_factor, clip_factor_of, sum_squares_all};

/// Gradient clipping's factor, `min(1, max_norm / (norm + 1e-6))`, in f32.
#[derive(Debug, Clone)]
pub enum ClipScale {
    /// Read on the host.
    Host(f32),
    /// An f32 scalar on the gradients' device.
    Device(Tensor),
}

impl ClipScale {
    /// No clipping.
    pub const ONE: ClipScale = ClipScale::Host(1.0);

    /// An f32 gradient times the factor. On the host, a factor of 1 leaves
    /// it as it is and another is candle's affine op (`x * s + 0`); on the
    /// device, every gradient is multiplied (by 1 when not clipped, which
    /// changes no value).
    pub fn apply(&self, g: Tensor) -> Result<Tensor> {
        match self {
            ClipScale::Host(s) if *s < 1.0 => g * f64::from(*s),
            ClipScale::Host(_) => Ok(g),
            ClipScale::Device(s) => g.broadcast_mul(&s.to_dtype(g.dtype())?),
        }
    }

    /// The factor on the host (a read, and on CUDA a wait, for `Device`).
    pub fn value(&self) -> Result<f32> {
        match self {
            ClipScale::Host(s) => Ok(*s),
            ClipScale::Device(t) => t.to_scalar::<f32>(),
        }
    }
}

/// The sum of all gradients' squares, an f64 scalar on their device, in a
/// fixed order (`kernels::sum_squares_all`: on CUDA one pass per tensor and
/// one launch to add them).
fn sum_of_squares(vars: &[(String, Var)], grads: &GradStore) -> Result<Option<Tensor>> {
    let gs: Vec<&Tensor> = vars.iter().filter_map(|(_, v)| grads.get(v)).collect();
    sum_squares_all(&gs)
}

/// The global L2 norm of all gradients, read back once.
pub fn grad_norm(vars: &[(String, Var)], grads: &GradStore) -> Result<f64> {
    Ok(match sum_of_squares(vars, grads)? {
        Some(t) => t.to_scalar::<f64>()?.sqrt(),
        None => 0.0,
    })
}

/// The factor that clips the gradients' global norm to `max_norm`: on the
/// device when `on_device` (the same value, bit for bit), else read.
pub fn clip_scale(
    vars: &[(String, Var)],
    grads: &GradStore,
    max_norm: f64,
    on_device: bool,
) -> Result<ClipScale> {
    let Some(total) = sum_of_squares(vars, grads)? else {
        return Ok(ClipScale::ONE);
    };
    if on_device {
        Ok(ClipScale::Device(clip_factor(&total, max_norm)?))
    } else {
        Ok(ClipScale::Host(clip_factor_of(
            total.to_scalar::<f64>()?,
            max_norm,
        )))
    }
}

/// Multiplies every gradient by `scale` ([`ClipScale::apply`]).
pub fn scale_grads(vars: &[(String, Var)], grads: &mut GradStore, scale: &ClipScale) -> Result<()> {
    if matches!(scale, ClipScale::Host(s) if *s >= 1.0) {
        return Ok(());
    }
    for (_, v) in vars {
        if let Some(g) = grads.remove(v) {
            grads.insert(v, scale.apply(g)?);
        }
    }
    Ok(())
}

/// Scales gradients so that their global norm is at most `max_norm`, as
/// `torch.nn.utils.clip_grad_norm_` does. Returns the norm before clipping
/// (read back: a wait on CUDA; the trainer uses [`clip_scale`]).
pub fn clip_grad_norm(vars: &[(String, Var)], grads: &mut GradStore, max_norm: f64) -> Result<f64> {
    let Some(total) = sum_of_squares(vars, grads)? else {
        return Ok(0.0);
    };
    let total = total.to_scalar::<f64>()?;
    scale_grads(
        vars,
        grads,
        &ClipScale::Host(clip_factor_of(total, max_norm)),
    )?;
    Ok(total.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn vars() -> Result<Vec<(String, Var)>> {
        let mut vars = Vec::new();
        for (k, n) in [(0u64, 1000usize), (1, 37), (2, 5000)] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i as u64 * 7919 + k * 13) % 1009) as f32 / 400.0 - 1.26)
                .collect();
            vars.push((format!("p{k}"), Var::from_vec(x, n, &Device::Cpu)?));
        }
        Ok(vars)
    }

    /// Each variable's gradient: a copy of its values.
    fn grads_of(vars: &[(String, Var)]) -> Result<GradStore> {
        let mut grads = GradStore::default();
        for (_, v) in vars {
            grads.insert(v.as_tensor(), v.as_tensor().copy()?);
        }
        Ok(grads)
    }

    fn bits(grads: &GradStore, vars: &[(String, Var)]) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        for (_, v) in vars {
            let g: Vec<f32> = grads.get(v).unwrap().to_vec1()?;
            out.extend(g.iter().map(|x| x.to_bits()));
        }
        Ok(out)
    }

    /// The factor kept as a tensor (the CUDA path, here on the CPU) is the
    /// one read on the host, and scales the gradients to the same bits;
    /// both match `clip_grad_norm` and a float64 computation of the norm.
    #[test]
    fn kept_and_read_factors_agree_bit_for_bit() -> Result<()> {
        for max in [0.5, 1e6] {
            let vars = vars()?;
            let grads = grads_of(&vars)?;
            let norm64: f64 = vars
                .iter()
                .map(|(_, v)| {
                    let g: Vec<f32> = grads.get(v).unwrap().to_vec1().unwrap();
                    g.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>()
                })
                .sum::<f64>()
                .sqrt();
            let kept = clip_scale(&vars, &grads, max, true)?;
            let read = clip_scale(&vars, &grads, max, false)?;
            assert!(matches!(kept, ClipScale::Device(_)));
            assert_eq!(kept.value()?.to_bits(), read.value()?.to_bits());
            let want = (max / (norm64 + 1e-6)).min(1.0);
            assert!(
                (f64::from(read.value()?) - want).abs() <= want * 1e-7,
                "{max}"
            );

            let (mut a, mut b, mut c) = (grads_of(&vars)?, grads_of(&vars)?, grads);
            scale_grads(&vars, &mut a, &kept)?;
            scale_grads(&vars, &mut b, &read)?;
            let norm = clip_grad_norm(&vars, &mut c, max)?;
            assert!((norm - norm64).abs() <= norm64 * 1e-12);
            assert_eq!(bits(&a, &vars)?, bits(&b, &vars)?, "{max}");
            assert_eq!(bits(&b, &vars)?, bits(&c, &vars)?, "{max}");
            let after = grad_norm(&vars, &b)?;
            assert!(after <= max * (1.0 + 1e-6) && after <= norm64 * (1.0 + 1e-6));
        }
        Ok(())
    }
}
