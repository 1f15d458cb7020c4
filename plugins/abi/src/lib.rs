//! The C ABI of taper strategy plugins (version 1), and [`export!`], which
//! turns a Rust type implementing [`Plugin`] into a plugin.
//!
//! A plugin is a shared library exporting one entry symbol per ABI major
//! version, `taper_plugin_v1`, which returns a pointer to a static
//! [`Descriptor`]. The descriptor starts with the ABI version and its own
//! size, so that later versions may only append fields. Only `#[repr(C)]`
//! types cross the boundary: no Rust `String`, `Vec`, `Box<dyn _>` or
//! `Result`. Every call returns a [`Status`] and, on failure, writes a
//! message into the host's [`ErrorBuf`]. `export!` wraps each call in
//! `catch_unwind`, so that a panic becomes [`STATUS_PANIC`] with its message.
//!
//! The same ABI in C: `plugins/include/taper_plugin.h` (a test checks that
//! the two agree on every size and offset).
//!
//! Threading: the host serializes calls into one plugin instance (the state
//! returned by `create`), but may make them from different threads (a data
//! transform runs on the prefetch thread).

use std::ffi::{c_char, c_void};

/// The ABI version this crate describes; the entry symbol is `taper_plugin_v1`.
pub const ABI_VERSION: u32 = 1;
/// The entry symbol's name, NUL-terminated.
pub const ENTRY_SYMBOL: &[u8] = b"taper_plugin_v1\0";

/// The result of every call: 0 is success.
pub type Status = i32;
pub const STATUS_OK: Status = 0;
/// The call failed; the message is in the error buffer.
pub const STATUS_ERROR: Status = 1;
/// The call panicked (Rust) or aborted its work; the message is in the buffer.
pub const STATUS_PANIC: Status = 2;

/// Strategy kinds, as bits of [`Descriptor::kinds`].
pub const KIND_OOM_POLICY: u32 = 1;
pub const KIND_SCHEDULE: u32 = 2;
pub const KIND_TRANSFORM: u32 = 4;

/// A borrowed UTF-8 string (not NUL-terminated).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Str {
    pub ptr: *const u8,
    pub len: usize,
}

impl Str {
    pub fn new(s: &str) -> Str {
        Str {
            ptr: s.as_ptr(),
            len: s.len(),
        }
    }
    /// # Safety
    /// `ptr` must point at `len` readable bytes for the returned lifetime.
    pub unsafe fn as_str<'a>(&self) -> Result<&'a str, std::str::Utf8Error> {
        if self.len == 0 {
            return Ok("");
        }
        std::str::from_utf8(std::slice::from_raw_parts(self.ptr, self.len))
    }
}

/// A host-owned buffer for an error message: the plugin writes at most
/// `cap` bytes of UTF-8 and sets `len`.
#[repr(C)]
pub struct ErrorBuf {
    pub ptr: *mut u8,
    pub cap: usize,
    pub len: usize,
}

impl ErrorBuf {
    /// Writes `msg`, cut at a character boundary to fit.
    pub fn write(&mut self, msg: &str) {
        let mut n = msg.len().min(self.cap);
        while !msg.is_char_boundary(n) {
            n -= 1;
        }
        if !self.ptr.is_null() {
            // SAFETY: the host gave `cap` writable bytes at `ptr`.
            unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), self.ptr, n) };
        }
        self.len = n;
    }
}

/// Where in the step an OOM happened.
pub const PHASE_FORWARD: u32 = 0;
pub const PHASE_BACKWARD: u32 = 1;
pub const PHASE_OPTIMIZER: u32 = 2;
/// Since ABI 1.1.
pub const PHASE_UPLOAD: u32 = 3;
pub const PHASE_ACCUMULATE: u32 = 4;
pub const PHASE_EVAL: u32 = 5;
/// What raised it.
pub const CAUSE_DEVICE: u32 = 0;
pub const CAUSE_BUDGET: u32 = 1;
pub const CAUSE_INJECTED: u32 = 2;

