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
    prompt: Option<Prompt>,
    /// A chat's messages: the reply to them, rendered with the run's chat
    /// template and ended at its end token.
    messages: Option<Vec<serde_json::Value>>,
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
    let spec = r.core.trainer.spec();
    if spec.context().is_some() && !spec.causal() {
        return Err(config_error(
            lua,
            format!(
                "run:generate: {} does not predict the next token (generate from a language model: taper.model.gpt, taper.model.llama_gguf)",
                spec.describe()
            ),
        ));
    }
    let check_only = state(lua).opts.check_only;
    let vocab = match &r.data {
        Some(Feed::Pipeline(p)) => p.source().vocab().cloned(),
        _ => None,
    };
    let (ids, end) = prompt_ids(lua, &o, vocab.as_ref())?;
    // `taper check` validates the call without sampling from an untrained model.
    let tokens = if check_only { 0 } else { o.tokens };
    let out = r
        .core
        .trainer
        // A signal stops a long sampling between tokens, as it stops an
        // evaluation between batches.
        .generate_until(
            &ids,
            tokens,
            end,
            o.temperature,
            o.seed,
            &mut crate::run::interrupt::check,
        )
        .map_err(|e| match e {
            crate::Error::Config(m) => config_error(lua, format!("run:{m}")),
            other => lua_err(other),
        })?;
    match (&o.prompt, vocab) {
        (Some(Prompt::Ids(_)), _) | (_, None) => mlua::LuaSerdeExt::to_value(lua, &out),
        (_, Some(v)) => Ok(Value::String(lua.create_string(v.decode(&out))?)),
    }
}

/// The prompt's ids, and the id that ends a chat's reply: from ids, text
/// through the run's vocabulary, or a chat's messages through its template.
fn prompt_ids(
    lua: &Lua,
    o: &GenerateOpts,
    vocab: Option<&crate::data::Vocab>,
) -> mlua::Result<(Vec<u32>, Option<u32>)> {
    let err = |e| config_error(lua, e);
    match (&o.prompt, &o.messages, vocab) {
        (Some(_), Some(_), _) => Err(err(
            "run:generate: give a `prompt` or a chat's `messages`, not both".to_string(),
        )),
        (None, None, _) => Err(err(
            "run:generate: give a `prompt` (text or ids) or a chat's `messages`".to_string(),
        )),
        (Some(Prompt::Ids(ids)), None, _) => Ok((ids.clone(), None)),
        (Some(Prompt::Text(s)), None, Some(v)) => {
            Ok((v.encode(s).map_err(|e| err(e.to_string()))?, None))
        }
        (Some(Prompt::Text(_)), None, None) => Err(err(
            "run:generate: a text prompt needs a run whose data is text".to_string(),
        )),
        (None, Some(m), v) => match v.and_then(|v| v.chat_prompt(m)) {
            Some(r) => r.map_err(|e| err(format!("run:generate: {e}"))),
            None => Err(err(
                "run:generate: `messages` need a run on chats (taper.data.chat), whose chat template renders them"
                    .to_string(),
            )),
        },
    }
}
