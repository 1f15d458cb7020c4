//! The parameter store: a candle `VarBuilder` backend that creates each
//! variable on first use, initialised from taper's own seeded generator.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use candle_core::{DType, Device, Shape, Tensor, Var};
use candle_nn::init::{Init, NormalOrUniform};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::VarBuilder;

use super::rng::Rng;

/// Owns a model's trainable variables, by name. Cloning shares them.
#[derive(Clone)]
pub struct ParamStore {
    vars: Arc<Mutex<BTreeMap<String, Var>>>,
    seed: u64,
}

impl ParamStore {
    pub fn new(seed: u64) -> Self {
        ParamStore {
            vars: Arc::new(Mutex::new(BTreeMap::new())),
            seed,
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Var>> {
        // A panic while holding this lock leaves the map itself consistent.
        self.vars.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A builder that creates missing variables here (for a trainable model).
    pub fn var_builder(&self, dtype: DType, device: &Device) -> VarBuilder<'static> {
        VarBuilder::from_backend(Box::new(self.clone()), dtype, device.clone())
    }

    /// A builder over detached copies of the variables: a model built from it
    /// records no gradient graph (for evaluation and generation).
    pub fn frozen_builder(&self, dtype: DType, device: &Device) -> VarBuilder<'static> {
        let ts: HashMap<String, Tensor> = self
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().detach()))
            .collect();
        VarBuilder::from_tensors(ts, dtype, device)
    }

    /// A builder over copies of the variables as they are now: a model
    /// built from it stays as it is while training goes on (a
    /// distillation teacher).
    pub fn snapshot_builder(
        &self,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<VarBuilder<'static>> {
        let ts = self
            .lock()
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.as_tensor().detach().copy()?)))
            .collect::<candle_core::Result<HashMap<String, Tensor>>>()?;
        Ok(VarBuilder::from_tensors(ts, dtype, device))
    }

    /// All variables, sorted by name.
    pub fn vars(&self) -> Vec<(String, Var)> {
        self.lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Whether every value of every floating-point variable is finite:
    /// `0 * x` is NaN exactly for NaN and infinite `x`, so one product and
    /// one sum per variable, added up on the device, and one read tell.
    pub fn all_finite(&self) -> candle_core::Result<bool> {
        let mut probe: Option<Tensor> = None;
        for (_, v) in self.lock().iter() {
            let t = v.as_tensor();
            if !t.dtype().is_float() {
                continue;
            }
            let z = (t * 0.0)?.sum_all()?.to_dtype(DType::F32)?;
            probe = Some(match probe {
                Some(p) => (p + z)?,
                None => z,
            });
        }
        match probe {
            Some(p) => Ok(p.to_scalar::<f32>()?.is_finite()),
            None => Ok(true),
        }
    }

    /// The variables' current values by name (sharing their storage): what
    /// an export writes.
    pub fn tensors(&self) -> HashMap<String, Tensor> {
        self.lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect()
    }

    /// Creates variables with these initial values (in `dtype`, on `device`).
    pub fn insert_initial(
        &self,
        values: Vec<(String, Tensor)>,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<()> {
        let mut vars = self.lock();
        for (name, t) in values {
            let var = Var::from_tensor(&t.to_dtype(dtype)?.to_device(device)?)?;
            vars.insert(name, var);
        }
        Ok(())
    }

    /// A new store holding copies of these variables in `dtype` (the
    /// working copy of mixed precision).
    pub fn cast(&self, dtype: DType) -> candle_core::Result<ParamStore> {
        let vars = self
            .lock()
            .iter()
            .map(|(k, v)| {
                Ok((
                    k.clone(),
                    Var::from_tensor(&v.as_tensor().to_dtype(dtype)?)?,
                ))
            })
            .collect::<candle_core::Result<BTreeMap<_, _>>>()?;
        Ok(ParamStore {
            vars: Arc::new(Mutex::new(vars)),
            seed: self.seed,
        })
    }

    pub fn num_params(&self) -> usize {
        self.lock().values().map(|v| v.elem_count()).sum()
    }

    /// Overwrites variables from `tensors` (a checkpoint). Every variable must
    /// be present with the same shape.
    pub fn load(&self, tensors: &HashMap<String, Tensor>) -> Result<(), String> {
        for (name, var) in self.lock().iter() {
            let t = tensors
                .get(name)
                .ok_or_else(|| format!("parameter {name} is missing"))?;
            if t.shape() != var.shape() {
                return Err(format!(
                    "shape mismatch on {name}: {:?} <> {:?}",
                    var.shape(),
                    t.shape()
                ));
            }
            let t = t
                .to_dtype(var.dtype())
                .and_then(|t| t.to_device(var.device()))
                .map_err(|e| format!("{name}: {e}"))?;
            var.set(&t).map_err(|e| format!("{name}: {e}"))?;
        }
        Ok(())
    }
}

fn init_values(init: Init, shape: &Shape, rng: &mut Rng) -> Vec<f64> {
    let n = shape.elem_count();
    match init {
        Init::Const(c) => vec![c; n],
        Init::Uniform { lo, up } => (0..n).map(|_| lo + (up - lo) * rng.uniform()).collect(),
        Init::Randn { mean, stdev } => (0..n).map(|_| mean + stdev * rng.normal()).collect(),
        Init::Kaiming {
            dist,
            fan,
            non_linearity,
        } => {
            let std = non_linearity.gain() / (fan.for_shape(shape) as f64).sqrt();
            match dist {
                NormalOrUniform::Uniform => {
                    let bound = 3f64.sqrt() * std;
                    (0..n)
                        .map(|_| -bound + 2.0 * bound * rng.uniform())
                        .collect()
                }
                NormalOrUniform::Normal => (0..n).map(|_| std * rng.normal()).collect(),
            }
        }
    }
}

impl SimpleBackend for ParamStore {
    fn get(
        &self,
        s: Shape,
        name: &str,
        h: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let mut vars = self.lock();
        if let Some(v) = vars.get(name) {
            if v.shape() != &s {
                candle_core::bail!("shape mismatch on {name}: {:?} <> {s:?}", v.shape());
            }
            return Ok(v.as_tensor().clone());
        }
        let mut rng = Rng::stream(self.seed, name);
        let values = init_values(h, &s, &mut rng);
        let t = Tensor::from_vec(values, s, &Device::Cpu)?
            .to_dtype(dtype)?
            .to_device(dev)?;
        let var = Var::from_tensor(&t)?;
        let out = var.as_tensor().clone();
        vars.insert(name.to_string(), var);
        Ok(out)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        match self.lock().get(name) {
            Some(v) => Ok(v.as_tensor().clone()),
            None => candle_core::bail!("no parameter named {name}"),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.lock().contains_key(name)
    }
}
