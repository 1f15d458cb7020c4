//! A global allocator that counts live and peak bytes. The `taper` binary
//! installs it; an embedder may install it too. When it is not installed the
//! counters stay at zero and [`HostMemory::is_counting`] says so.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// A memory budget being watched (usize::MAX: none), and the size of the
/// first allocation that took the heap over it since the peak was reset:
/// what a budget OOM "requested".
static LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);
static CROSSING: AtomicUsize = AtomicUsize::new(0);

/// `#[global_allocator] static A: taper::memory::CountingAlloc = taper::memory::CountingAlloc;`
pub struct CountingAlloc;

impl CountingAlloc {
    #[inline]
    fn add(n: usize) {
        let now = CURRENT.fetch_add(n, Ordering::Relaxed) + n;
        PEAK.fetch_max(now, Ordering::Relaxed);
        if now > LIMIT.load(Ordering::Relaxed) {
            let _ = CROSSING.compare_exchange(0, n, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
}

// SAFETY: every method forwards to `System` unchanged; the counters are
// bookkeeping only and never affect the pointers returned.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ACTIVE.store(true, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            Self::add(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ACTIVE.store(true, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            Self::add(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
            Self::add(new_size);
        }
        p
    }
}

/// Reads the counters of [`CountingAlloc`].
pub struct HostMemory;

impl HostMemory {
    /// Whether the counting allocator is installed in this process.
    pub fn is_counting() -> bool {
        ACTIVE.load(Ordering::Relaxed)
    }
    /// Bytes currently allocated on the heap.
    pub fn current() -> usize {
        CURRENT.load(Ordering::Relaxed)
    }
    /// Highest `current()` since start or since the last [`HostMemory::reset_peak`].
    pub fn peak() -> usize {
        PEAK.load(Ordering::Relaxed)
    }
    /// Starts a new peak window at the current level (and forgets which
    /// allocation crossed the limit).
    pub fn reset_peak() {
        PEAK.store(CURRENT.load(Ordering::Relaxed), Ordering::Relaxed);
        CROSSING.store(0, Ordering::Relaxed);
    }
    /// Watches `limit`: the first allocation that takes the heap over it is
    /// remembered (see [`HostMemory::take_crossing`]). None stops watching.
    pub fn set_limit(limit: Option<usize>) {
        LIMIT.store(limit.unwrap_or(usize::MAX), Ordering::Relaxed);
    }
    /// The size of the first allocation that took the heap over the limit
    /// since the peak was reset, if one did; forgets it.
    pub fn take_crossing() -> Option<usize> {
        Some(CROSSING.swap(0, Ordering::Relaxed)).filter(|&n| n > 0)
    }
}
