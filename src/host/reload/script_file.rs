//! Reading a script file, and only a regular one: a recipe or module that a
//! save replaced by a FIFO, or a symlink to `/dev/zero`, would otherwise be
//! read forever by the run's thread.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Scripts are small; anything larger is refused rather than read whole.
pub const MAX_SCRIPT_BYTES: u64 = 64 << 20;

/// The text of the regular file at `path` (symlinks followed), as Lua's
/// own `loadfile` reads it (see [`as_lua_reads`]), or why not.
pub fn read_script(path: &Path) -> Result<String, String> {
    let bytes = read_regular(path, MAX_SCRIPT_BYTES)?;
    String::from_utf8(bytes)
        .map(as_lua_reads)
        .map_err(|e| format!("cannot read {}: not UTF-8 text ({e})", path.display()))
}

/// A script's text as `lua` (`luaL_loadfile`) reads a file: a UTF-8
/// byte-order mark (which some Windows editors write) is passed over, and
/// so is a first line starting with `#` (`#!/usr/bin/env taper`), whose line
/// ending stays so that line numbers are the file's.
fn as_lua_reads(text: String) -> String {
    let t = text.strip_prefix('\u{feff}').unwrap_or(&text);
    if t.starts_with('#') {
        t.find('\n').map_or(String::new(), |i| t[i..].to_string())
    } else if t.len() == text.len() {
        text
    } else {
        t.to_string()
    }
}

/// The bytes of the regular file at `path` (symlinks followed), at most
/// `max` of them, or why not.
pub fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let shown = path.display();
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
    // writer. The type is checked on the opened file, not on the name.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!(
            "cannot read {shown}: not a regular file ({}); a script must be a plain file",
            kind(&meta.file_type())
        ));
    }
    if meta.len() > max {
        return Err(format!(
            "cannot read {shown}: {} bytes is more than the {max} expected",
            meta.len()
        ));
    }
    let mut bytes = Vec::new();
    file.take(max)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    Ok(bytes)
}

fn kind(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifos_and_devices_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("recipe.lua");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let err = read_script(&fifo).unwrap_err();
        assert!(err.contains("not a regular file (a FIFO)"), "{err}");

        let zero = dir.path().join("zero.lua");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let err = read_script(&zero).unwrap_err();
        assert!(err.contains("a character device"), "{err}");

        let plain = dir.path().join("plain.lua");
        std::fs::write(&plain, "return 1\n").unwrap();
        assert_eq!(read_script(&plain).unwrap(), "return 1\n");
    }

    #[test]
    fn a_byte_order_mark_and_a_first_hash_line_are_passed_over_as_lua_does() {
        assert_eq!(as_lua_reads("\u{feff}return 1\n".into()), "return 1\n");
        assert_eq!(
            as_lua_reads("\u{feff}#!/usr/bin/env taper\r\nreturn 1\n".into()),
            "\nreturn 1\n"
        );
        assert_eq!(as_lua_reads("#!taper".into()), "");
        // Only the first line, and only a `#` that starts it.
        assert_eq!(as_lua_reads(" #x\n#y\n".into()), " #x\n#y\n");
    }
}
