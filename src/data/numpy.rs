//! NumPy arrays as samples: an `.npz` archive (`np.savez`, or
//! `np.savez_compressed`) holding inputs and targets, or two `.npy` files
//! (`np.save`). An `.npy` file is a short header, a Python dict literal
//! giving the element type (`descr`), the order and the shape, then the
//! elements packed end to end, so it is read in place from a map of the
//! file. An archive member stored as it is (`np.savez`) is read in place
//! from a map of the archive; a compressed one is inflated once into a
//! removed temporary file, mapped, so memory does not grow with it. Each
//! member's CRC-32 is checked, as `np.load` does.

use std::path::Path;
use std::sync::Arc;

use safetensors::Dtype;

use super::mapped::Mapped;
use super::samples::{Column, Samples, Targets};
use crate::{Error, Result};

/// What an `.npy` header says, and where the elements begin.
struct Header {
    dtype: Dtype,
    shape: Vec<usize>,
    data_offset: usize,
}

/// Inputs and targets from NumPy arrays: with `archive`, arrays `x` and
/// `y` of that `.npz` file (named with or without `.npy`); without, `x` and
/// `y` are `.npy` files.
pub fn numpy(
    archive: Option<&Path>,
    x: &str,
    y: Targets,
    scale: f32,
    split: &str,
) -> Result<Samples> {
    let (y, target) = match y {
        Targets::Labels(n) => (n, false),
        Targets::Values(n) => (n, true),
    };
    let (name, xc, yc) = match archive {
        Some(path) => {
            let mut arrays = archive_arrays(path, &[x, y])?.into_iter();
            let (Some(xc), Some(yc)) = (arrays.next(), arrays.next()) else {
                unreachable!("two names, two arrays")
            };
            (format!("numpy {}", path.display()), xc, yc)
        }
        None => (
            format!("numpy {x}, {y}"),
            npy_file(Path::new(x))?,
            npy_file(Path::new(y))?,
        ),
    };
    Samples::new(name, xc, yc, target, scale, split)
}

/// The array of an `.npy` file.
pub(super) fn npy_file(path: &Path) -> Result<Column> {
    let map = Arc::new(Mapped::open(path)?);
    let file = path.display().to_string();
    let what = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or(&file)
        .to_string();
    let end = map.len();
    array(map, 0..end, file, &what)
}

/// Arrays `names` of the `.npz` archive at `path` (each named with or
/// without `.npy`), in that order.
pub(super) fn archive_arrays(path: &Path, names: &[&str]) -> Result<Vec<Column>> {
    let map = Arc::new(Mapped::open(path)?);
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(&map[..])).map_err(|e| {
        Error::Data(format!(
            "{}: not an .npz archive (a zip of .npy files): {e}",
            path.display()
        ))
    })?;
    names
        .iter()
        .map(|n| member(path, &map, &mut zip, n))
        .collect()
}

/// Array `name` of the archive, read in place when stored, else inflated.
fn member(
    path: &Path,
    map: &Arc<Mapped>,
    zip: &mut zip::ZipArchive<std::io::Cursor<&[u8]>>,
    name: &str,
) -> Result<Column> {
    let stem = name.strip_suffix(".npy").unwrap_or(name);
    let file = format!("{stem}.npy");
    let err = |msg: String| Error::Data(format!("{}: {file}: {msg}", path.display()));
    let Some(index) = zip.index_for_name(&file) else {
        let mut names: Vec<String> = zip
            .file_names()
            .filter_map(|n| {
                n.ok()
                    .and_then(|n| n.strip_suffix(".npy").map(String::from))
            })
            .collect();
        names.sort();
        return Err(Error::Data(format!(
            "{}: no array named `{stem}` (it has: {})",
            path.display(),
            names.join(", ")
        )));
    };
    let entry = zip.by_index_raw(index).map_err(|e| err(e.to_string()))?;
    let start = entry
        .data_start()
        .ok_or_else(|| err("the archive does not say where its data begins".into()))?
        as usize;
    let stored = entry.compressed_size() as usize;
    let (size, crc, method) = (entry.size() as usize, entry.crc32(), entry.compression());
    drop(entry);
    let raw = start
        .checked_add(stored)
        .and_then(|end| map.get(start..end))
        .ok_or_else(|| err(format!("offset {}: the archive ends inside it", map.len())))?;
    let stem_what = stem.to_string();
    match method {
        zip::CompressionMethod::Stored => {
            if crc32fast::hash(raw) != crc {
                return Err(err(format!(
                    "offset {start}: its CRC-32 is not the one the archive records: the file is damaged"
                )));
            }
            array(map.clone(), start..start + stored, path.display().to_string(), &stem_what)
        }
        m if m == zip::CompressionMethod::DEFLATE => {
            let inflated = Arc::new(inflate_to_file(raw, size as u64, crc).map_err(|e| {
                err(format!("offset {start}: {e}"))
            })?);
            let end = inflated.len();
            array(
                inflated,
                0..end,
                format!(
                    "{}: {file} (compressed; offsets in the array's own bytes)",
                    path.display()
                ),
                &stem_what,
            )
        }
        other => Err(err(format!(
            "compressed with {other:?}; np.savez and np.savez_compressed write stored or deflated arrays"
        ))),
    }
}

