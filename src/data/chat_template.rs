//! A model's chat template: the Jinja that turns a conversation into the
//! text the model was trained on (`<|im_start|>user\n...<|im_end|>\n` for
//! SmolLM2), read from where models carry it (a GGUF file's
//! `tokenizer.chat_template`, a `tokenizer_config.json`'s `chat_template`,
//! or a `.jinja` file) and rendered as transformers' `apply_chat_template`
//! renders it: `trim_blocks` and `lstrip_blocks` on, `messages`,
//! `add_generation_prompt`, the `bos_token` and `eos_token` the file names,
//! `raise_exception`, and Python's string methods.

use std::path::Path;

use minijinja::{Environment, ErrorKind};

use crate::{Error, Result};

/// A chat template ready to render conversations.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The Jinja, kept for checkpoints.
    source: String,
    bos: Option<String>,
    eos: Option<String>,
    /// Where it came from, for messages.
    origin: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChatTemplate({})", self.origin)
    }
}

impl ChatTemplate {
    /// The template in `path`: a `.gguf` model, a `tokenizer_config.json`,
    /// or (any other name) the template's own text.
    pub fn load(path: &Path) -> Result<Self> {
        let bad = |why: String| Error::Data(format!("{}: {why}", path.display()));
        let name = path.to_string_lossy().to_lowercase();
        let origin = path.display().to_string();
        if name.ends_with(".gguf") {
            let (source, bos, eos) = from_gguf(path).map_err(bad)?;
            return Self::new(source, bos, eos, origin);
        }
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        if name.ends_with(".json") {
            let (source, bos, eos) = from_config(&text).map_err(bad)?;
            return Self::new(source, bos, eos, origin);
        }
        Self::new(text, None, None, origin)
    }

    /// A template from its Jinja `source`; `bos` and `eos` are the tokens
    /// it may name as `bos_token` and `eos_token`.
    pub fn new(
        source: String,
        bos: Option<String>,
        eos: Option<String>,
        origin: String,
    ) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned("chat", source.clone())
            .map_err(|e| {
                Error::Data(format!(
                    "{origin}: the chat template is not Jinja that renders: {e}"
                ))
            })?;
        Ok(ChatTemplate {
            env,
            source,
            bos,
            eos,
            origin,
        })
    }

    /// The template as data, for checkpoints: `{"template": ..., "bos_token":
    /// ..., "eos_token": ...}`.
    pub fn record(&self) -> serde_json::Value {
        serde_json::json!({ "template": self.source, "bos_token": self.bos, "eos_token": self.eos })
    }

    /// The template [`ChatTemplate::record`] wrote.
    pub fn from_record(v: &serde_json::Value) -> Result<Self> {
        let text = |key: &str| v.get(key).and_then(|s| s.as_str()).map(str::to_string);
        let source = text("template")
            .ok_or_else(|| Error::Data("chat template record has no `template`".into()))?;
        Self::new(
            source,
            text("bos_token"),
            text("eos_token"),
            "the checkpoint's chat template".into(),
        )
    }

    /// The token that ends a reply (the file's EOS), where it names one.
    pub fn end_token(&self) -> Option<&str> {
        self.eos.as_deref()
    }

    /// The text of `messages` (JSON objects with `role` and `content`), and
    /// with `add_generation_prompt` the start of the assistant's reply.
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> std::result::Result<String, String> {
        let t = self.env.get_template("chat").map_err(|e| e.to_string())?;
        t.render(minijinja::context! {
            messages => minijinja::Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.clone(),
            eos_token => self.eos.clone(),
        })
        .map_err(|e| format!("the chat template ({}) fails: {e}", self.origin))
    }
}

type Found = (String, Option<String>, Option<String>);

