//! A taper plugin in the data slot: random shifts of image batches, by up to
//! `max_shift` pixels in each direction, with zeros shifted in. A sample's
//! shift is a function of (`seed`, epoch, sample index) only, so a run is
//! reproducible and resumes exactly whatever the batch sizes.
//!
//! Inputs are `[N, H, W]`, `[N, C, H, W]`, or flat `[N, H*W]` with `width`
//! given (`height` follows); only f32 inputs are shifted.
//!
//! ```lua
//! local shift = taper.plugin.load("target/release/libtaper_augment.so", { width = 8, max_shift = 1, seed = 7 })
//! local train = taper.data.digits{ split = "train" }:shuffle{ seed = 1 }:batch(32):map(shift)
//! ```

use taper_plugin::{BatchView, Plugin, KIND_TRANSFORM};

struct Augment {
    seed: u64,
    max_shift: i64,
    width: Option<usize>,
    /// Share of samples shifted (the rest pass unchanged).
    probability: f64,
}

fn mix(mut z: u64) -> u64 {
    // SplitMix64's finalizer.
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Augment {
    fn shift_for(&self, epoch: u64, index: u64) -> (i64, i64) {
        let h = mix(self.seed ^ mix(epoch ^ mix(index)));
        if (h >> 11) as f64 / (1u64 << 53) as f64 >= self.probability {
            return (0, 0);
        }
        let span = (2 * self.max_shift + 1) as u64;
        let g = mix(h);
        (
            (g % span) as i64 - self.max_shift,
            ((g / span) % span) as i64 - self.max_shift,
        )
    }
}

/// Shifts one `h x w` plane by (dx, dy), filling with zeros.
fn shift_plane(p: &mut [f32], h: usize, w: usize, dx: i64, dy: i64, tmp: &mut Vec<f32>) {
    tmp.clear();
    tmp.extend_from_slice(p);
    for r in 0..h as i64 {
        for c in 0..w as i64 {
            let (sr, sc) = (r - dy, c - dx);
            let inside = sr >= 0 && sr < h as i64 && sc >= 0 && sc < w as i64;
            p[(r * w as i64 + c) as usize] = if inside {
                tmp[(sr * w as i64 + sc) as usize]
            } else {
                0.0
            };
        }
    }
}

impl Plugin for Augment {
    const KINDS: u32 = KIND_TRANSFORM;

    fn create(config_json: &str) -> Result<Self, String> {
        let cfg: serde_json::Value =
            serde_json::from_str(config_json).map_err(|e| format!("bad options: {e}"))?;
        let known = ["seed", "max_shift", "width", "probability"];
        if let Some(obj) = cfg.as_object() {
            if let Some(k) = obj.keys().find(|k| !known.contains(&k.as_str())) {
                return Err(format!(
                    "unknown option `{k}` (expected {})",
                    known.join(", ")
                ));
            }
        }
        let num = |k: &str| cfg.get(k).and_then(|v| v.as_f64());
        let max_shift = num("max_shift").unwrap_or(1.0);
        let probability = num("probability").unwrap_or(1.0);
        if max_shift < 0.0 || !(0.0..=1.0).contains(&probability) {
            return Err("max_shift must be >= 0 and probability within 0..1".into());
        }
        Ok(Augment {
            seed: num("seed").unwrap_or(0.0) as u64,
            max_shift: max_shift as i64,
            width: num("width").map(|w| w as usize),
            probability,
        })
    }

    fn transform(&mut self, batch: &mut BatchView) -> Result<(), String> {
        let x = &mut batch.x;
        let dims: Vec<usize> = x.shape[..x.ndim as usize]
            .iter()
            .map(|&d| d as usize)
            .collect();
        let (planes, h, w) = match (dims.len(), self.width) {
            (2, Some(w)) if w > 0 && dims[1].is_multiple_of(w) => (1, dims[1] / w, w),
            (2, _) => return Err(format!("flat inputs {dims:?} need the option `width`")),
            (3, _) => (1, dims[1], dims[2]),
            (4, _) => (dims[1], dims[2], dims[3]),
            _ => return Err(format!("expected image inputs, got shape {dims:?}")),
        };
        // SAFETY: the host's view, valid during this call.
        let Some(values) = (unsafe { x.f32_mut() }) else {
            return Ok(());
        };
        let indices = unsafe { batch.indices() };
        let per_sample = planes * h * w;
        let mut tmp = Vec::with_capacity(h * w);
        for (n, sample) in values.chunks_mut(per_sample).enumerate() {
            let (dx, dy) = self.shift_for(batch.epoch, indices.get(n).copied().unwrap_or(n as u64));
            if (dx, dy) == (0, 0) {
                continue;
            }
            for plane in sample.chunks_mut(h * w) {
                shift_plane(plane, h, w, dx, dy, &mut tmp);
            }
        }
        Ok(())
    }
}

taper_plugin::export!(Augment, name = "augment");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shifts_move_pixels_and_fill_zeros() {
        let mut p: Vec<f32> = (1..=9).map(|v| v as f32).collect();
        shift_plane(&mut p, 3, 3, 1, 0, &mut Vec::new());
        assert_eq!(p, [0., 1., 2., 0., 4., 5., 0., 7., 8.]);
        let mut p: Vec<f32> = (1..=9).map(|v| v as f32).collect();
        shift_plane(&mut p, 3, 3, 0, -1, &mut Vec::new());
        assert_eq!(p, [4., 5., 6., 7., 8., 9., 0., 0., 0.]);
    }

    #[test]
    fn a_sample_shift_depends_on_seed_epoch_and_index_only() {
        let a = Augment {
            seed: 3,
            max_shift: 2,
            width: None,
            probability: 1.0,
        };
        assert_eq!(a.shift_for(1, 17), a.shift_for(1, 17));
        let all: Vec<_> = (0..200).map(|i| a.shift_for(1, i)).collect();
        assert!(all.iter().all(|&(x, y)| x.abs() <= 2 && y.abs() <= 2));
        assert!(all.iter().collect::<std::collections::HashSet<_>>().len() > 10);
    }
}
