//! Hot reload: watching a recipe and the Lua modules it required, so that a
//! long run picks up edits at its next safe point (see `host::reload` for
//! how a new version is tried and swapped in).

mod script_file;
pub mod watcher;

pub use script_file::{read_regular, read_script};

pub use watcher::{Changes, Watcher, DEBOUNCE};
