//! A folder of images, one subfolder per class, as torchvision's
//! `ImageFolder` reads it: `ROOT/CLASS/.../IMAGE`, the classes in sorted
//! order (label 0 is the first), the images of each class in sorted order
//! of their folder, then their name, and only files with an image
//! extension (see `image_files`: other files are passed over, and counted
//! for a warning). Each sample is the image's pixels, channel first (as
//! `ToTensor`), divided by `scale`; the label is its class.
//!
//! The headers are read when the source is made (every file is an image
//! taper can decode, and of one size unless `size` resizes them); the
//! pixels are decoded when a batch is gathered, the batch's images in
//! parallel, so memory does not grow with the folder.

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use image::imageops::FilterType;
use rayon::prelude::*;

use super::augment::Augment;
use super::image_files::{class_folders, extension_list, image_files, PassedOver};
use super::Source;
use crate::{Error, Result};

/// The image folder source.
pub struct Images {
    root: PathBuf,
    split: String,
    classes: Vec<String>,
    /// Each image and its class.
    files: Vec<(PathBuf, u32)>,
    channels: usize,
    /// Height and width of every sample.
    size: (u32, u32),
    /// Resize each image to `size` (bilinear, antialiased, as PIL's).
    resize: bool,
    scale: f32,
    /// Random crops and flips, drawn per epoch and sample.
    augment: Option<Augment>,
    /// The class folders' files that are not images.
    passed_over: PassedOver,
}

pub(super) fn data_err(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Data(format!("{}: {msg}", path.display()))
}

/// How an image's decoding failed, for a person.
pub(super) fn image_err(path: &Path, e: image::ImageError) -> Error {
    match e {
        image::ImageError::Unsupported(u) => data_err(
            path,
            format!("{u} (taper reads PNG, JPEG, BMP, PPM/PGM, WebP and TIFF)"),
        ),
        e => data_err(path, format!("not a readable image: {e}")),
    }
}

/// The image folder at `root`. `size` (height, width) resizes every image
/// to it; without it, every image must have the first one's size.
/// `channels` is 1 (grey, as PIL's `convert("L")`) or 3 (RGB; an alpha
/// channel is dropped). `split` names it in records.
pub fn images(
    root: &Path,
    size: Option<(u32, u32)>,
    channels: usize,
    scale: f32,
    split: &str,
) -> Result<Images> {
    let classes = class_folders(root)?;
    read(root, classes, size, channels, scale, split)
}

/// The image folder at `root` labelled by `classes` (another folder's, as
/// `train:classes()`), not by its own folders: a class without a folder
/// here has no images (a validation set that lacks one), and a folder that
/// is not one of `classes` is an error. Otherwise as [`images`].
pub fn images_of(
    root: &Path,
    classes: &[String],
    size: Option<(u32, u32)>,
    channels: usize,
    scale: f32,
    split: &str,
) -> Result<Images> {
    if classes.is_empty() {
        return Err(data_err(root, "`classes` is empty"));
    }
    for (i, c) in classes.iter().enumerate() {
        if classes[..i].contains(c) {
            return Err(data_err(root, format!("`classes` names `{c}` twice")));
        }
    }
    let folders = class_folders(root)?;
    if let Some(extra) = folders.iter().find(|f| !classes.contains(f)) {
        return Err(data_err(
            &root.join(extra),
            format!(
                "a class folder that is not one of the {} `classes` given ({})",
                classes.len(),
                super::name_list(classes)
            ),
        ));
    }
    let present: Vec<String> = classes
        .iter()
        .filter(|c| folders.contains(c))
        .cloned()
        .collect();
    let mut src = read(root, present, size, channels, scale, split)?;
    // Relabel by the given order.
    let index = |name: &str| classes.iter().position(|c| c == name).unwrap() as u32;
    let found = src.classes.clone();
    for (_, label) in &mut src.files {
        *label = index(&found[*label as usize]);
    }
    src.classes = classes.to_vec();
    Ok(src)
}

fn read(
    root: &Path,
    classes: Vec<String>,
    size: Option<(u32, u32)>,
    channels: usize,
    scale: f32,
    split: &str,
) -> Result<Images> {
    let mut files = Vec::new();
    let mut passed_over = PassedOver::default();
    for (label, class) in classes.iter().enumerate() {
        let dir = root.join(class);
        let found = image_files(&dir)?;
        if found.images.is_empty() {
            let others = match found.passed_over.summary() {
                Some(s) => format!(": passed over {s}"),
                None => format!(" ({})", extension_list()),
            };
            return Err(data_err(
                &dir,
                format!("class `{class}` holds no image{others}"),
            ));
        }
        files.extend(found.images.into_iter().map(|p| (p, label as u32)));
        passed_over.merge(found.passed_over);
    }
    let first = one_size(&files, size.is_none())?;
    Ok(Images {
        root: root.to_path_buf(),
        split: split.to_string(),
        classes,
        files,
        channels,
        size: size.unwrap_or(first),
        resize: size.is_some(),
        scale,
        augment: None,
        passed_over,
    })
}

