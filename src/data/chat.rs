//! `taper.data.chat`: conversations to fine-tune a chat model on, one per
//! line of a JSON Lines file in the formats TRL's `SFTTrainer` takes:
//! `{"messages": [{"role": "user", "content": ...}, ...]}`, or a prompt and
//! its completion as lists of messages. Each conversation is rendered with
//! the model's chat template and tokenized whole; the loss learns the
//! replies (the assistant's messages, or the completion), and the prompt's
//! and padding's positions are ignored (`engine::ignored`), as TRL's
//! `assistant_only_loss` and `completion_only_loss` do.
//!
//! A reply is found by rendering the conversation up to it twice, with the
//! generation prompt and with the reply (transformers' way to the same
//! mask where a template has no `{% generation %}` markers): what the reply
//! adds to the text is its span, and the tokens that hold any of it are
//! trained. Each conversation is one sample of `context` positions, cut
//! there when longer (said, with how many) and padded when shorter.

use std::path::Path;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use serde_json::Value;

use super::chat_template::ChatTemplate;
use super::files::read_text;
use super::tokenized::{Cache, Key};
use super::{Source, Vocab};
use crate::engine::loss::IGNORE;
use crate::{Error, Result};

/// Which positions a chat source trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainOn {
    /// The replies: the assistant's messages, or a prompt's completion.
    Assistant,
    /// Every token of the rendered conversation.
    All,
}

/// How a chat file becomes samples.
pub struct ChatOptions<'a> {
    pub tokenizer: &'a Path,
    pub template: &'a Path,
    pub context: usize,
    pub split: &'a str,
    pub train_on: TrainOn,
}

/// Tokenized conversations, each with its trained positions.
pub struct Chats {
    name: String,
    split: String,
    context: usize,
    data: Arc<Conversations>,
    notes: Vec<String>,
}

/// A file's conversations as one tokenization, shared by the sources made
/// from the same bytes (see [`tokenized`](super::tokenized)).
struct Conversations {
    /// Every conversation's tokens (cut to `context + 1`), one after another.
    ids: Vec<u32>,
    /// Per token: whether it is trained (a reply's).
    trained: Vec<bool>,
    /// Conversation `k` is `ids[starts[k]..starts[k + 1]]`.
    starts: Vec<usize>,
    vocab: Arc<Vocab>,
    /// The lines of conversations cut at `context`, and of those left out
    /// for having no reply token within it.
    cut: Vec<usize>,
    empty: Vec<usize>,
}

static CHATS: Cache<Arc<Conversations>> = Cache::new();

/// The conversations of `path`, rendered and tokenized.
pub fn chat(path: &Path, o: ChatOptions) -> Result<Chats> {
    if o.context == 0 {
        return Err(Error::Config(
            "taper.data.chat: context must be 1 or more".into(),
        ));
    }
    let text = read_text(path)?;
    // Windows' editors start a UTF-8 file with a byte order mark.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let template = ChatTemplate::load(o.template)?;
    let record = template.record().to_string();
    let make = || conversations(path, text, template, &o);
    // A tokenizer file that cannot be read skips the cache, and
    // `from_tokenizer_file` says what is wrong with it.
    let data = match std::fs::read(o.tokenizer) {
        Ok(tokenizer) => {
            let options = format!("{} {:?}", o.context, o.train_on);
            let key = Key::of(&[
                text.as_bytes(),
                &tokenizer,
                record.as_bytes(),
                options.as_bytes(),
            ]);
            CHATS.shared(key, || make().map(Arc::new))?
        }
        Err(_) => Arc::new(make()?),
    };
    let name = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    let notes = notes(path, o.context, &data.cut, &data.empty);
    if data.starts.len() < 2 {
        return Err(Error::Data(format!(
            "{}: no conversation with a reply to train on{}",
            path.display(),
            notes.first().map(|n| format!(" ({n})")).unwrap_or_default()
        )));
    }
    Ok(Chats {
        name,
        split: o.split.to_string(),
        context: o.context,
        data,
        notes,
    })
}

