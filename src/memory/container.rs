//! The memory limit this process runs under: the limit of its container
//! (the cgroup's `memory.max` in cgroup v2 or `memory.limit_in_bytes` in v1,
//! the smallest along the path to the hierarchy's root), or outside one the
//! machine's memory (`/proc/meminfo`). Past it the kernel kills the process
//! (SIGKILL: no checkpoint, nothing to recover) or, where the machine has
//! swap, pages until the run crawls; below it, taper turns a step that grows
//! too large into an OOM its policy recovers from.

use std::path::{Path, PathBuf};

/// A memory limit and what is held under it besides the heap.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryLimit {
    /// The limit, in bytes.
    pub limit: usize,
    /// Memory the kernel cannot hand out, all processes' (in a cgroup its
    /// anonymous memory; on the machine `MemTotal - MemAvailable`, less
    /// free swap, see [`machine`]): page cache, which the kernel reclaims,
    /// is not held.
    /// [`MemoryLimit::others`] takes this process's own share out.
    pub held: usize,
    /// The file the limit was read from, for messages.
    pub file: PathBuf,
    pub whose: Whose,
}

/// Whose limit a [`MemoryLimit`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whose {
    /// A cgroup's: a container, a Slurm job, a systemd unit.
    Container,
    /// The machine's memory: no cgroup sets a smaller limit.
    Machine,
}

/// How this process's resident memory follows its counted heap: about
/// `base + ratio * heap` at a peak. The rest is the allocator's free lists
/// and fragments, thread stacks and the binary, which the heap counter
/// does not see: measured at 1.2 to 1.45 times the heap on a GPT step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Residency {
    pub base: usize,
    pub ratio: f64,
}

impl Residency {
    /// Before a measurement: what is resident beyond the heap now, and half
    /// again the heap's peak.
    pub fn assumed() -> Residency {
        let heap = super::HostMemory::current();
        Residency {
            base: resident().map_or(0, |r| r.saturating_sub(heap)),
            ratio: 1.5,
        }
    }

    /// The line through (heap peak, resident peak) points, where their
    /// heaps differ enough to tell a slope; a ratio below 1 (noise) is 1.
    pub fn fit(points: &[(usize, usize)]) -> Option<Residency> {
        let (lo, hi) = (points.first()?, points.last()?);
        if hi.0 < lo.0 + lo.0 / 4 {
            return None;
        }
        let ratio = super::planner::line(points).0.max(1.0);
        // The line at that slope through the point highest above it.
        let base = points
            .iter()
            .map(|&(h, r)| r as f64 - ratio * h as f64)
            .fold(0.0, f64::max);
        Some(Residency {
            base: base as usize,
            ratio,
        })
    }
}

/// Limits at or above this are "no limit" (v1 writes a page-rounded
/// `i64::MAX`).
const UNLIMITED: u64 = 1 << 60;

/// The limit this process runs under, if its cgroup sets one below the
/// machine's memory.
pub fn detect() -> Option<MemoryLimit> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let found = detect_in(&cgroups, Path::new("/sys/fs/cgroup"))?;
    let total = machine().map_or(usize::MAX, |m| m.limit);
    (found.limit < total).then_some(found)
}

/// The limit the kernel enforces on this process: its container's
/// ([`detect`]), else the machine's memory ([`machine`]).
pub fn detect_any() -> Option<MemoryLimit> {
    detect().or_else(machine)
}

/// The machine's memory, from `/proc/meminfo`: `MemTotal`, with what is not
/// `MemAvailable` held, less what free swap can take of it: other programs'
/// idle pages go to swap, while a run past the machine's memory would page
/// its own and crawl.
pub fn machine() -> Option<MemoryLimit> {
    machine_in(&std::fs::read_to_string(MEMINFO).ok()?)
}

const MEMINFO: &str = "/proc/meminfo";

/// [`machine`] over a `/proc/meminfo` text. A kernel older than 3.14 gives
/// no `MemAvailable`: its free memory and page cache stand in.
pub fn machine_in(meminfo: &str) -> Option<MemoryLimit> {
    let total = kib_value(meminfo, "MemTotal:")?;
    let available = kib_value(meminfo, "MemAvailable:").or_else(|| {
        let free = kib_value(meminfo, "MemFree:")?;
        Some(free + kib_value(meminfo, "Cached:").unwrap_or(0))
    })?;
    let swap = kib_value(meminfo, "SwapFree:").unwrap_or(0);
    Some(MemoryLimit {
        limit: total,
        held: total.saturating_sub(available).saturating_sub(swap),
        file: PathBuf::from(MEMINFO),
        whose: Whose::Machine,
    })
}

