//! The frozen weights' copies on a GPU, one per device (and dtype), shared
//! by every model built from the same file while any of them lives. A run
//! builds its model more than once: the training model, and a frozen one
//! for each evaluation (`Trainer::frozen`); without sharing, each
//! evaluation would upload the quantized blocks and the dequantized
//! embedding again and hold a second copy of them on the device beside the
//! training model's.
//!
//! The cache holds weak references only, so the copies go when the last
//! model using them does.

use std::any::Any;
use std::sync::{Arc, Mutex, Weak};

use candle_core::Result;

type Entry = ((usize, String), Weak<dyn Any + Send + Sync>);

static COPIES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// `make()`, the copy of `source` for `target` (a device and dtype, as
/// text), or the one made before while a model still holds it. `source`
/// is named by its address, so it must be a value the file's cache keeps
/// for the whole process ([`super::LlamaGguf::weights`] never evicts).
pub(super) fn shared<S, T: Any + Send + Sync>(
    source: &S,
    target: &str,
    make: impl FnOnce() -> Result<T>,
) -> Result<Arc<T>> {
    let key = (source as *const S as usize, target.to_string());
    let mut copies = COPIES.lock().unwrap_or_else(|p| p.into_inner());
    copies.retain(|(_, w)| w.strong_count() > 0);
    let live = copies
        .iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, w)| w.upgrade());
    if let Some(t) = live.and_then(|a| a.downcast::<T>().ok()) {
        return Ok(t);
    }
    let made = Arc::new(make()?);
    let erased: Arc<dyn Any + Send + Sync> = made.clone();
    copies.push((key, Arc::downgrade(&erased)));
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_shared_while_held_and_made_again_after() -> Result<()> {
        static SOURCE: [f32; 4] = [1.0, 2.0, 3.0, 4.0];
        let mut made = 0;
        let copy = |made: &mut usize| {
            *made += 1;
            Ok(SOURCE.map(|v| v * 2.0))
        };
        let a = shared(&SOURCE, "gpu0 f32", || copy(&mut made))?;
        let b = shared(&SOURCE, "gpu0 f32", || copy(&mut made))?;
        assert!(Arc::ptr_eq(&a, &b) && made == 1);
        let other = shared(&SOURCE, "gpu0 bf16", || copy(&mut made))?;
        assert!(!Arc::ptr_eq(&a, &other) && made == 2);
        drop((a, b));
        let c = shared(&SOURCE, "gpu0 f32", || copy(&mut made))?;
        assert_eq!((made, c[3]), (3, 8.0));
        Ok(())
    }
}