/// The lines of `text` tokenized, each an error naming its line when it
/// is not a conversation. One line after another: in parallel, the
/// rendering and tokenizing threads wait on each other's allocations in
/// taper's one malloc arena (5,000 conversations took 2.0 s on 2 threads,
/// 1.5 s on one).
fn conversations(
    path: &Path,
    text: &str,
    template: ChatTemplate,
    o: &ChatOptions,
) -> Result<Conversations> {
    // The vocabulary keeps the template: checkpoints carry it, and
    // `run:generate{ messages = ... }` and `taper sample --chat` render with it.
    let vocab = Arc::new(Vocab::from_tokenizer_file(o.tokenizer)?.with_chat(template));
    let template = vocab.chat().expect("the template was just given");
    let mut chats = Conversations {
        ids: Vec::new(),
        trained: Vec::new(),
        starts: vec![0],
        vocab: vocab.clone(),
        cut: Vec::new(),
        empty: Vec::new(),
    };
    let keep = o.context + 1;
    for (k, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = |why: String| Error::Data(format!("{}:{}: {why}", path.display(), k + 1));
        let (mut ids, mut trained) = tokenized(line, template, &vocab, o.train_on).map_err(at)?;
        let long = ids.len() > keep;
        ids.truncate(keep);
        trained.truncate(keep);
        // A position is trained when the token it predicts is.
        if ids.len() < 2 || !trained[1..].iter().any(|&t| t) {
            chats.empty.push(k + 1);
            continue;
        }
        if long {
            chats.cut.push(k + 1);
        }
        chats.ids.extend_from_slice(&ids);
        chats.trained.extend_from_slice(&trained);
        chats.starts.push(chats.ids.len());
    }
    Ok(chats)
}

/// A line's conversation as token ids, and for each whether it is trained.
fn tokenized(
    line: &str,
    template: &ChatTemplate,
    vocab: &Vocab,
    train_on: TrainOn,
) -> std::result::Result<(Vec<u32>, Vec<bool>), String> {
    let (messages, replies) = conversation(line)?;
    let (text, spans) = match train_on {
        TrainOn::All => (template.render(&messages, false)?, Vec::new()),
        TrainOn::Assistant => reply_spans(template, &messages, &replies)?,
    };
    let (ids, offsets) = vocab.encode_offsets(&text).map_err(|e| e.to_string())?;
    let trained = offsets
        .iter()
        .map(|&(a, b)| match train_on {
            TrainOn::All => true,
            // A token that holds any of a reply's text.
            TrainOn::Assistant => spans.iter().any(|&(s, e)| a < e && s < b),
        })
        .collect();
    Ok((ids, trained))
}

/// What a user should know of a file's conversations: those cut at
/// `context` and those left out for having no reply within it.
fn notes(path: &Path, context: usize, cut: &[usize], empty: &[usize]) -> Vec<String> {
    let lines = |v: &[usize]| {
        let shown: Vec<String> = v.iter().take(5).map(|l| l.to_string()).collect();
        let more = if v.len() > 5 { ", ..." } else { "" };
        format!("{}{more}", shown.join(", "))
    };
    let mut notes = Vec::new();
    if !cut.is_empty() {
        notes.push(format!(
            "{}: {} conversation(s) longer than context {context} + 1 tokens are cut there (line {}): a larger `context` keeps them whole",
            path.display(),
            cut.len(),
            lines(cut)
        ));
    }
    if !empty.is_empty() {
        notes.push(format!(
            "{}: {} conversation(s) have no reply token within context {context} and are left out (line {})",
            path.display(),
            empty.len(),
            lines(empty)
        ));
    }
    notes
}

/// A line's messages and which of them are replies to train.
fn conversation(line: &str) -> std::result::Result<(Vec<Value>, Vec<usize>), String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not a JSON object: {e}"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let list = |key: &str| -> std::result::Result<Vec<Value>, String> {
        match obj.get(key) {
            Some(Value::Array(m)) => {
                for (i, msg) in m.iter().enumerate() {
                    check_message(msg).map_err(|why| format!("{key}[{i}]: {why}"))?;
                }
                Ok(m.clone())
            }
            Some(Value::String(_)) => Err(format!(
                "`{key}` is text: give it as messages, [{{\"role\": \"{}\", \"content\": \"...\"}}] (TRL's conversational format), so that the chat template renders it",
                if key == "completion" { "assistant" } else { "user" }
            )),
            Some(_) => Err(format!("`{key}` is not a list of messages")),
            None => Err(format!("no `{key}`")),
        }
    };
    if obj.contains_key("messages") {
        let messages = list("messages")?;
        let replies = (0..messages.len())
            .filter(|&i| messages[i]["role"] == "assistant")
            .collect();
        return Ok((messages, replies));
    }
    if obj.contains_key("prompt") || obj.contains_key("completion") {
        let mut messages = list("prompt")?;
        let from = messages.len();
        messages.extend(list("completion")?);
        return Ok((messages.clone(), (from..messages.len()).collect()));
    }
    if obj.contains_key("conversations") {
        return Err("`conversations` (ShareGPT's format, `from` and `value`): rename it `messages`, each `from` to `role` (human: user, gpt: assistant) and `value` to `content`".into());
    }
    let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    Err(format!(
        "no `messages` (or `prompt` and `completion`) in it; its keys are {keys:?}"
    ))
}