/// An out-of-memory event, as the Lua policies see it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OomEvent {
    pub phase: u32,
    pub cause: u32,
    /// The step that failed (1-based).
    pub step: u64,
    pub epoch: u64,
    pub batch_size: u64,
    /// The micro-batch that ran out of memory.
    pub micro_batch: u64,
    /// 1 for the first attempt at this step.
    pub attempt: u32,
    pub _pad: u32,
    /// Host heap bytes (counting allocator).
    pub memory_used: u64,
    pub memory_peak: u64,
    /// The memory budget, 0 when none.
    pub memory_limit: u64,
    // Appended in ABI 1.1: a plugin built against 1.0 reads the fields above.
    /// Bytes the failed allocation asked for; 0 when unknown.
    pub requested: u64,
    /// On a GPU, the driver's figures; 0 on the CPU.
    pub device_used: u64,
    pub device_free: u64,
    pub device_total: u64,
    /// `PRECISION_*`: what forward and backward ran in.
    pub precision: u32,
    pub _pad2: u32,
    // Appended in ABI 1.2.
    /// Every how many blocks the backward recomputed; 0 for none.
    pub recompute: u32,
    /// 1 when AdamW's moments were offloaded.
    pub offload: u32,
}

pub const PRECISION_UNSET: u32 = 0;
pub const PRECISION_F32: u32 = 1;
pub const PRECISION_BF16: u32 = 2;
pub const PRECISION_F16: u32 = 3;

pub const ACTION_DEFAULT: u32 = 0;
pub const ACTION_SPLIT: u32 = 1;
pub const ACTION_RETRY: u32 = 2;
pub const ACTION_SKIP: u32 = 3;
pub const ACTION_STOP: u32 = 4;
/// Since ABI 1.1: switch to `precision` (`PRECISION_*`), then retry.
pub const ACTION_PRECISION: u32 = 5;
/// Since ABI 1.2: recompute every `every` blocks (0: every block), then retry.
pub const ACTION_RECOMPUTE: u32 = 6;
/// Since ABI 1.2: offload AdamW's moments out of memory, then retry.
pub const ACTION_OFFLOAD: u32 = 7;

/// A policy's answer. `ACTION_DEFAULT` lets the host decide (halve the
/// micro-batch). `micro_batch` 0 with `ACTION_SPLIT` means half. The host
/// zeroes the whole struct before the call: a plugin built against ABI 1.0
/// writes only the first fields.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OomAction {
    pub action: u32,
    pub _pad: u32,
    pub micro_batch: u64,
    // Appended in ABI 1.1.
    /// With `ACTION_PRECISION`: `PRECISION_*`.
    pub precision: u32,
    pub _pad2: u32,
    // Appended in ABI 1.2.
    /// With `ACTION_RECOMPUTE`: every how many blocks (0: every block).
    pub every: u64,
}

impl OomAction {
    pub fn split(micro_batch: u64) -> OomAction {
        OomAction {
            action: ACTION_SPLIT,
            micro_batch,
            ..OomAction::default()
        }
    }
    pub fn of(action: u32) -> OomAction {
        OomAction {
            action,
            ..OomAction::default()
        }
    }
    /// Since ABI 1.1.
    pub fn precision(precision: u32) -> OomAction {
        OomAction {
            action: ACTION_PRECISION,
            precision,
            ..OomAction::default()
        }
    }
    /// Since ABI 1.2.
    pub fn recompute(every: u64) -> OomAction {
        OomAction {
            action: ACTION_RECOMPUTE,
            every,
            ..OomAction::default()
        }
    }
}

/// After each successful step (for policies that grow the micro-batch back).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StepInfo {
    pub step: u64,
    pub micro_batch: u64,
    pub batch_size: u64,
    /// Successful steps since the last OOM.
    pub clean_steps: u64,
    // Appended in ABI 1.2.
    /// The step's measured heap peak (counting allocator); 0 when not counted.
    pub peak: u64,
    /// The memory budget; 0 when none.
    pub limit: u64,
}

/// A plan for one step; fields left at their "unset" value (NaN, 0) leave
/// the host's default.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    /// Learning rate; NaN for unset.
    pub lr: f64,
    /// Samples per micro-batch; 0 for unset.
    pub micro_batch: u64,
    /// Samples in the step's batch; 0 for unset.
    pub batch_size: u64,
}

