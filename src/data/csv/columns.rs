//! Where a CSV file's columns are, by index or header name, and which line
//! a record starts on, for messages.

use std::path::Path;

use super::{Column, CsvOptions};
use crate::data::files::data_err;
use crate::data::name_list;
use crate::Result;

/// Where the columns are: the label's index, the features', and the names
/// for messages (empty without a header).
pub(super) struct Layout {
    pub(super) label: usize,
    pub(super) features: Vec<usize>,
    names: Vec<String>,
}

impl Layout {
    pub(super) fn resolve(
        what: &Path,
        opts: &CsvOptions,
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
        let label = find(&opts.label, "label")?;
        let features = match &opts.features {
            None => (0..n).filter(|&c| c != label).collect(),
            Some(cols) => {
                let mut out: Vec<usize> = Vec::with_capacity(cols.len());
                for c in cols {
                    let at = find(c, "feature")?;
                    let named = |at: usize| names.get(at).map(|s| format!(" (`{s}`)"));
                    if at == label {
                        return Err(data_err(
                            what,
                            format!(
                                "column {}{} is the label; it cannot be a feature too",
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