fn check_message(m: &Value) -> std::result::Result<(), String> {
    match (m.get("role"), m.get("content")) {
        (Some(Value::String(_)), Some(Value::String(_))) => Ok(()),
        (Some(Value::String(_)), Some(_)) => {
            Err("its `content` is not text (parts or images are not read)".into())
        }
        _ => Err("a message is an object with `role` and `content` text".into()),
    }
}

/// The rendered conversation and the byte spans of its replies.
fn reply_spans(
    template: &ChatTemplate,
    messages: &[Value],
    replies: &[usize],
) -> std::result::Result<(String, Vec<(usize, usize)>), String> {
    let full = template.render(messages, false)?;
    let mut spans = Vec::new();
    for &i in replies {
        let assistant = messages[i]["role"] == "assistant";
        let with = template.render(&messages[..=i], false)?;
        let before = template.render(&messages[..i], assistant)?;
        let start = match with.starts_with(&before) {
            true => Some(before.len()),
            // A conversation the assistant opens: a template may render
            // its first message with more than its header (SmolLM2's adds a
            // system prompt), so the reply starts at its own text.
            false => reply_text(template, messages, i, &with)?,
        };
        match start {
            Some(start) if full.starts_with(&with) => spans.push((start, with.len())),
            _ => {
                return Err(format!(
                    "the chat template renders the conversation before message {i} differently once it goes on (it rewrites earlier turns), so message {i}'s tokens cannot be told apart: train on the whole text with `train_on = \"all\"`"
                ))
            }
        }
    }
    Ok((full, spans))
}

/// Where message `i`'s own text starts in `with` (the conversation rendered
/// up to it), after the rendering of the messages before it; None when that
/// rendering is not where `with` starts.
fn reply_text(
    template: &ChatTemplate,
    messages: &[Value],
    i: usize,
    with: &str,
) -> std::result::Result<Option<usize>, String> {
    let earlier = template.render(&messages[..i], false)?;
    let content = messages[i]["content"].as_str().unwrap_or_default();
    Ok(match with.strip_prefix(earlier.as_str()) {
        Some(rest) => rest.rfind(content).map(|at| earlier.len() + at),
        None => None,
    })
}

impl Chats {
    /// What the user should be told of the file (conversations cut or left
    /// out).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }
}

impl Source for Chats {
    fn len(&self) -> usize {
        self.data.starts.len() - 1
    }
    fn split(&self) -> &str {
        &self.split
    }
    fn describe(&self) -> String {
        let trained = (0..self.len())
            .map(|k| {
                self.data.trained[self.data.starts[k] + 1..self.data.starts[k + 1]]
                    .iter()
                    .filter(|&&t| t)
                    .count()
            })
            .sum::<usize>();
        format!(
            "{}/{} ({} conversations, {} tokens, {trained} of them trained, context {}, vocabulary {})",
            self.name,
            self.split,
            self.len(),
            self.data.ids.len(),
            self.context,
            self.data.vocab.len()
        )
    }
    fn gather(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        let (t, d) = (self.context, &*self.data);
        // Padding: id 0 as input (a causal model's earlier positions never
        // see it, and a step computes none after the last labelled one),
        // ignored as a label.
        let mut x = vec![0u32; indices.len() * t];
        let mut y = vec![IGNORE; indices.len() * t];
        for (row, &k) in indices.iter().enumerate() {
            let (s, e) = (d.starts[k], d.starts[k + 1]);
            for p in 0..e - s - 1 {
                x[row * t + p] = d.ids[s + p];
                if d.trained[s + p + 1] {
                    y[row * t + p] = d.ids[s + p + 1];
                }
            }
        }
        let b = indices.len();
        Ok((
            Tensor::from_vec(x, (b, t), &Device::Cpu)?,
            Tensor::from_vec(y, (b, t), &Device::Cpu)?,
        ))
    }
    fn vocab(&self) -> Option<&Vocab> {
        Some(&self.data.vocab)
    }
    /// Each conversation's tokens (cut at `context + 1`).
    fn lengths(&self) -> Option<Vec<usize>> {
        Some(self.data.starts.windows(2).map(|w| w[1] - w[0]).collect())
    }
}
