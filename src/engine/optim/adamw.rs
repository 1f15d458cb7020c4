//! AdamW, as `torch.optim.AdamW`, with its moments kept one of these ways
//! per parameter:
//! - **fused** (f32 parameters, the default): host buffers that
//!   `kernels::adamw` updates in one pass with the weights, in place; on
//!   CUDA, device buffers that `kernels/adamw.cu` updates the same way;
//! - **composed**: candle tensor ops, on any device and dtype (and the
//!   reference the fused kernel was checked against);
//! - **offloaded** (`offload`, f32 parameters on any device): in a
//!   memory-mapped file ([`super::offload`]), updated in place on the CPU and
//!   through a device copy, one tensor at a time, on CUDA;
//! - **8-bit** (`state = "8bit"`, parameters of at least [`MIN_8BIT`]
//!   elements, as bitsandbytes): blockwise dynamic 8-bit moments,
//!   2 bytes per parameter instead of 8, on the host or (f32 CUDA
//!   parameters) on the device.

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Result, Tensor, Var};

use super::{AdamWConfig, Optimizer, StateFormat};
use crate::kernels::adamw::{adamw_inplace, update_inplace, AdamWStep};
use crate::kernels::device_state::DeviceMoments;
use crate::kernels::quant8::{self, adamw8_slices, Blockwise};

use super::offload::{Offloaded, Place};
use moments::{Moments, Path};

mod mixed;
mod moments;

/// Parameters smaller than this keep f32 moments under `state = "8bit"`
/// (bitsandbytes' `min_8bit_size`): biases and norms cost little, and
/// quantizing them costs accuracy.
pub const MIN_8BIT: usize = 4096;

pub struct AdamW {
    cfg: AdamWConfig,
    fused: bool,
    t: u64,
    moments: HashMap<String, Moments>,
    /// Where f32 moments are offloaded to, when they are.
    offload: Option<Place>,
}

impl AdamW {
    /// Fused where it applies if `kernels::fused()` (the default).
    pub fn new(cfg: AdamWConfig) -> Self {
        AdamW {
            cfg,
            fused: crate::kernels::fused(),
            t: 0,
            moments: HashMap::new(),
            offload: None,
        }
    }

    /// Chooses between the fused and the composed update (tests compare them).
    pub fn with_fused(mut self, on: bool) -> Self {
        self.fused = on;
        self
    }

    fn path(&self, var: &Var) -> Path {
        let f32 = var.dtype() == DType::F32;
        let (host_f32, cuda_f32) = (f32 && var.device().is_cpu(), f32 && var.device().is_cuda());
        if self.offload.is_some() && f32 {
            // Offloading wins over 8-bit moments: they leave memory altogether.
            Path::Offload
        } else if self.cfg.state == StateFormat::Q8 && var.elem_count() >= MIN_8BIT {
            // The 8-bit kernel is fused by nature: it is used whatever `fused` says.
            if cuda_f32 {
                Path::Q8Device
            } else {
                Path::Q8
            }
        } else if self.fused && host_f32 {
            Path::Fused
        } else if self.fused && cuda_f32 {
            Path::FusedDevice
        } else {
            Path::Composed
        }
    }

    /// The composed update at step `t`: new (parameter, m, v), computed
    /// without changing anything.
    fn composed(
        &self,
        t: u64,
        var: &Var,
        g: &Tensor,
        m: &Tensor,
        v: &Tensor,
    ) -> Result<[Tensor; 3]> {
        let (b1, b2) = self.cfg.betas;
        let lr = self.cfg.lr;
        let bc1 = 1.0 - b1.powi(t as i32);
        let bc2 = 1.0 - b2.powi(t as i32);
        let m = ((m * b1)? + (g * (1.0 - b1))?)?;
        let v = ((v * b2)? + (g.sqr()? * (1.0 - b2))?)?;
        let theta = (var.as_tensor() * (1.0 - lr * self.cfg.weight_decay))?;
        let denom = ((&v * (1.0 / bc2))?.sqrt()? + self.cfg.eps)?;
        let update = ((&m * (lr / bc1))? / denom)?;
        Ok([(theta - update)?, m, v])
    }
}

