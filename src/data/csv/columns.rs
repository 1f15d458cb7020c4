//! Where a CSV file's columns are, by index or header name, and which line
//! a record starts on, for messages.

use std::path::Path;

use super::categories::Coder;
use super::records::number;
use super::row::{Cell, Row};
use super::Column;
use crate::data::files::data_err;
use crate::data::name_list;
use crate::Result;

/// Where the columns are: the label's index, or the targets' (none when
/// only features are read), the features', and the names for messages
/// (empty without a header).
pub(super) struct Layout {
    pub(super) labels: Vec<usize>,
    /// What `labels` are: `label` or `target`.
    role: &'static str,
    pub(super) features: Vec<usize>,
    pub(super) names: Vec<String>,
    /// The numbers' decimal mark (set by `each_row`).
    pub(super) decimal: u8,
    /// The file's column count.
    pub(super) n: usize,
}

/// Where the `role` column `c` is among a file's `n` columns named `names`,
/// or the error that says it is not there.
fn locate(what: &Path, c: &Column, role: &str, n: usize, names: &[String]) -> Result<usize> {
    c.place(n, names).ok_or_else(|| {
        data_err(
            what,
            match c {
                Column::Index(i) => format!(
                    "{role} column {i} is outside the {n} columns (0 is the first, -1 the last)"
                ),
                Column::Name(name) => format!(
                    "{role} column `{name}` is not in the header, which names {}",
                    name_list(&super::vectors::shorten(names))
                ),
            },
        )
    })
}

impl Layout {
    /// The columns of a file of `n` columns (`names` from its header):
    /// `labels` are the `role` columns (`label` or `target`), `features`
    /// the feature columns (default: every other column).
    pub(super) fn resolve(
        what: &Path,
        (labels, role): (&[Column], &'static str),
        features: Option<&[Column]>,
        n: usize,
        names: Vec<String>,
    ) -> Result<Layout> {
        let find = |c: &Column, role: &str| locate(what, c, role, n, &names);
        let named = |at: usize| names.get(at).map(|s| format!(" (`{s}`)"));
        let mut label_at: Vec<usize> = Vec::with_capacity(labels.len());
        for c in labels {
            let at = find(c, role)?;
            if label_at.contains(&at) {
                return Err(data_err(
                    what,
                    format!(
                        "column {}{} is among the {role}s twice",
                        at + 1,
                        named(at).unwrap_or_default()
                    ),
                ));
            }
            label_at.push(at);
        }
        let features = match features {
            None => (0..n).filter(|c| !label_at.contains(c)).collect(),
            Some(cols) => {
                let mut out: Vec<usize> = Vec::with_capacity(cols.len());
                for c in cols {
                    let at = find(c, "feature")?;
                    if label_at.contains(&at) {
                        return Err(data_err(
                            what,
                            format!(
                                "column {}{} is {} {role}; it cannot be a feature too",
                                at + 1,
                                named(at).unwrap_or_default(),
                                if label_at.len() > 1 { "a" } else { "the" }
                            ),
                        ));
                    }
                    if out.contains(&at) {
                        return Err(data_err(
                            what,
                            format!(
                                "column {}{} is among the features twice",
                                at + 1,
                                named(at).unwrap_or_default()
                            ),
                        ));
                    }
                    out.push(at);
                }
                out
            }
        };
        if features.is_empty() {
            return Err(data_err(what, "there are no feature columns"));
        }
        Ok(Layout {
            labels: label_at,
            role,
            features,
            names,
            decimal: b'.',
            n,
        })
    }

    /// What the label columns are: `label` or `target`.
    pub(super) fn role(&self) -> &'static str {
        self.role
    }

    /// The place among the features of a column named as categorical.
    pub(super) fn feature_place(&self, what: &Path, c: &Column) -> Result<usize> {
        let at = locate(what, c, "categorical", self.n, &self.names)?;
        self.features.iter().position(|&f| f == at).ok_or_else(|| {
            data_err(
                what,
                format!(
                    "{} is categorical but not among the features{}",
                    self.column(at),
                    match self.labels.contains(&at) {
                        true if self.labels.len() > 1 => format!(" (it is a {})", self.role),
                        true => format!(" (it is the {})", self.role),
                        false => "; add it to `features`".into(),
                    }
                ),
            )
        })
    }

    /// Why `cell`, not a number with this file's decimal mark, would be one
    /// with the other (a European spreadsheet's `2,5`, or `2.5` read with
    /// `decimal = ","`): what to say after "is not a number".
    pub(super) fn decimal_comma(&self, cell: &str) -> Option<&'static str> {
        match self.decimal {
            b'.' if cell.contains(',') && number::<f32>(cell, b',').is_some() => Some(
                " with `.` as the decimal mark; it reads as one with a decimal comma: give `decimal = \",\"`",
            ),
            b',' if number::<f32>(cell, b'.').is_some() => Some(
                " with `,` as the decimal mark (`decimal = \",\"`); it reads as one with a `.`: leave `decimal` out",
            ),
            _ => None,
        }
    }

    /// "column 3" or "column 3 (`bill_length_mm`)": 1-based, as editors count.
    pub(super) fn column(&self, c: usize) -> String {
        match self.names.get(c) {
            Some(name) => format!("column {} (`{name}`)", c + 1),
            None => format!("column {}", c + 1),
        }
    }
}

impl Layout {
    /// The first used column whose cell is a missing value.
    pub(super) fn missing(&self, row: Row) -> Option<usize> {
        self.missing_in(row, true)
    }

    /// [`Layout::missing`], the label columns among those looked at only
    /// when `labels` (a column of label sets holds none for an empty cell).
    pub(super) fn missing_in(&self, row: Row, labels: bool) -> Option<usize> {
        let labels = if labels { &self.labels[..] } else { &[] };
        labels
            .iter()
            .chain(&self.features)
            .copied()
            .find(|&c| row.is_missing(c))
    }

