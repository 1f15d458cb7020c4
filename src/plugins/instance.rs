//! A created plugin: its state pointer and safe wrappers around each call.
//! Calls into one instance are serialized by a mutex. A call that returns an
//! error or panics becomes an `Error::Script` naming the plugin and the call,
//! which fails the run like a policy error in Lua (checkpoint, exit 1).

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Tensor};
use taper_plugin::{
    BatchView, ErrorBuf, OomAction, OomEvent, Plan, StepInfo, Str, TensorView, DTYPE_F32,
    DTYPE_U32, MAX_DIMS, STATUS_OK, STATUS_PANIC,
};

use super::Library;
use crate::data::Batch;
use crate::engine::schedule::{Schedule, StepPlan};
use crate::{Error, Result};

struct State(*mut c_void);
// The plugin's state is only touched under the mutex, one call at a time.
unsafe impl Send for State {}

pub struct Instance {
    pub lib: Arc<Library>,
    state: Mutex<State>,
}

const ERR_CAP: usize = 1024;

impl Instance {
    /// Calls the plugin's `create` with the recipe's options as JSON.
    pub fn create(lib: Arc<Library>, config_json: &str) -> Result<Instance> {
        let create = lib.descriptor().create.expect("checked at load");
        let mut state = std::ptr::null_mut();
        let mut buf = vec![0u8; ERR_CAP];
        let mut err = err_buf(&mut buf);
        // SAFETY: arguments are valid for the call, per the ABI.
        let status = unsafe { create(Str::new(config_json), &mut state, &mut err) };
        if status != STATUS_OK {
            return Err(Error::Plugin(format!(
                "{} ({}): create failed: {}",
                lib.name,
                lib.path.display(),
                message(&buf, &err, status)
            )));
        }
        Ok(Instance {
            lib,
            state: Mutex::new(State(state)),
        })
    }

    /// Runs one call with the state locked and an error buffer.
    fn call(&self, what: &str, f: impl FnOnce(*mut c_void, *mut ErrorBuf) -> i32) -> Result<()> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // On the stack: most calls succeed and never touch it.
        let mut buf = [0u8; ERR_CAP];
        let mut err = err_buf(&mut buf);
        let status = f(st.0, &mut err);
        if status == STATUS_OK {
            return Ok(());
        }
        Err(Error::Script(format!(
            "plugin {} ({}): {what} {}",
            self.lib.name,
            self.lib.path.display(),
            if status == STATUS_PANIC {
                message(&buf, &err, status)
            } else {
                format!("failed: {}", message(&buf, &err, status))
            }
        )))
    }

    pub fn on_oom(&self, event: &OomEvent) -> Result<OomAction> {
        let f = self
            .lib
            .descriptor()
            .on_oom
            .ok_or_else(|| self.missing("on_oom"))?;
        let mut action = OomAction::default();
        // SAFETY: valid pointers for the call's duration.
        self.call("on_oom", |s, e| unsafe { f(s, event, &mut action, e) })?;
        Ok(action)
    }

    /// `on_step` is optional for policies: None when the plugin has none.
    pub fn on_step(&self, info: &StepInfo) -> Result<Option<Plan>> {
        let Some(f) = self.lib.descriptor().on_step else {
            return Ok(None);
        };
        let mut plan = Plan::default();
        // SAFETY: valid pointers for the call's duration.
        self.call("on_step", |s, e| unsafe { f(s, info, &mut plan, e) })?;
        Ok(Some(plan))
    }

    pub fn schedule(&self, step: u64, epoch: u64) -> Result<StepPlan> {
        let f = self
            .lib
            .descriptor()
            .schedule
            .ok_or_else(|| self.missing("schedule"))?;
        let mut plan = Plan::default();
        // SAFETY: valid pointers for the call's duration.
        self.call("schedule", |s, e| unsafe {
            f(s, step, epoch, &mut plan, e)
        })?;
        Ok(StepPlan {
            lr: (!plan.lr.is_nan()).then_some(plan.lr),
            micro_batch: (plan.micro_batch > 0).then_some(plan.micro_batch as usize),
            batch_size: (plan.batch_size > 0).then_some(plan.batch_size as usize),
        })
    }

    /// Runs the plugin's transform over a batch's host buffers.
    pub fn transform(&self, batch: Batch, epoch: u64) -> Result<Batch> {
        let f = self
            .lib
            .descriptor()
            .transform
            .ok_or_else(|| self.missing("transform"))?;
        let mut x = Buffer::from_tensor(&batch.x)?;
        let mut y = Buffer::from_tensor(&batch.y)?;
        let indices: Vec<u64> = batch.indices.iter().map(|&i| i as u64).collect();
        let mut view = BatchView {
            x: x.view(),
            y: y.view(),
            indices: indices.as_ptr(),
            size: indices.len() as u64,
            epoch,
        };
        // SAFETY: the views point into `x`, `y` and `indices`, alive here.
        self.call("transform", |s, e| unsafe { f(s, &mut view, e) })?;
        Ok(Batch {
            x: x.into_tensor(batch.x.dtype())?,
            y: y.into_tensor(batch.y.dtype())?,
            indices: batch.indices,
        })
    }

    fn missing(&self, kind: &str) -> Error {
        Error::Plugin(format!(
            "{} ({}) does not implement `{kind}`",
            self.lib.name,
            self.lib.path.display()
        ))
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(destroy) = self.lib.descriptor().destroy {
            // SAFETY: the state `create` returned, destroyed once.
            unsafe { destroy(st.0) };
        }
    }
}

