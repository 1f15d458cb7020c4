//! Writing a plugin in Rust: the [`Plugin`] trait, the `extern "C"` glue
//! that calls it with every error and panic caught, and [`export!`](crate::export).

use std::ffi::{c_char, c_void};

use crate::{
    BatchView, Descriptor, ErrorBuf, OomAction, OomEvent, Plan, Status, StepInfo, Str, ABI_VERSION,
    KIND_OOM_POLICY, KIND_SCHEDULE, KIND_TRANSFORM, STATUS_ERROR, STATUS_OK, STATUS_PANIC,
};

/// A plugin written in Rust. Implement the hooks of the kinds you list in
/// `KINDS`; the others are never called.
pub trait Plugin: Sized + Send + 'static {
    /// `KIND_*` bits.
    const KINDS: u32;
    /// Builds the plugin from the recipe's options, as JSON (`{}` when none).
    fn create(config_json: &str) -> Result<Self, String>;
    fn on_oom(&mut self, _event: &OomEvent) -> Result<OomAction, String> {
        Ok(OomAction::default())
    }
    /// May set `plan.micro_batch` to grow the micro-batch back.
    fn on_step(&mut self, _info: &StepInfo, _plan: &mut Plan) -> Result<(), String> {
        Ok(())
    }
    fn schedule(&mut self, _step: u64, _epoch: u64, _plan: &mut Plan) -> Result<(), String> {
        Ok(())
    }
    fn transform(&mut self, _batch: &mut BatchView) -> Result<(), String> {
        Ok(())
    }
}

/// Runs `f`, turning an error or a panic into a status and a message.
///
/// # Safety
/// `err` must be null or point at a valid [`ErrorBuf`].
#[doc(hidden)]
pub unsafe fn guard(err: *mut ErrorBuf, f: impl FnOnce() -> Result<(), String>) -> Status {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    let (status, msg) = match result {
        Ok(Ok(())) => return STATUS_OK,
        Ok(Err(msg)) => (STATUS_ERROR, msg),
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            (STATUS_PANIC, format!("panicked: {msg}"))
        }
    };
    if !err.is_null() {
        // SAFETY: the host passes a valid buffer or null.
        unsafe { (*err).write(&msg) };
    }
    status
}

/// The `extern "C"` functions for a [`Plugin`] type (used by `export!`).
#[doc(hidden)]
pub mod glue {
    use super::*;

    pub unsafe extern "C" fn create<P: Plugin>(
        config: Str,
        state: *mut *mut c_void,
        err: *mut ErrorBuf,
    ) -> Status {
        guard(err, || {
            let cfg = config
                .as_str()
                .map_err(|e| format!("config is not UTF-8: {e}"))?;
            let p = P::create(cfg)?;
            *state = Box::into_raw(Box::new(p)) as *mut c_void;
            Ok(())
        })
    }
    pub unsafe extern "C" fn destroy<P: Plugin>(state: *mut c_void) {
        if !state.is_null() {
            let _ = std::panic::catch_unwind(|| drop(Box::from_raw(state as *mut P)));
        }
    }
    pub unsafe extern "C" fn on_oom<P: Plugin>(
        state: *mut c_void,
        event: *const OomEvent,
        action: *mut OomAction,
        err: *mut ErrorBuf,
    ) -> Status {
        guard(err, || {
            *action = (*(state as *mut P)).on_oom(&*event)?;
            Ok(())
        })
    }
    pub unsafe extern "C" fn on_step<P: Plugin>(
        state: *mut c_void,
        info: *const StepInfo,
        plan: *mut Plan,
        err: *mut ErrorBuf,
    ) -> Status {
        guard(err, || (*(state as *mut P)).on_step(&*info, &mut *plan))
    }
    pub unsafe extern "C" fn schedule<P: Plugin>(
        state: *mut c_void,
        step: u64,
        epoch: u64,
        plan: *mut Plan,
        err: *mut ErrorBuf,
    ) -> Status {
        guard(err, || {
            (*(state as *mut P)).schedule(step, epoch, &mut *plan)
        })
    }
    pub unsafe extern "C" fn transform<P: Plugin>(
        state: *mut c_void,
        batch: *mut BatchView,
        err: *mut ErrorBuf,
    ) -> Status {
        guard(err, || (*(state as *mut P)).transform(&mut *batch))
    }

    pub const fn descriptor<P: Plugin>(name: *const c_char, version: *const c_char) -> Descriptor {
        let k = P::KINDS;
        Descriptor {
            abi_version: ABI_VERSION,
            size: std::mem::size_of::<Descriptor>() as u32,
            name,
            version,
            kinds: k,
            _pad: 0,
            create: Some(create::<P>),
            destroy: Some(destroy::<P>),
            on_oom: if k & KIND_OOM_POLICY != 0 {
                Some(on_oom::<P>)
            } else {
                None
            },
            on_step: if k & KIND_OOM_POLICY != 0 {
                Some(on_step::<P>)
            } else {
                None
            },
            schedule: if k & KIND_SCHEDULE != 0 {
                Some(schedule::<P>)
            } else {
                None
            },
            transform: if k & KIND_TRANSFORM != 0 {
                Some(transform::<P>)
            } else {
                None
            },
        }
    }
}

/// Exports a [`Plugin`] type as a taper plugin:
///
/// ```
/// use taper_plugin::{OomAction, OomEvent, Plugin, KIND_OOM_POLICY};
///
/// struct Halve;
///
/// impl Plugin for Halve {
///     const KINDS: u32 = KIND_OOM_POLICY;
///     fn create(_config_json: &str) -> Result<Self, String> {
///         Ok(Halve)
///     }
///     fn on_oom(&mut self, ev: &OomEvent) -> Result<OomAction, String> {
///         Ok(OomAction::split(ev.micro_batch / 2))
///     }
/// }
///
/// taper_plugin::export!(Halve, name = "halve");
///
/// // What the host reads first:
/// let d = unsafe { &*taper_plugin_v1() };
/// assert_eq!((d.abi_version, d.kinds), (taper_plugin::ABI_VERSION, KIND_OOM_POLICY));
/// assert!(d.on_oom.is_some() && d.schedule.is_none());
/// ```
///
/// The version is the crate's (`CARGO_PKG_VERSION`). Build the crate as a
/// `cdylib`.
#[macro_export]
macro_rules! export {
    ($ty:ty, name = $name:literal) => {
        #[no_mangle]
        pub extern "C" fn taper_plugin_v1() -> *const $crate::Descriptor {
            static DESCRIPTOR: $crate::Descriptor = $crate::glue::descriptor::<$ty>(
                concat!($name, "\0").as_ptr() as *const ::std::ffi::c_char,
                concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const ::std::ffi::c_char,
            );
            &DESCRIPTOR
        }
    };
}
