//! Out-of-memory errors: one place classifies them, whatever their source
//! ([`classify`] for the device's, [`check`] for the budget and injected
//! faults).
//!
//! - **device**: a real CUDA out-of-memory. candle returns it as
//!   `Error::Cuda(..)` holding `CUDA_ERROR_OUT_OF_MEMORY` (or cuBLAS'
//!   `CUBLAS_STATUS_ALLOC_FAILED`), possibly wrapped in backtrace, context or
//!   path layers, which [`classify`] unwraps.
//! - **budget**: the run's memory limit was exceeded, measured at phase
//!   boundaries (a soft OOM, so that a CPU run exercises the whole path).
//! - **injected**: a fault injected by `--inject-oom` or `run:inject_oom{}`.

use serde::{Deserialize, Serialize};

/// Where the memory ran out: every phase of a step that allocates, and
/// evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The batch copied to the device (and cast to the working precision).
    Upload,
    Forward,
    Backward,
    /// Adding a micro-batch's gradients into the step's, and reading its
    /// loss back.
    Accumulate,
    /// Master gradients, clipping and the update (before any parameter
    /// changes).
    Optimizer,
    /// Evaluation (`run:evaluate`): no training state is involved.
    Eval,
}

impl Phase {
    pub const ALL: [Phase; 6] = [
        Phase::Upload,
        Phase::Forward,
        Phase::Backward,
        Phase::Accumulate,
        Phase::Optimizer,
        Phase::Eval,
    ];
    /// The names, for messages: `upload, forward, ...`.
    pub const NAMES: &'static str = "upload, forward, backward, accumulate, optimizer or eval";

