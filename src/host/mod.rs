//! The Lua host: the `taper` module a recipe sees, and running a recipe.

mod api;
mod append;
mod batch;
mod batch_tables;
mod best;
mod class_weights;
mod config;
mod csv_columns;
mod data;
mod data_csv;
mod data_files;
mod data_images;
mod eval_scores;
mod evaluate;
mod export;
mod folder_lock;
mod generate;
mod generator;
mod host_options;
mod members;
mod memory_limit;
mod models;
mod oom;
mod oom_options;
mod oom_policy;
mod optim_loss;
mod options;
mod output;
mod passes;
mod plan;
mod plugin;
mod policies;
mod progress;
pub(crate) mod reload;
mod render;
mod run;
mod run_create;
mod run_options;
mod run_state;
mod schedule;
mod table_files;
mod tensorboard;

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use candle_core::Device;
use mlua::{Lua, Table, Value};
use serde::de::DeserializeOwned;

use crate::data::Source;
use crate::engine::{parse_device, Eval, ModelSpec};
pub use crate::memory::inject::parse_size;
use crate::{Error, Result};
pub use folder_lock::FolderLock;
pub use host_options::{HostOptions, DEFAULT_LOG_EVERY};
use output::Output;
pub use plan::{probe_sizes, RunPlan};
pub use render::render_error;
use run_state::RunState;
pub use run_state::RunSummary;

/// A quiet metrics writer into `dir`, for `taper bench records`.
pub(crate) fn output_for_bench(dir: &std::path::Path) -> Result<output::Output> {
    output::Output::new(Some(dir), true, false, false)
}

/// Decodes what a Lua OOM policy returned, as the host does (for
/// benchmarks): whether it decided something.
pub fn oom_action_of_lua(v: Value) -> Result<bool> {
    Ok(oom_policy::parse_action(v, "bench")?.is_some())
}

/// State shared by the Lua API functions (stored as Lua app data).
pub(crate) struct HostState {
    pub opts: HostOptions,
    pub device: Device,
    pub out: Output,
    /// The recipe version (generation) that last called `taper.config{}`:
    /// each version, the first and every reloaded one, calls it once.
    pub config_called: Cell<Option<u64>>,
    pub runs: RefCell<Vec<Rc<RefCell<RunState>>>>,
    pub resume: RefCell<Option<PathBuf>>,
    /// Hash of the recipe being run (see `CheckpointMeta::recipe_hash`).
    pub recipe_hash: RefCell<String>,
    /// Reloading the recipe's scripts: versions and the one being tried.
    pub reload: RefCell<reload::ReloadState>,
    /// Watching them.
    pub watch: RefCell<reload::watch::Watching>,
    /// On a GPU with `--mem-limit`: the rest of the card, reserved.
    pub ballast: Option<crate::memory::device::Ballast>,
    /// On the CPU: the heap budget runs keep under when no other limit is
    /// given, from the container's memory limit or the machine's memory.
    pub budget: Option<memory_limit::HostBudget>,
}

pub(crate) fn state(lua: &Lua) -> Rc<HostState> {
    // Set in Host::new before any Lua code can run.
    lua.app_data_ref::<Rc<HostState>>()
        .map(|s| s.clone())
        .expect("taper host state is installed by Host::new")
}

/// What a finished recipe left behind.
#[derive(Debug, Clone)]
pub struct Report {
    pub runs: Vec<RunSummary>,
    pub metrics: Option<PathBuf>,
}

pub struct Host {
    lua: Lua,
    state: Rc<HostState>,
    checkpoints: Vec<PathBuf>,
    /// Whether a final or failure checkpoint was tried and not written.
    save_failed: bool,
}

