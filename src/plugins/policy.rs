//! The plugin-backed OOM policy: the run core's [`OomEvent`] as the C
//! struct, and the plugin's answer as an [`Action`].

use std::sync::Arc;

use taper_plugin as abi;

use super::Instance;
use crate::engine::precision::Precision;
use crate::memory::{OomCause, Phase};
use crate::run::{Action, MemoryFigures, OomEvent, OomPolicy, StepInfo};
use crate::{Error, Result};

/// A plugin in the `on_oom` slot.
pub struct PluginPolicy(pub Arc<Instance>);

impl OomPolicy for PluginPolicy {
    fn on_oom(&mut self, e: &OomEvent) -> Result<Option<Action>> {
        let answer = self.0.on_oom(&c_event(e))?;
        action(&self.0, answer)
    }

    fn on_step(&mut self, info: &StepInfo) -> Result<Option<usize>> {
        let info = abi::StepInfo {
            step: info.step,
            micro_batch: info.micro_batch as u64,
            batch_size: info.batch_size as u64,
            clean_steps: info.clean_steps,
            peak: info.peak.unwrap_or(0),
            limit: info.limit.unwrap_or(0),
        };
        Ok(self
            .0
            .on_step(&info)?
            .filter(|plan| plan.micro_batch > 0)
            .map(|plan| plan.micro_batch as usize))
    }

    fn describe(&self) -> String {
        format!("plugin {} ({})", self.0.lib.name, self.0.lib.path.display())
    }
}

pub fn phase_code(p: Phase) -> u32 {
    match p {
        Phase::Forward => abi::PHASE_FORWARD,
        Phase::Backward => abi::PHASE_BACKWARD,
        Phase::Optimizer => abi::PHASE_OPTIMIZER,
        Phase::Upload => abi::PHASE_UPLOAD,
        Phase::Accumulate => abi::PHASE_ACCUMULATE,
        Phase::Eval => abi::PHASE_EVAL,
    }
}

pub fn cause_code(c: OomCause) -> u32 {
    match c {
        OomCause::Device => abi::CAUSE_DEVICE,
        OomCause::Budget => abi::CAUSE_BUDGET,
        OomCause::Injected => abi::CAUSE_INJECTED,
    }
}

pub fn precision_code(p: Precision) -> u32 {
    match p {
        Precision::F32 => abi::PRECISION_F32,
        Precision::Bf16 => abi::PRECISION_BF16,
        Precision::F16 => abi::PRECISION_F16,
    }
}

fn precision_of(code: u32) -> Option<Precision> {
    [Precision::F32, Precision::Bf16, Precision::F16]
        .into_iter()
        .find(|p| precision_code(*p) == code)
}

/// The event as the C struct: every field a Lua policy sees but the error
/// text. Host heap figures always; the device's on a GPU.
pub fn c_event(e: &OomEvent) -> abi::OomEvent {
    let mut c = abi::OomEvent {
        phase: phase_code(e.phase),
        cause: cause_code(e.cause),
        step: e.step,
        epoch: e.epoch,
        batch_size: e.batch_size as u64,
        micro_batch: e.micro_batch as u64,
        attempt: e.attempt,
        requested: e.requested.unwrap_or(0),
        precision: precision_code(e.precision),
        recompute: e.recompute as u32,
        offload: u32::from(e.offload),
        ..abi::OomEvent::default()
    };
    match e.memory {
        MemoryFigures::Host { used, peak, limit } => {
            c.memory_used = used;
            c.memory_peak = peak;
            c.memory_limit = limit.unwrap_or(0);
        }
        MemoryFigures::Device { used, free, total } => {
            c.memory_used = crate::memory::HostMemory::current() as u64;
            c.memory_peak = crate::memory::HostMemory::peak() as u64;
            c.device_used = used;
            c.device_free = free;
            c.device_total = total;
        }
    }
    c
}

/// A plugin's answer as the host's action (None: the default).
pub fn action(p: &Instance, a: abi::OomAction) -> Result<Option<Action>> {
    let bad = |what: String| {
        Error::Script(format!(
            "plugin {} ({}): on_oom returned {what}",
            p.lib.name,
            p.lib.path.display()
        ))
    };
    Ok(match a.action {
        abi::ACTION_DEFAULT => None,
        abi::ACTION_SPLIT => Some(Action::Split(
            (a.micro_batch > 0).then_some(a.micro_batch as usize),
        )),
        abi::ACTION_RETRY => Some(Action::Retry),
        abi::ACTION_SKIP => Some(Action::Skip),
        abi::ACTION_STOP => Some(Action::Stop(format!(
            "the OOM policy plugin {} stopped the run",
            p.lib.name
        ))),
        abi::ACTION_PRECISION => match precision_of(a.precision) {
            Some(prec) => Some(Action::Precision(prec)),
            None => {
                return Err(bad(format!(
                "the precision action with unknown precision {} (TAPER_PRECISION_F32, _BF16, _F16)",
                a.precision
            )))
            }
        },
        abi::ACTION_RECOMPUTE => Some(Action::Recompute(a.every.max(1) as usize)),
        abi::ACTION_OFFLOAD => Some(Action::Offload),
        other => return Err(bad(format!("unknown action {other}"))),
    })
}