/// The 8-bit update with host moments. On an f32 CPU parameter it runs in
/// place; elsewhere (other dtypes, other devices) it goes through host
/// copies. f32 CUDA parameters keep their 8-bit moments on the device.
fn q8_step(
    var: &Var,
    g: &Tensor,
    m: &mut Blockwise,
    v: &mut Blockwise,
    h: &AdamWStep,
) -> Result<()> {
    if var.device().is_cpu() && var.dtype() == DType::F32 {
        return update_inplace(var.as_tensor(), &g.to_dtype(DType::F32)?, |theta, g| {
            adamw8_slices(theta, g, m, v, h);
            Ok(())
        });
    }
    let host = |t: &Tensor| {
        t.to_device(&Device::Cpu)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()
    };
    let (mut theta, g) = (host(var.as_tensor())?, host(g)?);
    adamw8_slices(&mut theta, &g, m, v, h);
    let t = Tensor::from_vec(theta, var.shape(), &Device::Cpu)?
        .to_dtype(var.dtype())?
        .to_device(var.device())?;
    var.set(&t)
}

impl Optimizer for AdamW {
    fn kind(&self) -> &'static str {
        "adamw"
    }

    fn step(&mut self, vars: &[(String, Var)], grads: &GradStore) -> Result<()> {
        self.prepare(vars, grads)?;
        let t = self.t + 1;
        // The composed updates allocate: all of them are computed before any
        // parameter or moment changes, so that an error (an OOM) leaves the
        // step undone. The fused paths below work in place.
        let mut composed = HashMap::new();
        for (name, var) in vars {
            let Some(g) = grads.get(var) else { continue };
            if let (Path::Composed, Some(Moments::Tensors(m, v))) =
                (self.path(var), self.moments.get(name))
            {
                composed.insert(name.clone(), self.composed(t, var, g, m, v)?);
            }
        }
        self.t = t;
        let c = &self.cfg;
        let h = AdamWStep::new(c.lr, c.betas, c.eps, c.weight_decay, self.t);
        for (name, var) in vars {
            let Some(g) = grads.get(var) else { continue };
            let path = self.path(var);
            let st =
                Moments::into_path(self.moments.remove(name), path, var, self.offload.as_ref())?;
            let st = match st {
                Moments::Tensors(m, v) => {
                    let [theta, m, v] = match composed.remove(name) {
                        Some(new) => new,
                        // Moments that changed form this step (rare: the
                        // parameter moved between paths).
                        None => self.composed(t, var, g, &m, &v)?,
                    };
                    var.set(&theta)?;
                    Moments::Tensors(m, v)
                }
                Moments::Host(s, mut m, mut v) => {
                    adamw_inplace(var.as_tensor(), g, &mut m, &mut v, &h)?;
                    Moments::Host(s, m, v)
                }
                Moments::Q8(s, mut m, mut v) => {
                    q8_step(var, g, &mut m, &mut v, &h)?;
                    Moments::Q8(s, m, v)
                }
                Moments::Device(s, mut d) => {
                    d.step(var.as_tensor(), g, &h)?;
                    Moments::Device(s, d)
                }
                Moments::Q8Device(s, mut d) => {
                    d.step(var.as_tensor(), g, &h)?;
                    Moments::Q8Device(s, d)
                }
                Moments::Offload(s, mut o) => {
                    offload_step(var, g, &mut o, &h)?;
                    Moments::Offload(s, o)
                }
            };
            self.moments.insert(name.clone(), st);
        }
        Ok(())
    }

    fn one_pass(&self, var: &Var, g: &Tensor, work: &Var) -> bool {
        self.takes_one_pass(var, g, work)
    }

    fn step_mixed(
        &mut self,
        vars: &[(String, Var)],
        grads: &GradStore,
        scale: &super::ClipScale,
        work: &HashMap<String, Var>,
    ) -> Result<std::collections::HashSet<String>> {
        self.mixed_step(vars, grads, scale, work)
    }

    fn prepare(&mut self, vars: &[(String, Var)], grads: &GradStore) -> Result<()> {
        for (name, var) in vars {
            if grads.get(var).is_none() || self.moments.contains_key(name) {
                continue;
            }
            let st = Moments::into_path(None, self.path(var), var, self.offload.as_ref())?;
            self.moments.insert(name.clone(), st);
        }
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.cfg.lr
    }
    fn set_learning_rate(&mut self, lr: f64) {
        self.cfg.lr = lr;
    }
    fn clip_grad_norm(&self) -> Option<f64> {
        self.cfg.clip_grad_norm
    }

    fn state_bytes(&self, vars: &[(String, Var)]) -> usize {
        vars.iter()
            .map(|(_, v)| {
                let n = v.elem_count();
                match self.path(v) {
                    Path::Q8 | Path::Q8Device => 2 * (n + 4 * n.div_ceil(quant8::BLOCK)),
                    Path::Fused | Path::FusedDevice => 8 * n,
                    // In a file: none in the heap or on the device.
                    Path::Offload => 0,
                    Path::Composed => 2 * n * v.dtype().size_in_bytes(),
                }
            })
            .sum()
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        let cpu = Device::Cpu;
        if let Ok(t) = Tensor::new(self.t as f64, &cpu) {
            out.push(("t".to_string(), t));
        }
        for (name, st) in &self.moments {
            st.entries(&mut |k, t| {
                if let Ok(t) = t {
                    out.push((format!("{k}.{name}"), t))
                }
            });
        }
        out
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        self.t = match state.get("t") {
            Some(t) => t.to_dtype(DType::F64)?.to_scalar::<f64>()? as u64,
            None => 0,
        };
        self.moments.clear();
        let get = |k: &str, name: &str| -> Result<&Tensor> {
            match state.get(&format!("{k}.{name}")) {
                Some(t) => Ok(t),
                None => candle_core::bail!("adamw state: {k}.{name} is missing"),
            }
        };
        for key in state.keys() {
            if let Some(name) = key.strip_prefix("m.") {
                let st = Moments::Tensors(get("m", name)?.clone(), get("v", name)?.clone());
                self.moments.insert(name.to_string(), st);
            } else if let Some(name) = key.strip_prefix("m8.") {
                let st = Moments::q8_from_state(state, name)?;
                self.moments.insert(name.to_string(), st);
            }
        }
        Ok(())
    }

    fn set_offload(&mut self, place: Option<Place>) -> Result<bool> {
        self.offload = place;
        // The moments move now, so that the memory they held is free for
        // the next attempt (an OOM action), not after the next update.
        let names: Vec<String> = self.moments.keys().cloned().collect();
        for name in names {
            let Some(st) = self.moments.remove(&name) else {
                continue;
            };
            // f32 moments held in memory, and their parameter's device;
            // 8-bit ones stay as they are.
            let held = match &st {
                Moments::Host(s, ..) => Some((s.clone(), Device::Cpu)),
                Moments::Device(s, d) => Some((s.clone(), d.device())),
                Moments::Tensors(m, _) if m.dtype() == DType::F32 => {
                    Some((m.shape().clone(), m.device().clone()))
                }
                _ => None,
            };
            let moved = match (st, &self.offload, held) {
                (st, Some(place), Some((s, dev))) => {
                    let (m, v) = st.dense()?;
                    Moments::Offload(s, Offloaded::from_host(place, &dev, &m, &v)?)
                }
                (Moments::Offload(s, o), None, _) => {
                    // Back in memory as host moments; the next update puts
                    // them where the parameter's path wants them.
                    let (m, v) = o.to_host()?;
                    Moments::Host(s, m, v)
                }
                (st, _, _) => st,
            };
            self.moments.insert(name, moved);
        }
        Ok(true)
    }

    fn offload(&self) -> Option<&Place> {
        self.offload.as_ref()
    }
}

/// The update with offloaded moments: in place through the mapping on the
/// CPU; elsewhere the moments go to the device for this tensor and back:
/// queued DMA copies from and to pinned memory with `offload = true`, a
/// synchronous round trip through the mapping with a folder.
fn offload_step(var: &Var, g: &Tensor, o: &mut Offloaded, h: &AdamWStep) -> Result<()> {
    if let Some(pinned) = o.pinned_mut() {
        return pinned.step(var.as_tensor(), g, h);
    }
    let (m, v) = o.slices()?;
    if var.device().is_cpu() {
        return adamw_inplace(var.as_tensor(), g, m, v, h);
    }
    let mut d = DeviceMoments::from_host(var.device(), m, v)?;
    d.step(var.as_tensor(), g, h)?;
    let (dm, dv) = d.to_host()?;
    m.copy_from_slice(&dm);
    v.copy_from_slice(&dv);
    Ok(())
}
