//! `taper plugin new NAME`: a plugin crate to start from, and `taper plugin
//! info PATH`: what a plugin declares.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// One line per fact: name, version, ABI, kinds, path.
pub fn info(path: &Path) -> Result<String> {
    let lib = super::load(path)?;
    Ok(format!(
        "name     {}\nversion  {}\nABI      {}\nkinds    {}\npath     {}\n",
        lib.name,
        lib.version,
        taper_plugin::ABI_VERSION,
        lib.kind_names().join(", "),
        lib.path.display()
    ))
}

/// Writes `DIR/NAME/` (Cargo.toml, src/lib.rs) for a Rust plugin that
/// depends on the ABI crate at `abi`. Refuses to overwrite.
pub fn new_plugin(name: &str, dir: &Path, abi: &Path) -> Result<PathBuf> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && name.starts_with(|c: char| c.is_ascii_alphabetic());
    if !ok {
        return Err(Error::Config(format!(
            "plugin name `{name}`: use letters, digits, '-' and '_', starting with a letter"
        )));
    }
    let abi = abi.canonicalize().map_err(|e| {
        Error::Config(format!(
            "the taper-plugin crate at {}: {e} (pass --abi PATH)",
            abi.display()
        ))
    })?;
    let root = dir.join(name);
    if root.exists() {
        return Err(Error::Config(format!("{} already exists", root.display())));
    }
    let src = root.join("src");
    std::fs::create_dir_all(&src).map_err(|e| Error::io(&src, e))?;
    let ident: String = name
        .split(['-', '_'])
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect();
    let cargo = format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2021"

[lib]
crate-type = ["cdylib"]

[dependencies]
taper-plugin = {{ path = "{}" }}

# Not part of an enclosing workspace.
[workspace]
"#,
        abi.display()
    );
    let lib = format!(
        r#"//! A taper plugin. Build: `cargo build --release`; use from a recipe:
//!   local p = taper.plugin.load("target/release/lib{lib_name}.so", {{ floor = 2 }})
//!   local run = taper.run{{ ..., on_oom = p }}

use taper_plugin::{{OomAction, OomEvent, Plugin, ACTION_STOP, KIND_OOM_POLICY}};

struct {ident} {{
    floor: u64,
}}

impl Plugin for {ident} {{
    // Add KIND_SCHEDULE or KIND_TRANSFORM and their hooks as needed.
    const KINDS: u32 = KIND_OOM_POLICY;

    /// The recipe's options arrive as JSON.
    fn create(config_json: &str) -> Result<Self, String> {{
        let floor = config_json
            .split("\"floor\":")
            .nth(1)
            .and_then(|s| s.trim_start().split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        Ok({ident} {{ floor }})
    }}

    /// Halve the micro-batch on an OOM; stop below `floor`.
    fn on_oom(&mut self, event: &OomEvent) -> Result<OomAction, String> {{
        let half = event.micro_batch / 2;
        if half < self.floor {{
            return Ok(OomAction::of(ACTION_STOP));
        }}
        Ok(OomAction::split(half))
    }}
}}

taper_plugin::export!({ident}, name = "{name}");
"#,
        lib_name = name.replace('-', "_")
    );
    for (path, text) in [(root.join("Cargo.toml"), cargo), (src.join("lib.rs"), lib)] {
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
    }
    Ok(root)
}
