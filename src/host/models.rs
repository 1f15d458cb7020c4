//! `taper.model`, `taper.optim` and `taper.loss`: constructors that return
//! handles to plain specs. The run instantiates them.

use std::sync::Arc;

use candle_core::{DType, Device};
use mlua::{Lua, MetaMethod, Table, UserData, UserDataMethods, Value};

use super::options::{config_error, decode};
use crate::engine::loss::{CrossEntropy, Distill, Loss};
use crate::engine::optim::{AdamWConfig, OptimSpec, SgdConfig};
use crate::engine::{Cnn, Gpt, Mlp, ModelSpec, ParamStore};

#[derive(Clone)]
pub struct ModelHandle(pub Arc<dyn ModelSpec>);

impl UserData for ModelHandle {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        super::members::unknown_is_an_error(m, "Model");
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(format!("taper.model({})", this.0.describe()))
        });
        // Builds the model once on the CPU to count its parameters.
        m.add_method("parameters", |_, this, ()| {
            let store = ParamStore::new(0);
            this.0
                .build(store.var_builder(DType::F32, &Device::Cpu))
                .map_err(crate::error::lua_err)?;
            Ok(store.num_params())
        });
        m.add_method("describe", |_, this, ()| Ok(this.0.describe()));
    }
}

#[derive(Clone)]
pub struct OptimHandle(pub OptimSpec);

impl UserData for OptimHandle {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        super::members::unknown_is_an_error(m, "Optim");
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(format!("taper.optim({})", this.0.describe()))
        });
    }
}

#[derive(Clone)]
pub struct LossHandle(pub Loss);

impl UserData for LossHandle {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        super::members::unknown_is_an_error(m, "Loss");
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(format!("taper.loss({})", this.0.describe()))
        });
    }
}

/// `taper.loss.distill{ teacher = run, temperature = 2, alpha = 0.5,
/// label_smoothing = 0 }`: the teacher is frozen as it is now.
fn distill(lua: &Lua, opts: Table) -> mlua::Result<LossHandle> {
    let what = "taper.loss.distill";
    super::options::check_keys(
        lua,
        what,
        &opts,
        &["teacher", "temperature", "alpha", "label_smoothing"],
    )?;
    let teacher: super::run_state::RunHandle =
        super::options::handle(lua, what, &opts, "teacher", "a taper.run")?.ok_or_else(|| {
            config_error(
                lua,
                "taper.loss.distill: option `teacher` (a run) is required",
            )
        })?;
    let num = |key: &str, default: f64| -> mlua::Result<f64> {
        match opts.get::<Value>(key)? {
            Value::Nil => Ok(default),
            Value::Integer(i) => Ok(i as f64),
            Value::Number(n) => Ok(n),
            other => Err(config_error(
                lua,
                format!(
                    "{what}: option `{key}` must be a number, got {}",
                    super::options::a_type(&other)
                ),
            )),
        }
    };
    let (temperature, alpha) = (num("temperature", 2.0)?, num("alpha", 0.5)?);
    let label_smoothing = num("label_smoothing", 0.0)?;
    if !(temperature > 0.0 && temperature.is_finite()) {
        return Err(config_error(
            lua,
            format!("{what}: temperature {temperature} must be positive"),
        ));
    }
    if !(0.0..=1.0).contains(&alpha) {
        return Err(config_error(
            lua,
            format!("{what}: alpha {alpha} must be in [0, 1]"),
        ));
    }
    if !(0.0..1.0).contains(&label_smoothing) {
        return Err(config_error(
            lua,
            format!("{what}: label_smoothing must be in [0, 1)"),
        ));
    }
    let r = teacher.get()?;
    let model = r.core.trainer.snapshot().map_err(crate::error::lua_err)?;
    Ok(LossHandle(Loss::Distill(Distill {
        teacher: std::rc::Rc::from(model),
        teacher_name: r.core.trainer.spec().describe(),
        temperature,
        alpha,
        base: CrossEntropy {
            label_smoothing,
            ..Default::default()
        },
    })))
}

