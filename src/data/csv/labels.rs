//! A CSV file's label or target cells as what the samples are labelled
//! with: class ids (indices, or names sorted as scikit-learn's LabelEncoder
//! sorts them, or the recipe's classes) or finite target values.

use std::collections::BTreeSet;
use std::path::Path;

use super::columns::Layout;
use super::records::number;
use super::CsvOptions;
use crate::data::files::data_err;
use crate::data::name_list;
use crate::Result;

/// What a CSV file's samples are labelled with.
pub(super) enum Labels {
    Classes(Vec<u32>),
    /// A regression's target values, `k` per row.
    Values(Vec<f32>, usize),
}

impl Labels {
    pub(super) fn len(&self) -> usize {
        match self {
            Labels::Classes(v) => v.len(),
            Labels::Values(v, k) => v.len() / k,
        }
    }
}

/// The target cells (row after row, a cell per target column) as numbers,
/// or an error naming the first that is not a finite one.
pub(super) fn target_values(
    what: &Path,
    layout: &Layout,
    cells: &[String],
    lines: &[usize],
) -> Result<Vec<f32>> {
    let k = layout.labels.len();
    cells
        .iter()
        .enumerate()
        .map(|(i, cell)| match number::<f32>(cell, layout.decimal) {
            Some(v) if v.is_finite() => Ok(v),
            _ => Err(data_err(
                what,
                format!(
                    "line {}, {}: target `{cell}` is not a finite number{}",
                    lines[i / k],
                    layout.column(layout.labels[i % k]),
                    layout.decimal_comma(cell).unwrap_or_default()
                ),
            )),
        })
        .collect()
}

/// The label cells as class ids, and the class names where there are any.
pub(super) fn label_ids(
    what: &Path,
    layout: &Layout,
    cells: &[String],
    lines: &[usize],
    opts: &CsvOptions,
) -> Result<(Vec<u32>, Option<Vec<String>>)> {
    let label = layout.labels[0];
    let at = |k: usize| format!("line {}, {}", lines[k], layout.column(label));
    if let Some(classes) = &opts.classes {
        let ids = cells
            .iter()
            .enumerate()
            .map(|(k, cell)| {
                let index = cell.parse::<usize>().ok().filter(|&i| i < classes.len());
                match classes.iter().position(|c| c == cell).or(index) {
                    Some(id) => Ok(id as u32),
                    None => Err(data_err(
                        what,
                        format!(
                            "{}: label `{cell}` is not one of the classes ({})",
                            at(k),
                            name_list(classes)
                        ),
                    )),
                }
            })
            .collect::<Result<_>>()?;
        return Ok((ids, Some(classes.clone())));
    }
    if cells.iter().all(|c| c.parse::<f64>().is_ok()) {
        let ids = cells
            .iter()
            .enumerate()
            .map(|(k, cell)| match cell.parse::<f64>() {
                Ok(v) if v >= 0.0 && v.fract() == 0.0 && v < u32::MAX as f64 => Ok(v as u32),
                _ => Err(data_err(
                    what,
                    format!(
                        "{}: label `{cell}` is not a class index: labels are classes (to predict a number, give the column as `target` instead of `label`)",
                        at(k)
                    ),
                )),
            })
            .collect::<Result<_>>()?;
        return Ok((ids, None));
    }
    // Class names: sorted, as scikit-learn's LabelEncoder orders them.
    let names: Vec<String> = cells
        .iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .cloned()
        .collect();
    let ids = cells
        .iter()
        .map(|c| names.binary_search(c).expect("a name of the set") as u32)
        .collect();
    Ok((ids, Some(names)))
}
