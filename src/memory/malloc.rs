//! glibc malloc tuning for candle on the CPU.
//!
//! candle allocates a fresh output buffer for every op. With glibc's defaults,
//! buffers above the (dynamic) mmap threshold are mmapped and unmapped on free,
//! and freed heap tops are trimmed back to the OS, so the next op page-faults
//! fresh zeroed pages: measured on this project's 2-core machine, 29% of a
//! candle training step was kernel page-fault time. Raising the mmap threshold
//! to its maximum and the trim threshold far above it keeps those pages in the
//! process for reuse. The cost is that freed memory is returned to the OS
//! later (RSS stays near its peak); the counting allocator still reports the
//! live bytes exactly.
//!
//! Under a memory limit, where resident memory is what the kernel kills
//! for, glibc keeps one arena instead of one per thread: a GPT step of 338
//! MiB counted heap was 520 MiB resident with an arena per thread and 397
//! MiB with one, at the same speed (2-core machine). The limit is a
//! container's, or the machine's memory outside one (a run plans under
//! either): with an arena per thread, the same Shakespeare run planned under
//! a 600 MiB machine peaked anywhere from 480 MiB to past 600 MiB (killed) as
//! threads met, and at 461-474 MiB with one.

use std::sync::atomic::{AtomicBool, Ordering};

/// glibc caps M_MMAP_THRESHOLD at HEAP_MAX_SIZE / 2 = 32 MiB on 64-bit.
const MMAP_THRESHOLD: i32 = 32 << 20;
const TRIM_THRESHOLD: i32 = 1 << 30;
/// Arenas under a memory limit.
const CONTAINED_ARENAS: i32 = 1;

static TUNED: AtomicBool = AtomicBool::new(false);

/// Applies the tuning once per process, before threads start. Returns
/// whether it is in effect (false on non-glibc targets).
pub fn tune_malloc() -> bool {
    if TUNED.swap(true, Ordering::SeqCst) {
        return true;
    }
    apply()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() -> bool {
    // SAFETY: mallopt only changes allocator parameters; it is safe to call at
    // any time, and these values are within glibc's documented ranges.
    let tuned = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    };
    if super::container::detect_any().is_some() {
        // SAFETY: as above; M_ARENA_MAX only bounds arenas made from now on.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, CONTAINED_ARENAS) };
    }
    tuned
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() -> bool {
    let _ = (MMAP_THRESHOLD, TRIM_THRESHOLD, CONTAINED_ARENAS);
    false
}
