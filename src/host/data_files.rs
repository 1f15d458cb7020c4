//! `taper.data` sources read from files: IDX, text, safetensors samples
//! and token files (CSV options are in `data_csv.rs`, image folders' in
//! `data_images.rs`).

use std::sync::Arc;

use mlua::{Lua, Table, Value};
use serde::Deserialize;

use super::data::DataHandle;
use super::options::{at_caller, config_error, decode};
use crate::data::{self, Pipeline, Source};

/// A missing input file is a usage error (exit 2) that says where data comes
/// from; a file that exists but is corrupt is a data error (exit 1).
pub(super) fn check_files(lua: &Lua, what: &str, paths: &[&std::path::Path]) -> mlua::Result<()> {
    for p in paths {
        if !p.exists() {
            return Err(config_error(
                lua,
                format!("{what}: {} does not exist{}", p.display(), missing_hint(p)),
            ));
        }
    }
    Ok(())
}

/// What is there instead of a missing `path`: its folder's entries (the
/// first eight, sorted), or, for the recipes' own `data/`, how to fetch it.
/// A relative path also names the folder it is relative to: the current
/// one, which is not the recipe's.
fn missing_hint(path: &std::path::Path) -> String {
    let from = match (path.is_relative(), std::env::current_dir()) {
        (true, Ok(cwd)) => format!(" (relative to the current folder, {})", cwd.display()),
        _ => String::new(),
    };
    if path.starts_with("data") {
        let fetch = std::path::Path::new("scripts/fetch-data.sh").exists();
        return match fetch {
            true => format!("{from}; for the data sets the recipes use, run `bash scripts/fetch-data.sh`"),
            false => format!("{from}; the recipes' data sets are fetched into data/ by `bash scripts/fetch-data.sh` in taper's repository: run from there"),
        };
    }
    from + &folder_entries(path)
}

fn folder_entries(path: &std::path::Path) -> String {
    let Some(dir) = path.parent().filter(|d| d.is_dir()) else {
        return String::new();
    };
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    match names.len() {
        0 => format!("; {} is empty", dir.display()),
        _ => format!(
            "; {} holds {}",
            dir.display(),
            crate::data::name_list(&names)
        ),
    }
}

