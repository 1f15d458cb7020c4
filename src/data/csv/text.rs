//! A CSV column of text as a model's input (`taper.data.csv{ text = ...,
//! tokenizer = ... }`): each cell tokenized as transformers' tokenizer
//! does for a classifier, `tokenizer(text, truncation=True,
//! max_length=context)`: the tokenizer's own special tokens (BERT's
//! `[CLS]` and `[SEP]`) added, cut to `context` ids, then padded after the
//! text with the tokenizer's padding token. Two columns are a text pair
//! (`text = { "premise", "hypothesis" }`), tokenized as `tokenizer(a, b,
//! truncation=True, max_length=context)`: `[CLS] a [SEP] b [SEP]`, the
//! longer text cut first.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{Device, Tensor};
use tokenizers::{EncodeInput, Tokenizer, TruncationParams};

use super::super::tokenized::{Cache, Key};
use super::records::{Files, Place};
use super::Column;
use crate::{Error, Result};

/// Which column holds the text, and how it becomes ids.
#[derive(Debug, Clone)]
pub struct TextOptions {
    /// One column, or two: a text pair.
    pub columns: Vec<Column>,
    /// A `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// The most ids a sample has, special tokens included.
    pub context: usize,
}

/// How a run's texts became ids, saved with its checkpoints (in its
/// [`super::TableInput`]), so that `taper classify` reads new rows the same
/// way.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TextInput {
    /// The most ids of a text.
    pub context: usize,
    /// The padding id.
    pub pad: u32,
    /// The tokenizer, as its `tokenizer.json` holds it.
    pub tokenizer: serde_json::Value,
}

/// The texts of a file's rows as ids, each `context` long once padded.
pub(super) struct Texts {
    ids: Vec<u32>,
    /// Where each row's ids start in `ids` (one more than the rows).
    starts: Vec<usize>,
    context: usize,
    pad: u32,
    /// The places of the texts cut at `context`.
    pub cut: Vec<Place>,
    /// The tokenizer file's name, for `describe`.
    pub tokenizer: String,
    /// The reading, for checkpoints.
    pub input: TextInput,
}

/// The tokenizer of `o`, cutting at `o.context`, and its padding id.
fn tokenizer(o: &TextOptions) -> Result<(Tokenizer, u32)> {
    let path = &o.tokenizer;
    let t = Tokenizer::from_file(path).map_err(|e| {
        Error::Data(format!(
            "{}: not a readable tokenizer.json: {e}",
            path.display()
        ))
    })?;
    cutting(t, path, o.context)
}

/// `t` cutting at `context` ids and padding nothing, and its padding id
/// (`path` names it in errors).
fn cutting(mut t: Tokenizer, path: &Path, context: usize) -> Result<(Tokenizer, u32)> {
    let pad = t.get_padding().map(|p| p.pad_id).or_else(|| {
        ["[PAD]", "<pad>", "<|pad|>"]
            .iter()
            .find_map(|n| t.token_to_id(n))
    });
    let Some(pad) = pad else {
        return Err(Error::Data(format!(
            "{}: the tokenizer names no padding token (its `padding`, or a `[PAD]` or `<pad>` token), which texts of several lengths need",
            path.display()
        )));
    };
    t.with_padding(None);
    t.with_truncation(Some(TruncationParams {
        max_length: context,
        ..Default::default()
    }))
    .map_err(|e| Error::Data(format!("{}: {e}", path.display())))?;
    Ok((t, pad))
}

/// Tokenized texts by what they were made from: a recipe's sources of one
/// file, and those a hot-reloaded recipe builds again, share one
/// tokenization while any of them is alive (`data/tokenized.rs`).
static TEXTS: Cache<Arc<Texts>> = Cache::new();

/// A row's text, or its pair of texts: one cell per text column.
pub(super) type Cells = Vec<String>;

/// `column `a``, or `columns `a` and `b`` for a pair, in errors.
pub(super) fn describe_columns(columns: &[Column]) -> String {
    match columns {
        [c] => c.describe(),
        _ => format!(
            "columns {}",
            columns
                .iter()
                .map(|c| c.describe().trim_start_matches("column ").to_string())
                .collect::<Vec<_>>()
                .join(" and ")
        ),
    }
}

/// The `cells` (read at `places` of `files`) as ids: shared with a live
/// source of the same texts, places, files, tokenizer file and options.
pub(super) fn tokenize(
    (files, places): (&Files, &[Place]),
    o: &TextOptions,
    cells: Vec<Cells>,
) -> Result<Arc<Texts>> {
    let tokenizer_bytes = std::fs::read(&o.tokenizer).map_err(|e| Error::io(&o.tokenizer, e))?;
    let mut rows = Vec::new();
    for (row, place) in cells.iter().zip(places) {
        for cell in row {
            rows.extend((cell.len() as u64).to_le_bytes());
            rows.extend(cell.as_bytes());
        }
        rows.extend(place.key());
    }
    let mut paths = Vec::new();
    for p in files.paths() {
        paths.extend(p.as_os_str().as_encoded_bytes());
        paths.push(0);
    }
    let key = Key::of(&[
        &rows,
        &tokenizer_bytes,
        &o.context.to_le_bytes(),
        describe_columns(&o.columns).as_bytes(),
        &paths,
    ]);
    TEXTS.shared(key, || {
        tokenize_now((files, places), o, cells).map(Arc::new)
    })
}