impl Default for Plan {
    fn default() -> Plan {
        Plan {
            lr: f64::NAN,
            micro_batch: 0,
            batch_size: 0,
        }
    }
}

pub const DTYPE_F32: u32 = 0;
pub const DTYPE_U32: u32 = 1;
pub const MAX_DIMS: usize = 6;

/// A host-owned tensor on the CPU, row-major and contiguous. A transform
/// may change the values in place, not the shape.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TensorView {
    pub data: *mut c_void,
    pub dtype: u32,
    pub ndim: u32,
    pub shape: [u64; MAX_DIMS],
}

impl TensorView {
    pub fn len(&self) -> usize {
        self.shape[..self.ndim as usize].iter().product::<u64>() as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The values, when the dtype is f32.
    ///
    /// # Safety
    /// The view must come from the host, for the duration of the call.
    pub unsafe fn f32_mut<'a>(&mut self) -> Option<&'a mut [f32]> {
        (self.dtype == DTYPE_F32)
            .then(|| std::slice::from_raw_parts_mut(self.data as *mut f32, self.len()))
    }
    /// The values, when the dtype is u32.
    ///
    /// # Safety
    /// The view must come from the host, for the duration of the call.
    pub unsafe fn u32_mut<'a>(&mut self) -> Option<&'a mut [u32]> {
        (self.dtype == DTYPE_U32)
            .then(|| std::slice::from_raw_parts_mut(self.data as *mut u32, self.len()))
    }
}

/// One batch for a transform: inputs, targets, and which samples they are
/// (so that a random transform can be a function of (seed, epoch, sample)).
#[repr(C)]
#[derive(Debug)]
pub struct BatchView {
    pub x: TensorView,
    pub y: TensorView,
    pub indices: *const u64,
    pub size: u64,
    pub epoch: u64,
}

impl BatchView {
    /// # Safety
    /// The view must come from the host, for the duration of the call.
    pub unsafe fn indices<'a>(&self) -> &'a [u64] {
        if self.size == 0 {
            return &[];
        }
        std::slice::from_raw_parts(self.indices, self.size as usize)
    }
}

pub type CreateFn =
    unsafe extern "C" fn(config_json: Str, state: *mut *mut c_void, err: *mut ErrorBuf) -> Status;
pub type DestroyFn = unsafe extern "C" fn(state: *mut c_void);
pub type OnOomFn = unsafe extern "C" fn(
    state: *mut c_void,
    event: *const OomEvent,
    action: *mut OomAction,
    err: *mut ErrorBuf,
) -> Status;
/// `plan` comes in unset; the plugin fills what it decides.
pub type OnStepFn = unsafe extern "C" fn(
    state: *mut c_void,
    info: *const StepInfo,
    plan: *mut Plan,
    err: *mut ErrorBuf,
) -> Status;
pub type ScheduleFn = unsafe extern "C" fn(
    state: *mut c_void,
    step: u64,
    epoch: u64,
    plan: *mut Plan,
    err: *mut ErrorBuf,
) -> Status;
pub type TransformFn =
    unsafe extern "C" fn(state: *mut c_void, batch: *mut BatchView, err: *mut ErrorBuf) -> Status;

/// What `taper_plugin_v1` returns: static data describing the plugin.
/// Append-only: a later ABI adds fields at the end and raises `size`.
#[repr(C)]
pub struct Descriptor {
    pub abi_version: u32,
    /// `size_of::<Descriptor>()` as the plugin was compiled.
    pub size: u32,
    /// NUL-terminated UTF-8.
    pub name: *const c_char,
    pub version: *const c_char,
    /// `KIND_*` bits.
    pub kinds: u32,
    pub _pad: u32,
    pub create: Option<CreateFn>,
    pub destroy: Option<DestroyFn>,
    pub on_oom: Option<OnOomFn>,
    pub on_step: Option<OnStepFn>,
    pub schedule: Option<ScheduleFn>,
    pub transform: Option<TransformFn>,
}

// The descriptor is immutable static data.
unsafe impl Sync for Descriptor {}

/// The type of the entry symbol.
pub type EntryFn = unsafe extern "C" fn() -> *const Descriptor;

mod export;
pub use export::{glue, guard, Plugin};
