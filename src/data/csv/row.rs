//! A row as it is read: its cells as text, and the items of its lists of
//! numbers read as a column a number (an embedding's 384 features) kept as
//! the numbers they are, not written as text to be parsed back.

use std::borrow::Cow;

use csv::StringRecord;

use super::records::f32_text;
use super::MISSING;

/// A column's numbers as f32, row after row. Of a list column (`ends`):
/// row `r`'s items are `values[ends[r - 1]..ends[r]]` (none for a null or
/// empty list; a null item is NaN, a missing value). Of a column of
/// numbers (`flat`): row `r`'s is `values[r]`, none for the rows in
/// `nulls`.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Lists {
    pub values: Vec<f32>,
    pub ends: Vec<usize>,
    pub flat: bool,
    /// With `flat`: the rows that hold a null, in order.
    pub nulls: Vec<usize>,
}

impl Lists {
    /// A column of numbers, a value a row.
    pub(super) fn flat() -> Lists {
        Lists {
            flat: true,
            ..Lists::default()
        }
    }

    /// Row `r`'s items.
    pub(super) fn row(&self, r: usize) -> &[f32] {
        if self.flat {
            return match self.nulls.binary_search(&r) {
                Ok(_) => &[],
                Err(_) => std::slice::from_ref(&self.values[r]),
            };
        }
        let start = if r == 0 { 0 } else { self.ends[r - 1] };
        &self.values[start..self.ends[r]]
    }

    /// Appends `more`'s rows (of the same kind).
    pub(super) fn append(&mut self, more: Lists) {
        let rows = self.values.len();
        self.nulls.extend(more.nulls.iter().map(|r| r + rows));
        self.ends.extend(more.ends.iter().map(|e| e + rows));
        self.values.extend(more.values);
    }

    /// Row `r`'s list as its cell's text: its items joined by `sep` (a
    /// null item: empty), as a list's text is read.
    pub(super) fn text(&self, r: usize, sep: &str) -> String {
        let mut out = String::new();
        for (i, &v) in self.row(r).iter().enumerate() {
            if i > 0 {
                out.push_str(sep);
            }
            if !v.is_nan() {
                super::records::push_f32(&mut out, v);
            }
        }
        out
    }
}

/// Where a row's column is: a cell of its text, or item `i` of the list
/// column whose items are `lists`.
#[derive(Clone, Copy)]
pub(super) enum Slot<'a> {
    Text(usize),
    Item(&'a Lists, usize),
}

/// A cell: text, or a list's item (NaN: a missing value; None: the row's
/// list is null or empty, each of its items missing).
pub(super) enum Cell<'a> {
    Text(&'a str),
    Number(Option<f32>),
}

/// A row: its text cells, and with `slots`, where each of its columns is
/// (the file's row `r`).
#[derive(Clone, Copy)]
pub(super) struct Row<'a> {
    text: &'a StringRecord,
    slots: Option<(&'a [Slot<'a>], usize)>,
    /// Whether its cells are read without the whitespace around them (a
    /// CSV file's, as its reader leaves it).
    trim: bool,
}

