//! Text vocabularies: the characters of a corpus, or a `tokenizer.json`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::{Error, Result};

/// A byte range of a text: where a token came from.
pub type Span = (usize, usize);

/// A text vocabulary: the characters of a corpus, or a `tokenizer.json`
/// (any model the `tokenizers` crate reads: BPE, WordPiece, WordLevel, ...).
#[derive(Clone)]
pub struct Vocab {
    kind: VocabKind,
    /// A chat model's template, for a run on conversations: prompts are
    /// rendered with it, and replies end at its end token.
    chat: Option<Arc<crate::data::ChatTemplate>>,
    /// What taper changed in a tokenizer file's settings, to say so.
    notes: Vec<String>,
}

#[derive(Clone)]
enum VocabKind {
    Chars {
        chars: Vec<char>,
        index: HashMap<char, u32>,
    },
    Tokenizer(Arc<tokenizers::Tokenizer>),
}

impl std::fmt::Debug for Vocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            VocabKind::Chars { chars, .. } => write!(f, "Vocab(chars, {})", chars.len()),
            VocabKind::Tokenizer(_) => write!(f, "Vocab(tokenizer, {})", self.len()),
        }
    }
}

impl Vocab {
    pub fn from_text(text: &str) -> Self {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        let index = chars
            .iter()
            .enumerate()
            .map(|(i, &c)| (c, i as u32))
            .collect();
        Vocab {
            kind: VocabKind::Chars { chars, index },
            chat: None,
            notes: Vec::new(),
        }
    }
    pub fn from_tokenizer_file(path: &Path) -> Result<Self> {
        let t = tokenizers::Tokenizer::from_file(path).map_err(|e| {
            Error::Data(format!(
                "{}: not a readable tokenizer.json: {e}",
                path.display()
            ))
        })?;
        // A corpus is tokenized whole and cut into windows by taper: a
        // tokenizer.json made for a model's inputs would cut it at its
        // `max_length` (a 1 MB text to 128 ids) or pad it.
        let mut t = t;
        let mut notes = Vec::new();
        if let Some(tr) = t.get_truncation() {
            notes.push(format!(
                "{}: its truncation (to {} tokens) is turned off: the whole text is tokenized, then cut into windows of `context` tokens",
                path.display(),
                tr.max_length
            ));
        }
        if t.get_padding().is_some() {
            notes.push(format!(
                "{}: its padding is turned off: windows are cut from the text, never padded",
                path.display()
            ));
        }
        t.with_truncation(None)
            .map_err(|e| Error::Data(format!("{}: {e}", path.display())))?;
        t.with_padding(None);
        Ok(Vocab {
            kind: VocabKind::Tokenizer(Arc::new(t)),
            chat: None,
            notes,
        })
    }
    /// The vocabulary as data, for checkpoints: `{"chars": "..."}` (the
    /// characters in id order) or `{"tokenizer": <tokenizer.json>}`.
    pub fn record(&self) -> serde_json::Value {
        match &self.kind {
            VocabKind::Chars { chars, .. } => {
                serde_json::json!({ "chars": chars.iter().collect::<String>() })
            }
            VocabKind::Tokenizer(t) => {
                let json = t
                    .to_string(false)
                    .ok()
                    .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
                match &self.chat {
                    Some(c) => {
                        serde_json::json!({ "tokenizer": json, "chat_template": c.record() })
                    }
                    None => serde_json::json!({ "tokenizer": json }),
                }
            }
        }
    }
    /// The vocabulary [`Vocab::record`] wrote.
    pub fn from_record(record: &serde_json::Value) -> Result<Self> {
        if let Some(chars) = record.get("chars").and_then(|c| c.as_str()) {
            let chars: Vec<char> = chars.chars().collect();
            let index = chars
                .iter()
                .enumerate()
                .map(|(i, &c)| (c, i as u32))
                .collect();
            return Ok(Vocab {
                kind: VocabKind::Chars { chars, index },
                chat: None,
                notes: Vec::new(),
            });
        }
        let json = record
            .get("tokenizer")
            .filter(|t| !t.is_null())
            .ok_or_else(|| {
                Error::Data("vocabulary record has neither `chars` nor `tokenizer`".into())
            })?;
        let t: tokenizers::Tokenizer = serde_json::from_value(json.clone())
            .map_err(|e| Error::Data(format!("vocabulary record: not a tokenizer: {e}")))?;
        let chat = match record.get("chat_template") {
            Some(c) => Some(Arc::new(crate::data::ChatTemplate::from_record(c)?)),
            None => None,
        };
        Ok(Vocab {
            kind: VocabKind::Tokenizer(Arc::new(t)),
            chat,
            notes: Vec::new(),
        })
    }
    /// The vocabulary of a chat model, with its template.
    pub fn with_chat(mut self, template: crate::data::ChatTemplate) -> Self {
        self.chat = Some(Arc::new(template));
        self
    }
    /// The chat template, for a run on conversations.
    pub fn chat(&self) -> Option<&crate::data::ChatTemplate> {
        self.chat.as_deref()
    }
    /// The ids of a chat's next reply's prompt: `messages` rendered with
    /// the generation prompt, and the id that ends a reply, where the
    /// template names one that is a single token. None without a template.
    pub fn chat_prompt(
        &self,
        messages: &[serde_json::Value],
    ) -> Option<Result<(Vec<u32>, Option<u32>)>> {
        let t = self.chat()?;
        let prompt = match t.render(messages, true) {
            Ok(p) => p,
            Err(e) => return Some(Err(Error::Data(e))),
        };
        let end = t
            .end_token()
            .and_then(|e| self.encode(e).ok())
            .and_then(|ids| match ids[..] {
                [id] => Some(id),
                _ => None,
            });
        Some(self.encode(&prompt).map(|ids| (ids, end)))
    }
    /// The characters in id order, for a character vocabulary.
    pub fn chars(&self) -> Option<&[char]> {
        match &self.kind {
            VocabKind::Chars { chars, .. } => Some(chars),
            VocabKind::Tokenizer(_) => None,
        }
    }
    /// What taper changed in the tokenizer file's settings (said to the user).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }
    pub fn len(&self) -> usize {
        match &self.kind {
            VocabKind::Chars { chars, .. } => chars.len(),
            VocabKind::Tokenizer(t) => t.get_vocab_size(true),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match &self.kind {
            VocabKind::Chars { index, chars } => text
                .chars()
                .map(|c| {
                    index.get(&c).copied().ok_or_else(|| {
                        // The characters it has (a short list), so that
                        // another prompt can be chosen.
                        let known: String = chars.iter().collect();
                        let listed = match chars.len() {
                            n if n <= 128 => format!("its {n} characters are {known:?}"),
                            n => format!("it has {n} characters"),
                        };
                        Error::Data(format!(
                            "character {c:?} is not in the vocabulary; {listed}"
                        ))
                    })
                })
                .collect(),
            VocabKind::Tokenizer(t) => Ok(t
                .encode(text, false)
                .map_err(|e| Error::Data(format!("tokenizer: {e}")))?
                .get_ids()
                .to_vec()),
        }
    }
    /// The ids of `text` and the byte range each came from, for a
    /// tokenizer (a character vocabulary: each character's).
    pub fn encode_offsets(&self, text: &str) -> Result<(Vec<u32>, Vec<Span>)> {
        match &self.kind {
            VocabKind::Chars { .. } => Ok((
                self.encode(text)?,
                text.char_indices()
                    .map(|(i, c)| (i, i + c.len_utf8()))
                    .collect(),
            )),
            VocabKind::Tokenizer(t) => {
                let e = t
                    .encode(text, false)
                    .map_err(|e| Error::Data(format!("tokenizer: {e}")))?;
                Ok((e.get_ids().to_vec(), e.get_offsets().to_vec()))
            }
        }
    }
    pub fn decode(&self, ids: &[u32]) -> String {
        match &self.kind {
            VocabKind::Chars { chars, .. } => ids
                .iter()
                .map(|&i| chars.get(i as usize).copied().unwrap_or('\u{fffd}'))
                .collect(),
            VocabKind::Tokenizer(t) => t.decode(ids, false).unwrap_or_else(|e| format!("<{e}>")),
        }
    }
}