impl Host {
    pub fn new(opts: HostOptions) -> Result<Host> {
        let device = parse_device(&opts.device)?;
        host_options::check_options(&opts)?;
        let out = Output::new(
            opts.out_dir.as_deref(),
            opts.quiet,
            opts.resume.is_some() || opts.reuse_out,
            opts.tensorboard,
        )?;
        if let Some(dir) = &opts.out_dir {
            // A save killed half-way leaves a temporary file, never a
            // checkpoint; one killed between its two renames, an old sidecar.
            crate::engine::checkpoint::tidy(dir);
        }
        let ballast = memory_limit::reserve_above_limit(opts.mem_limit, &device, &out)?;
        let budget = memory_limit::host_budget(&device);
        let lua = Lua::new();
        let state = Rc::new(HostState {
            resume: RefCell::new(opts.resume.clone()),
            opts,
            device,
            out,
            config_called: Cell::new(None),
            runs: RefCell::new(Vec::new()),
            recipe_hash: RefCell::new(String::new()),
            reload: RefCell::new(reload::ReloadState::default()),
            watch: RefCell::new(reload::watch::Watching::default()),
            ballast,
            budget,
        });
        lua.set_app_data(state.clone());
        api::register_api(&lua, &state)?;
        Ok(Host {
            lua,
            state,
            checkpoints: Vec::new(),
            save_failed: false,
        })
    }

    /// The Lua state, for embedders that add their own functions.
    pub fn lua(&self) -> &Lua {
        &self.lua
    }

    /// The recipe's globals: each version of a recipe (see `--watch`) runs
    /// with its own, reading through to the shared ones where `taper` is.
    pub fn globals(&self) -> Result<Table> {
        Ok(reload::recipe_env(&self.lua)?)
    }

    fn sub_table(&self, name: &str) -> Result<Table> {
        let taper: Table = self.lua.globals().get("taper")?;
        Ok(taper.get(name)?)
    }

    /// Makes `taper.model.<name>{...}` build `T`, decoded from the options
    /// table (use `#[serde(deny_unknown_fields)]`).
    pub fn register_model<T>(&self, name: &str) -> Result<()>
    where
        T: ModelSpec + DeserializeOwned + 'static,
    {
        let what = format!("taper.model.{name}");
        let f = self.lua.create_function(move |lua, opts: Value| {
            let spec: T = options::decode(lua, &what, opts)?;
            Ok(models::ModelHandle(Arc::new(spec)))
        })?;
        self.sub_table("model")?.set(name, f)?;
        Ok(())
    }

    /// Makes `taper.data.<name>{...}` a source built by `make` from options `O`.
    pub fn register_data<O, F>(&self, name: &str, make: F) -> Result<()>
    where
        O: DeserializeOwned + 'static,
        F: Fn(O) -> Result<Arc<dyn Source>> + 'static,
    {
        let what = format!("taper.data.{name}");
        let f = self.lua.create_function(move |lua, opts: Value| {
            let o: O = options::decode(lua, &what, opts)?;
            let source = make(o).map_err(crate::error::lua_err)?;
            Ok(data::DataHandle(crate::data::Pipeline::new(source)))
        })?;
        self.sub_table("data")?.set(name, f)?;
        Ok(())
    }

