//! `taper.schedule`: built-in schedules, and Lua functions as schedules.

use std::cell::RefCell;
use std::rc::Rc;

use mlua::{Function, Lua, MetaMethod, Table, UserData, UserDataMethods, Value};
use serde::Deserialize;

use super::options::{decode, defined_at};
use crate::engine::schedule::{BatchRamp, Constant, Schedule, StepDecay, StepPlan, WarmupCosine};
use crate::Error;

#[derive(Clone)]
pub struct ScheduleHandle(pub Rc<RefCell<dyn Schedule>>);

impl UserData for ScheduleHandle {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        super::members::unknown_is_an_error(m, "Schedule");
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(format!("taper.schedule({})", this.0.borrow().describe()))
        });
        // The plan for a step, for inspecting a schedule from a recipe.
        m.add_method("plan", |lua, this, (step, epoch): (u64, Option<u64>)| {
            let p = this
                .0
                .borrow_mut()
                .plan(step, epoch.unwrap_or(1))
                .map_err(crate::error::lua_err)?;
            let t = lua.create_table()?;
            t.set("lr", p.lr)?;
            t.set("micro_batch", p.micro_batch)?;
            t.set("batch_size", p.batch_size)?;
            Ok(t)
        });
    }
}

/// What a Lua schedule function returns.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanTable {
    lr: Option<f64>,
    micro_batch: Option<usize>,
    batch_size: Option<usize>,
}

/// `function(step, epoch, state) return { lr = ..., micro_batch = ... } end`.
/// `state` is a table the function owns, kept between calls.
pub struct LuaSchedule {
    lua: Lua,
    f: Function,
    state: Table,
    place: String,
}

impl LuaSchedule {
    pub fn new(lua: &Lua, f: Function) -> mlua::Result<Self> {
        let place = format!("schedule function at {}", defined_at(&f));
        Ok(LuaSchedule {
            lua: lua.clone(),
            f,
            state: lua.create_table()?,
            place,
        })
    }
}

impl Schedule for LuaSchedule {
    fn plan(&mut self, step: u64, epoch: u64) -> crate::Result<StepPlan> {
        let v: Value = self.f.call((step, epoch, self.state.clone()))?;
        if v.is_nil() {
            return Ok(StepPlan::default());
        }
        let de = mlua::serde::Deserializer::new(v);
        let p: PlanTable = serde_path_to_error::deserialize(de).map_err(|e| {
            let inner = e.inner().to_string();
            Error::Config(format!(
                "{}: bad return value: {}",
                self.place,
                inner.trim_start_matches("deserialize error: ")
            ))
        })?;
        if p.micro_batch == Some(0) || p.batch_size == Some(0) {
            return Err(Error::Config(format!(
                "{}: micro_batch and batch_size must be positive",
                self.place
            )));
        }
        let _ = &self.lua;
        Ok(StepPlan {
            lr: p.lr,
            micro_batch: p.micro_batch,
            batch_size: p.batch_size,
        })
    }
    fn describe(&self) -> String {
        self.place.clone()
    }
}

fn builtin<T: Schedule + serde::de::DeserializeOwned + 'static>(
    lua: &Lua,
    name: &'static str,
) -> mlua::Result<Function> {
    lua.create_function(move |lua, opts: Value| {
        let s: T = decode(lua, name, opts)?;
        s.check()
            .map_err(|e| super::options::config_error(lua, format!("{name}: {e}")))?;
        Ok(ScheduleHandle(Rc::new(RefCell::new(s))))
    })
}

pub(crate) fn register(lua: &Lua, taper: &Table) -> mlua::Result<()> {
    let t = lua.create_table()?;
    t.set(
        "constant",
        builtin::<Constant>(lua, "taper.schedule.constant")?,
    )?;
    t.set(
        "warmup_cosine",
        builtin::<WarmupCosine>(lua, "taper.schedule.warmup_cosine")?,
    )?;
    t.set("step", builtin::<StepDecay>(lua, "taper.schedule.step")?)?;
    t.set(
        "batch_ramp",
        builtin::<BatchRamp>(lua, "taper.schedule.batch_ramp")?,
    )?;
    taper.set("schedule", t)
}
