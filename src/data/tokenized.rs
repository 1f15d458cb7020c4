//! Text files tokenized once per process. A recipe's `train` and `val`
//! sources of one file, and the same sources built again by a hot-reloaded
//! version of the recipe, share one tokenization: with a `tokenizer.json`
//! it is the slow part (SmolLM2's tokenizer over Shakespeare's 1 MB takes
//! about 0.6 s, and a reload paused the run for both splits).
//!
//! The cache holds weak references only: the tokens live as long as a
//! source uses them, and an entry is found again only while one does (as
//! the old version's sources do while a reloaded version runs). Entries are
//! keyed by the bytes of the text and of the tokenizer file, so an edited
//! file is tokenized afresh.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, Weak};

use super::Vocab;
use crate::Result;

/// What a tokenization depends on: the text's bytes and the tokenizer
/// file's (none for a character vocabulary), each as its length and hash.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Key {
    text: (usize, u64),
    tokenizer: Option<(usize, u64)>,
}

impl Key {
    pub(super) fn new(text: &[u8], tokenizer: Option<&[u8]>) -> Key {
        Key {
            text: digest(text),
            tokenizer: tokenizer.map(digest),
        }
    }
}

fn digest(bytes: &[u8]) -> (usize, u64) {
    // SipHash with fixed keys: the same in every call of one process, which
    // is all this cache needs.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    (bytes.len(), h.finish())
}

type Entry = (Key, Weak<Vec<u32>>, Weak<Vocab>);

static CACHE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// The tokens and vocabulary for `key`: shared with a live source made
/// from the same bytes, or made by `tokenize` (outside the lock, so that
/// other sources are not held up).
pub(super) fn shared(
    key: Key,
    tokenize: impl FnOnce() -> Result<(Vec<u32>, Vocab)>,
) -> Result<(Arc<Vec<u32>>, Arc<Vocab>)> {
    {
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|(_, t, v)| t.strong_count() > 0 && v.strong_count() > 0);
        let live = cache
            .iter()
            .find(|(k, ..)| *k == key)
            .and_then(|(_, t, v)| Some((t.upgrade()?, v.upgrade()?)));
        if let Some(found) = live {
            return Ok(found);
        }
    }
    let (tokens, vocab) = tokenize()?;
    let (tokens, vocab) = (Arc::new(tokens), Arc::new(vocab));
    CACHE.lock().unwrap_or_else(|p| p.into_inner()).push((
        key,
        Arc::downgrade(&tokens),
        Arc::downgrade(&vocab),
    ));
    Ok((tokens, vocab))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn chars(text: &str, calls: &Cell<usize>) -> Result<(Vec<u32>, Vocab)> {
        calls.set(calls.get() + 1);
        let v = Vocab::from_text(text);
        Ok((v.encode(text)?, v))
    }

    #[test]
    fn a_live_tokenization_is_shared_and_a_dropped_one_is_made_again() {
        let calls = Cell::new(0);
        let text = "shared by the train and val splits of one test";
        let key = Key::new(text.as_bytes(), None);
        let (a, va) = shared(key, || chars(text, &calls)).unwrap();
        let (b, vb) = shared(key, || chars(text, &calls)).unwrap();
        assert_eq!(calls.get(), 1);
        assert!(Arc::ptr_eq(&a, &b) && Arc::ptr_eq(&va, &vb));
        drop((a, b, va, vb));
        let (c, _) = shared(key, || chars(text, &calls)).unwrap();
        assert_eq!(calls.get(), 2);
        assert_eq!(c.len(), text.chars().count());
    }

    #[test]
    fn other_bytes_or_another_tokenizer_are_tokenized_afresh() {
        let calls = Cell::new(0);
        let text = "the same text under three keys";
        let edited = "the same text under three keys!";
        let plain = Key::new(text.as_bytes(), None);
        let (_a, _) = shared(plain, || chars(text, &calls)).unwrap();
        let (b, _) = shared(Key::new(edited.as_bytes(), None), || chars(edited, &calls)).unwrap();
        let with_file = Key::new(text.as_bytes(), Some(b"{}"));
        let (_c, _) = shared(with_file, || chars(text, &calls)).unwrap();
        assert_eq!(calls.get(), 3);
        assert_eq!(b.len(), edited.len());
        assert_ne!(with_file, Key::new(text.as_bytes(), Some(b"{ }")));
        assert_eq!(plain, Key::new(text.as_bytes(), None));
    }
}