/// [`tokenize`], without the cache.
fn tokenize_now(read: (&Files, &[Place]), o: &TextOptions, cells: Vec<Cells>) -> Result<Texts> {
    let (t, pad) = tokenizer(o)?;
    let name = o
        .tokenizer
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    encode(
        (read, &o.tokenizer, name),
        &o.columns,
        (t, pad, o.context),
        cells,
    )
}

/// The `cells` (read at `places` of `files`) as ids, as the run that
/// saved `input` read its texts (its column named `column` in errors).
pub(super) fn tokenize_as(
    read: (&Files, &[Place]),
    input: &TextInput,
    columns: &[Column],
    cells: Vec<Cells>,
) -> Result<Texts> {
    let saved = Path::new("the checkpoint's tokenizer");
    let t: Tokenizer = input
        .tokenizer
        .to_string()
        .parse()
        .map_err(|e| Error::Data(format!("{}: {e}", saved.display())))?;
    let (t, _) = cutting(t, saved, input.context)?;
    let source = (read, saved, "the run's tokenizer".to_string());
    encode(source, columns, (t, input.pad, input.context), cells)
}

/// The `cells` as ids of `t`, padded with `pad` to `context`; `read`,
/// `source` and `name`: where the cells were read, the tokenizer's file
/// and its name.
fn encode(
    ((files, places), source, name): ((&Files, &[Place]), &Path, String),
    columns: &[Column],
    (t, pad, context): (Tokenizer, u32, usize),
    cells: Vec<Cells>,
) -> Result<Texts> {
    let inputs: Vec<EncodeInput> = cells
        .into_iter()
        .map(|row| {
            let mut row = row.into_iter();
            let a = row.next().unwrap_or_default();
            match row.next() {
                None => EncodeInput::Single(a.into()),
                Some(b) => EncodeInput::Dual(a.into(), b.into()),
            }
        })
        .collect();
    let encodings = t
        .encode_batch(inputs, true)
        .map_err(|e| Error::Data(format!("{}: {e}", source.display())))?;
    let json = t
        .to_string(false)
        .map_err(|e| Error::Data(format!("{}: {e}", source.display())))?;
    let mut texts = Texts {
        ids: Vec::new(),
        starts: vec![0],
        context,
        pad,
        cut: Vec::new(),
        tokenizer: name,
        input: TextInput {
            context,
            pad,
            tokenizer: serde_json::from_str(&json)
                .map_err(|e| Error::Data(format!("{}: {e}", source.display())))?,
        },
    };
    for (e, &place) in encodings.iter().zip(places) {
        let ids = e.get_ids();
        if ids.contains(&pad) {
            return Err(files.error(place, |row| {
                format!(
                    "{row}, {}: the text holds the tokenizer's padding token (`{}`), which the model would not see: take it out of the text",
                    describe_columns(columns),
                    t.id_to_token(pad).unwrap_or_default()
                )
            }));
        }
        // A pair's second text starts after the first separator (BERT's
        // types follow from it): a first text holding that token would
        // shift them.
        if let Some(second) = e.get_type_ids().iter().position(|&t| t == 1) {
            let sep = ids[second.saturating_sub(1)];
            if ids[..second.saturating_sub(1)].contains(&sep) {
                return Err(files.error(place, |row| {
                    format!(
                        "{row}, {}: the first text holds the separator token (`{}`) that the pair's texts are joined with: take it out of the text",
                        describe_columns(columns),
                        t.id_to_token(sep).unwrap_or_default()
                    )
                }));
            }
        }
        if !e.get_overflowing().is_empty() {
            texts.cut.push(place);
        }
        texts.ids.extend_from_slice(ids);
        texts.starts.push(texts.ids.len());
    }
    Ok(texts)
}

impl Texts {
    fn row(&self, i: usize) -> &[u32] {
        &self.ids[self.starts[i]..self.starts[i + 1]]
    }

    /// Each text's ids, padded to `context`: u32 `[n, context]`.
    pub(super) fn gather(&self, indices: &[usize]) -> Result<Tensor> {
        let c = self.context;
        Ok(Tensor::from_vec(
            self.padded(indices),
            (indices.len(), c),
            &Device::Cpu,
        )?)
    }

    /// Each text's ids, padded to `context`, row after row.
    pub(super) fn padded(&self, indices: &[usize]) -> Vec<u32> {
        let c = self.context;
        let mut x = Vec::with_capacity(indices.len() * c);
        for &i in indices {
            let row = self.row(i);
            x.extend_from_slice(row);
            x.extend(std::iter::repeat_n(self.pad, c - row.len()));
        }
        x
    }

    pub(super) fn len(&self) -> usize {
        self.starts.len() - 1
    }

    /// Each text's ids, special tokens included.
    pub(super) fn lengths(&self) -> Vec<usize> {
        self.starts.windows(2).map(|w| w[1] - w[0]).collect()
    }

    pub(super) fn context(&self) -> usize {
        self.context
    }
}
