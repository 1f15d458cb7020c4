//! `taper.data.images{...}`: a folder of images as torchvision's
//! `ImageFolder` reads it, with its options and augmentation checked.

use mlua::{Lua, Value};
use serde::Deserialize;

use super::data::DataHandle;
use super::data_files::{check_files, check_scale, pixel_scale, source};
use super::options::{at_caller, config_error, decode};
use crate::data;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImagesOpts {
    path: std::path::PathBuf,
    size: Option<Vec<u32>>,
    #[serde(default = "rgb")]
    channels: usize,
    #[serde(default = "pixel_scale")]
    scale: f32,
    split: Option<String>,
    augment: Option<AugmentOpts>,
    /// Label by these class names (another folder's), not by the folder's
    /// own subfolders.
    classes: Option<Vec<String>>,
}

/// `augment = { flip?, pad_crop?, resized_crop?, seed? }` (torchvision's
/// RandomHorizontalFlip, RandomCrop(padding), RandomResizedCrop).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AugmentOpts {
    #[serde(default)]
    flip: bool,
    #[serde(default)]
    pad_crop: u32,
    resized_crop: Option<ResizedCropOpts>,
    #[serde(default)]
    seed: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResizedCropOpts {
    #[serde(default = "crop_scale")]
    scale: (f64, f64),
    #[serde(default = "crop_ratio")]
    ratio: (f64, f64),
}

fn crop_scale() -> (f64, f64) {
    (0.08, 1.0)
}
fn crop_ratio() -> (f64, f64) {
    (3.0 / 4.0, 4.0 / 3.0)
}

/// The augmentation asked for, checked: a resized crop needs `size` and
/// ranges that hold a box.
fn augment(lua: &Lua, o: &AugmentOpts, sized: bool) -> mlua::Result<data::Augment> {
    let what = "taper.data.images: option `augment`";
    let resized_crop = match &o.resized_crop {
        None => None,
        Some(_) if !sized => {
            return Err(config_error(
                lua,
                format!("{what}: `resized_crop` resizes to `size`: give `size` too"),
            ))
        }
        Some(c) => {
            let (s, r) = (c.scale, c.ratio);
            let holds = s.0 > 0.0 && s.0 <= s.1 && s.1 <= 1.0;
            if !(holds && r.0 > 0.0 && r.0 <= r.1 && r.1.is_finite()) {
                return Err(config_error(
                    lua,
                    format!("{what}: `resized_crop` needs 0 < scale[1] <= scale[2] <= 1 and 0 < ratio[1] <= ratio[2], got scale {s:?}, ratio {r:?}"),
                ));
            }
            Some((s, r))
        }
    };
    Ok(data::Augment {
        seed: o.seed
            ^ super::state(lua)
                .opts
                .seed
                .wrapping_mul(0x9e37_79b9_7f4a_7c15),
        resized_crop,
        pad_crop: o.pad_crop,
        flip: o.flip,
    })
}

fn rgb() -> usize {
    3
}

/// `taper.data.images{...}`.
pub(super) fn images(lua: &Lua, opts: Value) -> mlua::Result<DataHandle> {
    const WHAT: &str = "taper.data.images";
    let o: ImagesOpts = decode(lua, WHAT, opts)?;
    check_files(lua, WHAT, &[&o.path])?;
    check_scale(lua, WHAT, o.scale)?;
    let size = match o.size.as_deref() {
        None => None,
        Some(&[h, w]) if h > 0 && w > 0 => Some((h, w)),
        Some(other) => {
            return Err(config_error(
                lua,
                format!(
                "{WHAT}: option `size` must be {{ height, width }}, both at least 1, got {other:?}"
            ),
            ))
        }
    };
    if ![1, 3].contains(&o.channels) {
        return Err(config_error(
            lua,
            format!(
                "{WHAT}: option `channels` must be 1 (grey) or 3 (RGB), got {}",
                o.channels
            ),
        ));
    }
    // The folder's own name (`train`, `val`) names it in records.
    let split = o.split.unwrap_or_else(|| {
        o.path
            .file_name()
            .map_or("all".into(), |n| n.to_string_lossy().into_owned())
    });
    let augment = match &o.augment {
        Some(a) => Some(augment(lua, a, size.is_some())?),
        None => None,
    };
    let mut images = match &o.classes {
        Some(c) => data::images_of(&o.path, c, size, o.channels, o.scale, &split),
        None => data::images(&o.path, size, o.channels, o.scale, &split),
    }
    .map_err(|e| at_caller(lua, WHAT, e))?;
    if o.classes.is_none() {
        if let Some(why) = data::split_like(&o.path, images.classes()) {
            super::state(lua).out.warn(&format!("{WHAT}: {why}"));
        }
    }
    if let Some(why) = images.passed_over_note() {
        super::state(lua).out.warn(&format!("{WHAT}: {why}"));
    }
    if let Some(a) = augment {
        images = images.augmented(a);
    }
    Ok(source(images))
}
