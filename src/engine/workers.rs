//! Running the whole command on a worker of the CPU thread pool.
//!
//! candle's matmul (gemm) and taper's CPU kernels split their work over
//! rayon's global pool, which has one worker per core. Called from the
//! main thread, every parallel section is handed to the pool through its
//! queue and the main thread sleeps until it is done; between sections the
//! workers spin looking for work, competing for the cores with the main
//! thread that runs the step's serial parts (one more thread than cores).
//! Run on a worker instead, the caller takes a share of each section
//! itself and the process has only as many busy threads as cores. candle
//! offers the same idea per call (`Device::with_context`, its own pool);
//! here it covers the whole command, so the Lua recipe, the data threads
//! and the kernels share one pool. candle's element-wise ops, which run
//! on a pool of candle's own from other threads, run on this one too
//! (`vendor/README.md`). Measured on the 2-core machine:
//! `docs/performance.md`.

use std::sync::OnceLock;

/// Stack size of the pool's threads: the command runs on one of them, so
/// it gets what the main thread would have (Linux's default 8 MiB) and
/// room to spare for deep Lua calls or long graphs. Only the pages used
/// are committed.
const STACK: usize = 32 << 20;

/// Runs `f` on a worker of rayon's global pool, built here with rayon's
/// usual thread count (`RAYON_NUM_THREADS`, else the CPUs this process
/// may use), and returns its result; a panic in `f` resumes on the caller.
///
/// Runs `f` on the calling thread instead when the pool has a single
/// thread (nothing to gain, and a data thread's parallel section would
/// wait on the one worker while that worker waits for the data), or when
/// the global pool was already built (its stacks may be too small).
pub fn run_on_workers<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    // Whether this process's global pool is the one built here.
    static OURS: OnceLock<bool> = OnceLock::new();
    let ours = *OURS.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .stack_size(STACK)
            .thread_name(|i| format!("taper-cpu-{i}"))
            .build_global()
            .is_ok()
    });
    if !ours || rayon::current_num_threads() < 2 {
        return f();
    }
    rayon::scope(|_| f())
}
