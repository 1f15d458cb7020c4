//! `taper.optim.*` and `taper.loss.*`: optimizers and losses as Lua
//! values, each checked where the recipe builds it.

use mlua::{Lua, MetaMethod, Table, UserData, UserDataMethods, Value};

use super::options::{config_error, decode};
use crate::engine::loss::{CrossEntropy, Distill, Loss};
use crate::engine::optim::{AdamWConfig, OptimSpec, SgdConfig};

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

/// `taper.optim` and `taper.loss`.
pub(crate) fn register(lua: &Lua, taper: &Table) -> mlua::Result<()> {
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
        "bce",
        lua.create_function(|lua, opts: Option<Table>| bce(lua, opts))?,
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

/// `taper.loss.bce{ pos_weight = 3 }` (or `{ 3, 1, 0.5 }`, one per label):
/// multi-label classification, as `torch.nn.BCEWithLogitsLoss`.
fn bce(lua: &Lua, opts: Option<Table>) -> mlua::Result<LossHandle> {
    const WHAT: &str = "taper.loss.bce";
    let Some(t) = opts else {
        return Ok(LossHandle(Loss::Bce(Default::default())));
    };
    super::options::check_keys(lua, WHAT, &t, &["pos_weight"])?;
    let bad = |got: String| {
        super::options::config_error(
            lua,
            format!("{WHAT}: `pos_weight` is a number above 0, or a list of them (one per label); got {got}"),
        )
    };
    let weights: Vec<f64> = match t.get::<Value>("pos_weight")? {
        Value::Nil => return Ok(LossHandle(Loss::Bce(Default::default()))),
        Value::Integer(n) => vec![n as f64],
        Value::Number(n) => vec![n],
        Value::Table(list) => list
            .sequence_values::<Value>()
            .map(|v| match v? {
                Value::Integer(n) => Ok(n as f64),
                Value::Number(n) => Ok(n),
                other => Err(bad(super::options::a_type(&other).to_string())),
            })
            .collect::<mlua::Result<_>>()?,
        other => return Err(bad(super::options::a_type(&other).to_string())),
    };
    if weights.is_empty() || weights.iter().any(|w| !(w.is_finite() && *w > 0.0)) {
        return Err(bad(format!("{weights:?}")));
    }
    let pos_weight = Some(weights.into_iter().map(|w| w as f32).collect());
    Ok(LossHandle(Loss::Bce(crate::engine::loss::Bce {
        pos_weight,
    })))
}