/// `taper.model.mlp{...}` / `taper.model.cnn{...}` (`kind`), or, with
/// `from`, the model another run trained (see [`warm_start`]).
fn model<T: ModelSpec + serde::de::DeserializeOwned + 'static>(
    lua: &Lua,
    name: &'static str,
    kind: &'static str,
) -> mlua::Result<mlua::Function> {
    lua.create_function(move |lua, opts: Value| match &opts {
        Value::Table(t) if t.contains_key("from")? => warm_start(lua, name, kind, t),
        _ => {
            let spec: T = decode(lua, name, opts)?;
            checked(lua, name, spec)
        }
    })
}

/// `taper.model.cnn{ from = "runs/pets", outputs = 5, dropout = 0.2 }`:
/// the architecture and trained weights of a checkpoint (or a run folder's
/// newest), with a new head when `outputs` differs from the checkpoint's,
/// and the checkpoint's dropout unless `dropout` is given.
fn warm_start(lua: &Lua, what: &str, kind: &str, t: &Table) -> mlua::Result<ModelHandle> {
    let keys = ["from", "outputs", "dropout"];
    super::options::check_keys(lua, &format!("{what} with `from`"), t, &keys)?;
    let from: String = match t.get::<Value>("from")? {
        Value::String(s) => s.to_str()?.to_string(),
        other => {
            return Err(config_error(
                lua,
                format!(
                    "{what}: option `from` must be a checkpoint or a run folder, got {}",
                    super::options::a_type(&other)
                ),
            ))
        }
    };
    let outputs = positive(lua, what, t, "outputs")?;
    let dropout = rate(lua, what, t, "dropout")?;
    let fail = |e: crate::Error| config_error(lua, format!("{what}: {e}"));
    super::data_files::check_files(lua, what, &[std::path::Path::new(&from)])?;
    let path = crate::interop::saved::locate(std::path::Path::new(&from)).map_err(fail)?;
    let (tensors, meta) =
        crate::engine::checkpoint::load(&path, &candle_core::Device::Cpu).map_err(fail)?;
    let started = crate::engine::warm_start::start_from(
        &path,
        kind,
        meta.model_config.as_ref(),
        tensors,
        (outputs, dropout),
    )
    .map_err(fail)?;
    let host = super::state(lua);
    // A run about to resume takes its own checkpoint's weights instead.
    let resuming = host.resume.borrow().is_some();
    if let (Some((head, trained)), false) = (&started.new_head, resuming) {
        host.out.tell(&format!(
            "note: {what}: `{head}`, the head, starts afresh with {} outputs (the checkpoint's has {trained}); every other weight from {}",
            outputs.unwrap_or(*trained),
            path.display()
        ));
    }
    checked(lua, what, started.spec)
}

/// `taper.model.gpt{ vocab, context, width, layers, heads, mlp }`, or
/// `taper.model.gpt{ from = "gpt2/", context = 256 }`: a Hugging Face GPT-2
/// (its folder, or its model.safetensors with config.json beside it) whose
/// weights the run starts from.
fn gpt(lua: &Lua, opts: Value) -> mlua::Result<ModelHandle> {
    const WHAT: &str = "taper.model.gpt";
    let from = match &opts {
        Value::Table(t) => t.get::<Value>("from")?,
        _ => Value::Nil,
    };
    let from = match from {
        Value::Nil => return checked(lua, WHAT, decode::<Gpt>(lua, WHAT, opts)?),
        Value::String(s) => s.to_str()?.to_string(),
        other => {
            return Err(config_error(
                lua,
                format!(
                    "{WHAT}: option `from` must be a path, got {}",
                    super::options::a_type(&other)
                ),
            ))
        }
    };
    let Value::Table(t) = &opts else {
        unreachable!("`from` came from a table")
    };
    // The file's config says what the model is; only the context may be
    // shortened, and the dropout chosen (the config's otherwise).
    super::options::check_keys(
        lua,
        &format!("{WHAT} with `from`"),
        t,
        &["from", "context", "dropout"],
    )?;
    let context = positive(lua, WHAT, t, "context")?;
    let dropout = rate(lua, WHAT, t, "dropout")?;
    let spec = crate::interop::hf::import(std::path::Path::new(&from), context, dropout)
        .map_err(|e| config_error(lua, format!("{WHAT}: {e}")))?;
    checked(lua, WHAT, spec)
}