fn err_buf(buf: &mut [u8]) -> ErrorBuf {
    ErrorBuf {
        ptr: buf.as_mut_ptr(),
        cap: buf.len(),
        len: 0,
    }
}

fn message(buf: &[u8], err: &ErrorBuf, status: i32) -> String {
    let n = err.len.min(buf.len());
    match String::from_utf8_lossy(&buf[..n]).into_owned() {
        m if m.is_empty() => format!("status {status}, no message"),
        m => m,
    }
}

/// A tensor's values in a host buffer of an ABI dtype.
enum Values {
    F32(Vec<f32>),
    U32(Vec<u32>),
}

struct Buffer {
    values: Values,
    shape: Vec<usize>,
}

impl Buffer {
    fn from_tensor(t: &Tensor) -> Result<Buffer> {
        let shape = t.dims().to_vec();
        if shape.len() > MAX_DIMS {
            return Err(Error::Data(format!(
                "a plugin transform takes tensors of at most {MAX_DIMS} dimensions, got {shape:?}"
            )));
        }
        let flat = t.flatten_all()?;
        let values = match t.dtype() {
            DType::U32 | DType::U8 | DType::I64 => {
                Values::U32(flat.to_dtype(DType::U32)?.to_vec1()?)
            }
            _ => Values::F32(flat.to_dtype(DType::F32)?.to_vec1()?),
        };
        Ok(Buffer { values, shape })
    }

    fn view(&mut self) -> TensorView {
        let mut shape = [0u64; MAX_DIMS];
        for (s, d) in shape.iter_mut().zip(&self.shape) {
            *s = *d as u64;
        }
        let (data, dtype) = match &mut self.values {
            Values::F32(v) => (v.as_mut_ptr() as *mut c_void, DTYPE_F32),
            Values::U32(v) => (v.as_mut_ptr() as *mut c_void, DTYPE_U32),
        };
        TensorView {
            data,
            dtype,
            ndim: self.shape.len() as u32,
            shape,
        }
    }

    fn into_tensor(self, dtype: DType) -> Result<Tensor> {
        let t = match self.values {
            Values::F32(v) => Tensor::from_vec(v, self.shape, &Device::Cpu)?,
            Values::U32(v) => Tensor::from_vec(v, self.shape, &Device::Cpu)?,
        };
        Ok(t.to_dtype(dtype)?)
    }
}

/// A plugin in the schedule slot.
pub struct PluginSchedule(pub Arc<Instance>);

impl Schedule for PluginSchedule {
    fn plan(&mut self, step: u64, epoch: u64) -> Result<StepPlan> {
        self.0.schedule(step, epoch)
    }
    fn describe(&self) -> String {
        format!("plugin {} {}", self.0.lib.name, self.0.lib.version)
    }
}

/// A plugin as a pipeline transform.
impl crate::data::Transform for Instance {
    fn apply(&self, batch: Batch, epoch: u64) -> Result<Batch> {
        self.transform(batch, epoch)
    }
    fn describe(&self) -> String {
        format!("plugin {}", self.lib.name)
    }
}
