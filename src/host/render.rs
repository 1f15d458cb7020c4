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
            if let mlua::Error::BadArgument { to, pos, cause, .. } = &**cause {
                return bad_argument(to.as_deref(), *pos, cause, traceback);
            }
            let head = render_lua(cause);
            // A config error, or a step that diverged, is one line that
            // names its place: no traceback. Nor is there one for an error
            // that names the recipe line that called taper (a data file's
            // offset, said where the source was made), when that call is
            // where the traceback starts.
            let placed = |e: &Error| matches!(e, Error::Config(_) | Error::Diverged(_));
            let at_call = first_lua_frame(traceback)
                .is_some_and(|place| head.contains(&format!("{place}: ")));
            if at_call || Error::Lua((**cause).clone()).find(placed) {
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
        mlua::Error::RuntimeError(msg) => {
            locate_unknown_field(msg).unwrap_or_else(|| locate_valueless(msg))
        }
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

/// Reading a field a taper handle does not have (`batch.sizee`): mlua's
/// message has no place; it is given the recipe's line, the frame under
/// the `index` metamethod in the traceback.
fn locate_unknown_field(msg: &str) -> Option<String> {
    let (first, rest) = msg.split_once('\n')?;
    let field = first.strip_prefix("attempt to get an unknown field ")?;
    let place = rest
        .lines()
        .map(str::trim)
        .skip_while(|l| !l.contains("in metamethod 'index'"))
        .nth(1)?
        .split_once(": in ")?
        .0;
    Some(format!(
        "{place}: attempt to get an unknown field {field} of a taper object\n{rest}"
    ))
}

/// A taper function or method given an argument of the wrong type, where
/// mlua's message names Rust types ("bad argument #2 to `RunHandle.step`:
/// error converting Lua nil to userdata (expected userdata of type
/// taper::host::batch::BatchHandle)"): one line, placed at the recipe's call
/// as taper's own option errors are, counting a method's arguments after
/// its object and naming taper's types as a recipe knows them.
fn bad_argument(to: Option<&str>, pos: usize, cause: &mlua::Error, traceback: &str) -> String {
    // `RunHandle.step` is `run:step`, whose first argument mlua counts as 2.
    let (call, n) = match to.and_then(|t| t.split_once("Handle.")) {
        Some((kind, method)) => (
            format!("{}:{method}", kind.to_lowercase()),
            pos.saturating_sub(1),
        ),
        None => (to.unwrap_or("a taper function").to_string(), pos),
    };
    let wanted = match cause {
        mlua::Error::FromLuaConversionError { from, to, message } => {
            let taper_type = message
                .as_deref()
                .and_then(|m| m.rsplit_once("::"))
                .map(|(_, ty)| ty.trim_end_matches(')'));
            let what = match taper_type {
                Some("BatchHandle") => "a batch (from run:batches() or data:batches())".into(),
                Some("DataHandle") => "data (taper.data.*)".into(),
                Some("ModelHandle") => "a model (taper.model.*)".into(),
                Some("RunHandle") => "a run (taper.run{...})".into(),
                Some("OptimHandle") => "an optimizer (taper.optim.*)".into(),
                Some("LossHandle") => "a loss (taper.loss.*)".into(),
                Some("ScheduleHandle") => "a schedule (taper.schedule.*)".into(),
                Some("GeneratorHandle") => "a generator".into(),
                Some("PluginHandle") => "a plugin (taper.plugin.load)".into(),
                _ => super::options::with_article(to),
            };
            format!("must be {what}, got {}", super::options::with_article(from))
        }
        // A taper object of another kind (data where a batch goes): mlua
        // does not say which kind was wanted.
        mlua::Error::UserDataTypeMismatch if call == "run:step" => {
            "must be a batch (from run:batches() or data:batches()), got another kind of taper object".into()
        }
        mlua::Error::UserDataTypeMismatch => "is another kind of taper object than it takes".into(),
        other => format!("is wrong: {}", render_lua(other)),
    };
    let place = first_lua_frame(traceback)
        .map(|p| format!("{p}: "))
        .unwrap_or_default();
    format!("{place}{call}: argument {n} {wanted}")
}

/// The recipe's line that called into taper: the first frame of the
/// traceback that is Lua's (`recipe.lua:12`).
fn first_lua_frame(traceback: &str) -> Option<&str> {
    traceback
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("[C]") && !l.starts_with("stack traceback"))
        .find_map(|l| l.split_once(": in ").map(|(p, _)| p))
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
    use super::{locate_unknown_field, locate_valueless};

    #[test]
    fn an_unknown_field_is_placed_at_the_line_that_read_it() {
        let tb = "stack traceback:\n\t[C]: in upvalue 'error'\n\t__mlua_index:33: in metamethod 'index'\n\trecipe.lua:7: in main chunk";
        let m = locate_unknown_field(&format!("attempt to get an unknown field 'sizee'\n{tb}"));
        assert_eq!(
            m.as_deref(),
            Some(&*format!(
                "recipe.lua:7: attempt to get an unknown field 'sizee' of a taper object\n{tb}"
            ))
        );
        assert_eq!(
            locate_unknown_field("recipe.lua:3: bad\nstack traceback:"),
            None
        );
    }

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