/// A writer that counts and checksums what passes through it.
struct Checked<W> {
    inner: W,
    bytes: u64,
    crc: crc32fast::Hasher,
}

impl<W: std::io::Write> std::io::Write for Checked<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        self.crc.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// `raw` (a deflated member) inflated, a buffer at a time, into a temporary
/// file that is removed once mapped; its size and CRC-32 checked against
/// the archive's (`size`, `crc`).
fn inflate_to_file(raw: &[u8], size: u64, crc: u32) -> std::result::Result<Mapped, String> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("taper-npz-{}-{n}.npy", std::process::id()));
    let written =
        (|| -> std::result::Result<Checked<std::io::BufWriter<std::fs::File>>, String> {
            let file = std::fs::File::create(&path)
                .map_err(|e| format!("inflating it into {}: {e}", path.display()))?;
            let mut out = Checked {
                inner: std::io::BufWriter::new(file),
                bytes: 0,
                crc: crc32fast::Hasher::new(),
            };
            // Never more than the archive says, plus one byte to tell.
            let mut inflate = std::io::Read::take(flate2::read::DeflateDecoder::new(raw), size + 1);
            std::io::copy(&mut inflate, &mut out)
                .map_err(|e| format!("cannot be inflated: {e}"))?;
            std::io::Write::flush(&mut out)
                .map_err(|e| format!("inflating it into {}: {e}", path.display()))?;
            Ok(out)
        })();
    let mapped = written.and_then(|out| {
        if out.bytes != size || out.crc.finalize() != crc {
            return Err(
                "inflated, it is not what the archive records (size or CRC-32): the file is damaged"
                    .into(),
            );
        }
        Mapped::open(&path).map_err(|e| e.to_string())
    });
    let _ = std::fs::remove_file(&path);
    mapped
}

/// The array whose `.npy` bytes are `bytes` of `map`.
fn array(
    map: Arc<Mapped>,
    bytes: std::ops::Range<usize>,
    file: String,
    name: &str,
) -> Result<Column> {
    let at = bytes.start;
    let h = header(&map[bytes.clone()]).map_err(|e| Error::Data(format!("{file}: {e}")))?;
    let c = Column::new(
        h.dtype,
        h.shape,
        at + h.data_offset,
        map,
        file,
        ("array", name),
    )?;
    let end = c.start + c.shape[0] * c.row_bytes;
    if end > bytes.end {
        return Err(Error::Data(format!(
            "{}: offset {}: {} of shape {:?} runs past the end of its data ({} bytes): the file is cut short",
            c.file,
            bytes.end,
            c.what(),
            c.shape,
            bytes.end - at
        )));
    }
    Ok(c)
}

