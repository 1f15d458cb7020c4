//! Dropout whose masks are a hash of where they fall, not a generator's
//! state: whether value `j` of a row is kept is a function of the site's
//! key (the run's seed, the optimizer step, the layer) and the row's ids
//! (the sample's place in the step's batch, then its position, or head and
//! query). A step's masks are therefore the same however its batch is cut
//! into micro-batches, retried after an OOM, shared among data-parallel
//! ranks, trimmed to its longest text, or resumed from a checkpoint; and
//! the fused attention draws its weights' masks in place, keeping nothing
//! of size `t x t` for the backward (as flash attention draws Philox
//! numbers). Kept values are scaled by `1 / (1 - rate)`, as PyTorch's
//! `nn.Dropout` scales them in training.

use candle_core::{Device, Result, Tensor};
use rayon::prelude::*;

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's finalizer: a bijection of u64 whose outputs pass BigCrush
/// when fed a counter.
fn fmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `key` combined with the ids in order.
fn combine(key: u64, ids: &[u64]) -> u64 {
    ids.iter()
        .fold(key, |k, &i| fmix(k ^ fmix(i.wrapping_add(GOLDEN))))
}

/// One dropout site's draw: its rate and key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// Values with a 16-bit draw below this are dropped (`rate x 65536`).
    threshold: u32,
    scale: f32,
    key: u64,
}

impl Dropout {
    /// Dropout at `rate` (in `[0, 1)`) for site `site` of step `step` under
    /// `seed`; None at rate 0, which changes nothing.
    pub fn new(rate: f64, seed: u64, step: u64, site: u64) -> Option<Dropout> {
        if rate <= 0.0 || rate.is_nan() {
            return None;
        }
        let rate = rate.min(1.0 - 1.0 / 65536.0);
        Some(Dropout {
            threshold: (rate * 65536.0).round() as u32,
            scale: (1.0 / (1.0 - rate)) as f32,
            key: combine(seed, &[step, site]),
        })
    }

    /// The key of the row with these ids (the sample's place in the batch
    /// first).
    pub fn row(&self, ids: &[u64]) -> u64 {
        combine(self.key, ids)
    }

    /// `xs`, the first values of row `row`, dropped or scaled in place: a
    /// value's fate depends on its index alone, not on the row's length.
    pub fn apply(&self, row: u64, xs: &mut [f32]) {
        for (c, chunk) in xs.chunks_mut(4).enumerate() {
            let r = fmix(row.wrapping_add((c as u64 + 1).wrapping_mul(GOLDEN)));
            for (k, x) in chunk.iter_mut().enumerate() {
                let u = (r >> (16 * k)) as u16 as u32;
                *x = if u >= self.threshold {
                    *x * self.scale
                } else {
                    0.0
                };
            }
        }
    }

    /// The mask of a tensor of `shape` (`[samples, .., values]`) whose
    /// first sample is the batch's `first`: 0 or `1 / (1 - rate)` at each
    /// value; a row's ids are its sample's place and its other indices.
    pub fn mask(&self, first: usize, shape: &[usize], device: &Device) -> Result<Tensor> {
        let Some((&cols, lead)) = shape.split_last() else {
            candle_core::bail!("dropout: a mask needs a shape")
        };
        let rows: usize = lead.iter().product();
        let mut m = vec![1f32; rows * cols];
        if cols > 0 {
            m.par_chunks_mut(cols).enumerate().for_each(|(r, row)| {
                let mut ids = vec![0u64; lead.len()];
                let mut rest = r;
                for (id, &d) in ids.iter_mut().zip(lead).rev() {
                    *id = (rest % d) as u64;
                    rest /= d;
                }
                ids[0] += first as u64;
                self.apply(self.row(&ids), row);
            });
        }
        Tensor::from_vec(m, shape, device)
    }
}

/// `x` (`[samples, .., values]`, its first sample the batch's `first`)
/// with `drop`'s mask applied; `x` itself without one.
pub fn dropout(x: &Tensor, drop: Option<&Dropout>, first: usize) -> Result<Tensor> {
    match drop {
        None => Ok(x.clone()),
        Some(d) => {
            let m = d.mask(first, x.dims(), x.device())?.to_dtype(x.dtype())?;
            x.mul(&m)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The share dropped is the rate, the kept are scaled, and the draws of
    /// neighbouring rows, sites and steps are not alike.
    #[test]
    fn drops_the_rate_and_scales_the_rest() -> Result<()> {
        for rate in [0.1, 0.5] {
            let d = Dropout::new(rate, 7, 3, 1).unwrap();
            let m = d.mask(0, &[8, 50, 384], &Device::Cpu)?;
            let v = m.flatten_all()?.to_vec1::<f32>()?;
            let dropped = v.iter().filter(|&&x| x == 0.0).count() as f64 / v.len() as f64;
            // 153,600 draws: the binomial's sd is 0.0013 at 0.5.
            assert!(
                (dropped - rate).abs() < 0.006,
                "dropped {dropped} at {rate}"
            );
            let kept = 1.0 / (1.0 - rate) as f32;
            assert!(v.iter().all(|&x| x == 0.0 || x == kept));
        }
        let row = |seed, step, site, ids: &[u64]| {
            let d = Dropout::new(0.5, seed, step, site).unwrap();
            let mut xs = vec![1f32; 64];
            d.apply(d.row(ids), &mut xs);
            xs
        };
        let base = row(1, 1, 1, &[0, 0]);
        for other in [
            row(2, 1, 1, &[0, 0]),
            row(1, 2, 1, &[0, 0]),
            row(1, 1, 2, &[0, 0]),
            row(1, 1, 1, &[1, 0]),
            row(1, 1, 1, &[0, 1]),
        ] {
            let same = base.iter().zip(&other).filter(|(a, b)| a == b).count();
            // Independent halves agree on about 32 of 64.
            assert!((16..=48).contains(&same), "{same} of 64 alike");
        }
        assert!(Dropout::new(0.0, 1, 1, 1).is_none());
        Ok(())
    }

    /// A sample's mask depends on its place in the batch, not on the
    /// micro-batch it is computed in, and a row's values on their index,
    /// not on the row's length (a batch trimmed to its longest text).
    #[test]
    fn a_mask_is_the_same_whatever_the_split() -> Result<()> {
        let d = Dropout::new(0.3, 5, 11, 2).unwrap();
        let whole = d.mask(0, &[6, 9, 10], &Device::Cpu)?;
        let part = d.mask(4, &[2, 9, 10], &Device::Cpu)?;
        let diff = (whole.narrow(0, 4, 2)? - part)?.abs()?.max_all()?;
        assert_eq!(diff.to_scalar::<f32>()?, 0.0);
        let short = d.mask(0, &[6, 9, 7], &Device::Cpu)?;
        let diff = (whole.narrow(2, 0, 7)? - short)?.abs()?.max_all()?;
        assert_eq!(diff.to_scalar::<f32>()?, 0.0);
        Ok(())
    }
}
