//! Data: sources of samples and the pipeline (take, shuffle, batch) a recipe
//! builds over them. Batches are built natively on the host; Lua only holds
//! handles.

mod array_input;
mod augment;
mod builtin;
mod by_length;
mod chat;
mod chat_template;
mod csv;
mod epoch;
mod files;
mod image_files;
mod image_input;
mod images;
mod jpeg;
mod mapped;
mod numpy;
mod permutation;
mod pipeline;
mod samples;
mod standardize;
mod tokenized;
mod tokens;
mod vocab;

pub use array_input::{ArrayInput, ArrayRows};
pub use augment::Augment;
pub use builtin::{digits, shakespeare, shakespeare_tokens, CharText, Digits};
pub use chat::{chat, ChatOptions, Chats, TrainOn};
pub use chat_template::ChatTemplate;
pub use csv::{
    csv, csv_files, is_json, is_parquet, parse_csv, Column, Csv, CsvOptions, Files, Missing, Place,
    TableInput, TableRows, TextInput, TextOptions, TextRows,
};
pub use epoch::Epoch;
pub use files::{idx, text, Idx};
pub use image_files::{image_files, split_like, Listing, PassedOver};
pub use image_input::ImageInput;
pub use images::{images, images_of, Images};
pub use numpy::numpy;
pub use permutation::Permutation;
pub use pipeline::{Pipeline, Stats};
pub use samples::{samples, Samples, Targets};
pub use standardize::{Moments, SampleInput, Standardize};
pub use tokens::{tokens, TokenType, Tokens};
pub use vocab::Vocab;

use candle_core::Tensor;

use crate::Result;

/// A finite, indexable set of samples.
pub trait Source: Send + Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The split this source reads (`train`, `test`, ...), for metrics.
    fn split(&self) -> &str;
    /// One line for `__tostring` and logs.
    fn describe(&self) -> String;
    /// Inputs and targets for these samples, on the CPU, batch first.
    fn gather(&self, indices: &[usize]) -> Result<(Tensor, Tensor)>;
    /// The samples as `epoch` sees them: as [`Source::gather`], unless the
    /// source draws anew each epoch (an image folder's augmentation).
    fn gather_epoch(&self, indices: &[usize], _epoch: u64) -> Result<(Tensor, Tensor)> {
        self.gather(indices)
    }
    /// Text sources: their vocabulary, for encoding prompts and decoding output.
    fn vocab(&self) -> Option<&Vocab> {
        None
    }
    /// Class names, label 0 first, where the source knows them (an image
    /// folder's).
    fn classes(&self) -> Option<&[String]> {
        None
    }
    /// The class label of each of these samples, where the targets are one
    /// label per sample; None where they are not (a sequence's, a
    /// regression's). Reads the samples; an image folder answers from its
    /// file list.
    fn labels(&self, indices: &[usize]) -> Result<Option<Vec<u32>>> {
        let mut labels = Vec::with_capacity(indices.len());
        for chunk in indices.chunks(4096) {
            let (_, y) = self.gather(chunk)?;
            if y.dtype() != candle_core::DType::U32 || y.dims() != [chunk.len()] {
                return Ok(None);
            }
            labels.extend(y.to_vec1::<u32>()?);
        }
        Ok(Some(labels))
    }
    /// Each sample's length, for sources of sequences of many lengths (a
    /// chat file's conversations, in tokens); None where every sample is
    /// as long as the next. `data:shuffle{ group_by_length = true }`
    /// batches samples of like lengths by it.
    fn lengths(&self) -> Option<Vec<usize>> {
        None
    }
    /// How an image file becomes a sample, for an image folder.
    fn image_input(&self) -> Option<ImageInput> {
        None
    }
    /// How a table row becomes a sample, for a CSV file.
    fn table_input(&self) -> Option<TableInput> {
        None
    }
    /// How an array's sample becomes a sample, for a safetensors file or
    /// NumPy arrays.
    fn array_input(&self) -> Option<ArrayInput> {
        None
    }
}

/// A native per-batch transform in a pipeline (`data:map(plugin)`), run
/// where the batch is built (on the prefetch thread, with prefetch).
pub trait Transform: Send + Sync {
    fn apply(&self, batch: Batch, epoch: u64) -> crate::Result<Batch>;
    fn describe(&self) -> String;
}