/// Reads every image's header (in parallel): each is an image taper can
/// decode, and with `same`, all have the first one's size, which it returns
/// as (height, width).
fn one_size(files: &[(PathBuf, u32)], same: bool) -> Result<(u32, u32)> {
    let dims: Vec<(u32, u32)> = files
        .par_iter()
        .map(|(p, _)| {
            let reader = image::ImageReader::open(p)
                .map_err(|e| data_err(p, e))?
                .with_guessed_format()
                .map_err(|e| data_err(p, e))?;
            let (w, h) = reader.into_dimensions().map_err(|e| image_err(p, e))?;
            Ok((h, w))
        })
        .collect::<Result<_>>()?;
    let first = dims[0];
    match dims.iter().position(|d| *d != first) {
        Some(i) if same => Err(data_err(
            &files[i].0,
            format!(
                "{}x{} pixels, where {} has {}x{} (height x width): give `size` to resize every image to one size",
                dims[i].0,
                dims[i].1,
                files[0].0.display(),
                first.0,
                first.1
            ),
        )),
        _ => Ok(first),
    }
}

impl Images {
    /// Augments every image read (training data): `RandomResizedCrop`
    /// needs the images resized (`size`), the other draws do not.
    pub fn augmented(mut self, augment: Augment) -> Images {
        self.augment = Some(augment);
        self
    }

    /// What to say of the files in the class folders that are not images
    /// taper reads (a `.gif`), which it passes over; nothing when none were.
    pub fn passed_over_note(&self) -> Option<String> {
        self.passed_over.note(&self.root)
    }

    /// The class names, label 0 first.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Values per sample: channels x height x width.
    pub fn sample_len(&self) -> usize {
        self.channels * (self.size.0 * self.size.1) as usize
    }

    /// One image's pixels as sample `index` of `epoch` sees them, channel
    /// first, divided by `scale`.
    fn pixels(&self, index: usize, epoch: u64) -> Result<Vec<f32>> {
        let path = &self.files[index].0;
        let decoded = super::image_input::decode(path)?;
        let (h, w) = self.size;
        let rgb = match &self.augment {
            Some(a) if self.resize || (decoded.height(), decoded.width()) == (h, w) => {
                a.apply(decoded.to_rgb8(), self.size, epoch, index as u64)
            }
            None if self.resize && (decoded.height(), decoded.width()) != (h, w) => {
                image::imageops::resize(&decoded.to_rgb8(), w, h, FilterType::Triangle)
            }
            _ => decoded.to_rgb8(),
        };
        if (rgb.height(), rgb.width()) != (h, w) {
            // The file changed since the source read its header.
            return Err(data_err(
                path,
                format!(
                    "now {}x{} pixels, where the data's images are {h}x{w}",
                    rgb.height(),
                    rgb.width()
                ),
            ));
        }
        Ok(super::image_input::values(&rgb, self.channels, self.scale))
    }

    /// How a file becomes one of this folder's samples, without the
    /// augmentation: what a trained model's inputs are.
    pub fn input(&self) -> super::ImageInput {
        super::ImageInput {
            size: [self.size.0, self.size.1],
            channels: self.channels,
            scale: self.scale,
            standardize: None,
        }
    }
}

impl Source for Images {
    fn len(&self) -> usize {
        self.files.len()
    }
    fn split(&self) -> &str {
        &self.split
    }
    fn describe(&self) -> String {
        let augmented = match &self.augment {
            Some(a) => format!(", augmented: {a}"),
            None => String::new(),
        };
        let classes = match self.classes.len() {
            1 => "1 class".to_string(),
            n => format!("{n} classes"),
        };
        format!(
            "images {} ({} of {}x{}x{}, {classes}{augmented})",
            self.root.display(),
            self.files.len(),
            self.channels,
            self.size.0,
            self.size.1,
        )
    }
    fn gather(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        self.gather_epoch(indices, 0)
    }
    fn gather_epoch(&self, indices: &[usize], epoch: u64) -> Result<(Tensor, Tensor)> {
        let rows: Vec<Vec<f32>> = indices
            .par_iter()
            .map(|&i| self.pixels(i, epoch))
            .collect::<Result<_>>()?;
        let x: Vec<f32> = rows.concat();
        let y: Vec<u32> = indices.iter().map(|&i| self.files[i].1).collect();
        Ok((
            Tensor::from_vec(x, (indices.len(), self.sample_len()), &Device::Cpu)?,
            Tensor::from_vec(y, indices.len(), &Device::Cpu)?,
        ))
    }
    fn classes(&self) -> Option<&[String]> {
        Some(&self.classes)
    }
    fn labels(&self, indices: &[usize]) -> Result<Option<Vec<u32>>> {
        Ok(Some(indices.iter().map(|&i| self.files[i].1).collect()))
    }
    fn image_input(&self) -> Option<super::ImageInput> {
        Some(self.input())
    }
}
