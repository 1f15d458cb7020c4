//! Data sets compiled into the binary (provenance and licences in
//! `src/data/builtin/README.md`).

use std::io::Read;
use std::sync::{Arc, OnceLock};

use candle_core::{Device, Tensor};

use std::path::Path;

use super::csv::{parse_csv, Csv, CsvOptions};
use super::vocab::Vocab;
use super::Source;
use crate::{Error, Result};

const DIGITS_GZ: &[u8] = include_bytes!("builtin/digits.csv.gz");
const SHAKESPEARE_GZ: &[u8] = include_bytes!("builtin/shakespeare.txt.gz");

fn gunzip(bytes: &[u8], what: &str) -> Result<String> {
    let mut s = String::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_string(&mut s)
        .map_err(|e| Error::Data(format!("built-in {what}: {e}")))?;
    Ok(s)
}

/// scikit-learn's 8x8 digits: 1,797 samples of 64 pixels (0..16) and a label.
fn digits_table() -> Result<&'static Csv> {
    static TABLE: OnceLock<Csv> = OnceLock::new();
    if let Some(t) = TABLE.get() {
        return Ok(t);
    }
    let text = gunzip(DIGITS_GZ, "digits")?;
    let table = parse_csv(
        Path::new("built-in digits.csv"),
        &text,
        &CsvOptions {
            scale: 16.0,
            ..CsvOptions::default()
        },
    )?;
    if table.len() != 1797 || table.width() != 64 {
        return Err(Error::Data(format!(
            "built-in digits: {} rows of {}",
            table.len(),
            table.width()
        )));
    }
    Ok(TABLE.get_or_init(|| table))
}

/// The digits, split deterministically: every fifth sample (index % 5 == 0)
/// is `test` (360 samples), the rest `train` (1,437).
pub struct Digits {
    split: String,
    rows: Vec<usize>,
}

pub fn digits(split: &str) -> Result<Digits> {
    let n = digits_table()?.len();
    let rows: Vec<usize> = match split {
        "train" => (0..n).filter(|i| i % 5 != 0).collect(),
        "test" => (0..n).filter(|i| i % 5 == 0).collect(),
        "all" => (0..n).collect(),
        other => {
            return Err(Error::Config(format!(
                "digits: unknown split `{other}`: use train, test or all"
            )))
        }
    };
    Ok(Digits {
        split: split.to_string(),
        rows,
    })
}

impl Source for Digits {
    fn len(&self) -> usize {
        self.rows.len()
    }
    fn split(&self) -> &str {
        &self.split
    }
    fn describe(&self) -> String {
        format!("digits/{} ({} samples)", self.split, self.rows.len())
    }
    fn gather(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        let rows: Vec<usize> = indices.iter().map(|&i| self.rows[i]).collect();
        digits_table()?.gather(&rows)
    }
}

struct Corpus {
    vocab: Arc<Vocab>,
    tokens: Arc<Vec<u32>>,
}

fn shakespeare_corpus() -> Result<&'static Corpus> {
    static CORPUS: OnceLock<Corpus> = OnceLock::new();
    if let Some(c) = CORPUS.get() {
        return Ok(c);
    }
    let text = gunzip(SHAKESPEARE_GZ, "shakespeare")?;
    let vocab = Vocab::from_text(&text);
    let tokens = vocab.encode(&text)?;
    Ok(CORPUS.get_or_init(|| Corpus {
        vocab: Arc::new(vocab),
        tokens: Arc::new(tokens),
    }))
}

/// Character-level text cut into windows of `context + 1` tokens, `stride`
/// apart: inputs are the first `context`, targets the same shifted by one.
pub struct CharText {
    name: String,
    split: String,
    tokens: Arc<Vec<u32>>,
    range: std::ops::Range<usize>,
    context: usize,
    stride: usize,
    vocab: Arc<Vocab>,
}

