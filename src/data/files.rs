//! Sources read from files: IDX (MNIST's format) and plain text (CSV is
//! in `csv.rs`). Each
//! error names the file and the offset or line where reading failed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::{tokenized, CharText, Source, Vocab};
use crate::{Error, Result};

pub(crate) fn data_err(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Data(format!("{}: {msg}", path.display()))
}

/// The bytes of a file, gunzipped when it starts with the gzip magic: every
/// member of it (`cat a.gz b.gz`, bgzip), not only the first.
pub(crate) fn read_maybe_gz(path: &Path) -> Result<Vec<u8>> {
    let raw = std::fs::read(path).map_err(|e| data_err(path, e))?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|e| {
                data_err(
                    path,
                    format!("corrupt gzip stream after {} bytes: {e}", out.len()),
                )
            })?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

/// A text file's text, gunzipped: UTF-8, or UTF-16 with its byte order
/// mark (what Windows' Notepad saves as "Unicode", and Excel as "Unicode
/// Text"). Other bytes are an error naming the line and offset of the first
/// that is not UTF-8, and how to convert the file.
pub(crate) fn read_text(path: &Path) -> Result<String> {
    let bytes = read_maybe_gz(path)?;
    let utf16 = |units: Vec<u16>| {
        char::decode_utf16(units)
            .enumerate()
            .map(|(k, c)| {
                c.map_err(|_| {
                    data_err(
                        path,
                        format!("offset {}: not UTF-16 (a lone surrogate, or half a unit at the end), though the file starts with UTF-16's byte order mark", 2 + 2 * k),
                    )
                })
            })
            .collect::<Result<String>>()
    };
    let pairs = |b: &[u8], le: bool| -> Vec<u16> {
        b.chunks(2)
            .map(|p| match (p, le) {
                ([a, b], true) => u16::from_le_bytes([*a, *b]),
                ([a, b], false) => u16::from_be_bytes([*a, *b]),
                // An odd last byte: not a whole unit.
                _ => 0xDC00,
            })
            .collect()
    };
    match bytes.as_slice() {
        [0xFF, 0xFE, rest @ ..] => return utf16(pairs(rest, true)),
        [0xFE, 0xFF, rest @ ..] => return utf16(pairs(rest, false)),
        _ => {}
    }
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let b = e.as_bytes();
        let line = 1 + b[..at].iter().filter(|&&c| c == b'\n').count();
        data_err(
            path,
            format!(
                "line {line}, offset {at}: byte 0x{:02X} is not UTF-8; a file saved in Latin-1 or Windows-1252 (`\u{e9}` as one byte)? convert it: iconv -f WINDOWS-1252 -t UTF-8 {} > {}",
                b[at],
                path.display(),
                utf8_name(path).display()
            ),
        )
    })
}

/// Where a converted copy of `path` could go: `notes.txt` as
/// `notes.utf8.txt`, beside it.
fn utf8_name(path: &Path) -> PathBuf {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = match path.extension() {
        Some(e) => format!("{stem}.utf8.{}", e.to_string_lossy()),
        None => format!("{stem}.utf8"),
    };
    path.with_file_name(name)
}

/// Parses an IDX header: the dimensions and where the data starts.
fn idx_header(path: &Path, b: &[u8]) -> Result<(Vec<usize>, usize)> {
    if b.len() < 4 {
        return Err(data_err(
            path,
            format!("offset 0: truncated IDX header ({} bytes)", b.len()),
        ));
    }
    if b[0] != 0 || b[1] != 0 {
        return Err(data_err(
            path,
            "offset 0: not an IDX file (the first two bytes must be zero)",
        ));
    }
    if b[2] != 0x08 {
        return Err(data_err(
            path,
            format!(
                "offset 2: element type 0x{:02x} is not supported (only unsigned bytes, 0x08)",
                b[2]
            ),
        ));
    }
    let nd = b[3] as usize;
    let header = 4 + 4 * nd;
    if b.len() < header {
        return Err(data_err(
            path,
            format!(
                "offset {}: truncated IDX header: {nd} dimensions need {header} bytes",
                b.len()
            ),
        ));
    }
    let dims: Vec<usize> = (0..nd)
        .map(|i| {
            u32::from_be_bytes([b[4 + 4 * i], b[5 + 4 * i], b[6 + 4 * i], b[7 + 4 * i]]) as usize
        })
        .collect();
    let expected: usize = dims.iter().product();
    let found = b.len() - header;
    if found != expected {
        return Err(data_err(
            path,
            format!(
                "offset {header}: dimensions {dims:?} need {expected} bytes of data, the file has {found} ({})",
                if found < expected { "truncated" } else { "trailing bytes" }
            ),
        ));
    }
    Ok((dims, header))
}