/// `taper.model.bert{ from = "minilm/", outputs = 6, context = 128 }`: a
/// Hugging Face BERT (its folder, or its model.safetensors with
/// config.json beside it) with a classification head of `outputs`.
fn bert(lua: &Lua, opts: Table) -> mlua::Result<ModelHandle> {
    const WHAT: &str = "taper.model.bert";
    super::options::check_keys(
        lua,
        WHAT,
        &opts,
        &[
            "from",
            "outputs",
            "context",
            "dropout",
            "attention_dropout",
            "classifier_dropout",
        ],
    )?;
    let from = match opts.get::<Value>("from")? {
        Value::String(s) => s.to_str()?.to_string(),
        other => {
            return Err(config_error(
                lua,
                format!(
                    "{WHAT}: option `from` (a transformers BERT folder) is required, got {}",
                    super::options::a_type(&other)
                ),
            ))
        }
    };
    let Some(outputs) = positive(lua, WHAT, &opts, "outputs")? else {
        return Err(config_error(
            lua,
            format!("{WHAT}: option `outputs` (one per class: `#train:classes()`) is required"),
        ));
    };
    let context = positive(lua, WHAT, &opts, "context")?;
    let rates = [
        rate(lua, WHAT, &opts, "dropout")?,
        rate(lua, WHAT, &opts, "attention_dropout")?,
        rate(lua, WHAT, &opts, "classifier_dropout")?,
    ];
    super::data_files::check_files(lua, WHAT, &[std::path::Path::new(&from)])?;
    let mut imported = crate::interop::bert::import(std::path::Path::new(&from), outputs, context)
        .map_err(|e| config_error(lua, format!("{WHAT}: {e}")))?;
    // `dropout` is every site's rate; the other two override theirs. The
    // config's rates otherwise, as transformers trains.
    let spec = &mut imported.spec;
    if let Some(r) = rates[0] {
        (
            spec.dropout,
            spec.attention_dropout,
            spec.classifier_dropout,
        ) = (r, r, r);
    }
    spec.attention_dropout = rates[1].unwrap_or(spec.attention_dropout);
    spec.classifier_dropout = rates[2].unwrap_or(spec.classifier_dropout);
    // A run about to resume takes its own checkpoint's weights instead.
    let host = super::state(lua);
    if host.resume.borrow().is_none() {
        for note in &imported.notes {
            host.out.tell(&format!("note: {WHAT}: {note}"));
        }
    }
    checked(lua, WHAT, imported.spec)
}

/// Option `key` of `t`: absent, or a rate in `[0, 1)`.
fn rate(lua: &Lua, what: &str, t: &Table, key: &str) -> mlua::Result<Option<f64>> {
    let v = t.get::<Value>(key)?;
    let r = match &v {
        Value::Nil => return Ok(None),
        Value::Integer(n) => *n as f64,
        Value::Number(n) => *n,
        _ => f64::NAN,
    };
    if (0.0..1.0).contains(&r) {
        return Ok(Some(r));
    }
    Err(config_error(
        lua,
        format!(
            "{what}: option `{key}` must be a rate from 0 up to (not including) 1, got {}",
            super::options::brief(&v)
        ),
    ))
}

/// Option `key` of `t`: absent, or a whole number of 1 or more.
fn positive(lua: &Lua, what: &str, t: &Table, key: &str) -> mlua::Result<Option<usize>> {
    match t.get::<Value>(key)? {
        Value::Nil => Ok(None),
        Value::Integer(n) if n > 0 => Ok(Some(n as usize)),
        other => Err(config_error(
            lua,
            format!(
                "{what}: option `{key}` must be a positive whole number, got {}",
                super::options::brief(&other)
            ),
        )),
    }
}