impl<'a> Row<'a> {
    /// A row whose cells are all text, as they are (a Parquet or JSON
    /// file's without numbers kept).
    pub(super) fn plain(text: &'a StringRecord) -> Row<'a> {
        Row {
            text,
            slots: None,
            trim: false,
        }
    }

    /// A CSV file's row, each cell read without the whitespace around it,
    /// as `str::trim` leaves it (the CSV reader keeps it, since trimming
    /// every cell as it reads costs a copy of each record).
    pub(super) fn csv(text: &'a StringRecord) -> Row<'a> {
        Row {
            text,
            slots: None,
            trim: true,
        }
    }

    /// Row `r` of a file of records, its columns where `slots` says.
    pub(super) fn laid(text: &'a StringRecord, slots: &'a [Slot<'a>], r: usize) -> Row<'a> {
        Row {
            text,
            slots: Some((slots, r)),
            trim: false,
        }
    }

    /// The number of columns.
    pub(super) fn len(&self) -> usize {
        match self.slots {
            Some((slots, _)) => slots.len(),
            None => self.text.len(),
        }
    }

    /// Column `c`'s cell.
    pub(super) fn cell(&self, c: usize) -> Cell<'a> {
        match self.slots {
            None if self.trim => Cell::Text(trim(&self.text[c])),
            None => Cell::Text(&self.text[c]),
            Some((slots, r)) => match slots[c] {
                Slot::Text(at) => Cell::Text(&self.text[at]),
                Slot::Item(lists, i) => Cell::Number(lists.row(r).get(i).copied()),
            },
        }
    }

    /// Column `c`'s cell as text: a list's item as the shortest text that
    /// reads back as it (`NaN`; empty for a null or empty list).
    pub(super) fn text(&self, c: usize) -> Cow<'a, str> {
        match self.cell(c) {
            Cell::Text(t) => Cow::Borrowed(t),
            Cell::Number(None) => Cow::Borrowed(""),
            Cell::Number(Some(v)) => Cow::Owned(f32_text(v)),
        }
    }

    /// Whether column `c`'s cell is a missing value.
    pub(super) fn is_missing(&self, c: usize) -> bool {
        match self.cell(c) {
            Cell::Text(t) => MISSING.contains(&t),
            Cell::Number(v) => v.is_none_or(f32::is_nan),
        }
    }

    /// Every cell as text.
    pub(super) fn texts(&self) -> impl Iterator<Item = Cow<'a, str>> + '_ {
        (0..self.len()).map(|c| self.text(c))
    }
}

/// `cell` without the whitespace around it, as `str::trim` gives it; a
/// cell that starts and ends with a visible ASCII character (a number's)
/// as it is, without looking further.
fn trim(cell: &str) -> &str {
    let visible = |b: Option<&u8>| b.is_some_and(|&b| b > b' ' && b < 0x7f);
    match visible(cell.as_bytes().first()) && visible(cell.as_bytes().last()) {
        true => cell,
        false => cell.trim(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_csv_cell_is_trimmed_as_str_trim_trims_it() {
        for cell in [
            "1.5",
            " 1.5",
            "1.5\t",
            " a b ",
            "",
            " ",
            "\u{a0}x\u{a0}",
            "x\u{85}",
            "\u{3000}",
            "é",
            "~",
            "\u{7f}",
        ] {
            assert_eq!(trim(cell), cell.trim(), "{cell:?}");
        }
    }

    #[test]
    fn a_rows_list_items_are_its_columns() {
        let lists = Lists {
            values: vec![0.5, f32::NAN, 3.0, 1.25, -2.0],
            ends: vec![3, 3, 5],
            ..Lists::default()
        };
        assert_eq!(lists.text(0, "|"), "0.5||3");
        assert_eq!(lists.text(1, "|"), "");
        let text = StringRecord::from(vec!["a", "", "7"]);
        let slots = [
            Slot::Text(0),
            Slot::Item(&lists, 0),
            Slot::Item(&lists, 1),
            Slot::Text(2),
        ];
        let row = Row::laid(&text, &slots, 0);
        assert_eq!(row.len(), 4);
        let texts: Vec<String> = row.texts().map(Cow::into_owned).collect();
        assert_eq!(texts, ["a", "0.5", "NaN", "7"]);
        assert_eq!(
            (0..4).map(|c| row.is_missing(c)).collect::<Vec<_>>(),
            [false, false, true, false]
        );
        let empty = Row::laid(&text, &slots, 1);
        assert!(empty.is_missing(1) && empty.is_missing(2));
        assert_eq!(empty.text(1), "");
        let last = Row::laid(&text, &slots, 2);
        assert!(matches!(last.cell(2), Cell::Number(Some(v)) if v == -2.0));
        let mut flat = Lists::flat();
        flat.append(Lists {
            values: vec![1.5, f32::NAN],
            nulls: vec![1],
            ..Lists::flat()
        });
        flat.append(Lists {
            values: vec![f32::NAN, 4.0],
            nulls: vec![0],
            ..Lists::flat()
        });
        assert_eq!(flat.nulls, [1, 2]);
        let rows: Vec<&[f32]> = (0..4).map(|r| flat.row(r)).collect();
        assert_eq!(rows, [&[1.5][..], &[], &[], &[4.0]]);
        let plain = Row::plain(&text);
        assert!(plain.is_missing(1) && !plain.is_missing(0));
        assert_eq!(plain.text(2), "7");
    }
}