/// Inputs are divided by `scale`: 0 or infinity would make NaN of them.
pub(super) fn check_scale(lua: &Lua, what: &str, scale: f32) -> mlua::Result<()> {
    if scale.is_finite() && scale > 0.0 {
        return Ok(());
    }
    Err(config_error(
        lua,
        format!("{what}: option `scale` must be a positive number, got {scale}"),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IdxOpts {
    images: std::path::PathBuf,
    labels: std::path::PathBuf,
    #[serde(default = "all")]
    split: String,
    #[serde(default = "pixel_scale")]
    scale: f32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TextFileOpts {
    path: std::path::PathBuf,
    tokenizer: Option<std::path::PathBuf>,
    #[serde(default = "super::data::train")]
    split: String,
    #[serde(default = "super::data::context")]
    context: usize,
    stride: Option<usize>,
    #[serde(default = "val_fraction")]
    val_fraction: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatOpts {
    path: std::path::PathBuf,
    tokenizer: std::path::PathBuf,
    template: std::path::PathBuf,
    #[serde(default = "chat_context")]
    context: usize,
    #[serde(default = "all")]
    split: String,
    #[serde(default = "assistant")]
    train_on: data::TrainOn,
}

fn chat_context() -> usize {
    512
}
fn assistant() -> data::TrainOn {
    data::TrainOn::Assistant
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenOpts {
    path: std::path::PathBuf,
    #[serde(default = "u16_tokens")]
    dtype: data::TokenType,
    #[serde(default = "super::data::context")]
    context: usize,
    stride: Option<usize>,
    #[serde(default = "all")]
    split: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SafetensorsOpts {
    path: std::path::PathBuf,
    #[serde(default = "x_name")]
    x: String,
    /// Class labels' tensor (default `y`); `target` names numbers instead.
    y: Option<String>,
    target: Option<String>,
    #[serde(default = "pixel_scale")]
    scale: f32,
    #[serde(default = "all")]
    split: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NumpyOpts {
    /// An `.npz` archive; without it, `x` and `y` are `.npy` files.
    path: Option<std::path::PathBuf>,
    x: Option<String>,
    y: Option<String>,
    target: Option<String>,
    #[serde(default = "pixel_scale")]
    scale: f32,
    #[serde(default = "all")]
    split: String,
}

/// Which array holds the targets: `y` (class labels) or `target` (numbers),
/// `y` when neither is given; both is an error.
fn targets<'a>(
    lua: &Lua,
    what: &str,
    y: &'a Option<String>,
    target: &'a Option<String>,
) -> mlua::Result<data::Targets<'a>> {
    Ok(match (y, target) {
        (Some(_), Some(_)) => {
            return Err(config_error(
                lua,
                format!(
                    "{what}: give `y` (class labels) or `target` (numbers to predict), not both"
                ),
            ))
        }
        (None, Some(t)) => data::Targets::Values(t),
        (Some(y), None) => data::Targets::Labels(y),
        (None, None) => data::Targets::Labels("y"),
    })
}

/// `taper.data.numpy{...}`: an `.npz` archive's arrays, or two `.npy` files.
fn numpy_source(lua: &Lua, opts: Value) -> mlua::Result<super::data::DataHandle> {
    const WHAT: &str = "taper.data.numpy";
    let o: NumpyOpts = decode(lua, WHAT, opts)?;
    check_scale(lua, WHAT, o.scale)?;
    let y = targets(lua, WHAT, &o.y, &o.target)?;
    let src = match &o.path {
        Some(p) => {
            check_files(lua, WHAT, &[p])?;
            if p.extension().is_some_and(|e| e == "npy") {
                return Err(config_error(
                    lua,
                    format!("{WHAT}: {} is one array (an .npy file); name the inputs' and the targets' files: taper.data.numpy{{ x = \"x.npy\", y = \"y.npy\" }}", p.display()),
                ));
            }
            data::numpy(Some(p), o.x.as_deref().unwrap_or("x"), y, o.scale, &o.split)
        }
        None => {
            let (Some(x), Some(yfile)) = (&o.x, o.y.as_ref().or(o.target.as_ref())) else {
                return Err(config_error(
                    lua,
                    format!("{WHAT}: give `path` (an .npz archive), or the .npy files of the inputs (`x`) and of the targets (`y`, or `target` for numbers to predict)"),
                ));
            };
            check_files(
                lua,
                WHAT,
                &[std::path::Path::new(x), std::path::Path::new(yfile)],
            )?;
            data::numpy(None, x, y, o.scale, &o.split)
        }
    };
    Ok(source(src.map_err(|e| at_caller(lua, WHAT, e))?))
}

fn x_name() -> String {
    "x".into()
}
fn all() -> String {
    "all".into()
}
pub(super) fn pixel_scale() -> f32 {
    255.0
}
fn val_fraction() -> f64 {
    0.1
}
fn u16_tokens() -> data::TokenType {
    data::TokenType::U16
}

pub(super) fn source(s: impl Source + 'static) -> DataHandle {
    DataHandle(Pipeline::new(Arc::new(s)))
}

pub(crate) fn register(lua: &Lua, t: &Table) -> mlua::Result<()> {
    t.set(
        "idx",
        lua.create_function(|lua, opts: Value| {
            let o: IdxOpts = decode(lua, "taper.data.idx", opts)?;
            check_scale(lua, "taper.data.idx", o.scale)?;
            check_files(lua, "taper.data.idx", &[&o.images, &o.labels])?;
            Ok(source(
                data::idx(&o.images, &o.labels, &o.split, o.scale)
                    .map_err(|e| at_caller(lua, "taper.data.idx", e))?,
            ))
        })?,
    )?;
    super::data_csv::register(lua, t)?;
    t.set(
        "text",
        lua.create_function(|lua, opts: Value| {
            let o: TextFileOpts = decode(lua, "taper.data.text", opts)?;
            check_files(lua, "taper.data.text", &[&o.path])?;
            if let Some(t) = &o.tokenizer {
                check_files(lua, "taper.data.text", &[t])?;
            }
            let src = data::text(
                &o.path,
                o.tokenizer.as_deref(),
                &o.split,
                o.context,
                o.stride,
                o.val_fraction,
            )
            .map_err(|e| at_caller(lua, "taper.data.text", e))?;
            if let Some(v) = crate::data::Source::vocab(&src) {
                for n in v.notes() {
                    super::state(lua).out.warn(n);
                }
            }
            Ok(source(src))
        })?,
    )?;
    t.set(
        "chat",
        lua.create_function(|lua, opts: Value| {
            let o: ChatOpts = decode(lua, "taper.data.chat", opts)?;
            check_files(
                lua,
                "taper.data.chat",
                &[&o.path, &o.tokenizer, &o.template],
            )?;
            let src = data::chat(
                &o.path,
                data::ChatOptions {
                    tokenizer: &o.tokenizer,
                    template: &o.template,
                    context: o.context,
                    split: &o.split,
                    train_on: o.train_on,
                },
            )
            .map_err(|e| at_caller(lua, "taper.data.chat", e))?;
            let out = &super::state(lua).out;
            let vocab_notes = crate::data::Source::vocab(&src).map(|v| v.notes().to_vec());
            for n in vocab_notes.unwrap_or_default().iter().chain(src.notes()) {
                out.warn(n);
            }
            Ok(source(src))
        })?,
    )?;
    t.set(
        "safetensors",
        lua.create_function(|lua, opts: Value| {
            let o: SafetensorsOpts = decode(lua, "taper.data.safetensors", opts)?;
            check_scale(lua, "taper.data.safetensors", o.scale)?;
            check_files(lua, "taper.data.safetensors", &[&o.path])?;
            let y = targets(lua, "taper.data.safetensors", &o.y, &o.target)?;
            Ok(source(
                data::samples(&o.path, &o.x, y, o.scale, &o.split)
                    .map_err(|e| at_caller(lua, "taper.data.safetensors", e))?,
            ))
        })?,
    )?;
    t.set("numpy", lua.create_function(numpy_source)?)?;
    t.set("images", lua.create_function(super::data_images::images)?)?;
    t.set(
        "tokens",
        lua.create_function(|lua, opts: Value| {
            let o: TokenOpts = decode(lua, "taper.data.tokens", opts)?;
            check_files(lua, "taper.data.tokens", &[&o.path])?;
            Ok(source(
                data::tokens(&o.path, o.dtype, o.context, o.stride, &o.split)
                    .map_err(|e| at_caller(lua, "taper.data.tokens", e))?,
            ))
        })?,
    )
}

impl mlua::FromLua for DataHandle {
    fn from_lua(value: Value, _: &Lua) -> mlua::Result<Self> {
        if let Value::UserData(ud) = &value {
            if let Ok(d) = ud.borrow::<DataHandle>() {
                return Ok(d.clone());
            }
        }
        Err(mlua::Error::FromLuaConversionError {
            from: value.type_name(),
            to: "taper.data".into(),
            message: Some("expected data from taper.data (e.g. taper.data.digits{})".into()),
        })
    }
}