/// One batch: inputs, targets and the sample indices they came from.
#[derive(Debug, Clone)]
pub struct Batch {
    pub x: Tensor,
    pub y: Tensor,
    pub indices: Vec<usize>,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.indices.len()
    }
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
    /// The rows `[start, start + len)` (a data-parallel rank's shard).
    pub fn rows(&self, start: usize, len: usize) -> candle_core::Result<Batch> {
        Ok(Batch {
            x: self.x.narrow(0, start, len)?,
            y: self.y.narrow(0, start, len)?,
            indices: self.indices[start..start + len].to_vec(),
        })
    }
}

/// Names as a person reads a list: the first eight, then a count.
pub fn name_list(classes: &[String]) -> String {
    let shown: Vec<String> = classes.iter().take(8).map(|c| format!("`{c}`")).collect();
    match classes.len() {
        n if n > 8 => format!("{}, and {} more", shown.join(", "), n - 8),
        _ => shown.join(", "),
    }
}

/// How the class names of `theirs` (a name, its classes) differ from those
/// of `ours`, label 0 first, for a person; `None` when they are the same.
/// Where they differ, a label means another class in each:
/// "val's classes (9) are not the run's (10): without `bag`; label 1 is
/// `coat` in val's and `bag` in the run's".
pub fn class_difference(ours: (&str, &[String]), theirs: (&str, &[String])) -> Option<String> {
    list_difference(("classes", "label"), ours, theirs)
}

/// How the model inputs of table data `theirs` (a name, its reading) differ
/// from those of `ours`, by name (`sex_female`), as [`class_difference`]
/// words it; `None` when they are the same, or when one file names its
/// columns and the other does not (the names cannot be compared then,
/// unless a column of categories is involved).
pub fn input_difference(ours: (&str, &TableInput), theirs: (&str, &TableInput)) -> Option<String> {
    let (o, t) = (ours.1, theirs.1);
    let categories = !o.categories.is_empty() || !t.categories.is_empty();
    if o.header != t.header && !categories {
        return None;
    }
    list_difference(
        ("inputs", "input"),
        (ours.0, &o.input_names()),
        (theirs.0, &t.input_names()),
    )
}

/// How the regression targets of table data `theirs` differ from those of
/// `ours`, as [`class_difference`] words it: the model's `k`th output is
/// the run's `k`th target. `None` when they are the same, when either has
/// none, or when one file names its columns and the other does not.
pub fn target_difference(ours: (&str, &TableInput), theirs: (&str, &TableInput)) -> Option<String> {
    let (o, t) = (ours.1, theirs.1);
    if o.targets.is_empty() || t.targets.is_empty() || o.header != t.header {
        return None;
    }
    let names = |i: &TableInput| i.targets.iter().map(Column::name).collect::<Vec<_>>();
    let words = match o.label_sep.is_some() || t.label_sep.is_some() {
        true => ("labels", "label"),
        false => ("targets", "target"),
    };
    list_difference(words, (ours.0, &names(o)), (theirs.0, &names(t)))
}

