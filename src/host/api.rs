//! The `taper` table a recipe sees, and the Lua globals the host replaces
//! (`print`, `os.exit`) or hooks (a stop asked for by a signal).

use mlua::{Lua, Table, Value};

use super::HostState;
use super::{
    config, data, data_files, models, optim_loss, plugin, policies, reload, run, schedule, state,
};
use crate::Error;

/// The `taper` table (`require "taper"` too), `print` through the host's
/// output, and the hooks that stop or reload Lua code between steps.
pub(super) fn register_api(lua: &Lua, state: &HostState) -> crate::Result<()> {
    let taper = lua.create_table()?;
    taper.set("version", env!("CARGO_PKG_VERSION"))?;
    taper.set("device", crate::engine::describe_device(&state.device))?;
    let start = std::time::Instant::now();
    taper.set(
        "clock",
        lua.create_function(move |_, ()| Ok(start.elapsed().as_secs_f64()))?,
    )?;
    config::register(lua, &taper)?;
    models::register(lua, &taper)?;
    optim_loss::register(lua, &taper)?;
    data::register(lua, &taper)?;
    // The file formats, into the same `taper.data` table.
    data_files::register(lua, &taper.get::<Table>("data")?)?;
    run::register(lua, &taper)?;
    schedule::register(lua, &taper)?;
    policies::register(lua, &taper)?;
    plugin::register(lua, &taper)?;
    lua.globals().set("taper", taper.clone())?;
    lua.register_module("taper", taper)?;
    install_print(lua)?;
    // A stop asked for by a signal also ends Lua code that never steps
    // (a loop in the recipe): checked every 16k Lua instructions.
    lua.set_global_hook(
        mlua::HookTriggers::new().every_nth_instruction(1 << 14),
        |_, _| {
            crate::run::interrupt::check().map_err(crate::error::lua_err)?;
            Ok(mlua::VmState::Continue)
        },
    )?;
    reload::register_safe_points(lua)?;
    Ok(())
}

/// `print` goes through the output so that it neither tears the progress bar
/// nor shows when quiet.
fn install_print(lua: &Lua) -> mlua::Result<()> {
    let print = lua.create_function(|lua, args: mlua::MultiValue| {
        let tostring: mlua::Function = lua.globals().get("tostring")?;
        let parts = args
            .into_iter()
            .map(|v| tostring.call::<String>(v))
            .collect::<mlua::Result<Vec<_>>>()?;
        state(lua).out.line(&parts.join("\t"));
        Ok(())
    })?;
    lua.globals().set("print", print)?;
    // `os.exit(code)` ends the run through the same path as a signal: the
    // checkpoint and the final records are written, then the CLI exits
    // with `code` (`true`/nil: 0, `false`: 1).
    let exit = lua.create_function(|_, code: Value| -> mlua::Result<()> {
        let code = match code {
            Value::Nil | Value::Boolean(true) => 0,
            Value::Boolean(false) => 1,
            Value::Integer(n) => n as i32,
            Value::Number(n) => n as i32,
            other => {
                return Err(crate::error::lua_err(Error::Script(format!(
                    "os.exit: expected an exit code, got {}",
                    super::options::a_type(&other)
                ))))
            }
        };
        Err(crate::error::lua_err(Error::Exited(code)))
    })?;
    let os: Table = lua.globals().get("os")?;
    os.set("exit", exit)
}
