//! Native strategy plugins: loading shared libraries that speak the C ABI in
//! `plugins/abi` (crate `taper-plugin`, header `plugins/include/taper_plugin.h`),
//! and calling them safely.
//!
//! Libraries are never unloaded (a plugin's code may be referenced by state
//! the host still holds). Loading a path whose content changed since it was
//! first loaded (a rebuilt plugin, picked up by a reload) loads a copy under
//! a new file name, since the dynamic loader would hand back the old one.
//! Each way loading can fail has its own message.

mod instance;
pub mod policy;
pub mod scaffold;

use std::collections::HashMap;
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

pub use instance::{Instance, PluginSchedule};
pub use policy::PluginPolicy;
use taper_plugin::{Descriptor, EntryFn, ABI_VERSION};

use crate::{Error, Result};

/// A loaded plugin library.
pub struct Library {
    pub path: PathBuf,
    pub name: String,
    pub version: String,
    pub kinds: u32,
    desc: &'static Descriptor,
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "plugin {} {} ({})",
            self.name,
            self.version,
            self.path.display()
        )
    }
}

/// The kinds a plugin can implement, by `KIND_*` bit and the name recipes use.
pub const KINDS: &[(u32, &str)] = &[
    (taper_plugin::KIND_OOM_POLICY, "on_oom"),
    (taper_plugin::KIND_SCHEDULE, "schedule"),
    (taper_plugin::KIND_TRANSFORM, "transform"),
];

impl Library {
    pub fn kind_names(&self) -> Vec<&'static str> {
        KINDS
            .iter()
            .filter(|(bit, _)| self.kinds & bit != 0)
            .map(|(_, n)| *n)
            .collect()
    }

    /// An error unless the plugin implements `kind`.
    pub fn require(&self, kind: u32) -> Result<()> {
        if self.kinds & kind != 0 {
            return Ok(());
        }
        let want = KINDS.iter().find(|(b, _)| *b == kind).map_or("?", |k| k.1);
        Err(Error::Plugin(format!(
            "{} ({}) does not implement `{want}`; it implements: {}",
            self.name,
            self.path.display(),
            self.kind_names().join(", ")
        )))
    }

    pub(crate) fn descriptor(&self) -> &'static Descriptor {
        self.desc
    }
}

/// Loaded libraries by (path, content hash): loading the same bytes twice
/// gives the same library.
type Registry = Mutex<HashMap<(PathBuf, String), Arc<Library>>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Loads the plugin at `path` (or returns it if these bytes are loaded).
pub fn load(path: &Path) -> Result<Arc<Library>> {
    let shown = path.display();
    let bytes = std::fs::read(path).map_err(|e| {
        Error::Plugin(match e.kind() {
            std::io::ErrorKind::NotFound => format!(
                "{shown}: no such file (build it first, e.g. `cargo build --release -p taper-adaptive-batch`)"
            ),
            _ => format!("{shown}: cannot read: {e}"),
        })
    })?;
    let canonical = path.canonicalize().map_err(|e| Error::io(path, e))?;
    let hash = crate::engine::checkpoint::text_hash(&String::from_utf8_lossy(&bytes));
    let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(lib) = reg.get(&(canonical.clone(), hash.clone())) {
        return Ok(lib.clone());
    }
    // A changed file at a path already loaded: load a copy under a new name.
    let seen_path = reg.keys().any(|(p, _)| *p == canonical);
    let open_at = if seen_path {
        copy_for_reload(&canonical, &hash, &bytes)?
    } else {
        canonical.clone()
    };
    let lib = open(&open_at, path)?;
    let lib = Arc::new(lib);
    reg.insert((canonical, hash), lib.clone());
    Ok(lib)
}

fn copy_for_reload(path: &Path, hash: &str, bytes: &[u8]) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("taper-plugins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("plugin");
    let ext = path.extension().and_then(|s| s.to_str()).unwrap_or("so");
    let copy = dir.join(format!("{stem}-{hash}.{ext}"));
    std::fs::write(&copy, bytes).map_err(|e| Error::io(&copy, e))?;
    Ok(copy)
}

/// dlopen + the checks, in order; `shown` is the path the recipe gave.
fn open(at: &Path, shown: &Path) -> Result<Library> {
    let s = shown.display();
    // SAFETY: loading a library runs its initializers; that is what loading
    // a plugin means. The library is never unloaded (leaked below).
    let lib = unsafe { libloading::Library::new(at) }
        .map_err(|e| Error::Plugin(format!("{s}: not a loadable shared library ({e})")))?;
    let entry: EntryFn = match unsafe { lib.get::<EntryFn>(taper_plugin::ENTRY_SYMBOL) } {
        Ok(f) => *f,
        Err(_) => {
            let other = (2..=9).find(|v| unsafe {
                lib.get::<EntryFn>(format!("taper_plugin_v{v}\0").as_bytes())
                    .is_ok()
            });
            std::mem::forget(lib);
            return Err(Error::Plugin(match other {
                Some(v) => format!(
                    "{s}: built for taper plugin ABI v{v}, but this taper speaks v{ABI_VERSION}: rebuild it against taper-plugin {ABI_VERSION}.x"
                ),
                None => format!(
                    "{s}: no `taper_plugin_v{ABI_VERSION}` symbol: is this a taper plugin? (Rust: taper_plugin::export!; C: see plugins/include/taper_plugin.h)"
                ),
            }));
        }
    };
    // Never unloaded: the function pointers below point into it.
    std::mem::forget(lib);
    // SAFETY: the symbol has the entry point's type by the ABI's contract.
    let desc = unsafe { entry() };
    if desc.is_null() {
        return Err(Error::Plugin(format!(
            "{s}: taper_plugin_v1 returned no descriptor"
        )));
    }
    // SAFETY: a non-null descriptor is static data in the library.
    let desc: &'static Descriptor = unsafe { &*desc };
    if desc.abi_version != ABI_VERSION {
        return Err(Error::Plugin(format!(
            "{s}: declares ABI version {}, expected {ABI_VERSION}",
            desc.abi_version
        )));
    }
    if (desc.size as usize) < std::mem::size_of::<Descriptor>() {
        return Err(Error::Plugin(format!(
            "{s}: its descriptor is {} bytes, expected at least {}: a damaged or hand-made plugin",
            desc.size,
            std::mem::size_of::<Descriptor>()
        )));
    }
    let text = |p: *const std::ffi::c_char, what: &str| -> Result<String> {
        if p.is_null() {
            return Err(Error::Plugin(format!("{s}: no {what} in its descriptor")));
        }
        // SAFETY: NUL-terminated static strings by the ABI's contract.
        Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let (name, version) = (text(desc.name, "name")?, text(desc.version, "version")?);
    if desc.create.is_none() || desc.destroy.is_none() {
        return Err(Error::Plugin(format!(
            "{name} ({s}): no create/destroy functions"
        )));
    }
    for (bit, kind) in KINDS {
        let has = match *bit {
            taper_plugin::KIND_OOM_POLICY => desc.on_oom.is_some(),
            taper_plugin::KIND_SCHEDULE => desc.schedule.is_some(),
            _ => desc.transform.is_some(),
        };
        if desc.kinds & bit != 0 && !has {
            return Err(Error::Plugin(format!(
                "{name} ({s}): declares `{kind}` but has no function for it"
            )));
        }
    }
    Ok(Library {
        path: shown.to_path_buf(),
        name,
        version,
        kinds: desc.kinds,
        desc,
    })
}
