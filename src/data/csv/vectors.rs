//! Columns of lists of numbers (an embedding a row, as a sentence
//! encoder's output saved by pandas or Hugging Face datasets) read as that
//! many columns of numbers: `embedding`, 384 numbers a row, becomes
//! `embedding[0]` ... `embedding[383]`, a feature each, as
//! `np.stack(df["embedding"])` makes them a matrix. A list column is read so
//! when every row's list holds numbers, as many as the others' (a null or
//! empty list is a missing value); the label column of a classifier stays a
//! column of label sets, and other list columns stay whole, with why, for
//! the error that names one read as a feature.

use super::records::{number, Records};
use super::row::{Lists, Slot};
use std::collections::HashSet;

/// Reads each list column of numbers of one length as that many columns,
/// except the column `keep` (a classifier's label sets): the names and
/// lengths change here, each such column's items are kept as numbers (its
/// cells dropped), and [`slots`] says where a row's columns are. A column
/// of lists kept whole has its items' text.
pub(super) fn expand(r: &mut Records, keep: Option<usize>) {
    let text_at = r.text_places();
    let mut kept = Vec::new();
    let lengths: Vec<Option<usize>> = (0..r.names.len())
        .map(|c| match r.lists[c] && Some(c) != keep {
            false => None,
            true => length(r, (c, text_at[c]))
                .map_err(|why| kept.push((c, why)))
                .ok(),
        })
        .collect();
    r.kept.extend(kept);
    settle_cells(r, &lengths, &text_at);
    if lengths.iter().all(Option::is_none) {
        r.lengths = lengths;
        return;
    }
    let (mut names, mut lists, mut at) = (Vec::new(), Vec::new(), vec![0; r.names.len()]);
    for (c, name) in r.names.iter().enumerate() {
        at[c] = names.len();
        match lengths[c] {
            None => {
                names.push(name.clone());
                lists.push(r.lists[c]);
            }
            Some(k) => {
                names.extend((0..k).map(|i| format!("{name}[{i}]")));
                lists.extend(std::iter::repeat_n(false, k));
                r.vectors.push((name.clone(), k));
            }
        }
    }
    for (c, _) in &mut r.kept {
        *c = at[*c];
    }
    r.names = names;
    r.lists = lists;
    r.lengths = lengths;
}

/// Where each of a row's columns is, as `r`'s columns are named (after
/// [`expand`]): a cell of its text, an item of a list read as a column a
/// number, or a number of a column kept as numbers.
pub(super) fn slots(r: &Records) -> Vec<Slot<'_>> {
    let mut slots = Vec::with_capacity(r.names.len());
    let text_at = r.text_places();
    for (c, numbers) in r.numbers.iter().enumerate() {
        match (r.lengths.get(c).copied().flatten(), numbers, text_at[c]) {
            (Some(k), Some(items), _) => slots.extend((0..k).map(|i| Slot::Item(items, i))),
            (None, Some(items), _) => slots.push(Slot::Item(items, 0)),
            (_, None, Some(at)) => slots.push(Slot::Text(at)),
            (_, None, None) => unreachable!("a column without numbers has text"),
        }
    }
    slots
}

/// The cells of `r` once each list column read as a column a number
/// (`lengths`) has its items as numbers: those columns' cells dropped (the
/// numbers hold them), and the other list columns' items as text again (a
/// column of numbers, a value a row, stays numbers). `text_at` is where
/// each column's cell was in a row's text before.
fn settle_cells(r: &mut Records, lengths: &[Option<usize>], text_at: &[Option<usize>]) {
    let mut texts: Vec<Option<Lists>> = vec![None; lengths.len()];
    for (c, numbers) in r.numbers.iter_mut().enumerate() {
        let flat = numbers.as_ref().is_some_and(|n| n.flat);
        if lengths[c].is_none() && !flat {
            texts[c] = numbers.take();
        }
    }
    let same = (0..lengths.len()).all(|c| text_at[c].is_some() == r.numbers[c].is_none());
    if same {
        return;
    }
    let mut cells = csv::StringRecord::new();
    for (i, row) in r.rows.iter_mut().enumerate() {
        cells.clear();
        for c in 0..lengths.len() {
            match (&r.numbers[c], &texts[c], text_at[c]) {
                (Some(_), _, _) => {}
                (None, Some(numbers), _) => cells.push_field(&numbers.text(i, &r.sep)),
                (None, None, Some(at)) => cells.push_field(&row[at]),
                (None, None, None) => unreachable!("a column without numbers had text"),
            }
        }
        std::mem::swap(row, &mut cells);
    }
}

