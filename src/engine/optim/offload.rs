//! Optimizer state offloaded out of the memory that runs out:
//!
//! - **to host memory** (`offload = true`, [`Place::Host`]; DeepSpeed's
//!   ZeRO-Offload): for a CUDA parameter, page-locked (pinned) host memory,
//!   copied to the device for the parameter's update and back, one tensor at
//!   a time, by DMA; on the CPU, where the heap is what runs out, a removed
//!   file in the system's temporary folder, as below.
//! - **to a file** (`offload = "dir"`, [`Place::Dir`]; ZeRO-Infinity's
//!   NVMe offload): a parameter's two AdamW moments live in a memory-mapped
//!   file. On the CPU the fused update reads and writes them in place
//!   through the mapping, and the page cache streams them to and from the
//!   disk; on CUDA they are copied as above.
//!
//! Either way the heap (or device) peak is lower by the moments' bytes, 8
//! per parameter. A file is removed once mapped, so that nothing is left
//! behind, even after a kill; the mapping lives until the moments are
//! dropped.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{bail, Device, Result};
use memmap2::MmapMut;

use crate::kernels::device_state::PinnedMoments;

/// Where offloaded moments go unless told: the system's temporary folder.
pub fn default_dir() -> PathBuf {
    std::env::temp_dir()
}

/// Where offloaded moments live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// Host memory: pinned for a CUDA parameter; a file in
    /// [`default_dir`] for a CPU one.
    Host,
    /// A file in this folder.
    Dir(PathBuf),
}

enum Backing {
    File(MmapMut),
    Pinned(PinnedMoments),
}

/// A parameter's moments, `m` then `v`, `n` f32 each.
pub struct Offloaded {
    backing: Backing,
    n: usize,
}

impl Offloaded {
    /// Zeroed moments for `n` parameters of a tensor on `device`.
    pub fn zeros(place: &Place, device: &Device, n: usize) -> Result<Offloaded> {
        let backing = match place {
            Place::Host if device.is_cuda() => {
                Backing::Pinned(PinnedMoments::zeros(device, 2 * n)?)
            }
            Place::Host => Backing::File(mapped_zeros(&default_dir(), n)?),
            Place::Dir(dir) => Backing::File(mapped_zeros(dir, n)?),
        };
        Ok(Offloaded { backing, n })
    }

    /// Moments given on the host, offloaded.
    pub fn from_host(place: &Place, device: &Device, m: &[f32], v: &[f32]) -> Result<Offloaded> {
        if m.len() != v.len() {
            bail!("offload: {} and {} moments", m.len(), v.len());
        }
        let mut o = Offloaded::zeros(place, device, m.len())?;
        let (om, ov) = o.slices()?;
        om.copy_from_slice(m);
        ov.copy_from_slice(v);
        Ok(o)
    }

    /// Both moments, mutable, in place in the mapping or the pinned buffer.
    pub fn slices(&mut self) -> Result<(&mut [f32], &mut [f32])> {
        let n = self.n;
        let all = match &mut self.backing {
            // SAFETY: the mapping is page-aligned and holds 2n f32 (8n bytes,
            // zero-filled or written by us); f32 has no invalid bit patterns.
            Backing::File(map) => unsafe {
                std::slice::from_raw_parts_mut(map.as_mut_ptr().cast::<f32>(), 2 * n)
            },
            Backing::Pinned(p) => p.values_mut()?,
        };
        Ok(all[..2 * n].split_at_mut(n))
    }

    /// The pinned buffer of a CUDA parameter's host-offloaded moments, which
    /// [`PinnedMoments::step`] updates without a host round trip.
    pub fn pinned_mut(&mut self) -> Option<&mut PinnedMoments> {
        match &mut self.backing {
            Backing::Pinned(p) => Some(p),
            Backing::File(_) => None,
        }
    }

    /// Copies of both moments on the host (checkpoints, a move back).
    pub fn to_host(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        let n = self.n;
        let all = match &self.backing {
            // SAFETY: as in `slices`, read-only.
            Backing::File(map) => unsafe {
                std::slice::from_raw_parts(map.as_ptr().cast::<f32>(), 2 * n)
            },
            Backing::Pinned(p) => p.values()?,
        };
        Ok((all[..n].to_vec(), all[n..2 * n].to_vec()))
    }
}

/// A zero-filled mapping of `2n` f32 in a new file under `dir`, removed
/// from the folder at once.
fn mapped_zeros(dir: &Path, n: usize) -> Result<MmapMut> {
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
        // SAFETY: the file is this process's own, new and unlinked below;
        // nothing else maps or truncates it.
        .and_then(|()| unsafe { MmapMut::map_mut(&file) });
    let _ = std::fs::remove_file(&path);
    mapped.map_err(|e| io("cannot map", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_round_trip_through_a_removed_file() -> Result<()> {
        let dir = tempfile::tempdir().unwrap();
        let place = Place::Dir(dir.path().to_path_buf());
        let cpu = Device::Cpu;
        let mut o = Offloaded::from_host(&place, &cpu, &[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0])?;
        // The file is gone from the folder; the mapping stays.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        o.slices()?.1[2] = 7.0;
        assert_eq!(o.to_host()?, (vec![1.0, 2.0, 3.0], vec![4.0, 5.0, 7.0]));
        let mut z = Offloaded::zeros(&place, &cpu, 4)?;
        assert_eq!(z.slices()?.0, &[0.0; 4]);
        // Host memory for a CPU tensor: a removed file too.
        let mut h = Offloaded::zeros(&Place::Host, &cpu, 3)?;
        assert!(matches!(h.backing, Backing::File(_)));
        h.slices()?.0[1] = 2.5;
        assert_eq!(h.to_host()?, (vec![0.0, 2.5, 0.0], vec![0.0; 3]));
        let err = Offloaded::zeros(&Place::Dir("/nonexistent/dir".into()), &cpu, 4)
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
