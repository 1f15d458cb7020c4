//! The command runs on a worker of the CPU pool, as the binary runs it
//! (`taper::engine::run_on_workers`). Its own test binary: the global pool
//! is built once per process, so no other test may have built it first.

use rayon::prelude::*;

#[test]
fn the_command_runs_on_a_pool_worker_and_shares_its_pool() {
    let threads = rayon::ThreadPoolBuilder::new()
        .build()
        .map(|p| p.current_num_threads())
        .unwrap_or(1);
    let (name, index, deep, sum) = taper::engine::run_on_workers(|| {
        // A recursion deeper than a 2 MiB stack holds: the command gets a
        // stack at least as large as the main thread's.
        fn depth(n: u64) -> u64 {
            let pad = std::hint::black_box([n; 64]);
            if n == 0 {
                0
            } else {
                1 + depth(n - 1) + pad[63] - n
            }
        }
        let sum: u64 = (0..100_000u64).into_par_iter().map(|i| i % 7).sum();
        let me = std::thread::current();
        (
            me.name().map(str::to_owned),
            rayon::current_thread_index(),
            // (On one CPU the caller's 2 MiB test thread runs it.)
            if threads >= 2 { depth(8_000) } else { 8_000 },
            sum,
        )
    });
    assert_eq!(sum, (0..100_000u64).map(|i| i % 7).sum::<u64>());
    assert_eq!(deep, 8_000);
    if threads >= 2 {
        assert!(index.is_some(), "ran off the pool");
        assert!(
            name.as_deref().is_some_and(|n| n.starts_with("taper-cpu-")),
            "ran on {name:?}"
        );
        assert_eq!(rayon::current_num_threads(), threads);
    } else {
        assert_eq!(index, None, "one CPU: runs on the caller");
    }
}