/// The length of every list in column `c` when each holds numbers (an
/// empty item, a null, is a missing value), as many as the others', its
/// items then kept as numbers in `r.numbers[c]`; else why not, naming the
/// row. `at`: where its cell is in a row's text, when it has one.
fn length(r: &mut Records, (c, at): (usize, Option<usize>)) -> Result<usize, String> {
    if let (None, Some(at)) = (&r.numbers[c], at) {
        r.numbers[c] = Some(parsed(r, at)?);
    }
    let items = r.numbers[c].as_ref().expect("parsed");
    let unit = r.unit;
    let mut first: Option<(usize, usize)> = None;
    for (row, &at) in r.at.iter().enumerate() {
        let n = items.row(row).len();
        if n == 0 {
            continue;
        }
        match first {
            None => first = Some((n, at)),
            Some((k, a)) if k != n => {
                let items = if n == 1 { "item" } else { "items" };
                return Err(format!(
                    "{unit} {at}'s list holds {n} {items}, where {unit} {a}'s holds {k}"
                ));
            }
            Some(_) => {}
        }
    }
    first
        .map(|(k, _)| k)
        .ok_or_else(|| "every row's list is empty or null".into())
}

/// The lists of the column whose cell is at `c` in a row's text, their
/// items parsed (an empty item, a null: NaN); else why one is not a list
/// of numbers, naming the row.
fn parsed(r: &Records, c: usize) -> Result<Lists, String> {
    let mut out = Lists::default();
    for (row, &at) in r.rows.iter().zip(&r.at) {
        let cell = &row[c];
        if !cell.is_empty() {
            for item in cell.split(r.sep.as_str()) {
                let v = match item.is_empty() {
                    true => f32::NAN,
                    false => number::<f32>(item, b'.').ok_or_else(|| {
                        format!("{} {at}'s list holds `{item}`, not a number", r.unit)
                    })?,
                };
                out.values.push(v);
            }
        }
        out.ends.push(out.values.len());
    }
    Ok(out)
}

/// The lists read whole among `columns`: each list's name and length `k`
/// when its items `base[0]` ... `base[k - 1]` are all there, in order,
/// and, given the columns of the file the run read (`file`), they are all
/// of its columns named `base[i]` (a list column's items, or columns named
/// so). Without them (a checkpoint written before runs recorded their
/// lists), every run of `base[0]` ... `base[k - 1]` counts as a list.
pub(super) fn read_whole(
    columns: &[super::Column],
    file: Option<&[String]>,
) -> Vec<(String, usize)> {
    let item = |name: &str| -> Option<(String, usize)> {
        let (base, i) = name.strip_suffix(']')?.rsplit_once('[')?;
        Some((base.to_string(), i.parse().ok()?))
    };
    let mut bases: Vec<(String, Vec<usize>)> = Vec::new();
    for c in columns {
        let super::Column::Name(name) = c else {
            continue;
        };
        let Some((base, i)) = item(name) else {
            continue;
        };
        match bases.iter_mut().find(|(b, _)| *b == base) {
            Some((_, items)) => items.push(i),
            None => bases.push((base, vec![i])),
        }
    }
    let file = file.map(name_set);
    bases
        .into_iter()
        .filter(|(_, items)| items.iter().enumerate().all(|(at, &i)| at == i))
        .map(|(base, items)| (base, items.len()))
        .filter(|(base, k)| file.as_ref().is_none_or(|names| held(base, names) == *k))
        .collect()
}

fn name_set(names: &[String]) -> HashSet<&str> {
    names.iter().map(String::as_str).collect()
}

/// How many of `names` are `base[0]`, `base[1]` ..., in turn.
fn held(base: &str, names: &HashSet<&str>) -> usize {
    (0..)
        .take_while(|i| names.contains(format!("{base}[{i}]").as_str()))
        .count()
}

/// The first of `lists` (a run's lists read whole: name and length) whose
/// lists are of another length among the columns named `names`: its
/// name, the length the run read and the length held; a run's list of 8
/// numbers read from a file whose lists hold 6, or 10 (whose first 8
/// would be read).
pub(super) fn other_length(
    lists: &[(String, usize)],
    names: &[String],
) -> Option<(String, usize, usize)> {
    let names = name_set(names);
    lists.iter().find_map(|(base, k)| {
        let held = held(base, &names);
        (held > 0 && held != *k).then(|| (base.clone(), *k, held))
    })
}

