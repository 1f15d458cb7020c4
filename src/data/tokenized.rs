//! Text and chat files tokenized once per process. A recipe's `train` and
//! `val` sources of one file, and the same sources built again by a
//! hot-reloaded version of the recipe, share one tokenization: with a
//! `tokenizer.json` it is the slow part (SmolLM2's tokenizer over
//! Shakespeare's 1 MB takes about 0.6 s, and a reload paused the run for
//! both splits; a chat file's conversations are each rendered with the
//! template, once per reply, before they are tokenized).
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

/// What a tokenization depends on: the bytes it reads (the text's, the
/// tokenizer file's, a chat template's and options), each as its length
/// and hash.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(super) struct Key(Vec<(usize, u64)>);

impl Key {
    /// A text's key, with its tokenizer file's bytes (none for a character
    /// vocabulary).
    pub(super) fn new(text: &[u8], tokenizer: Option<&[u8]>) -> Key {
        let parts: Vec<&[u8]> = [Some(text), tokenizer].into_iter().flatten().collect();
        Key::of(&parts)
    }

    /// The key of what is made from `parts`, in order.
    pub(super) fn of(parts: &[&[u8]]) -> Key {
        Key(parts.iter().map(|p| digest(p)).collect())
    }
}

fn digest(bytes: &[u8]) -> (usize, u64) {
    // SipHash with fixed keys: the same in every call of one process, which
    // is all this cache needs.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    (bytes.len(), h.finish())
}

/// What a cache hands out and keeps weakly: shared values.
pub(super) trait Handles: Sized {
    type Weak: Send;
    fn downgrade(&self) -> Self::Weak;
    fn upgrade(weak: &Self::Weak) -> Option<Self>;
}

impl<T: Send + Sync> Handles for Arc<T> {
    type Weak = Weak<T>;
    fn downgrade(&self) -> Weak<T> {
        Arc::downgrade(self)
    }
    fn upgrade(weak: &Weak<T>) -> Option<Self> {
        weak.upgrade()
    }
}

impl<A: Send + Sync, B: Send + Sync> Handles for (Arc<A>, Arc<B>) {
    type Weak = (Weak<A>, Weak<B>);
    fn downgrade(&self) -> Self::Weak {
        (Arc::downgrade(&self.0), Arc::downgrade(&self.1))
    }
    fn upgrade(weak: &Self::Weak) -> Option<Self> {
        Some((weak.0.upgrade()?, weak.1.upgrade()?))
    }
}

/// Tokenizations by [`Key`], found while a source still uses them.
pub(super) struct Cache<H: Handles>(Mutex<Vec<(Key, H::Weak)>>);

impl<H: Handles> Cache<H> {
    pub(super) const fn new() -> Self {
        Cache(Mutex::new(Vec::new()))
    }

    /// The value for `key`: shared with a live source made from the same
    /// bytes, or made by `make` (outside the lock, so that other sources
    /// are not held up).
    pub(super) fn shared(&self, key: Key, make: impl FnOnce() -> Result<H>) -> Result<H> {
        {
            let mut entries = self.0.lock().unwrap_or_else(|p| p.into_inner());
            let mut found = None;
            entries.retain(|(k, weak)| match H::upgrade(weak) {
                Some(live) => {
                    if *k == key {
                        found = Some(live);
                    }
                    true
                }
                None => false,
            });
            if let Some(found) = found {
                return Ok(found);
            }
        }
        let made = make()?;
        let weak = made.downgrade();
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((key, weak));
        Ok(made)
    }
}

static TEXTS: Cache<(Arc<Vec<u32>>, Arc<Vocab>)> = Cache::new();

/// The tokens and vocabulary for `key`: shared with a live text source
/// made from the same bytes, or made by `tokenize`.
pub(super) fn shared(
    key: Key,
    tokenize: impl FnOnce() -> Result<(Vec<u32>, Vocab)>,
) -> Result<(Arc<Vec<u32>>, Arc<Vocab>)> {
    TEXTS.shared(key, || {
        let (tokens, vocab) = tokenize()?;
        Ok((Arc::new(tokens), Arc::new(vocab)))
    })
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
        let (a, va) = shared(key.clone(), || chars(text, &calls)).unwrap();
        let (b, vb) = shared(key.clone(), || chars(text, &calls)).unwrap();
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
        let (_a, _) = shared(plain.clone(), || chars(text, &calls)).unwrap();
        let (b, _) = shared(Key::new(edited.as_bytes(), None), || chars(edited, &calls)).unwrap();
        let with_file = Key::new(text.as_bytes(), Some(b"{}"));
        let (_c, _) = shared(with_file.clone(), || chars(text, &calls)).unwrap();
        assert_eq!(calls.get(), 3);
        assert_eq!(b.len(), edited.len());
        assert_ne!(with_file, Key::new(text.as_bytes(), Some(b"{ }")));
        assert_eq!(plain, Key::new(text.as_bytes(), None));
    }
}
