//! `taper.policy.*`: the built-in OOM policies, written in Lua.

use mlua::{Function, Lua, Table};

/// The built-in policies: the Lua files in `scripts/policies/`, compiled in.
const POLICIES: &[(&str, &str)] = &[
    (
        "split_then_stop",
        include_str!("../../scripts/policies/split_then_stop.lua"),
    ),
    (
        "composer_like",
        include_str!("../../scripts/policies/composer_like.lua"),
    ),
    (
        "grow_back",
        include_str!("../../scripts/policies/grow_back.lua"),
    ),
    ("chain", include_str!("../../scripts/policies/chain.lua")),
    (
        "escalate",
        include_str!("../../scripts/policies/escalate.lua"),
    ),
];

/// `taper.policy.<name>{...}`: each built-in file returns its constructor.
pub(crate) fn register(lua: &Lua, taper: &Table) -> mlua::Result<()> {
    let t = lua.create_table()?;
    for (name, src) in POLICIES {
        let ctor: Function = lua
            .load(*src)
            .set_name(format!("@scripts/policies/{name}.lua"))
            .eval()?;
        t.set(*name, ctor)?;
    }
    taper.set("policy", t)
}