/// [`class_difference`] for a list of any `kind` (`classes`), whose
/// places are each an `item` (`label`).
fn list_difference(
    (kind, item): (&str, &str),
    ours: (&str, &[String]),
    theirs: (&str, &[String]),
) -> Option<String> {
    let ((on, o), (tn, t)) = (ours, theirs);
    if o == t {
        return None;
    }
    let missing: Vec<String> = o.iter().filter(|c| !t.contains(c)).cloned().collect();
    let extra: Vec<String> = t.iter().filter(|c| !o.contains(c)).cloned().collect();
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("without {}", name_list(&missing)));
    }
    if !extra.is_empty() {
        parts.push(format!("with {} besides", name_list(&extra)));
    }
    if parts.is_empty() {
        parts.push("the same names in another order".into());
    }
    let at = o
        .iter()
        .zip(t)
        .position(|(a, b)| a != b)
        .unwrap_or(o.len().min(t.len()));
    let label = match (o.get(at), t.get(at)) {
        (Some(a), Some(b)) => format!("{item} {at} is `{b}` in {tn} and `{a}` in {on}"),
        (Some(a), None) => format!("{tn} has no {item} {at} (`{a}` in {on})"),
        (None, Some(b)) => format!("{on} has no {item} {at} (`{b}` in {tn})"),
        (None, None) => unreachable!("equal lists return early"),
    };
    Some(format!(
        "{tn} {kind} ({}) are not {on} ({}): {}; {label}",
        t.len(),
        o.len(),
        parts.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn class_differences_name_what_is_missing_and_the_first_label_that_moves(
    ) -> serde_json::Result<()> {
        let run = names("ankle bag coat");
        assert_eq!(class_difference(("the run's", &run), ("val's", &run)), None);
        assert_eq!(
            class_difference(("the run's", &run), ("val's", &names("ankle coat"))).unwrap(),
            "val's classes (2) are not the run's (3): without `bag`; label 1 is `coat` in val's and `bag` in the run's"
        );
        assert_eq!(
            class_difference(("the run's", &run), ("val's", &names("ankle bag coat hat"))).unwrap(),
            "val's classes (4) are not the run's (3): with `hat` besides; the run's has no label 3 (`hat` in val's)"
        );
        assert_eq!(
            class_difference(("the run's", &run), ("val's", &names("bag ankle coat"))).unwrap(),
            "val's classes (3) are not the run's (3): the same names in another order; label 0 is `bag` in val's and `ankle` in the run's"
        );
        // Table inputs: by name, unless one file names its columns and the
        // other does not (and no column holds categories).
        let table = |columns: Vec<Column>, header, categories| TableInput {
            columns,
            header,
            delimiter: ",".into(),
            decimal: ".".into(),
            scale: 1.0,
            standardize: None,
            targets: Vec::new(),
            target_standardize: None,
            categories,
            text: None,
            label_column: None,
            label_sep: None,
            lists: None,
        };
        let named = table(
            vec![Column::Name("a".into()), Column::Name("b".into())],
            true,
            vec![],
        );
        let plain = table(vec![Column::Index(0), Column::Index(1)], false, vec![]);
        assert_eq!(
            input_difference(("the run's", &named), ("val's", &plain)),
            None
        );
        let cats = |k: &[&str]| vec![None, Some(k.iter().map(|c| c.to_string()).collect())];
        let ours = table(named.columns.clone(), true, cats(&["x", "y"]));
        let theirs = table(named.columns.clone(), true, cats(&["x", "z"]));
        assert_eq!(
            input_difference(("the run's", &ours), ("val's", &ours)),
            None
        );
        assert_eq!(
            input_difference(("the run's", &ours), ("val's", &theirs)).unwrap(),
            "val's inputs (3) are not the run's (3): without `b_y`, with `b_z` besides; input 2 is `b_z` in val's and `b_y` in the run's"
        );
        // Targets: by name, in order (output k is the kth target).
        let targets = |t: &[&str]| TableInput {
            targets: t.iter().map(|c| Column::Name(c.to_string())).collect(),
            ..named.clone()
        };
        let run = targets(&["mass", "flipper"]);
        assert_eq!(
            target_difference(("the run's", &run), ("val's", &run)),
            None
        );
        assert_eq!(
            target_difference(("the run's", &run), ("val's", &named)),
            None
        );
        assert_eq!(
            target_difference(("the run's", &run), ("val's", &targets(&["flipper", "mass"]))).unwrap(),
            "val's targets (2) are not the run's (2): the same names in another order; target 0 is `flipper` in val's and `mass` in the run's"
        );
        // Saved as one column for one target (as checkpoints before several
        // held it), as a list for several; both read back.
        let one = serde_json::to_value(targets(&["mass"]))?;
        assert_eq!(one["target"], "mass");
        assert_eq!(
            serde_json::from_value::<TableInput>(one)?,
            targets(&["mass"])
        );
        let two = serde_json::to_value(&run)?;
        assert_eq!(two["target"], serde_json::json!(["mass", "flipper"]));
        assert_eq!(serde_json::from_value::<TableInput>(two)?, run);
        assert!(serde_json::to_value(&named)?.get("target").is_none());
        let many: Vec<String> = (0..11).map(|i| format!("c{i}")).collect();
        assert_eq!(
            name_list(&many),
            "`c0`, `c1`, `c2`, `c3`, `c4`, `c5`, `c6`, `c7`, and 3 more"
        );
        Ok(())
    }
}