    /// Runs a recipe file. Its directory is on the `require` path.
    pub fn run_file(&mut self, path: &Path) -> Result<Report> {
        let src = reload::read_script(path).map_err(|e| {
            Error::Config(format!(
                "{} (try `taper train scripts/digits.lua`)",
                e.replacen("cannot read ", "cannot read recipe ", 1)
            ))
        })?;
        if let Some(dir) = path.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            let package: Table = self.lua.globals().get("package")?;
            let old: String = package.get("path")?;
            let d = dir.display();
            package.set("path", format!("{d}/?.lua;{d}/?/init.lua;{old}"))?;
        }
        let name = path.display().to_string();
        self.state.watch.borrow_mut().recipe = Some((path.to_path_buf(), name.clone()));
        if self.state.opts.watch {
            reload::watch::start_watching(&self.state);
        }
        self.run_source(&name, &src)
    }

    /// Runs recipe source; `name` is what error messages call the file.
    pub fn run_source(&mut self, name: &str, src: &str) -> Result<Report> {
        *self.state.recipe_hash.borrow_mut() = crate::engine::checkpoint::text_hash(src);
        let result = reload::drive(&self.lua, &self.state, name, src)
            .and_then(|_| self.check_overrides_used());
        match result {
            Ok(()) => self.finish(),
            // `os.exit(0)`: the recipe is done, as if it had returned.
            Err(e) if e.exited() == Some(0) => self.finish(),
            Err(e) => {
                self.state.out.finish_bar();
                let why = if e.interrupted().is_some() {
                    "interrupted"
                } else if e.exited().is_some() {
                    "exited"
                } else if e.find(|e| matches!(e, Error::Stopped(_))) {
                    "stopped"
                } else {
                    "failed"
                };
                // A checkpoint that cannot be written either (a full disk)
                // must not hide why the run failed: both are told. A run
                // whose step diverged said already that its model is not
                // saved.
                let diverged = e.find(|e| matches!(e, Error::Diverged(_)));
                for save in self.try_save_all(why) {
                    if diverged && save.find(|e| matches!(e, Error::Diverged(_))) {
                        continue;
                    }
                    self.state.out.finish_bar();
                    crate::tell!("taper: the {why} run's checkpoint could not be written: {save}");
                }
                if let Err(records) = self.state.out.finish_records() {
                    crate::tell!("taper: the {why} run's records: {records}");
                }
                Err(e)
            }
        }
    }

    fn check_overrides_used(&self) -> Result<()> {
        if !self.state.opts.overrides.is_empty() && self.state.config_called.get().is_none() {
            return Err(Error::Config(
                "--set was given but the recipe declares no taper.config{...}".into(),
            ));
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<Report> {
        for r in self.state.runs.borrow().iter() {
            run_state::finish_epoch(&self.state, &mut r.borrow_mut())?;
        }
        self.state.out.finish_bar();
        let saved = self.save_all("final");
        // Records that waited for room on the disk are written now, or the
        // run ends with an error that says how many could not be.
        let written = self.state.out.finish_records();
        if let (Err(_), Err(records)) = (&saved, &written) {
            crate::tell!("taper: the final records: {records}");
        }
        saved?;
        written?;
        for r in self.state.runs.borrow().iter() {
            let r = r.borrow();
            if r.core.trainer.step == 0 && !r.core.skipped.is_empty() {
                return Err(Error::Script(format!(
                    "run {} took no step: its OOM policy skipped all {} batches it was given (see the `oom` records)",
                    r.id,
                    r.core.skipped.len()
                )));
            }
        }
        Ok(Report {
            runs: self
                .state
                .runs
                .borrow()
                .iter()
                .map(|r| r.borrow().summary())
                .collect(),
            metrics: self.state.out.metrics_path(),
        })
    }

    /// Writes a checkpoint of every run that has trained, into the output
    /// folder: `checkpoint.safetensors`, `checkpoint-2.safetensors`, ...
    fn save_all(&mut self, why: &str) -> Result<()> {
        match self.try_save_all(why).into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// [`Self::save_all`], trying every run whatever the others' outcome
    /// (one diverged model does not keep the others from being saved);
    /// returns the errors.
    fn try_save_all(&mut self, why: &str) -> Vec<Error> {
        let mut errors = Vec::new();
        for r in self.state.runs.borrow().iter() {
            match run_state::checkpoint(&self.state, &mut r.borrow_mut(), why) {
                Ok(Some(path)) => self.checkpoints.push(path),
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
        self.save_failed |= !errors.is_empty();
        errors
    }

    /// Checkpoints written at the end of the last recipe, or after its failure.
    pub fn checkpoints(&self) -> &[PathBuf] {
        &self.checkpoints
    }

    /// Whether a run's final or failure checkpoint could not be written (a
    /// full disk): not when there was no run to save.
    pub fn save_failed(&self) -> bool {
        self.save_failed
    }

    /// The output folder (none under `taper check`, or before a run made it).
    pub fn out_dir(&self) -> Option<PathBuf> {
        self.state.out.dir()
    }

    /// The last evaluation of each run, in creation order.
    pub fn last_evals(&self) -> Vec<Option<Eval>> {
        self.state
            .runs
            .borrow()
            .iter()
            .map(|r| r.borrow().core.last_eval.clone())
            .collect()
    }
}

/// `YYYYmmdd-HHMMSS` in UTC, for default output folder names.
pub fn utc_stamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
