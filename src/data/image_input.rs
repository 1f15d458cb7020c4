//! How an image file becomes a model's input: an image folder's reading
//! (`Images`), and the record of it a classifier's checkpoint keeps
//! ([`ImageInput`]) for `taper classify` and ONNX exports.

use std::path::Path;

use image::imageops::FilterType;

use super::images::{data_err, image_err};
use crate::Result;

/// The image in a file, by its content (not its extension), or an error
/// naming the file.
pub(super) fn decode(path: &Path) -> Result<image::DynamicImage> {
    let bytes = std::fs::read(path).map_err(|e| data_err(path, e))?;
    let mut reader = image::ImageReader::new(std::io::Cursor::new(&bytes))
        .with_guessed_format()
        .map_err(|e| data_err(path, e))?;
    // Content that no format claims is read as its extension says (as
    // `ImageReader::open` does), so a damaged PNG is a PNG's error.
    if reader.format().is_none() {
        if let Ok(f) = image::ImageFormat::from_path(path) {
            reader.set_format(f);
        }
    }
    if reader.format() == Some(image::ImageFormat::Jpeg) {
        if let Some(end) = super::jpeg::truncated_at(&bytes) {
            return Err(data_err(
                path,
                format!("offset {end}: truncated: the JPEG data ends before its end-of-image marker (a partial copy or download? Pillow refuses it too: \"image file is truncated\")"),
            ));
        }
    }
    reader.decode().map_err(|e| image_err(path, e))
}

/// An RGB image as a sample: channel first (or PIL's grey), divided by
/// `scale`.
pub(super) fn values(rgb: &image::RgbImage, channels: usize, scale: f32) -> Vec<f32> {
    let px = rgb.as_raw();
    if channels == 1 {
        // PIL's convert("L"): ITU-R 601-2 luma in 16-bit fixed point.
        px.chunks_exact(3)
            .map(|p| {
                let l =
                    (p[0] as u32 * 19595 + p[1] as u32 * 38470 + p[2] as u32 * 7471 + 0x8000) >> 16;
                l as f32 / scale
            })
            .collect()
    } else {
        (0..3)
            .flat_map(|c| px.iter().skip(c).step_by(3).map(|&v| v as f32 / scale))
            .collect()
    }
}

/// How an image file becomes a model's input, as an image folder read it
/// for training (saved with a classifier's checkpoints, so that
/// `taper classify` and an ONNX export's users read files the same way).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ImageInput {
    /// Height and width.
    pub size: [u32; 2],
    /// 1 (grey) or 3 (RGB).
    pub channels: usize,
    /// Pixel bytes are divided by it...
    pub scale: f32,
    /// ...then standardized (`data:standardize()`): a mean and deviation
    /// per channel, or per value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standardize: Option<super::Moments>,
}

impl ImageInput {
    /// The file's pixels, resized to `size` (bilinear, antialiased, as
    /// PIL's) where it has another size, channel first, divided by `scale`.
    pub fn read(&self, path: &Path) -> Result<Vec<f32>> {
        let decoded = decode(path)?;
        let [h, w] = self.size;
        let rgb = decoded.to_rgb8();
        let rgb = if (rgb.height(), rgb.width()) == (h, w) {
            rgb
        } else {
            image::imageops::resize(&rgb, w, h, FilterType::Triangle)
        };
        let mut x = values(&rgb, self.channels, self.scale);
        if let Some(m) = &self.standardize {
            m.apply(&mut x);
        }
        Ok(x)
    }
}
