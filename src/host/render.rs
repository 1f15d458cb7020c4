//! Errors as the CLI prints them.

use crate::Error;

/// A readable, multi-line message for an error from a recipe: the cause
/// first, then the Lua traceback when there is one.
pub fn render_error(e: &Error) -> String {
    match e {
        Error::Lua(l) => render_lua(l),
        other => other.to_string(),
    }
}

fn render_lua(e: &mlua::Error) -> String {
    match e {
        mlua::Error::CallbackError { traceback, cause } => {
            let head = render_lua(cause);
            // A config error is one line that names its place: no traceback.
            if Error::Lua((**cause).clone()).find(|e| matches!(e, Error::Config(_))) {
                head
            } else {
                format!("{head}\n{traceback}")
            }
        }
        mlua::Error::WithContext { context, cause } => format!("{context}: {}", render_lua(cause)),
        mlua::Error::ExternalError(inner) => match inner.downcast_ref::<Error>() {
            Some(t) => render_error(t),
            None => inner.to_string(),
        },
        mlua::Error::SyntaxError { message, .. } => message.clone(),
        mlua::Error::RuntimeError(msg) => msg.clone(),
        other => other.to_string(),
    }
}

/// An error as one message, without the Lua traceback (reload records).
pub(crate) fn message(e: &Error) -> String {
    let full = render_error(e);
    match full.find("\nstack traceback:") {
        Some(i) => full[..i].to_string(),
        None => full,
    }
}
