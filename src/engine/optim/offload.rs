//! Optimizer state offloaded to a file (as DeepSpeed's ZeRO-Infinity to
//! NVMe): a parameter's two AdamW moments live in a memory-mapped file, not
//! in the heap or on the device. On the CPU the fused update reads and
//! writes them in place through the mapping, and the page cache streams
//! them to and from the disk; on CUDA they are copied to the device for the
//! parameter's update and back, one tensor at a time. The heap (or device)
//! peak is lower by the moments' bytes, 8 per parameter.
//!
//! The file is removed once mapped, so that nothing is left behind, even
//! after a kill; the mapping lives until the moments are dropped.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{bail, Result};
use memmap2::MmapMut;

/// Where offloaded moments go unless told: the system's temporary folder.
pub fn default_dir() -> PathBuf {
    std::env::temp_dir()
}

/// A parameter's moments, `m` then `v`, `n` f32 each, in a mapped file.
pub struct Offloaded {
    map: MmapMut,
    n: usize,
}

impl Offloaded {
    /// Zeroed moments for `n` parameters, in a new file under `dir`.
    pub fn zeros(dir: &Path, n: usize) -> Result<Offloaded> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = dir.join(format!(
            "taper-offload-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let io = |what: &str, e: std::io::Error| {
            candle_core::Error::Msg(format!("offload: {what} {}: {e}", path.display()))
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io("cannot create", e))?;
        // A new file's length reads as zeros: the moments' first values.
        let bytes = (2 * n * std::mem::size_of::<f32>()).max(1);
        let mapped = file
            .set_len(bytes as u64)
            // SAFETY: the file is this process's own, new and unlinked
            // below; nothing else maps or truncates it.
            .and_then(|()| unsafe { MmapMut::map_mut(&file) });
        let _ = std::fs::remove_file(&path);
        let map = mapped.map_err(|e| io("cannot map", e))?;
        Ok(Offloaded { map, n })
    }

    /// Moments given on the host, offloaded.
    pub fn from_host(dir: &Path, m: &[f32], v: &[f32]) -> Result<Offloaded> {
        if m.len() != v.len() {
            bail!("offload: {} and {} moments", m.len(), v.len());
        }
        let mut o = Offloaded::zeros(dir, m.len())?;
        let (om, ov) = o.slices();
        om.copy_from_slice(m);
        ov.copy_from_slice(v);
        Ok(o)
    }

    /// Both moments, mutable, in place in the mapping.
    pub fn slices(&mut self) -> (&mut [f32], &mut [f32]) {
        let n = self.n;
        // SAFETY: the mapping is page-aligned and holds 2n f32 (8n bytes,
        // zero-filled or written by us); f32 has no invalid bit patterns.
        let all =
            unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().cast::<f32>(), 2 * n) };
        all.split_at_mut(n)
    }

    /// Copies of both moments on the host (checkpoints, a move back).
    pub fn to_host(&self) -> (Vec<f32>, Vec<f32>) {
        let n = self.n;
        // SAFETY: as in `slices`, read-only.
        let all = unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<f32>(), 2 * n) };
        (all[..n].to_vec(), all[n..].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_round_trip_through_a_removed_file() -> Result<()> {
        let dir = tempfile::tempdir().unwrap();
        let mut o = Offloaded::from_host(dir.path(), &[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0])?;
        // The file is gone from the folder; the mapping stays.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        o.slices().1[2] = 7.0;
        assert_eq!(o.to_host(), (vec![1.0, 2.0, 3.0], vec![4.0, 5.0, 7.0]));
        let mut z = Offloaded::zeros(dir.path(), 4)?;
        assert_eq!(z.slices().0, &[0.0; 4]);
        let err = Offloaded::zeros(Path::new("/nonexistent/dir"), 4)
            .err()
            .unwrap();
        assert!(
            err.to_string()
                .contains("offload: cannot create /nonexistent/dir"),
            "{err}"
        );
        Ok(())
    }
}