/// A model handle, once its options are checked ([`ModelSpec::check`]):
/// a wrong value is reported at the recipe's line rather than when the run
/// first builds the model.
fn checked(lua: &Lua, what: &str, spec: impl ModelSpec + 'static) -> mlua::Result<ModelHandle> {
    spec.check()
        .map_err(|e| super::options::at_caller(lua, what, e))?;
    Ok(ModelHandle(Arc::new(spec)))
}

/// `taper.model.llama_gguf{ path, ... }`: a missing file is named with
/// where the recipe's data comes from; checking reads the file.
fn llama_gguf(lua: &Lua, opts: Value) -> mlua::Result<ModelHandle> {
    const WHAT: &str = "taper.model.llama_gguf";
    let mut spec: crate::quant::LlamaGguf = decode(lua, WHAT, opts)?;
    super::data_files::check_files(lua, WHAT, &[&spec.path])?;
    // Checkpoints name the file the frozen weights come from: absolute, so
    // that `taper sample`/`export`/`--resume` find it from any folder.
    if let Ok(p) = std::path::absolute(&spec.path) {
        spec.path = p;
    }
    checked(lua, WHAT, spec)
}

pub(crate) fn register(lua: &Lua, taper: &Table) -> mlua::Result<()> {
    let models = lua.create_table()?;
    models.set("mlp", model::<Mlp>(lua, "taper.model.mlp", "mlp")?)?;
    models.set("cnn", model::<Cnn>(lua, "taper.model.cnn", "cnn")?)?;
    models.set("gpt", lua.create_function(gpt)?)?;
    models.set("llama_gguf", lua.create_function(llama_gguf)?)?;
    models.set("bert", lua.create_function(bert)?)?;
    taper.set("model", models)?;

    let optim = lua.create_table()?;
    optim.set(
        "adamw",
        lua.create_function(|lua, opts: Value| {
            let c: AdamWConfig = decode(lua, "taper.optim.adamw", opts)?;
            check_lr(lua, "taper.optim.adamw", c.lr)?;
            c.check()
                .map_err(|e| config_error(lua, format!("taper.optim.adamw: {e}")))?;
            Ok(OptimHandle(OptimSpec::AdamW(c)))
        })?,
    )?;
    optim.set(
        "sgd",
        lua.create_function(|lua, opts: Value| {
            let c: SgdConfig = decode(lua, "taper.optim.sgd", opts)?;
            check_lr(lua, "taper.optim.sgd", c.lr)?;
            c.check()
                .map_err(|e| config_error(lua, format!("taper.optim.sgd: {e}")))?;
            Ok(OptimHandle(OptimSpec::Sgd(c)))
        })?,
    )?;
    taper.set("optim", optim)?;

    let loss = lua.create_table()?;
    loss.set(
        "cross_entropy",
        lua.create_function(|lua, opts: Value| {
            let (opts, class_weights) = super::class_weights::take(lua, opts)?;
            let mut c: CrossEntropy = decode(lua, "taper.loss.cross_entropy", opts)?;
            c.class_weights = class_weights;
            if !(0.0..1.0).contains(&c.label_smoothing) {
                return Err(super::options::config_error(
                    lua,
                    "taper.loss.cross_entropy: label_smoothing must be in [0, 1)",
                ));
            }
            Ok(LossHandle(Loss::CrossEntropy(c)))
        })?,
    )?;
    loss.set(
        "mse",
        lua.create_function(|lua, opts: Option<Table>| {
            if let Some(t) = opts {
                super::options::check_keys(lua, "taper.loss.mse", &t, &[])?;
            }
            Ok(LossHandle(Loss::Mse))
        })?,
    )?;
    loss.set(
        "distill",
        lua.create_function(|lua, opts: Table| distill(lua, opts))?,
    )?;
    taper.set("loss", loss)
}

/// A learning rate must be a finite number >= 0 (`--set lr=NaN` arrives here
/// through `taper.config`).
fn check_lr(lua: &Lua, what: &str, lr: f64) -> mlua::Result<()> {
    match crate::run::check_lr(lr) {
        Ok(()) => Ok(()),
        Err(why) => Err(config_error(lua, format!("{what}: option `lr`: {why}"))),
    }
}
