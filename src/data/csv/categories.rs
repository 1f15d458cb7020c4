//! Columns of categories (`categorical = { "sex" }`), one-hot encoded in
//! place as scikit-learn's `OneHotEncoder` and pandas' `get_dummies` do: a
//! column per category, 1 for the row's and 0 for the others. Categories
//! found in a file are sorted (as numbers when each is one, else as text);
//! given ones keep their order, and a cell that is none of them is an error.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use super::columns::Layout;
use super::Column;
use crate::data::files::data_err;
use crate::Result;

/// A column's categories, and the code of each cell read so far.
pub(super) struct Coder {
    names: Vec<String>,
    index: HashMap<String, u32>,
    /// Given categories: a cell outside them is not one.
    fixed: bool,
}

impl Coder {
    /// Categories to be found in the file.
    pub(super) fn found() -> Coder {
        Coder {
            names: Vec::new(),
            index: HashMap::new(),
            fixed: false,
        }
    }

    /// These categories, in this order.
    pub(super) fn given(names: &[String]) -> Coder {
        Coder {
            index: names
                .iter()
                .enumerate()
                .map(|(k, n)| (n.clone(), k as u32))
                .collect(),
            names: names.to_vec(),
            fixed: true,
        }
    }

    /// A cell's code: its category's place among those seen so far (found
    /// categories) or given; `None` for a cell outside given categories.
    pub(super) fn code(&mut self, cell: &str) -> Option<u32> {
        if let Some(&k) = self.index.get(cell) {
            return Some(k);
        }
        if self.fixed {
            return None;
        }
        let k = self.names.len() as u32;
        self.names.push(cell.to_string());
        self.index.insert(cell.to_string(), k);
        Some(k)
    }

    pub(super) fn names(&self) -> &[String] {
        &self.names
    }

    /// Puts found categories in order (numbers by value, else text), and
    /// returns each earlier code's place in it.
    pub(super) fn settle(&mut self) -> Vec<u32> {
        let mut order: Vec<usize> = (0..self.names.len()).collect();
        if !self.fixed {
            let numbers: Option<Vec<f64>> =
                self.names.iter().map(|n| n.parse::<f64>().ok()).collect();
            match numbers {
                Some(v) => order.sort_by(|&a, &b| v[a].total_cmp(&v[b])),
                None => order.sort_by(|&a, &b| self.names[a].cmp(&self.names[b])),
            }
        }
        let mut place = vec![0u32; order.len()];
        for (to, &from) in order.iter().enumerate() {
            place[from] = to as u32;
        }
        self.names = order.iter().map(|&k| self.names[k].clone()).collect();
        for (name, k) in self.index.iter_mut() {
            *k = place[*k as usize];
            debug_assert_eq!(&self.names[*k as usize], name);
        }
        place
    }
}

/// Rows of `kinds.len()` values each, where a categorical column holds a
/// code, as the model's inputs: each code becomes a one-hot run of its
/// column's categories. `kinds[p]` is `None` for a number, or the
/// categories' count and each code's place among them.
pub(super) fn one_hot(values: &[f32], kinds: &[Option<(usize, &[u32])>]) -> Vec<f32> {
    let width: usize = kinds.iter().map(|k| k.map_or(1, |(n, _)| n)).sum();
    let rows = values.len() / kinds.len().max(1);
    let mut out = Vec::with_capacity(rows * width);
    for row in values.chunks(kinds.len().max(1)) {
        for (&v, kind) in row.iter().zip(kinds) {
            match kind {
                None => out.push(v),
                Some((n, place)) => {
                    let at = out.len();
                    out.resize(at + n, 0.0);
                    out[at + place[v as usize] as usize] = 1.0;
                }
            }
        }
    }
    out
}