/// `tokenizer.chat_template` of a GGUF file, and its BOS and EOS tokens.
fn from_gguf(path: &Path) -> std::result::Result<Found, String> {
    use candle_core::quantized::gguf_file::{Content, Value};
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let content = Content::read(&mut f).map_err(|e| format!("not a GGUF file: {e}"))?;
    let meta = &content.metadata;
    let source = match meta.get("tokenizer.chat_template") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err("the model has no chat template (`tokenizer.chat_template`): give its tokenizer_config.json or a .jinja file as `template`".into()),
    };
    let token = |key: &str| -> Option<String> {
        let id = meta.get(key)?.to_u32().ok()? as usize;
        match meta.get("tokenizer.ggml.tokens")? {
            Value::Array(tokens) => tokens.get(id)?.to_string().ok().cloned(),
            _ => None,
        }
    };
    Ok((
        source,
        token("tokenizer.ggml.bos_token_id"),
        token("tokenizer.ggml.eos_token_id"),
    ))
}

/// `chat_template` of a `tokenizer_config.json` (a string, or a list of
/// named templates: the one named `default`), and its BOS and EOS tokens.
fn from_config(text: &str) -> std::result::Result<Found, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let source = match v.get("chat_template") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str())
            .ok_or("its `chat_template` list has no template named `default`")?
            .to_string(),
        _ => {
            return Err(
                "no `chat_template` in it (a tokenizer_config.json carries the model's)".into(),
            )
        }
    };
    // A special token is a string, or an object whose `content` it is.
    let token = |key: &str| match v.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        o => o.get("content")?.as_str().map(str::to_string),
    };
    Ok((source, token("bos_token"), token("eos_token")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn a_template_renders_a_conversation_and_its_generation_prompt() {
        let t = ChatTemplate::new(CHATML.into(), None, None, "test".into()).unwrap();
        let m = [json!({"role": "user", "content": "Hi"})];
        assert_eq!(
            t.render(&m, true).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_methods_special_tokens_and_raise_exception_work_as_in_transformers() {
        let src = "{{ bos_token }}{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('no role ' + m.role) }}{% endif %}{{ m.content.strip() }}{{ eos_token }}{% endfor %}";
        let t = ChatTemplate::new(
            src.into(),
            Some("<s>".into()),
            Some("</s>".into()),
            "t".into(),
        )
        .unwrap();
        let m = [json!({"role": "user", "content": "  a  "})];
        assert_eq!(t.render(&m, false).unwrap(), "<s>a</s>");
        let bad = [json!({"role": "tool", "content": "x"})];
        let e = t.render(&bad, false).unwrap_err();
        assert!(e.contains("no role tool"), "{e}");
    }

    /// Llama 3's template, and one with `namespace`, whitespace control,
    /// an undefined `tools` and Python's `split`: the text Python's jinja2
    /// renders with transformers' settings (trim_blocks, lstrip_blocks).
    #[test]
    fn other_models_templates_render_as_jinja2_renders_them() {
        let llama3 = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
        let t = ChatTemplate::new(
            llama3.into(),
            Some("<|begin_of_text|>".into()),
            None,
            "t".into(),
        )
        .unwrap();
        let m = [
            json!({"role": "user", "content": "  Hi "}),
            json!({"role": "assistant", "content": "Yo"}),
        ];
        assert_eq!(
            t.render(&m, true).unwrap(),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nYo<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        let other = "{%- if tools %}T{%- endif %}\n{%- set ns = namespace(n=0) %}\n{%- for m in messages %}\n    {%- set ns.n = ns.n + 1 %}\n    {{- m.role | upper }}:{{ m.content.split(',')[0] }}\n{%- endfor %}\n{{- ns.n }}";
        let t = ChatTemplate::new(other.into(), None, None, "t".into()).unwrap();
        let m = [
            json!({"role": "user", "content": "a,b"}),
            json!({"role": "assistant", "content": "c"}),
        ];
        assert_eq!(t.render(&m, false).unwrap(), "USER:aASSISTANT:c2");
    }

    #[test]
    fn a_tokenizer_config_names_its_template_and_tokens() {
        let cfg = json!({"chat_template": [{"name": "default", "template": "x"}],
            "bos_token": {"content": "<s>"}, "eos_token": "</s>"});
        let (src, bos, eos) = from_config(&cfg.to_string()).unwrap();
        assert_eq!(
            (src.as_str(), bos.as_deref(), eos.as_deref()),
            ("x", Some("<s>"), Some("</s>"))
        );
        assert!(from_config("{}")
            .unwrap_err()
            .contains("no `chat_template`"));
    }
}