/// Parses an `.npy` header (format versions 1 to 3), as `np.lib.format`
/// writes it: `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }`.
fn header(b: &[u8]) -> std::result::Result<Header, String> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err("offset 0: not an .npy file (it does not begin with \\x93NUMPY)".into());
    }
    let (len, text_at) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        2 | 3 => return Err("offset 8: the header is cut short".into()),
        v => {
            return Err(format!(
                "offset 6: .npy format version {v} is not one of 1, 2, 3"
            ))
        }
    };
    let text = b
        .get(text_at..text_at + len)
        .and_then(|t| std::str::from_utf8(t).ok())
        .ok_or_else(|| format!("offset {text_at}: the header is cut short or not text"))?;
    let bad = |what: &str| format!("offset {text_at}: header {text:?}: {what}");
    let descr = value_of(text, "descr").ok_or_else(|| bad("no 'descr'"))?;
    if descr.starts_with('[') {
        return Err(bad(
            "a structured type (fields); save each field as its own array",
        ));
    }
    let descr = descr.trim_matches('\'');
    let dtype = dtype(descr).map_err(|e| bad(&e))?;
    let shape_text = value_of(text, "shape").ok_or_else(|| bad("no 'shape'"))?;
    let shape = shape_text
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| bad("a shape that is not whole numbers"))?;
    let fortran = value_of(text, "fortran_order").ok_or_else(|| bad("no 'fortran_order'"))?;
    if fortran == "True" && shape.iter().filter(|&&d| d > 1).count() > 1 {
        return Err(format!(
            "the array of shape {shape:?} is in Fortran (column-major) order; save it in C order: np.save(f, np.ascontiguousarray(a))"
        ));
    }
    Ok(Header {
        dtype,
        shape,
        data_offset: text_at + len,
    })
}

/// The text of `key`'s value in a header dict: a quoted string, a word,
/// or a bracketed tuple or list.
fn value_of<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let at = text.find(&format!("'{key}'"))? + key.len() + 2;
    let rest = text[at..].trim_start().strip_prefix(':')?.trim_start();
    let end = match rest.chars().next()? {
        '\'' => rest[1..].find('\'')? + 2,
        '(' => rest.find(')')? + 1,
        '[' => rest.rfind(']')? + 1,
        _ => rest.find([',', '}']).unwrap_or(rest.len()),
    };
    Some(rest[..end].trim())
}

/// The element type of a `descr` such as `<f4`.
fn dtype(descr: &str) -> std::result::Result<Dtype, String> {
    let (order, code) = match descr.chars().next() {
        Some(c @ ('<' | '>' | '|' | '=')) => (c, &descr[1..]),
        _ => ('=', descr),
    };
    let d = match code {
        "f2" => Dtype::F16,
        "f4" => Dtype::F32,
        "f8" => Dtype::F64,
        "i1" => Dtype::I8,
        "i2" => Dtype::I16,
        "i4" => Dtype::I32,
        "i8" => Dtype::I64,
        "u1" | "b1" => Dtype::U8,
        "u2" => Dtype::U16,
        "u4" => Dtype::U32,
        "u8" => Dtype::U64,
        c if c.starts_with('U') || c.starts_with('S') || c.starts_with('O') => {
            return Err(format!(
                "the array holds strings or Python objects (`{descr}`); give numbers: class indices, e.g. np.unique(labels, return_inverse=True)[1]"
            ))
        }
        _ => return Err(format!("element type `{descr}` is not a number type taper reads")),
    };
    if order == '>' && !matches!(d, Dtype::U8 | Dtype::I8) {
        return Err(format!(
            "element type `{descr}` is big-endian; save it little-endian: a.astype(a.dtype.newbyteorder('<'))"
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(text: &str) -> Vec<u8> {
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend((text.len() as u16).to_le_bytes());
        b.extend(text.as_bytes());
        b
    }

    #[test]
    fn headers_as_numpy_writes_them() {
        let text = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }   \n";
        let h = header(&npy(text)).unwrap();
        assert_eq!(
            (h.dtype, h.shape, h.data_offset),
            (Dtype::F32, vec![3, 4], 10 + text.len())
        );
        let h = header(&npy(
            "{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }",
        ))
        .unwrap();
        assert_eq!((h.dtype, h.shape), (Dtype::U8, vec![5]));
        let h = header(&npy(
            "{'descr': '<i8', 'fortran_order': True, 'shape': (7,), }",
        ))
        .unwrap();
        assert_eq!((h.dtype, h.shape), (Dtype::I64, vec![7]));
        for (text, says) in [
            (
                "{'descr': '<U5', 'fortran_order': False, 'shape': (2,), }",
                "strings",
            ),
            (
                "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }",
                "big-endian",
            ),
            (
                "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }",
                "not a number type",
            ),
            (
                "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
                "Fortran",
            ),
            (
                "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }",
                "structured",
            ),
        ] {
            let e = header(&npy(text)).err().unwrap();
            assert!(e.contains(says), "{text}: {e}");
        }
        assert!(header(b"PK\x03\x04 not npy")
            .err()
            .unwrap()
            .contains("not an .npy file"));
    }
}
