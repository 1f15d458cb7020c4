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
            // A config error, or a step that diverged, is one line that
            // names its place: no traceback.
            let placed = |e: &Error| matches!(e, Error::Config(_) | Error::Diverged(_));
            if Error::Lua((**cause).clone()).find(placed) {
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
        mlua::Error::RuntimeError(msg) => locate_valueless(msg),
        other => other.to_string(),
    }
}

/// `error({})`, `error(nil)` or `error(42)` give Lua no message and no
/// place: the message becomes the place `error` was called from (the frame
/// under it in the traceback) and what it was given.
fn locate_valueless(msg: &str) -> String {
    let (first, rest) = msg.split_once('\n').unwrap_or((msg, ""));
    let what = if first.starts_with("table: 0x") {
        "a table".to_string()
    } else if first == "nil" {
        "nil".to_string()
    } else if first == "true" || first == "false" || first.parse::<f64>().is_ok() {
        format!("`{first}`")
    } else {
        return msg.to_string();
    };
    let mut frames = rest.lines().map(str::trim);
    let Some(place) = frames
        .by_ref()
        .find(|l| l.contains("in function 'error'"))
        .and_then(|_| frames.next())
        .and_then(|l| l.split_once(": in ").map(|(p, _)| p.to_string()))
    else {
        return msg.to_string();
    };
    let rest = if rest.is_empty() {
        String::new()
    } else {
        format!("\n{rest}")
    };
    format!("{place}: error() was given {what}, not a message (pass a string to say what went wrong){rest}")
}

/// An error as one message, without the Lua traceback (reload records).
pub(crate) fn message(e: &Error) -> String {
    let full = render_error(e);
    match full.find("\nstack traceback:") {
        Some(i) => full[..i].to_string(),
        None => full,
    }
}

#[cfg(test)]
mod tests {
    use super::locate_valueless;

    #[test]
    fn an_error_without_a_message_is_given_its_place() {
        let tb = "\nstack traceback:\n\t[C]: in function 'error'\n\trecipe.lua:3: in local 'f'\n\trecipe.lua:5: in main chunk";
        for (value, said) in [("table: 0x55aa", "a table"), ("nil", "nil"), ("42", "`42`")] {
            let m = locate_valueless(&format!("{value}{tb}"));
            assert!(
                m.starts_with(&format!(
                    "recipe.lua:3: error() was given {said}, not a message"
                )),
                "{m}"
            );
            assert!(m.ends_with("recipe.lua:5: in main chunk"), "{m}");
        }
        // A message with its own place, or one error() did not raise, is kept.
        let own = format!("recipe.lua:3: bad{tb}");
        assert_eq!(locate_valueless(&own), own);
        assert_eq!(locate_valueless("nil"), "nil");
    }
}