impl CharText {
    /// Windows over `tokens`: `split` is `train` (the first `1 - val_fraction`),
    /// `val` (the rest) or `all`.
    pub fn new(
        name: &str,
        split: &str,
        tokens: Arc<Vec<u32>>,
        vocab: Arc<Vocab>,
        context: usize,
        stride: Option<usize>,
        val_fraction: f64,
    ) -> Result<Self> {
        let n = tokens.len();
        let cut = n - ((n as f64) * val_fraction.clamp(0.0, 1.0)).round() as usize;
        let range = match split {
            "train" => 0..cut,
            "val" | "test" => cut..n,
            "all" => 0..n,
            other => {
                return Err(Error::Config(format!(
                    "{name}: unknown split `{other}`: use train, val or all"
                )))
            }
        };
        if context == 0 || context + 1 > range.len() {
            return Err(Error::Config(format!(
                "{name}: context {context} does not fit the {split} split ({} tokens)",
                range.len()
            )));
        }
        Ok(CharText {
            name: name.into(),
            split: split.to_string(),
            tokens,
            range,
            context,
            stride: stride.unwrap_or(context).max(1),
            vocab,
        })
    }
}

/// The built-in Shakespeare in a tokenizer's tokens (a `tokenizer.json`,
/// as [`super::text`] reads a file), split as [`shakespeare`].
pub fn shakespeare_tokens(
    split: &str,
    context: usize,
    stride: Option<usize>,
    tokenizer: &std::path::Path,
) -> Result<CharText> {
    let text = gunzip(SHAKESPEARE_GZ, "shakespeare")?;
    let cut = super::files::Windows {
        split,
        context,
        stride,
        val_fraction: 0.1,
    };
    super::files::text_windows("shakespeare", &text, Some(tokenizer), cut)
}

/// The built-in Shakespeare: the first 90% of the corpus is `train`, the
/// last 10% `val`.
pub fn shakespeare(split: &str, context: usize, stride: Option<usize>) -> Result<CharText> {
    let c = shakespeare_corpus()?;
    CharText::new(
        "shakespeare",
        split,
        c.tokens.clone(),
        c.vocab.clone(),
        context,
        stride,
        0.1,
    )
}

impl Source for CharText {
    fn len(&self) -> usize {
        (self.range.len() - self.context - 1) / self.stride + 1
    }
    fn split(&self) -> &str {
        &self.split
    }
    fn describe(&self) -> String {
        format!(
            "{}/{} ({} windows of {}, vocabulary {})",
            self.name,
            self.split,
            self.len(),
            self.context,
            self.vocab.len()
        )
    }
    fn gather(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        let t = self.context;
        let mut x = Vec::with_capacity(indices.len() * t);
        let mut y = Vec::with_capacity(indices.len() * t);
        for &i in indices {
            let s = self.range.start + i * self.stride;
            x.extend_from_slice(&self.tokens[s..s + t]);
            y.extend_from_slice(&self.tokens[s + 1..s + t + 1]);
        }
        let b = indices.len();
        Ok((
            Tensor::from_vec(x, (b, t), &Device::Cpu)?,
            Tensor::from_vec(y, (b, t), &Device::Cpu)?,
        ))
    }
    fn vocab(&self) -> Option<&Vocab> {
        Some(&self.vocab)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_split_is_fixed_and_complete() -> anyhow::Result<()> {
        let (train, test) = (digits("train")?, digits("test")?);
        assert_eq!((train.len(), test.len()), (1437, 360));
        let (x, y) = test.gather(&[0, 1])?;
        assert_eq!(x.dims(), &[2, 64]);
        // Row 0 of the CSV is a 0, row 5 is a 5 (the file cycles 0..9 at first).
        assert_eq!(y.to_vec1::<u32>()?, vec![0, 5]);
        let max = x.max_all()?.to_scalar::<f32>()?;
        assert!(max <= 1.0 && max > 0.9);
        Ok(())
    }

    #[test]
    fn shakespeare_windows_shift_by_one() -> anyhow::Result<()> {
        let s = shakespeare("train", 16, None)?;
        let (x, y) = s.gather(&[3])?;
        let (x, y) = (x.to_vec2::<u32>()?, y.to_vec2::<u32>()?);
        assert_eq!(x[0][1..], y[0][..15]);
        let v = s.vocab().unwrap();
        assert_eq!(v.decode(&v.encode("ROMEO:")?), "ROMEO:");
        assert!(v.len() > 50 && v.len() < 80, "{}", v.len());
        Ok(())
    }
}
