//! CSV cells that hold lists, as pandas' `to_csv` writes a column of them:
//! a NumPy array as its repr, `[ 0.12 -0.5  1.25]` (a long one wrapped over
//! lines in its quoted cell), a Python list as `[0.12, -0.5, 1.25]` or
//! `['rock', 'jazz']`. A file with a header whose first row holds such a
//! cell is read as records (see [`Records`]), each list's items joined: a
//! column of lists of numbers of one length is then a feature per number,
//! as from a Parquet file (see [`super::vectors`]), and a classifier's
//! label column of lists its label sets.

use std::path::Path;

use super::columns::Lines;
use super::records::{reader, Records, Shape};
use crate::data::files::data_err;
use crate::Result;

/// The records of the CSV text `text` of `path` when its first row holds a
/// list (and the file has a header and `.` as its decimal mark): the list
/// columns' items joined by `sep`, each row named by its line. None for a
/// file of plain cells.
pub(super) fn lists_of(
    path: &Path,
    text: &str,
    shape: Shape,
    sep: &str,
) -> Result<Option<Records>> {
    if !shape.header || shape.decimal != b'.' {
        return Ok(None);
    }
    let mut reader = reader(text, shape.delimiter, true);
    let mut lines = Lines::new(text.as_bytes());
    let (mut names, mut rows, mut at) = (None::<Vec<String>>, Vec::new(), Vec::new());
    for record in reader.records() {
        let record = record.map_err(|e| data_err(path, e))?;
        let line = lines.of(record.position().map_or(0, |p| p.byte() as usize));
        if record.len() == 1 && record[0].is_empty() {
            continue;
        }
        let Some(names) = &names else {
            names = Some(record.iter().map(str::to_string).collect());
            continue;
        };
        if rows.is_empty() && !record.iter().any(is_list) {
            return Ok(None);
        }
        if record.len() != names.len() {
            let (n, k) = (record.len(), names.len());
            return Err(data_err(
                path,
                format!("line {line}: {n} columns, expected {k}"),
            ));
        }
        rows.push(record);
        at.push(line);
    }
    let Some(names) = names else {
        return Ok(None);
    };
    let lists: Vec<bool> = (0..names.len())
        .map(|c| rows.iter().any(|r| is_list(&r[c])))
        .collect();
    for (row, &line) in rows.iter_mut().zip(&at) {
        let mut cells = csv::StringRecord::new();
        for (c, cell) in row.iter().enumerate() {
            match lists[c] && !cell.is_empty() {
                false => cells.push_field(cell),
                true => cells.push_field(&joined(cell, sep).map_err(|why| {
                    let column = format!("column {} (`{}`)", c + 1, names[c]);
                    data_err(path, format!("line {line}, {column}: {why}"))
                })?),
            }
        }
        *row = cells;
    }
    Ok(Some(Records::new(names, (rows, lists), (at, "line"), sep)))
}

/// Whether a cell is a list as pandas writes one: `[`, items, `]`.
pub(super) fn is_list(cell: &str) -> bool {
    cell.len() >= 2 && cell.starts_with('[') && cell.ends_with(']')
}

/// A list cell's items joined by `sep` (an empty list: an empty cell, a
/// missing value); else why it is not a list of numbers or labels.
fn joined(cell: &str, sep: &str) -> std::result::Result<String, String> {
    if !is_list(cell) {
        let shown: String = cell.chars().take(40).collect();
        return Err(format!(
            "`{shown}` is not a list, where other rows of the column hold lists"
        ));
    }
    let items = items(&cell[1..cell.len() - 1])?;
    if let Some(item) = items.iter().find(|i| i.contains(sep)) {
        return Err(format!(
            "the item `{item}` holds {sep:?}, which joins a list's items: give another `label_sep`"
        ));
    }
    Ok(items.join(sep))
}

/// The items of a list's text between its brackets: separated by commas
/// (a Python list) or spaces (a NumPy array's repr), a string quoted, a
/// NumPy scalar's repr (`np.float32(0.5)`) its number.
fn items(inner: &str) -> std::result::Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut rest = inner;
    loop {
        rest = rest.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        let Some(first) = rest.chars().next() else {
            return Ok(out);
        };
        let (item, after) = match first {
            '\'' | '"' => match rest[1..].find(first) {
                Some(end) => (&rest[1..1 + end], &rest[2 + end..]),
                None => return Err(format!("a string in the list, `{rest}`, is not closed")),
            },
            '[' => {
                return Err(
                    "a list of lists; taper reads a list of numbers or labels a cell".into(),
                )
            }
            _ => {
                let end = rest
                    .find(|c: char| c == ',' || c.is_whitespace())
                    .unwrap_or(rest.len());
                (scalar(&rest[..end]), &rest[end..])
            }
        };
        if item == "..." {
            return Err("NumPy wrote the array summarized, `...` in place of its middle items, which are not in the file: call `np.set_printoptions(threshold=sys.maxsize)` before `to_csv`, or write the table with `to_parquet`".into());
        }
        out.push(item);
        rest = after;
    }
}

/// A NumPy scalar's repr (`np.float32(0.5)`, as a Python list of NumPy
/// numbers is written) as its number; another item as it is.
fn scalar(item: &str) -> &str {
    item.strip_prefix("np.")
        .and_then(|s| s.split_once('('))
        .and_then(|(_, v)| v.strip_suffix(')'))
        .unwrap_or(item)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pandas_list_cells_read_as_their_items() {
        let j = |cell: &str| joined(cell, "|");
        assert_eq!(j("[ 0.5  -1.25e-03\n  2.   ]").unwrap(), "0.5|-1.25e-03|2.");
        assert_eq!(j("[0.5, -1.0, 3]").unwrap(), "0.5|-1.0|3");
        assert_eq!(j("['rock', \"it's\", 'a b']").unwrap(), "rock|it's|a b");
        assert_eq!(
            j("[np.float32(0.5), np.float64(-2.0)]").unwrap(),
            "0.5|-2.0"
        );
        assert_eq!(j("[]").unwrap(), "");
        assert!(j("[ 1.  2. ...  9.]").unwrap_err().contains("summarized"));
        assert!(j("[[1, 2], [3, 4]]").unwrap_err().contains("list of lists"));
        assert!(j("['a|b']").unwrap_err().contains("label_sep"));
        assert!(j("0.5").unwrap_err().contains("not a list"));
    }

    #[test]
    fn a_file_with_a_list_in_its_first_row_is_read_as_records() {
        let shape = Shape {
            header: true,
            delimiter: b',',
            decimal: b'.',
        };
        let text = "id,v,tags\n1,\"[ 1.5 -2.  ]\",\"['a', 'b']\"\n\n2,,[]\n";
        let r = lists_of(Path::new("t.csv"), text, shape, "|")
            .unwrap()
            .unwrap();
        assert_eq!(r.lists, [false, true, true]);
        assert_eq!(r.at, [2, 4]);
        assert_eq!(&r.rows[0], vec!["1", "1.5|-2.", "a|b"]);
        assert_eq!(&r.rows[1], vec!["2", "", ""]);
        let plain = "id,v\n1,2\n";
        assert!(lists_of(Path::new("p.csv"), plain, shape, "|")
            .unwrap()
            .is_none());
        let bad = "id,v\n1,[1 2]\n2,3\n";
        let e = match lists_of(Path::new("b.csv"), bad, shape, "|") {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a plain cell among lists read"),
        };
        assert!(
            e.contains("line 3, column 2 (`v`): `3` is not a list"),
            "{e}"
        );
    }
}
