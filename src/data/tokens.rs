//! Token files: little-endian `u16` or `u32` ids, one after another (the
//! layout of nanoGPT's `train.bin`), memory-mapped. Samples are windows of
//! `context + 1` tokens, `stride` apart.
//!
//! Host memory stays bounded whatever the file size. Pages of a file mapping
//! count toward the process's resident size once touched, and how many a
//! read maps is up to the kernel: fault-around maps 64 KiB around a fault,
//! and a freshly written file sits in large page-cache folios that a fault
//! maps whole (measured on Linux 6.18: a shuffled epoch over a 1 GiB file
//! reached 700 MB resident when released every 32 MiB of estimated pages).
//! So `gather` advises the mapping `MADV_DONTNEED` after every
//! `RELEASE_WINDOWS` windows: the pages stay in the page cache, and the next
//! read maps them again.

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use super::mapped::Mapped;
use super::Source;
use crate::{Error, Result};

const RELEASE_WINDOWS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenType {
    U16,
    U32,
}

impl TokenType {
    fn size(self) -> usize {
        match self {
            TokenType::U16 => 2,
            TokenType::U32 => 4,
        }
    }
}

pub struct Tokens {
    path: PathBuf,
    split: String,
    map: Mapped,
    dtype: TokenType,
    context: usize,
    stride: usize,
    count: usize,
}

pub fn tokens(
    path: &Path,
    dtype: TokenType,
    context: usize,
    stride: Option<usize>,
    split: &str,
) -> Result<Tokens> {
    let map = Mapped::open(path)?;
    let size = dtype.size();
    if map.len() % size != 0 {
        return Err(Error::Data(format!(
            "{}: offset {}: {} trailing bytes: the file is not a whole number of {:?} tokens",
            path.display(),
            map.len() - map.len() % size,
            map.len() % size,
            dtype
        )));
    }
    let count = map.len() / size;
    if context == 0 || count < context + 1 {
        return Err(Error::Config(format!(
            "{}: {count} tokens do not fill one window of context {context}",
            path.display()
        )));
    }
    Ok(Tokens {
        path: path.to_path_buf(),
        split: split.to_string(),
        map,
        dtype,
        context,
        stride: stride.unwrap_or(context).max(1),
        count,
    })
}

impl Tokens {
    fn token(&self, i: usize) -> u32 {
        let b = &self.map;
        match self.dtype {
            TokenType::U16 => u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32,
            TokenType::U32 => {
                u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
            }
        }
    }

    fn release(&self) {
        // SAFETY: a read-only file mapping: dropping its pages loses no data;
        // later reads fault them back in from the file.
        let _ = unsafe {
            self.map
                .mmap()
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        };
    }
}

impl Source for Tokens {
    fn len(&self) -> usize {
        (self.count - self.context - 1) / self.stride + 1
    }
    fn split(&self) -> &str {
        &self.split
    }
    fn describe(&self) -> String {
        format!(
            "tokens {} ({} {:?} tokens, {} windows of {})",
            self.path.display(),
            self.count,
            self.dtype,
            self.len(),
            self.context
        )
    }
    fn gather(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        self.map.check()?;
        let t = self.context;
        let mut x = Vec::with_capacity(indices.len() * t);
        let mut y = Vec::with_capacity(indices.len() * t);
        for (n, &i) in indices.iter().enumerate() {
            let s = i * self.stride;
            x.extend((s..s + t).map(|j| self.token(j)));
            y.extend((s + 1..s + t + 1).map(|j| self.token(j)));
            if n % RELEASE_WINDOWS == RELEASE_WINDOWS - 1 {
                self.release();
            }
        }
        self.release();
        let b = indices.len();
        Ok((
            Tensor::from_vec(x, (b, t), &Device::Cpu)?,
            Tensor::from_vec(y, (b, t), &Device::Cpu)?,
        ))
    }
}
