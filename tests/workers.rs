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

/// candle's element-wise ops over 64K values or more split their work on
/// a pool of candle's own, whose threads spin for work on the cores the
/// command's pool uses. On a worker they take the command's pool instead
/// (the vendored candle's fourth change): no `candle-bp` thread is made.
#[test]
fn candles_element_wise_ops_share_the_pool() -> anyhow::Result<()> {
    use candle_core::{Device, Tensor};
    let n = 200_000;
    let (sum, exp) = taper::engine::run_on_workers(|| -> candle_core::Result<_> {
        let a = Tensor::arange(0f32, n as f32, &Device::Cpu)?;
        let b = (a.ones_like()? * 0.5)?;
        let sum = (&a + &b)?.to_vec1::<f32>()?;
        let exp = (&b * -1.0)?.exp()?.to_vec1::<f32>()?;
        Ok((sum, exp))
    })?;
    assert!(sum.iter().enumerate().all(|(i, &v)| v == i as f32 + 0.5));
    assert!(exp.iter().all(|&v| v == (-0.5f32).exp()));
    if rayon::current_num_threads() >= 2 {
        let mut names = Vec::new();
        for task in std::fs::read_dir("/proc/self/task")? {
            // A thread of the other test may end between the listing and
            // the read: its entry is then gone, and it was no candle thread.
            match std::fs::read_to_string(task?.path().join("comm")) {
                Ok(name) => names.push(name),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        assert!(
            !names.iter().any(|n| n.starts_with("candle-bp")),
            "{names:?}"
        );
    }
    Ok(())
}
