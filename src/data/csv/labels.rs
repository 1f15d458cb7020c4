//! A CSV file's label or target cells as what the samples are labelled
//! with: class ids (indices, or names sorted as scikit-learn's LabelEncoder
//! sorts them, or the recipe's classes) or finite target values.

use super::columns::Layout;
use super::records::{number, Files, Place};
use super::{CsvOptions, MISSING};
use crate::data::files::data_err;
use crate::data::name_list;
use crate::Result;
use std::collections::{BTreeSet, HashMap};

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
    (files, places): (&Files, &[Place]),
    layout: &Layout,
    cells: &[String],
) -> Result<Vec<f32>> {
    let k = layout.labels.len();
    cells
        .iter()
        .enumerate()
        .map(|(i, cell)| match number::<f32>(cell, layout.decimal) {
            Some(v) if v.is_finite() => Ok(v),
            _ => Err(files.error(places[i / k], |row| {
                format!(
                    "{row}, {}: target `{cell}` is not a finite number{}",
                    layout.column(layout.labels[i % k]),
                    layout.decimal_comma(cell).unwrap_or_default()
                )
            })),
        })
        .collect()
}

/// A column of label sets (`gentoo|female`) as a multi-label classifier's
/// targets: row after row, a 0 or 1 for each label, and the labels' names.
/// A cell is split at `sep` (as pandas' `str.get_dummies(sep)` splits it;
/// spaces around a label are dropped, and so are empty pieces); an empty or
/// missing cell is a sample with no label. The labels are `classes`, in
/// their order (a label the cell names outside them is an error naming its
/// line), or else every label the file holds, sorted (numbers by value, as
/// scikit-learn's `MultiLabelBinarizer` sorts them).
pub(super) fn label_sets(
    (files, places): (&Files, &[Place]),
    layout: &Layout,
    cells: &[String],
    (sep, classes): (&str, Option<&[String]>),
) -> Result<(Vec<f32>, Vec<String>)> {
    let sets: Vec<Vec<&str>> = cells
        .iter()
        .map(|cell| match MISSING.contains(&cell.as_str()) {
            true => Vec::new(),
            false => cell
                .split(sep)
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect(),
        })
        .collect();
    let names: Vec<String> = match classes {
        Some(c) => c.to_vec(),
        None => {
            let all: BTreeSet<&str> = sets.iter().flatten().copied().collect();
            let mut names: Vec<String> = all.into_iter().map(str::to_string).collect();
            // Numbers by value (`2` before `10`), as the columns of
            // categories are sorted.
            let values: Option<Vec<f64>> = names.iter().map(|n| n.parse().ok()).collect();
            if let Some(v) = values {
                let mut order: Vec<usize> = (0..names.len()).collect();
                order.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
                names = order.iter().map(|&k| names[k].clone()).collect();
            }
            names
        }
    };
    if names.is_empty() {
        return Err(data_err(
            files.given(),
            format!(
                "{}: no row has a label (each cell a set of labels split at {sep:?})",
                layout.column(layout.labels[0])
            ),
        ));
    }
    let k = names.len();
    let index: HashMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let mut values = vec![0f32; sets.len() * k];
    for (row, set) in sets.iter().enumerate() {
        for label in set {
            let Some(&at) = index.get(label) else {
                return Err(files.error(places[row], |row| {
                    format!(
                        "{row}, {}: label `{label}` is not one of the classes ({})",
                        layout.column(layout.labels[0]),
                        name_list(&names)
                    )
                }));
            };
            values[row * k + at] = 1.0;
        }
    }
    Ok((values, names))
}

/// The label cells as class ids, and the class names where there are any.
pub(super) fn label_ids(
    (files, places): (&Files, &[Place]),
    layout: &Layout,
    cells: &[String],
    opts: &CsvOptions,
) -> Result<(Vec<u32>, Option<Vec<String>>)> {
    let label = layout.labels[0];
    let error = |k: usize, say: &dyn Fn(&str) -> String| {
        files.error(places[k], |row| {
            say(&format!("{row}, {}", layout.column(label)))
        })
    };
    if let Some(classes) = &opts.classes {
        let ids = cells
            .iter()
            .enumerate()
            .map(|(k, cell)| {
                let index = cell.parse::<usize>().ok().filter(|&i| i < classes.len());
                match classes.iter().position(|c| c == cell).or(index) {
                    Some(id) => Ok(id as u32),
                    None => Err(error(k, &|at| {
                        format!(
                            "{at}: label `{cell}` is not one of the classes ({})",
                            name_list(classes)
                        )
                    })),
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
                _ => Err(error(k, &|at| {
                    format!(
                        "{at}: label `{cell}` is not a class index: labels are classes (to predict a number, give the column as `target` instead of `label`)"
                    )
                })),
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