    pub fn name(self) -> &'static str {
        match self {
            Phase::Upload => "upload",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Accumulate => "accumulate",
            Phase::Optimizer => "optimizer",
            Phase::Eval => "eval",
        }
    }
    pub fn parse(s: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.name() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomCause {
    Device,
    Budget,
    Injected,
}

impl OomCause {
    pub const ALL: [OomCause; 3] = [OomCause::Device, OomCause::Budget, OomCause::Injected];
    pub fn parse(s: &str) -> Option<OomCause> {
        OomCause::ALL.into_iter().find(|c| c.name() == s)
    }
    pub fn name(self) -> &'static str {
        match self {
            OomCause::Device => "device",
            OomCause::Budget => "budget",
            OomCause::Injected => "injected",
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("out of memory ({}) in the {} phase: {detail}", cause.name(), phase.name())]
pub struct OomError {
    pub phase: Phase,
    pub cause: OomCause,
    pub detail: String,
    /// Bytes the failed allocation asked for, when known.
    pub requested: Option<u64>,
}

/// Whether a candle error is a device out-of-memory, looking through the
/// layers candle wraps errors in.
pub fn is_device_oom(e: &candle_core::Error) -> bool {
    use candle_core::Error as E;
    match e {
        E::WithBacktrace { inner, .. } | E::Context { inner, .. } | E::WithPath { inner, .. } => {
            is_device_oom(inner)
        }
        E::Cuda(inner) => oom_text(&inner.to_string()),
        E::WrappedContext { wrapped, .. } => oom_text(&wrapped.to_string()),
        E::Wrapped(inner) => oom_text(&inner.to_string()),
        _ => false,
    }
}

fn oom_text(s: &str) -> bool {
    s.contains("CUDA_ERROR_OUT_OF_MEMORY") || s.contains("CUBLAS_STATUS_ALLOC_FAILED")
}

/// Where a phase-boundary check happens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct At {
    /// The step (1-based; in evaluation, the next step).
    pub step: u64,
    pub attempt: u32,
    pub phase: Phase,
}

/// The OOMs that are not the device's, checked at the end of each phase: an
/// injected fault due here, or a heap peak (since the attempt began) over
/// the budget.
pub fn check(
    injections: &mut [super::inject::Injection],
    budget: Option<usize>,
    at: At,
) -> Result<(), OomError> {
    let At {
        step,
        attempt,
        phase,
    } = at;
    // An injection fires `times` times in all: a batch the policy skips
    // does not advance the step, and must not meet the same fault again.
    if let Some(i) = injections.iter_mut().find(|i| {
        i.step == step
            && i.phase == phase
            && i.times > 0
            && i.rank.is_none_or(|r| r == crate::dist::rank())
    }) {
        i.times -= 1;
        return Err(OomError {
            phase,
            cause: OomCause::Injected,
            detail: format!("injected at step {step}, attempt {attempt}"),
            requested: None,
        });
    }
    if let Some(limit) = budget {
        let peak = super::HostMemory::peak();
        if peak > limit {
            // The allocation that crossed the limit.
            let requested = super::HostMemory::take_crossing().map(|b| b as u64);
            let asked = requested
                .map(|b| format!(" (an allocation of {b} B crossed it)"))
                .unwrap_or_default();
            return Err(OomError {
                phase,
                cause: OomCause::Budget,
                detail: format!("peak {peak} B exceeds the limit of {limit} B{asked}"),
                requested,
            });
        }
    }
    Ok(())
}

thread_local! {
    /// The bytes of the last device allocation of taper's own kernels that
    /// failed on this thread, until [`classify`] takes it.
    static FAILED_ALLOC: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Notes that a device allocation of `bytes` failed here. taper's CUDA
/// kernels call it, so that a device OOM in one of them says what it asked
/// for; the driver's error does not, and candle's own allocations (its
/// matmuls and element-wise ops) do not note theirs, so their OOMs have no
/// `requested`.
pub fn note_failed_alloc(bytes: u64) {
    FAILED_ALLOC.with(|f| f.set(Some(bytes)));
}

/// Turns `e` into an [`OomError`] when it is one; otherwise gives it back.
pub fn classify(e: crate::Error, phase: Phase) -> crate::Error {
    // Taken whatever `e` is: a noted failure belongs to this error or to
    // none (it must not be reported for a later OOM).
    let noted = FAILED_ALLOC.with(|f| f.take());
    match e {
        crate::Error::Candle(c) if is_device_oom(&c) => crate::Error::Oom(OomError {
            phase,
            cause: OomCause::Device,
            detail: c.to_string().lines().next().unwrap_or_default().to_string(),
            requested: noted,
        }),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct FakeDriver(&'static str);
    impl std::fmt::Display for FakeDriver {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for FakeDriver {}

    #[test]
    fn unwraps_candle_layers() {
        // As cudarc reports it, inside candle's wrappers.
        let cuda = candle_core::Error::Cuda(Box::new(FakeDriver(
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")",
        )));
        let wrapped = cuda.context("allocating the activations").bt();
        assert!(is_device_oom(&wrapped));
        let blas = candle_core::Error::Cuda(Box::new(FakeDriver(
            "cublas error: CUBLAS_STATUS_ALLOC_FAILED",
        )));
        assert!(is_device_oom(&blas.with_path("model.safetensors")));
        let other = candle_core::Error::Cuda(Box::new(FakeDriver("CUDA_ERROR_ILLEGAL_ADDRESS")));
        assert!(!is_device_oom(&other));
        assert!(!is_device_oom(&candle_core::Error::Msg(
            "out of memory".into()
        )));
        match classify(crate::Error::Candle(wrapped), Phase::Backward) {
            crate::Error::Oom(o) => {
                assert_eq!((o.phase, o.cause), (Phase::Backward, OomCause::Device));
                assert_eq!(o.requested, None, "nobody noted an allocation");
            }
            other => panic!("not classified: {other}"),
        }
    }

    /// A failed allocation that taper's kernels noted is the OOM's
    /// `requested`, once: the next OOM (from candle's own allocations, which
    /// note nothing) has none.
    #[test]
    fn a_noted_allocation_is_requested_once() {
        let oom = || {
            crate::Error::Candle(candle_core::Error::Cuda(Box::new(FakeDriver(
                "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")",
            ))))
        };
        let requested = |e| match e {
            crate::Error::Oom(o) => o.requested,
            other => panic!("not classified: {other}"),
        };
        note_failed_alloc(3 << 20);
        assert_eq!(requested(classify(oom(), Phase::Forward)), Some(3 << 20));
        assert_eq!(requested(classify(oom(), Phase::Forward)), None);
        // A note followed by another error is dropped with it.
        note_failed_alloc(7);
        let other = classify(crate::Error::Config("x".into()), Phase::Forward);
        assert!(matches!(other, crate::Error::Config(_)));
        assert_eq!(requested(classify(oom(), Phase::Forward)), None);
    }
}