/// [`detect`] over a `/proc/self/cgroup` text and a cgroup mount point. The
/// v1 memory controller is preferred (a hybrid machine lists a v2 line too,
/// with no memory controller in it).
pub fn detect_in(proc_cgroup: &str, mount: &Path) -> Option<MemoryLimit> {
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            let root = mount.join(controllers);
            return smallest(&root, path, "memory.limit_in_bytes", "total_rss");
        }
        if id == "0" && controllers.is_empty() {
            v2 = Some(path.to_string());
        }
    }
    smallest(mount, &v2?, "memory.max", "anon")
}

/// The smallest limit in `file` from the process's cgroup up to `root`.
/// Where the path does not exist under the mount (a container that sees
/// only its own subtree, mounted at the root), the mount's root is the
/// process's cgroup.
fn smallest(root: &Path, path: &str, file: &str, held_key: &str) -> Option<MemoryLimit> {
    let relative = path.trim_start_matches('/');
    let mut dir = root.join(relative);
    if relative.is_empty() || !dir.is_dir() {
        dir = root.to_path_buf();
    }
    let mut best: Option<(u64, PathBuf)> = None;
    loop {
        let limit = std::fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok()) // "max": none
            .filter(|&b| b < UNLIMITED);
        if let Some(b) = limit {
            if best.as_ref().is_none_or(|(m, _)| b < *m) {
                best = Some((b, dir.clone()));
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    let (limit, at) = best?;
    let held = std::fs::read_to_string(at.join("memory.stat"))
        .ok()
        .and_then(|s| stat_value(&s, held_key))
        .unwrap_or(0);
    Some(MemoryLimit {
        limit: limit as usize,
        held: held as usize,
        file: at.join(file),
        whose: Whose::Container,
    })
}

/// `key value` from a `memory.stat` text.
fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

impl MemoryLimit {
    /// What is held outside this process (other processes in the container
    /// or on the machine).
    pub fn others(&self) -> usize {
        self.held.saturating_sub(resident_anonymous().unwrap_or(0))
    }

    /// "the container's limit is 300.0 MiB (/sys/fs/cgroup/...)", "the
    /// machine's memory is 23.54 GiB (/proc/meminfo; 22.96 GiB available)".
    pub fn describe(&self) -> String {
        let human = super::planner::human;
        match self.whose {
            Whose::Container => format!(
                "the container's limit is {} ({})",
                human(self.limit),
                self.file.display()
            ),
            Whose::Machine => format!(
                "the machine's memory is {} ({}; {} available)",
                human(self.limit),
                self.file.display(),
                human(self.limit - self.held)
            ),
        }
    }

    /// The heap budget a run gets under this limit: the limit less a
    /// twentieth, less what other processes hold (`others`), shared by
    /// `local_ranks` processes, and of that what this process's heap may
    /// reach with its resident memory following it as `r` says.
    pub fn heap_budget(&self, others: usize, r: Residency, local_ranks: usize) -> usize {
        let usable = (self.limit - self.limit / 20).saturating_sub(others) / local_ranks.max(1);
        (usable.saturating_sub(r.base) as f64 / r.ratio) as usize
    }
}

/// This process's resident memory (`VmRSS`), in bytes.
pub fn resident() -> Option<usize> {
    status_kib("VmRSS:")
}

/// This process's resident anonymous memory (`RssAnon`), in bytes.
fn resident_anonymous() -> Option<usize> {
    status_kib("RssAnon:")
}

/// This process's resident peak (`VmHWM`) since the last
/// [`reset_resident_peak`], in bytes.
pub fn resident_peak() -> Option<usize> {
    status_kib("VmHWM:")
}

/// Starts a new resident peak at the current resident memory; false where
/// the kernel does not allow it.
pub fn reset_resident_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn status_kib(key: &str) -> Option<usize> {
    kib_value(&std::fs::read_to_string("/proc/self/status").ok()?, key)
}

/// `KEY:   123 kB` from /proc text, in bytes.
fn kib_value(text: &str, key: &str) -> Option<usize> {
    let kib: usize = text
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn reads_the_smallest_v2_limit_up_the_tree() {
        let t = tree(&[
            ("memory.max", "max\n"),
            ("kube/memory.max", "1073741824\n"),
            ("kube/pod/memory.max", "max\n"),
            ("kube/memory.stat", "anon 104857600\nfile 5000\n"),
        ]);
        let got = detect_in("0::/kube/pod\n", t.path()).unwrap();
        assert_eq!(got.limit, 1 << 30);
        assert_eq!(got.held, 100 << 20);
        assert_eq!(got.file, t.path().join("kube/memory.max"));
    }

    #[test]
    fn prefers_the_v1_memory_controller_on_a_hybrid_machine() {
        let t = tree(&[
            ("memory/memory.limit_in_bytes", "9223372036854771712\n"),
            ("memory/job/memory.limit_in_bytes", "419430400\n"),
            (
                "memory/job/memory.stat",
                "cache 4096\nrss 0\ntotal_rss 2097152\n",
            ),
            ("memory.max", "1000\n"),
        ]);
        let text = "9:name=systemd:/\n4:memory:/job\n0::/\n";
        let got = detect_in(text, t.path()).unwrap();
        assert_eq!((got.limit, got.held), (400 << 20, 2 << 20));
    }

    #[test]
    fn a_path_outside_the_mount_is_the_mounts_own_cgroup() {
        // A container sees its own cgroup at the mount's root while
        // /proc/self/cgroup names the host's path to it.
        let t = tree(&[("memory/memory.limit_in_bytes", "2147483648\n")]);
        let got = detect_in("4:memory:/docker/0123abc\n", t.path()).unwrap();
        assert_eq!(got.limit, 2 << 30);
        assert_eq!(got.held, 0);
    }

    #[test]
    fn no_limit_is_none() {
        let t = tree(&[("memory.max", "max\n"), ("a/memory.max", "max\n")]);
        assert_eq!(detect_in("0::/a\n", t.path()), None);
        let t = tree(&[("memory/memory.limit_in_bytes", "9223372036854771712\n")]);
        assert_eq!(detect_in("4:memory:/\n", t.path()), None);
        assert_eq!(detect_in("", t.path()), None);
    }

    #[test]
    fn the_budget_leaves_a_twentieth_others_and_what_the_heap_drags_along() {
        let c = MemoryLimit {
            limit: 1000 << 20,
            held: 0,
            file: PathBuf::new(),
            whose: Whose::Container,
        };
        let r = Residency {
            base: 50 << 20,
            ratio: 1.5,
        };
        // (950 - 50 other - 50 base) / 1.5
        assert_eq!(c.heap_budget(50 << 20, r, 1), 850 * (1 << 20) * 2 / 3);
        // Two ranks: (450 - 50) / 1.5
        assert_eq!(c.heap_budget(50 << 20, r, 2), 400 * (1 << 20) * 2 / 3);
    }

    #[test]
    fn the_machine_holds_what_is_not_available() {
        let info = "MemTotal:       24684096 kB\nMemFree:        20000000 kB\n\
                    MemAvailable:   24077592 kB\nBuffers:          100000 kB\n\
                    Cached:          3000000 kB\nSwapTotal:             0 kB\n";
        let m = machine_in(info).unwrap();
        assert_eq!(m.limit, 24684096 << 10);
        assert_eq!(m.held, (24684096 - 24077592) << 10);
        assert_eq!(m.whose, Whose::Machine);
        assert_eq!(m.file, Path::new("/proc/meminfo"));
        // Swap takes other programs' pages: 2 GiB of swap, 1.5 of it free.
        let swapping = format!("{info}SwapTotal: 2097152 kB\nSwapFree: 1572864 kB\n");
        let swapping = swapping.replace("SwapTotal:             0 kB\n", "");
        let s = machine_in(&swapping).unwrap();
        assert_eq!(s.held, 0);
        let busy = swapping.replace("24077592", "20000000");
        let b = machine_in(&busy).unwrap();
        assert_eq!(b.held, (24684096 - 20000000 - 1572864) << 10);
        // Before MemAvailable (Linux 3.14): free memory and page cache.
        let old = "MemTotal: 1000 kB\nMemFree: 300 kB\nCached: 200 kB\n";
        assert_eq!(machine_in(old).unwrap().held, 500 << 10);
        assert_eq!(machine_in("MemFree: 300 kB\n"), None);
        assert_eq!(
            m.describe(),
            "the machine's memory is 23.54 GiB (/proc/meminfo; 22.96 GiB available)"
        );
    }

    #[test]
    fn the_machine_is_the_limit_outside_a_container() {
        // This machine's own figures: whatever the cgroup, a limit is found.
        let any = detect_any().unwrap();
        let m = machine().unwrap();
        assert!(any.limit <= m.limit);
        assert!(m.held < m.limit);
    }

    #[test]
    fn residency_is_fitted_on_the_probes() {
        let mib = |m: usize| m << 20;
        // resident = 40 MiB + 1.3 x heap
        let points: Vec<_> = [100, 200, 400]
            .iter()
            .map(|&h| (mib(h), mib(40) + mib(h) * 13 / 10))
            .collect();
        let r = Residency::fit(&points).unwrap();
        assert!((r.ratio - 1.3).abs() < 1e-6, "{r:?}");
        assert!(r.base.abs_diff(mib(40)) < 1 << 10, "{r:?}");
        // Heaps too close to tell a slope.
        assert_eq!(
            Residency::fit(&[(mib(100), mib(150)), (mib(110), mib(160))]),
            None
        );
        // Noise below a ratio of 1 reads as 1, the base raised to cover.
        let r = Residency::fit(&[(mib(100), mib(300)), (mib(400), mib(420))]).unwrap();
        assert_eq!(r.ratio, 1.0);
        assert_eq!(r.base, mib(200));
    }
}
