//! The crate's error type: one variant per kind of failure a caller matches on.

use std::path::PathBuf;

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A recipe option, config key or CLI value is wrong. The message names
    /// the key and, for Lua, the file and line.
    #[error("{0}")]
    Config(String),
    /// The recipe failed to load (syntax) or raised an error while running.
    #[error("{0}")]
    Script(String),
    /// A plugin could not be loaded or created, or lacks a strategy kind.
    #[error("plugin {0}")]
    Plugin(String),
    /// A data source could not be read or decoded.
    #[error("data: {0}")]
    Data(String),
    /// The requested device is not available in this build or on this machine.
    #[error("{0}")]
    Device(String),
    /// A checkpoint could not be written or read.
    #[error("checkpoint {}: {msg}", path.display())]
    Checkpoint { path: PathBuf, msg: String },
    /// The training diverged: a step's loss was NaN or infinite after its
    /// update went in, or a checkpoint's weights hold NaN or infinity. The
    /// run stops (it would not recover), and the diverged model is not
    /// saved over the last good checkpoint.
    #[error("{0}")]
    Diverged(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Out of memory (device, budget or injected): the step engine recovers.
    #[error(transparent)]
    Oom(#[from] crate::memory::OomError),
    /// An OOM policy stopped the run (after writing a checkpoint).
    #[error("{0}")]
    Stopped(String),
    /// A signal asked the run to stop (it stops at a step boundary, after
    /// writing a checkpoint). The exit code is 128 + the signal's number.
    #[error("interrupted by {}: stopped at a step boundary", crate::run::interrupt::signal_name(*.0))]
    Interrupted(i32),
    /// The recipe called `os.exit(code)`: the run ends there, with its
    /// checkpoint and final records, and the CLI exits with `code`.
    #[error("the recipe called os.exit({0})")]
    Exited(i32),
    /// Another rank of a data-parallel run died, hung, stopped or failed:
    /// this one stops too (rank 0 with its checkpoint).
    #[error("{0}")]
    Peer(String),
    #[error("{}", candle_message(.0))]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Lua(#[from] mlua::Error),
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// The CLI's exit code: 2 for usage and recipe errors (syntax, options,
    /// config, device), 3 when an OOM policy stopped the run, 4 when another
    /// rank of a data-parallel run failed, 128 + the
    /// signal's number when a signal did (130 SIGINT, 143 SIGTERM, 129
    /// SIGHUP), 1 for other failures during training.
    pub fn exit_code(&self) -> u8 {
        if let Some(sig) = self.interrupted() {
            (128 + sig).clamp(0, 255) as u8
        } else if let Some(code) = self.exited() {
            code.clamp(0, 255) as u8
        } else if self.is_recipe_error() {
            2
        } else if self.find(|e| matches!(e, Error::Stopped(_))) {
            3
        } else if self.find(|e| matches!(e, Error::Peer(_))) {
            4
        } else {
            1
        }
    }

    /// The signal, when a signal stopped the run (through Lua too).
    pub fn interrupted(&self) -> Option<i32> {
        self.first(|e| match e {
            Error::Interrupted(sig) => Some(*sig),
            _ => None,
        })
    }

    /// The code, when the recipe called `os.exit(code)`.
    pub fn exited(&self) -> Option<i32> {
        self.first(|e| match e {
            Error::Exited(code) => Some(*code),
            _ => None,
        })
    }

    /// The first value `f` gives for this error or one it wraps (the walk
    /// of [`Error::find`]).
    fn first<T: Copy>(&self, f: impl Fn(&Error) -> Option<T> + Copy) -> Option<T> {
        let found = std::cell::Cell::new(None);
        self.find(|e| match f(e) {
            Some(v) => {
                found.set(Some(v));
                true
            }
            None => false,
        });
        found.get()
    }

    /// Whether this error, or one it wraps (through Lua callbacks, context
    /// and `pcall`/`error` round trips), satisfies `f`. The one walk over
    /// mlua's error chain: leaf Lua errors are offered to `f` as `Error::Lua`.
    pub fn find(&self, f: impl Fn(&Error) -> bool + Copy) -> bool {
        fn lua(e: &mlua::Error, f: impl Fn(&Error) -> bool + Copy) -> bool {
            match e {
                mlua::Error::CallbackError { cause, .. }
                | mlua::Error::WithContext { cause, .. } => lua(cause, f),
                mlua::Error::ExternalError(inner) => match inner.downcast_ref::<Error>() {
                    Some(t) => t.find(f),
                    None => inner
                        .downcast_ref::<mlua::Error>()
                        .is_some_and(|m| lua(m, f)),
                },
                leaf => f(&Error::Lua(leaf.clone())),
            }
        }
        f(self) || matches!(self, Error::Lua(l) if lua(l, f))
    }

    /// True for errors in the recipe itself or its invocation.
    pub fn is_recipe_error(&self) -> bool {
        self.find(|e| {
            matches!(
                e,
                Error::Config(_)
                    | Error::Data(_)
                    | Error::Device(_)
                    | Error::Plugin(_)
                    | Error::Lua(mlua::Error::SyntaxError { .. })
                    // A taper function given an argument of the wrong type.
                    | Error::Lua(mlua::Error::BadArgument { .. })
            )
        })
    }
}

/// Wraps a taper error for a trip through Lua. `mlua::Error::external` keeps it
/// downcastable, so the type survives `pcall` and comes back out intact.
pub(crate) fn lua_err(e: impl Into<Error>) -> mlua::Error {
    mlua::Error::external(e.into())
}

/// A candle error as one message, without the backtrace candle attaches
/// when `RUST_BACKTRACE` is set (the CLI's errors stay readable).
pub fn candle_message(e: &candle_core::Error) -> String {
    use candle_core::Error as E;
    match e {
        E::WithBacktrace { inner, .. } => candle_message(inner),
        E::Context { inner, context } => format!("{context}\n{}", candle_message(inner)),
        E::WithPath { inner, path } => format!("path: {path:?} {}", candle_message(inner)),
        other => other.to_string(),
    }
}
