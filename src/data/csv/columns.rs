//! Where a CSV file's columns are, by index or header name, and which line
//! a record starts on, for messages.

use std::path::Path;

use csv::StringRecord;

use super::{Column, MISSING};
use crate::data::files::data_err;
use crate::data::name_list;
use crate::Result;

/// Where the columns are: the label's index (none when only features are
/// read), the features', and the names for messages (empty without a
/// header).
pub(super) struct Layout {
    pub(super) label: Option<usize>,
    pub(super) features: Vec<usize>,
    pub(super) names: Vec<String>,
}

impl Layout {
    pub(super) fn resolve(
        what: &Path,
        label: Option<(&Column, &str)>,
        features: Option<&[Column]>,
        n: usize,
        names: Vec<String>,
    ) -> Result<Layout> {
        let find = |c: &Column, role: &str| -> Result<usize> {
            match c {
                Column::Index(i) => {
                    let at = if *i < 0 { n as i64 + i } else { *i };
                    match usize::try_from(at) {
                        Ok(at) if at < n => Ok(at),
                        _ => Err(data_err(
                            what,
                            format!("{role} column {i} is outside the {n} columns (0 is the first, -1 the last)"),
                        )),
                    }
                }
                Column::Name(name) => names.iter().position(|h| h == name).ok_or_else(|| {
                    data_err(
                        what,
                        format!(
                            "{role} column `{name}` is not in the header, which names {}",
                            name_list(&names)
                        ),
                    )
                }),
            }
        };
        let role = label.map_or("label", |(_, role)| role);
        let label = label.map(|(l, role)| find(l, role)).transpose()?;
        let features = match features {
            None => (0..n).filter(|&c| Some(c) != label).collect(),
            Some(cols) => {
                let mut out: Vec<usize> = Vec::with_capacity(cols.len());
                for c in cols {
                    let at = find(c, "feature")?;
                    let named = |at: usize| names.get(at).map(|s| format!(" (`{s}`)"));
                    if Some(at) == label {
                        return Err(data_err(
                            what,
                            format!(
                                "column {}{} is the {role}; it cannot be a feature too",
                                at + 1,
                                named(at).unwrap_or_default()
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
            label,
            features,
            names,
        })
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
    pub(super) fn missing(&self, record: &StringRecord) -> Option<usize> {
        self.label
            .into_iter()
            .chain(self.features.iter().copied())
            .find(|&c| MISSING.contains(&&record[c]))
    }

    /// Appends the record's features, divided by `scale`; a cell that is
    /// not a finite number is an error naming it (with `hint` after it).
    pub(super) fn features_into(
        &self,
        (what, line): (&Path, usize),
        record: &StringRecord,
        scale: f32,
        hint: &str,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        for &c in &self.features {
            let cell = &record[c];
            let v: f32 = cell.parse().map_err(|_| {
                data_err(
                    what,
                    format!(
                        "line {line}, {}: `{cell}` is not a number{hint}",
                        self.column(c)
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