    /// Whether a file of `n` columns named `names` (none without a header)
    /// has this layout's columns: the same names, in any order, or, without
    /// a header, as many.
    pub(super) fn has_columns(&self, n: usize, names: &[String]) -> bool {
        let sorted = |names: &[String]| {
            let mut names = names.to_vec();
            names.sort();
            names
        };
        self.n == n && sorted(&self.names) == sorted(names)
    }

    /// Whether `other` (another file's layout) has the same columns and
    /// reads the same ones as labels and features: by name, or, without a
    /// header, at the same places.
    pub(super) fn same_columns(&self, other: &Layout) -> bool {
        let picked = |l: &Layout| -> Vec<String> {
            l.labels
                .iter()
                .chain(&l.features)
                .map(|&c| l.names.get(c).cloned().unwrap_or_default())
                .collect()
        };
        self.has_columns(other.n, &other.names)
            && match self.names.is_empty() {
                true => (&self.labels, &self.features) == (&other.labels, &other.features),
                false => picked(self) == picked(other),
            }
    }

    /// The columns of a file of `n` named `names` for a message: the
    /// header's names, or how many.
    pub(super) fn describe(n: usize, names: &[String]) -> String {
        match names.is_empty() {
            true => format!("{n} columns"),
            false => {
                let names = super::vectors::shorten(names);
                let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
                names.join(", ")
            }
        }
    }

    /// Appends the record's features: numbers divided by `scale`, and for
    /// a column with a coder (`coders[p]` for the `p`th feature), its
    /// category's code. A cell that is not a finite number, or none of
    /// given categories, is an error naming it; with a `hint` (the file a
    /// run reads), one that is not a number says how a column of categories
    /// is read, `hint` after it.
    pub(super) fn features_into(
        &self,
        (what, line): (&Path, usize),
        row: Row,
        scale: f32,
        hint: Option<&str>,
        coders: &mut [Option<Coder>],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        for (&c, coder) in self.features.iter().zip(coders.iter_mut()) {
            let cell = match (row.cell(c), &coder) {
                (Cell::Number(Some(v)), None) if v.is_finite() => {
                    out.push(v / scale);
                    continue;
                }
                (Cell::Text(t), _) => std::borrow::Cow::Borrowed(t),
                _ => row.text(c),
            };
            if let Some(coder) = coder {
                let Some(code) = coder.code(&cell) else {
                    return Err(data_err(
                        what,
                        format!(
                            "line {line}, {}: `{cell}` is not one of the categories ({})",
                            self.column(c),
                            name_list(coder.names())
                        ),
                    ));
                };
                out.push(code as f32);
                continue;
            }
            let v: f32 = number(&cell, self.decimal).ok_or_else(|| {
                if super::list_cells::is_list(&cell) {
                    let shown: String = cell.chars().take(40).collect();
                    return data_err(
                        what,
                        format!(
                            "line {line}, {}: `{shown}...` is a list, read as a feature per number only from a file whose first row names the columns and whose next holds a list, with `.` as the decimal mark",
                            self.column(c)
                        ),
                    );
                }
                if let Some(comma) = self.decimal_comma(&cell) {
                    return data_err(
                        what,
                        format!(
                            "line {line}, {}: `{cell}` is not a number{comma}",
                            self.column(c)
                        ),
                    );
                }
                let how = hint.map(|hint| {
                    let categorical = match self.names.get(c) {
                        Some(name) => format!("`categorical = {{ {name:?} }}`"),
                        None => format!("`categorical = {{ {c} }}`"),
                    };
                    format!(" (a column of categories is one-hot encoded with {categorical}{hint})")
                });
                data_err(
                    what,
                    format!(
                        "line {line}, {}: `{cell}` is not a number{}",
                        self.column(c),
                        how.unwrap_or_default()
                    ),
                )
            })?;
            if !v.is_finite() {
                return Err(data_err(
                    what,
                    format!(
                        "line {line}, {}: `{cell}` is not a finite number",
                        self.column(c)
                    ),
                ));
            }
            out.push(v / scale);
        }
        Ok(())
    }

    /// The first categorical feature whose cell is none of its (given)
    /// categories: the column and the cell.
    pub(super) fn unknown_category<'r>(
        &self,
        row: Row<'r>,
        coders: &mut [Option<Coder>],
    ) -> Option<(usize, std::borrow::Cow<'r, str>)> {
        self.features
            .iter()
            .zip(coders.iter_mut())
            .find_map(|(&c, coder)| match coder.as_mut()?.code(&row.text(c)) {
                None => Some((c, row.text(c))),
                Some(_) => None,
            })
    }
}

pub(super) fn named(c: &Column) -> bool {
    matches!(c, Column::Name(_))
}

/// Line numbers of byte offsets, counted forward. The `csv` crate's own
/// line numbers lag after CRLF line ends, and a record's byte offset may be
/// that of the line end before it.
pub(super) struct Lines<'a> {
    text: &'a [u8],
    at: usize,
    line: usize,
}

impl<'a> Lines<'a> {
    pub(super) fn new(text: &'a [u8]) -> Self {
        Lines {
            text,
            at: 0,
            line: 1,
        }
    }

    pub(super) fn of(&mut self, byte: usize) -> usize {
        let mut to = byte.min(self.text.len());
        while to < self.text.len() && matches!(self.text[to], b'\r' | b'\n') {
            to += 1;
        }
        if to > self.at {
            self.line += self.text[self.at..to]
                .iter()
                .filter(|&&b| b == b'\n')
                .count();
            self.at = to;
        }
        self.line
    }
}