/// `names` for a message, each run of a list's columns (`embedding[0]` ...
/// `embedding[383]`) named once, as `embedding[0..384]`.
pub(super) fn shorten(names: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    let mut i = 0;
    while i < names.len() {
        let run = names[i].strip_suffix("[0]").map(|base| {
            let item = |k: usize| format!("{base}[{k}]");
            (
                base,
                (1..)
                    .take_while(|&k| names.get(i + k) == Some(&item(k)))
                    .count()
                    + 1,
            )
        });
        match run {
            Some((base, k)) if k > 1 => {
                out.push(format!("{base}[0..{k}]"));
                i += k;
            }
            _ => {
                out.push(names[i].clone());
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::row::Row;
    use super::*;

    fn records(names: &[&str], rows: &[&[&str]], lists: &[bool]) -> Records {
        let names = names.iter().map(|s| s.to_string()).collect();
        let rows = rows.iter().map(|r| csv::StringRecord::from(r.to_vec()));
        let at = (1..=rows.len()).collect();
        Records::new(names, (rows.collect(), lists.to_vec()), (at, "row"), "|")
    }

    #[test]
    fn a_list_of_numbers_a_row_becomes_a_column_each() {
        let mut r = records(
            &["x", "emb", "labels", "words", "y"],
            &[
                &["1", "0.5|-2|3e-3", "2|27", "a|b", "0"],
                &["2", "", "10", "c", "1"],
                &["3", "1||0", "", "d|e|f", "1"],
            ],
            &[false, true, true, true, false],
        );
        expand(&mut r, Some(2));
        assert_eq!(
            r.names,
            ["x", "emb[0]", "emb[1]", "emb[2]", "labels", "words", "y"]
        );
        assert_eq!(r.lists, [false, false, false, false, true, true, false]);
        assert_eq!(r.vectors, [("emb".to_string(), 3)]);
        assert_eq!(
            r.kept,
            [(5, "row 1's list holds `a`, not a number".to_string())]
        );
        let slots = slots(&r);
        let rows: Vec<Vec<String>> = (r.rows.iter().enumerate())
            .map(|(i, row)| {
                Row::laid(row, &slots, i)
                    .texts()
                    .map(|c| c.into())
                    .collect()
            })
            .collect();
        assert_eq!(
            rows,
            [
                ["1", "0.5", "-2", "0.003", "2|27", "a|b", "0"],
                ["2", "", "", "", "10", "c", "1"],
                ["3", "1", "NaN", "0", "", "d|e|f", "1"],
            ]
        );
        assert_eq!(
            shorten(&r.names),
            ["x", "emb[0..3]", "labels", "words", "y"]
        );
    }

    #[test]
    fn a_list_read_at_another_length_is_found() {
        let columns: Vec<super::super::Column> = (0..4)
            .map(|i| super::super::Column::Name(format!("e[{i}]")))
            .chain([super::super::Column::Name("x".into())])
            .collect();
        let names = |k: usize| -> Vec<String> {
            (0..k)
                .map(|i| format!("e[{i}]"))
                .chain(["x".into()])
                .collect()
        };
        let e4 = vec![("e".to_string(), 4)];
        assert_eq!(read_whole(&columns, None), e4);
        assert_eq!(other_length(&e4, &names(4)), None);
        assert_eq!(other_length(&e4, &names(3)), Some(("e".into(), 4, 3)));
        assert_eq!(other_length(&e4, &names(6)), Some(("e".into(), 4, 6)));
        assert_eq!(other_length(&e4, &["x".into()]), None);
        assert_eq!(read_whole(&columns, Some(&names(4))), e4);
        // The first 4 items of a list of 6, each named, are not a list
        // read whole: the file the run read says so...
        assert_eq!(read_whole(&columns, Some(&names(6))), []);
        // ...as a chosen few of a list's items say it of themselves.
        assert_eq!(read_whole(&columns[1..3], None), []);
    }

    #[test]
    fn lists_of_other_lengths_stay_whole_and_say_where() {
        let mut r = records(
            &["emb", "none"],
            &[&["1|2", ""], &["3|4", ""], &["5", ""]],
            &[true, true],
        );
        expand(&mut r, None);
        assert_eq!(r.names, ["emb", "none"]);
        assert!(r.vectors.is_empty());
        assert_eq!(
            r.kept,
            [
                (
                    0,
                    "row 3's list holds 1 item, where row 1's holds 2".to_string()
                ),
                (1, "every row's list is empty or null".to_string())
            ]
        );
        assert_eq!(shorten(&["a[0]".into(), "b".into()]), ["a[0]", "b"]);
    }
}