/// The coders of the categorical columns, by their place among the
/// features (none for a number).
pub(super) fn categorical_coders(
    what: &Path,
    layout: &Layout,
    categorical: &[(Column, Option<Vec<String>>)],
) -> Result<Vec<Option<Coder>>> {
    let mut coders: Vec<Option<Coder>> = layout.features.iter().map(|_| None).collect();
    for (column, given) in categorical {
        let place = layout.feature_place(what, column)?;
        if coders[place].is_some() {
            return Err(data_err(
                what,
                format!(
                    "{} is named as categorical twice",
                    layout.column(layout.features[place])
                ),
            ));
        }
        coders[place] = Some(match given {
            Some(names) => {
                let mut seen = BTreeSet::new();
                if let Some(twice) = names.iter().find(|n| !seen.insert(*n)) {
                    return Err(data_err(
                        what,
                        format!(
                            "{}: category `{twice}` is given twice",
                            layout.column(layout.features[place])
                        ),
                    ));
                }
                if names.is_empty() {
                    return Err(data_err(
                        what,
                        format!(
                            "{}: no categories are given",
                            layout.column(layout.features[place])
                        ),
                    ));
                }
                Coder::given(names)
            }
            None => Coder::found(),
        });
    }
    Ok(coders)
}

/// Rows of feature values and category codes as the model's inputs: the
/// found categories put in order, and each code one-hot encoded.
pub(super) fn settle(values: Vec<f32>, coders: &mut [Option<Coder>]) -> Vec<f32> {
    if coders.iter().all(Option::is_none) {
        return values;
    }
    let places: Vec<Option<Vec<u32>>> = coders
        .iter_mut()
        .map(|c| c.as_mut().map(Coder::settle))
        .collect();
    let kinds: Vec<Option<(usize, &[u32])>> = places
        .iter()
        .map(|p| p.as_deref().map(|p| (p.len(), p)))
        .collect();
    one_hot(&values, &kinds)
}

/// Each feature's categories once settled (none for a number); empty when
/// no feature has any.
pub(super) fn settled_names(coders: &[Option<Coder>]) -> Vec<Option<Vec<String>>> {
    if coders.iter().all(Option::is_none) {
        return Vec::new();
    }
    coders
        .iter()
        .map(|c| c.as_ref().map(|c| c.names().to_vec()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn found_categories_are_sorted_as_numbers_when_each_is_one() {
        let mut c = Coder::found();
        let codes: Vec<u32> = ["10", "9", "10", "2.5"]
            .iter()
            .map(|s| c.code(s).unwrap())
            .collect();
        let place = c.settle();
        assert_eq!(c.names(), ["2.5", "9", "10"]);
        let settled: Vec<u32> = codes.iter().map(|&k| place[k as usize]).collect();
        assert_eq!(settled, [2, 1, 2, 0]);
        assert_eq!(c.code("9"), Some(1));

        let mut t = Coder::found();
        for s in ["male", "female", "10", "9"] {
            t.code(s);
        }
        t.settle();
        assert_eq!(t.names(), ["10", "9", "female", "male"]);
    }

    #[test]
    fn given_categories_keep_their_order_and_refuse_others() {
        let names = ["b", "a"].map(String::from);
        let mut c = Coder::given(&names);
        assert_eq!(
            (c.code("a"), c.code("b"), c.code("c")),
            (Some(1), Some(0), None)
        );
        assert_eq!(c.settle(), [0, 1]);
        assert_eq!(c.names(), names);
    }

    #[test]
    fn codes_become_one_hot_runs_in_place() {
        // Rows: (number, code of 3 categories, number).
        let values = [1.5, 2.0, -1.0, 0.5, 0.0, 7.0];
        let place = [1, 2, 0];
        let out = one_hot(&values, &[None, Some((3, &place)), None]);
        assert_eq!(
            out,
            [1.5, 1.0, 0.0, 0.0, -1.0, 0.5, 0.0, 1.0, 0.0, 7.0].map(|v: f64| v as f32)
        );
    }
}
