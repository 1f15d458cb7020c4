//! `taper.model`, `taper.optim` and `taper.loss`: constructors that return
//! handles to plain specs. The run instantiates them.

use std::sync::Arc;

use candle_core::{DType, Device};
use mlua::{Lua, MetaMethod, Table, UserData, UserDataMethods, Value};

use super::options::{config_error, decode};
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
    if let (Some((head, trained)), true) = (&started.new_head, starts_from_file(&host)) {
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
/// Hugging Face BERT, DistilBERT or RoBERTa (its folder, or its
/// model.safetensors with config.json beside it) with a classification
/// head of `outputs`.
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
                    "{WHAT}: option `from` (a transformers BERT, DistilBERT or RoBERTa folder) is required, got {}",
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
    let host = super::state(lua);
    if starts_from_file(&host) {
        for note in &imported.notes {
            host.out.tell(&format!("note: {WHAT}: {note}"));
        }
    }
    checked(lua, WHAT, imported.spec)
}

/// Whether a run will start from the weights a constructor reads (and its
/// notes on them, such as a head that starts afresh, are worth telling):
/// not when it resumes from its own checkpoint, nor in a reloaded version,
/// whose `taper.run{}` goes on with the running model's weights.
fn starts_from_file(host: &super::HostState) -> bool {
    let reload = host.reload.borrow();
    host.resume.borrow().is_none() && reload.generation == 0 && reload.trial.is_none()
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
    taper.set("model", models)
}
