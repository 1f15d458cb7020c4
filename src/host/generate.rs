//! `run:generate{...}`: sampling from a run's sequence model, with a text
//! prompt through the run's vocabulary or a table of token ids.

use mlua::{Lua, Value};
use serde::Deserialize;

use super::generator::Feed;
use super::options::{config_error, decode};
use super::run_state::RunHandle;
use super::state;
use crate::error::lua_err;

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GenerateOpts {
    prompt: Prompt,
    #[serde(default = "default_tokens")]
    tokens: usize,
    #[serde(default = "default_temperature")]
    temperature: f64,
    #[serde(default)]
    seed: u64,
}

fn default_tokens() -> usize {
    200
}
fn default_temperature() -> f64 {
    1.0
}

pub(crate) fn generate(lua: &Lua, run: &RunHandle, opts: Value) -> mlua::Result<Value> {
    let o: GenerateOpts = decode(lua, "run:generate", opts)?;
    let r = run.get()?;
    let check_only = state(lua).opts.check_only;
    let vocab = match &r.data {
        Some(Feed::Pipeline(p)) => p.source().vocab().cloned(),
        _ => None,
    };
    let ids = match (&o.prompt, &vocab) {
        (Prompt::Ids(ids), _) => ids.clone(),
        (Prompt::Text(s), Some(v)) => v.encode(s).map_err(|e| config_error(lua, e))?,
        (Prompt::Text(_), None) => {
            return Err(config_error(
                lua,
                "run:generate: a text prompt needs a run whose data is text",
            ))
        }
    };
    // `taper check` validates the call without sampling from an untrained model.
    let tokens = if check_only { 0 } else { o.tokens };
    let out = r
        .core
        .trainer
        // A signal stops a long sampling between tokens, as it stops an
        // evaluation between batches.
        .generate(
            &ids,
            tokens,
            o.temperature,
            o.seed,
            &mut crate::run::interrupt::check,
        )
        .map_err(|e| match e {
            crate::Error::Config(m) => config_error(lua, format!("run:{m}")),
            other => lua_err(other),
        })?;
    match (&o.prompt, vocab) {
        (Prompt::Text(_), Some(v)) => Ok(Value::String(lua.create_string(v.decode(&out))?)),
        _ => mlua::LuaSerdeExt::to_value(lua, &out),
    }
}
