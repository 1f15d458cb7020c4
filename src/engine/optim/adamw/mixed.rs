//! AdamW's update under mixed precision: parameters whose moments the
//! fused kernels update (host or device f32 moments) go through
//! `kernels::adamw_mixed`, which reads the low-precision gradient and
//! writes the working copy in the same pass; the rest (composed, 8-bit,
//! offloaded) get f32 gradients (`optim::mixed_grads`, before the update)
//! and the ordinary step.

use std::collections::{HashMap, HashSet};

use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor, Var};

use super::{AdamW, Moments, Path};
use crate::engine::optim::{ClipScale, Optimizer};
use crate::kernels::adamw::AdamWStep;
use crate::kernels::adamw_mixed::{adamw_mixed, Factor, MixedMoments};

impl AdamW {
    /// Fused moments, and a gradient and working copy of one low dtype and
    /// of the master's shape and device.
    pub(super) fn takes_one_pass(&self, var: &Var, g: &Tensor, w: &Var) -> bool {
        matches!(self.path(var), Path::Fused | Path::FusedDevice)
            && matches!(w.dtype(), DType::BF16 | DType::F16)
            && g.dtype() == w.dtype()
            && w.shape() == var.shape()
            && w.device().same_device(var.device())
    }

    pub(super) fn mixed_step(
        &mut self,
        vars: &[(String, Var)],
        grads: &GradStore,
        scale: &ClipScale,
        work: &HashMap<String, Var>,
    ) -> Result<HashSet<String>> {
        let mut one_pass = Vec::new();
        let mut rest = Vec::new();
        for (name, var) in vars {
            let Some(g) = grads.get(var) else { continue };
            match work.get(name) {
                Some(w) if g.dtype() != DType::F32 && self.takes_one_pass(var, g, w) => {
                    one_pass.push((name, var, g, w))
                }
                _ if g.dtype() == DType::F32 => rest.push((name.clone(), var.clone())),
                _ => candle_core::bail!(
                    "adamw (mixed): a {:?} gradient for {name}, which takes f32 ones",
                    g.dtype()
                ),
            }
        }
        // The first step's moments, then the ordinary step for the rest
        // (which counts the step), then the one-pass updates at that step.
        self.prepare(vars, grads)?;
        self.step(&rest, grads)?;
        let c = &self.cfg;
        let h = AdamWStep::new(c.lr, c.betas, c.eps, c.weight_decay, self.t);
        let mut written = HashSet::new();
        let scale = match scale {
            ClipScale::Host(s) => Factor::Value(*s),
            ClipScale::Device(t) => Factor::At(t),
        };
        for (name, var, g, w) in one_pass {
            let st = self.moments.remove(name);
            let st = Moments::into_path(st, self.path(var), var, self.offload.as_ref())?;
            let st = match st {
                Moments::Host(s, mut m, mut v) => {
                    let mv = MixedMoments::Host(&mut m, &mut v);
                    adamw_mixed(var.as_tensor(), g, scale, mv, w.as_tensor(), &h)?;
                    Moments::Host(s, m, v)
                }
                Moments::Device(s, mut d) => {
                    let mv = MixedMoments::Device(&mut d);
                    adamw_mixed(var.as_tensor(), g, scale, mv, w.as_tensor(), &h)?;
                    Moments::Device(s, d)
                }
                _ => candle_core::bail!("adamw (mixed): {name} left the fused path"),
            };
            self.moments.insert(name.clone(), st);
            written.insert(name.clone());
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::optim::{mixed_grads, AdamWConfig, StateFormat};
    use candle_core::{Device, Tensor};

    /// The old sequence's gradients: cast to f32 (`Mixed::master_grads`),
    /// then scaled if clipping's factor is below 1 (`clip_grad_norm`).
    fn f32_grads(vars: &[(String, Var)], grads: &GradStore, scale: f64) -> Result<GradStore> {
        let mut out = GradStore::default();
        for (_, v) in vars {
            if let Some(g) = grads.get(v) {
                let g = g.to_dtype(DType::F32)?;
                out.insert(v, if scale < 1.0 { (g * scale)? } else { g });
            }
        }
        Ok(out)
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        let v: Vec<f32> = t
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Masters of 5000 values (8-bit moments under `Q8`: the ordinary
    /// step), 300 (the one-pass update) and 7 (no gradient).
    fn masters(seed: u64) -> Vec<(String, Var)> {
        [("big", 5000), ("small", 300), ("idle", 7)]
            .into_iter()
            .map(|(name, n)| {
                let x: Vec<f32> = (0..n)
                    .map(|i| ((i as u64 * 7919 + seed) % 1009) as f32 / 500.0 - 1.0)
                    .collect();
                (name.to_string(), Var::from_vec(x, n, &Device::Cpu).unwrap())
            })
            .collect()
    }

    /// `step_mixed` against the cast, scale and ordinary step, bit for
    /// bit: weights, moments and the working copies it wrote, over three
    /// steps, with and without clipping's factor (read, or a tensor), f32
    /// and 8-bit moments, bf16 and f16.
    #[test]
    fn one_pass_matches_cast_then_step_bit_for_bit() -> Result<()> {
        // The factor read on the host, or kept as a tensor (as on CUDA).
        let on_device = ClipScale::Device(Tensor::new(0.37f32, &Device::Cpu)?);
        for (state, dtype, clip) in [
            (StateFormat::F32, DType::BF16, ClipScale::ONE),
            (StateFormat::F32, DType::F16, ClipScale::Host(0.37)),
            (StateFormat::Q8, DType::BF16, ClipScale::Host(0.37)),
            (StateFormat::F32, DType::BF16, on_device.clone()),
            (StateFormat::Q8, DType::F16, on_device.clone()),
        ] {
            let scale = f64::from(clip.value()?);
            let cfg = AdamWConfig {
                lr: 1e-2,
                weight_decay: 0.1,
                state,
                ..AdamWConfig::default()
            };
            let (mut a, mut b) = (AdamW::new(cfg.clone()), AdamW::new(cfg));
            let (va, vb) = (masters(1), masters(1));
            let work: HashMap<String, Var> = va
                .iter()
                .map(|(n, v)| {
                    (
                        n.clone(),
                        Var::from_tensor(&v.as_tensor().to_dtype(dtype).unwrap()).unwrap(),
                    )
                })
                .collect();
            for step in 0..3u64 {
                let (mut ga, mut gb) = (GradStore::default(), GradStore::default());
                for ((_, x), (_, y)) in va.iter().zip(&vb).filter(|((n, _), _)| n != "idle") {
                    let n = x.elem_count();
                    let g: Vec<f32> = (0..n)
                        .map(|i| ((i as u64 * 104_729 + step * 31) % 997) as f32 / 400.0 - 1.2)
                        .collect();
                    let g = Tensor::from_vec(g, n, &Device::Cpu)?.to_dtype(dtype)?;
                    ga.insert(x.as_tensor(), g.clone());
                    gb.insert(y.as_tensor(), g);
                }
                let ga = mixed_grads(&a, &va, ga, &clip, &work)?;
                let written = a.step_mixed(&va, &ga, &clip, &work)?;
                let expected: HashSet<String> = match state {
                    StateFormat::F32 => ["big", "small"].map(String::from).into(),
                    StateFormat::Q8 => ["small"].map(String::from).into(),
                };
                assert_eq!(written, expected);
                b.step(&vb, &f32_grads(&vb, &gb, scale)?)?;
                for ((name, x), (_, y)) in va.iter().zip(&vb) {
                    assert_eq!(
                        bits(x.as_tensor()),
                        bits(y.as_tensor()),
                        "{name} after step {step}"
                    );
                    if written.contains(name) {
                        let rounded = y.as_tensor().to_dtype(dtype)?;
                        assert_eq!(
                            bits(work[name].as_tensor()),
                            bits(&rounded),
                            "{name}'s working copy"
                        );
                    }
                }
                let (mut sa, mut sb) = (a.state(), b.state());
                sa.sort_by(|x, y| x.0.cmp(&y.0));
                sb.sort_by(|x, y| x.0.cmp(&y.0));
                assert_eq!(sa.len(), sb.len());
                for ((ka, ta), (kb, tb)) in sa.iter().zip(&sb) {
                    assert_eq!(ka, kb);
                    assert_eq!(bits(ta), bits(tb), "{ka} after step {step}");
                }
            }
        }
        Ok(())
    }
}
