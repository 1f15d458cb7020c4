//! Random augmentation of an image folder's training images, as
//! torchvision's transforms do it: `RandomResizedCrop` (a box of random
//! area and aspect ratio, resized to the sample size), `RandomCrop` with
//! zero padding, and `RandomHorizontalFlip`. Each sample's draws are a
//! function of (seed, epoch, sample index) alone, so a run is reproducible,
//! resumes to the same bits, and does not depend on batch sizes.

use image::imageops::FilterType;
use image::RgbImage;

/// What to draw for each training image.
#[derive(Clone, Debug, Default)]
pub struct Augment {
    pub seed: u64,
    /// `RandomResizedCrop(size, scale, ratio)`: (scale range, ratio range).
    pub resized_crop: Option<((f64, f64), (f64, f64))>,
    /// `RandomCrop(size, padding = n)`, padded with zeros.
    pub pad_crop: u32,
    /// `RandomHorizontalFlip(p = 0.5)`.
    pub flip: bool,
}

/// SplitMix64: a sample's stream of draws.
struct Draws(u64);

impl Draws {
    fn new(seed: u64, epoch: u64, index: u64) -> Draws {
        let mut d = Draws(seed);
        d.0 ^= d.next() ^ epoch.wrapping_mul(0xa076_1d64_78bd_642f);
        d.0 ^= d.next() ^ index.wrapping_mul(0xe703_7ed1_a0b4_28db);
        d
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
    /// Uniform in 0..=n.
    fn upto(&mut self, n: u32) -> u32 {
        (self.next() % (n as u64 + 1)) as u32
    }
}

/// `RandomResizedCrop.get_params`: a box (top, left, height, width) of an
/// `h x w` image whose area is a `scale` share of the image's and whose
/// aspect ratio (width / height) is in `ratio` (drawn log-uniform); ten
/// tries, then the central crop closest to `ratio`.
fn resized_crop_box(
    d: &mut Draws,
    (h, w): (u32, u32),
    scale: (f64, f64),
    ratio: (f64, f64),
) -> (u32, u32, u32, u32) {
    let area = (h * w) as f64;
    let (lr0, lr1) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * d.uniform(scale.0, scale.1);
        let aspect = d.uniform(lr0, lr1).exp();
        let cw = (target * aspect).sqrt().round() as u32;
        let ch = (target / aspect).sqrt().round() as u32;
        if 0 < cw && cw <= w && 0 < ch && ch <= h {
            let top = d.upto(h - ch);
            let left = d.upto(w - cw);
            return (top, left, ch, cw);
        }
    }
    let in_ratio = w as f64 / h as f64;
    let (ch, cw) = if in_ratio < ratio.0 {
        ((w as f64 / ratio.0).round() as u32, w)
    } else if in_ratio > ratio.1 {
        (h, (h as f64 * ratio.1).round() as u32)
    } else {
        (h, w)
    };
    ((h - ch) / 2, (w - cw) / 2, ch, cw)
}

impl Augment {
    /// The image `img` (decoded, RGB) as the sample `index` of `epoch`
    /// sees it, `size` (height, width) high and wide. Without a resized
    /// crop, `img` is resized to `size` first where it differs.
    pub fn apply(&self, img: RgbImage, size: (u32, u32), epoch: u64, index: u64) -> RgbImage {
        let mut d = Draws::new(self.seed, epoch, index);
        let (h, w) = size;
        let mut img = match self.resized_crop {
            Some((scale, ratio)) => {
                let (top, left, ch, cw) =
                    resized_crop_box(&mut d, (img.height(), img.width()), scale, ratio);
                let crop = image::imageops::crop_imm(&img, left, top, cw, ch).to_image();
                image::imageops::resize(&crop, w, h, FilterType::Triangle)
            }
            None if (img.height(), img.width()) != size => {
                image::imageops::resize(&img, w, h, FilterType::Triangle)
            }
            None => img,
        };
        if self.pad_crop > 0 {
            let p = self.pad_crop;
            let (dy, dx) = (
                d.upto(2 * p) as i64 - p as i64,
                d.upto(2 * p) as i64 - p as i64,
            );
            // Output pixel (y, x) is padded pixel (y + p + dy, x + p + dx):
            // source pixel (y + dy, x + dx), zero outside the image.
            let src = img;
            img = RgbImage::from_fn(w, h, |x, y| {
                let (sy, sx) = (y as i64 + dy, x as i64 + dx);
                if (0..h as i64).contains(&sy) && (0..w as i64).contains(&sx) {
                    *src.get_pixel(sx as u32, sy as u32)
                } else {
                    image::Rgb([0, 0, 0])
                }
            });
        }
        if self.flip && d.next() >> 63 == 1 {
            image::imageops::flip_horizontal_in_place(&mut img);
        }
        img
    }
}

impl std::fmt::Display for Augment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some((s, r)) = self.resized_crop {
            parts.push(format!(
                "resized crop (scale {}-{}, ratio {:.3}-{:.3})",
                s.0, s.1, r.0, r.1
            ));
        }
        if self.pad_crop > 0 {
            parts.push(format!("crop padded by {}", self.pad_crop));
        }
        if self.flip {
            parts.push("horizontal flip".into());
        }
        if parts.is_empty() {
            parts.push("nothing".into());
        }
        write!(f, "{}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Boxes stay inside the image, with the area share and aspect ratio
    /// asked for (up to rounding), at every position; a ratio the image
    /// cannot hold falls back to the central crop.
    #[test]
    fn resized_crop_boxes_have_the_asked_area_and_ratio() {
        let (scale, ratio) = ((0.08, 1.0), (3.0 / 4.0, 4.0 / 3.0));
        let (mut tops, mut fallback) = (std::collections::HashSet::new(), 0);
        for i in 0..2000 {
            let mut d = Draws::new(7, 1, i);
            let (top, left, ch, cw) = resized_crop_box(&mut d, (96, 128), scale, ratio);
            assert!(top + ch <= 96 && left + cw <= 128 && ch > 0 && cw > 0);
            let share = (ch * cw) as f64 / (96.0 * 128.0);
            if (ch, cw) == (96, 128) {
                fallback += 1;
                continue;
            }
            assert!(share > 0.07 && share < 1.03, "{share}");
            let aspect = cw as f64 / ch as f64;
            assert!(aspect > 0.70 && aspect < 1.42, "{aspect}");
            tops.insert(top);
        }
        assert!(tops.len() > 50, "tops drawn: {}", tops.len());
        assert!(fallback < 40, "{fallback} central crops");
        // A strip 10 times wider than high cannot hold a ratio of at most
        // 4/3 with a large area: the central crop of ratio 4/3.
        let mut d = Draws::new(1, 1, 1);
        assert_eq!(
            resized_crop_box(&mut d, (10, 100), (0.9, 1.0), ratio),
            (0, 43, 10, 13)
        );
    }
}
