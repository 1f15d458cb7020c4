//! Batches as Lua holds them, and iterating an epoch's batches.

use std::cell::RefCell;
use std::rc::Rc;

use mlua::{Function, Lua, MetaMethod, UserData, UserDataFields, UserDataMethods};

use crate::data::Batch;
use crate::error::lua_err;

/// A batch handed to Lua. Its tensors are released as soon as the iterator
/// that produced it moves on: Lua's garbage collector cannot see tensor
/// memory (a handle looks tiny to it), so leaving batches to the collector
/// let 1.7 GB pile up over an epoch of a token file.
#[derive(Clone)]
pub struct BatchHandle(Rc<RefCell<Option<Batch>>>);

impl BatchHandle {
    pub fn get(&self) -> mlua::Result<std::cell::Ref<'_, Batch>> {
        std::cell::Ref::filter_map(self.0.borrow(), |b| b.as_ref()).map_err(|_| {
            mlua::Error::external(crate::Error::Script(
                "this batch was released: a batch lives until its iterator moves on".into(),
            ))
        })
    }
}

/// Hands out batches to Lua one at a time, releasing the previous one.
#[derive(Default)]
pub struct BatchIssuer {
    last: RefCell<Option<BatchHandle>>,
}

impl BatchIssuer {
    pub fn issue(&self, batch: Option<Batch>) -> Option<BatchHandle> {
        if let Some(prev) = self.last.take() {
            prev.0.borrow_mut().take();
        }
        let handle = BatchHandle(Rc::new(RefCell::new(Some(batch?))));
        *self.last.borrow_mut() = Some(handle.clone());
        Some(handle)
    }
}

impl UserData for BatchHandle {
    fn add_fields<F: UserDataFields<Self>>(f: &mut F) {
        f.add_field_method_get("size", |_, this| Ok(this.get()?.len()));
        f.add_field_method_get("indices", |_, this| Ok(this.get()?.indices.clone()));
    }
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        super::members::unknown_is_an_error(m, "Batch");
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(match this.get() {
                Ok(b) => format!("taper.batch({} samples, x {:?})", b.len(), b.x.dims()),
                Err(_) => "taper.batch(released)".to_string(),
            })
        });
        m.add_meta_method(MetaMethod::Len, |_, this, ()| Ok(this.get()?.len()));
    }
}

/// A Lua iterator over `batches` (`for batch in data:batches() do`): each
/// batch is released when the next is asked for.
pub(crate) fn iterator(
    lua: &Lua,
    batches: impl Iterator<Item = crate::Result<Batch>> + 'static,
) -> mlua::Result<Function> {
    let it = RefCell::new(batches);
    let issuer = BatchIssuer::default();
    lua.create_function(move |_, ()| {
        let b = it.borrow_mut().next().transpose().map_err(lua_err)?;
        Ok(issuer.issue(b))
    })
}