/// Images and labels in IDX files (MNIST, Fashion-MNIST), gzipped or raw.
/// Pixels are scaled by `1 / scale` (255: into [0, 1]); samples are flat.
pub struct Idx {
    name: String,
    split: String,
    pixels: Vec<u8>,
    labels: Vec<u8>,
    sample: usize,
    scale: f32,
}

pub fn idx(images: &Path, labels: &Path, split: &str, scale: f32) -> Result<Idx> {
    let ib = read_maybe_gz(images)?;
    let (idims, ioff) = idx_header(images, &ib)?;
    let lb = read_maybe_gz(labels)?;
    let (ldims, loff) = idx_header(labels, &lb)?;
    if idims.is_empty() || ldims.len() != 1 || idims[0] != ldims[0] {
        return Err(data_err(
            labels,
            format!(
                "{ldims:?} labels do not match the images' dimensions {idims:?} in {}",
                images.display()
            ),
        ));
    }
    let sample: usize = idims[1..].iter().product();
    Ok(Idx {
        name: images
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        split: split.to_string(),
        pixels: ib[ioff..].to_vec(),
        labels: lb[loff..].to_vec(),
        sample,
        scale,
    })
}

impl Idx {
    /// Elements per sample (for a CNN: height x width).
    pub fn sample_len(&self) -> usize {
        self.sample
    }
}

impl Source for Idx {
    fn len(&self) -> usize {
        self.labels.len()
    }
    fn split(&self) -> &str {
        &self.split
    }
    fn describe(&self) -> String {
        format!(
            "idx {} ({} samples of {})",
            self.name,
            self.labels.len(),
            self.sample
        )
    }
    fn gather(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        let s = self.sample;
        let mut x = Vec::with_capacity(indices.len() * s);
        let mut y = Vec::with_capacity(indices.len());
        for &i in indices {
            x.extend(
                self.pixels[i * s..(i + 1) * s]
                    .iter()
                    .map(|&p| p as f32 / self.scale),
            );
            y.push(self.labels[i] as u32);
        }
        Ok((
            Tensor::from_vec(x, (indices.len(), s), &Device::Cpu)?,
            Tensor::from_vec(y, indices.len(), &Device::Cpu)?,
        ))
    }
}

/// A UTF-8 text file as windows of tokens: its characters, or with
/// `tokenizer`, the ids of that `tokenizer.json`. `val_fraction` of the end
/// is the `val` split.
pub fn text(
    path: &Path,
    tokenizer: Option<&Path>,
    split: &str,
    context: usize,
    stride: Option<usize>,
    val_fraction: f64,
) -> Result<CharText> {
    let text = read_text(path)?;
    let name = PathBuf::from(path.file_name().unwrap_or_default())
        .display()
        .to_string();
    let cut = Windows {
        split,
        context,
        stride,
        val_fraction,
    };
    text_windows(&name, &text, tokenizer, cut)
}

/// How [`text_windows`] cuts a text: which split, windows of `context`
/// tokens `stride` apart, the last `val_fraction` of it for `val`.
pub(crate) struct Windows<'a> {
    pub split: &'a str,
    pub context: usize,
    pub stride: Option<usize>,
    pub val_fraction: f64,
}

/// `text` cut into windows as [`text`] does, its tokenization shared with
/// other sources of the same text and tokenizer (`name` names the source).
pub(crate) fn text_windows(
    name: &str,
    text: &str,
    tokenizer: Option<&Path>,
    cut: Windows,
) -> Result<CharText> {
    let Windows {
        split,
        context,
        stride,
        val_fraction,
    } = cut;
    let tokenize = || {
        let vocab = match tokenizer {
            Some(t) => Vocab::from_tokenizer_file(t)?,
            None => Vocab::from_text(text),
        };
        Ok((vocab.encode(text)?, vocab))
    };
    // A tokenizer file that cannot be read skips the cache, and
    // `from_tokenizer_file` says what is wrong with it.
    let key = match tokenizer {
        None => Some(tokenized::Key::new(text.as_bytes(), None)),
        Some(t) => std::fs::read(t)
            .ok()
            .map(|b| tokenized::Key::new(text.as_bytes(), Some(&b))),
    };
    let (tokens, vocab) = match key {
        Some(key) => tokenized::shared(key, tokenize)?,
        None => {
            let (tokens, vocab) = tokenize()?;
            (Arc::new(tokens), Arc::new(vocab))
        }
    };
    CharText::new(name, split, tokens, vocab, context, stride, val_fraction)
}
