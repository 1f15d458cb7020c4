//! `taper bench plugin`: what one OOM-policy call costs, in nanoseconds, for
//! the three kinds of implementation a slot can hold: built into Rust, a Lua
//! function (the event table built and the action decoded, as the host
//! does), and a native plugin (the C struct filled, the call made through
//! the ABI, the action decoded).

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use mlua::{Function, Lua, Value};
use taper_plugin::{OomEvent, PHASE_BACKWARD};

use super::median;
use crate::host::oom_action_of_lua;
use crate::plugins::{self, Instance};
use crate::{Error, Result};

fn event(i: u64) -> OomEvent {
    OomEvent {
        phase: PHASE_BACKWARD,
        step: i,
        epoch: 1,
        batch_size: 64,
        micro_batch: 64,
        attempt: 1,
        memory_used: 1 << 20,
        memory_peak: 2 << 20,
        ..Default::default()
    }
}

/// ns per call of `f`, median of `rounds` timings of `calls` calls.
fn time(rounds: usize, calls: u64, mut f: impl FnMut(u64) -> Result<()>) -> Result<f64> {
    let mut per = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        for i in 0..calls {
            f(i)?;
        }
        per.push(t.elapsed().as_secs_f64() * 1e9 / calls as f64);
    }
    Ok(median(&mut per))
}

pub fn run(plugin: &Path, calls: u64, rounds: usize) -> Result<()> {
    if !plugin.exists() {
        return Err(Error::Plugin(format!(
            "{}: not built; run `cargo build --release -p taper-adaptive-batch` first",
            plugin.display()
        )));
    }
    let inst = Instance::create(plugins::load(plugin)?, r#"{"after": 1000000000}"#)?;
    // Built in: the host's default, halve the micro-batch.
    let builtin: &dyn Fn(&OomEvent) -> u64 = &|e| (e.micro_batch / 2).max(1);
    let rust = time(rounds, calls, |i| {
        black_box(builtin(black_box(&event(i))));
        Ok(())
    })?;
    let native = time(rounds, calls, |i| {
        let a = inst.on_oom(black_box(&event(i)))?;
        black_box(a);
        Ok(())
    })?;
    let lua = Lua::new();
    let policy: Function = lua
        .load("return function(ev) return { action = 'split', micro_batch = ev.micro_batch // 2 } end")
        .eval()?;
    let lua_ns = time(rounds, calls, |i| {
        let e = event(i);
        let t = lua.create_table()?;
        t.set("phase", "backward")?;
        t.set("cause", "injected")?;
        t.set("step", e.step)?;
        t.set("epoch", e.epoch)?;
        t.set("batch_size", e.batch_size)?;
        t.set("micro_batch", e.micro_batch)?;
        t.set("attempt", e.attempt)?;
        t.set("error", "out of memory")?;
        let mem = lua.create_table()?;
        mem.set("used", e.memory_used)?;
        mem.set("peak", e.memory_peak)?;
        t.set("memory", mem)?;
        let v: Value = policy.call(t)?;
        black_box(oom_action_of_lua(v)?);
        Ok(())
    })?;
    println!("one OOM-policy call (median of {rounds} x {calls} calls), event in, action out:");
    println!("  built-in Rust      {rust:>8.1} ns");
    println!(
        "  plugin             {native:>8.1} ns   {:.1}x Rust ({})",
        native / rust.max(1e-3),
        inst.lib.name
    );
    println!(
        "  Lua function       {lua_ns:>8.1} ns   {:.1}x the plugin",
        lua_ns / native
    );
    Ok(())
}
