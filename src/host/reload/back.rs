//! Going back: a reloaded version that fails in its own code after its
//! first safe point hands the run to the version it replaced (see the
//! module above).

use std::rc::Rc;
use std::time::Instant;

use mlua::{Lua, Value};
use serde_json::Map;

use super::{record_with, try_version, Tried, Version};
use crate::host::HostState;
use crate::{Error, Result};

/// A version of the recipe that ran: what the run goes back to when the
/// version that replaced it fails in its own code.
pub(super) struct Kept {
    pub(super) generation: u64,
    /// The recipe's text.
    pub(super) src: String,
    /// Its modules' values (`package.loaded`), as it used them.
    pub(super) loaded: Vec<(String, Value)>,
}

/// Whether a committed version stopped in its own code: a Lua error, or a
/// taper call it made wrongly. Not a signal, `os.exit`, divergence, an
/// OOM the policy gave up on, a data, device, plugin or I/O failure: the
/// version it replaced would meet those too, and they end the run.
pub(super) fn the_versions_own(e: &Error) -> bool {
    let not_the_code = e.find(|e| {
        matches!(
            e,
            Error::Interrupted(_)
                | Error::Exited(_)
                | Error::Diverged(_)
                | Error::Stopped(_)
                | Error::Oom(_)
                | Error::Peer(_)
                | Error::Data(_)
                | Error::Device(_)
                | Error::Plugin(_)
                | Error::Io { .. }
                | Error::Checkpoint { .. }
                | Error::Candle(_)
        )
    });
    !not_the_code
        && e.find(|e| {
            matches!(
                e,
                Error::Config(_)
                    | Error::Script(_)
                    | Error::Lua(mlua::Error::RuntimeError(_))
                    | Error::Lua(mlua::Error::BadArgument { .. })
            )
        })
}

/// A reloaded version failed in its own code (`why`): runs the version it
/// replaced again, from the run's state as it is, and records that. When
/// that cannot be done either, the run ends with `why`.
pub(super) fn go_back(lua: &Lua, host: &Rc<HostState>, back: &Kept, why: Error) -> Result<Tried> {
    let asked = Instant::now();
    let failed = host.reload.borrow().generation;
    let error = crate::host::render::message(&why);
    // No text is kept for what this replaces: the restored version has no
    // earlier one to go back to (see `drive`).
    match try_version(lua, host, Version::Kept(back), "") {
        Ok(tried) => {
            let generation = host.reload.borrow().generation;
            let mut f = Map::new();
            f.insert("failed".into(), failed.into());
            f.insert("back_to".into(), back.generation.into());
            f.insert("error".into(), error.clone().into());
            host.out.note(Some(format!(
                "generation {failed} failed; generation {}'s version runs",
                back.generation
            )));
            host.out.line(&format!(
                "generation {failed} failed: {error}\n  the run goes on with generation {}'s version (now generation {generation}); save a fixed version to try it again",
                back.generation
            ));
            record_with(host, asked, None, f)?;
            Ok(tried)
        }
        Err(again) => {
            host.out.line(&format!(
                "generation {failed} failed, and going back to generation {}'s version failed too: {again}",
                back.generation
            ));
            Err(why)
        }
    }
}
