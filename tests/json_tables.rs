//! `taper.data.json{...}`: JSON records as pandas' `to_json(orient="records")`
//! writes them and Hugging Face datasets' `to_json` keeps them (JSON Lines,
//! an object a line), or one JSON array of objects, read as the same table
//! a CSV file of the same data is: the Palmer penguins written by pandas
//! train to the bit as the CSV file does, and `taper classify` reads the
//! file's rows; a key of lists of label ids is a multi-label classifier's
//! label sets; a row missing a key has a missing value there.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Result};
use taper::data::{Column, CsvOptions, Missing, Source};

fn taper(args: &[&str]) -> Result<std::process::Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()?)
}

/// The penguins CSV as JSON records written by pandas: `layout` lines (JSON
/// Lines) or array; the file is named `name`.
fn penguins(dir: &Path, layout: &str, name: &str) -> Result<(PathBuf, PathBuf)> {
    let csv = common::fetched("data/penguins/penguins.csv")?;
    let out = dir.join(name);
    let said = common::interop_check(
        "pandas",
        &[
            "json-write",
            csv.to_str().unwrap(),
            out.to_str().unwrap(),
            layout,
        ],
    )?;
    ensure!(said["rows"] == 344, "{said}");
    Ok((csv, out))
}

/// `taper classify RUN FILE`'s answers, each without its `FILE:N:`, and
/// the first line.
fn answers(run: &Path, file: &Path) -> Result<(Vec<String>, String)> {
    let o = taper(&["classify", run.to_str().unwrap(), file.to_str().unwrap()])?;
    ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let answers = out
        .lines()
        .map(|l| l.rsplit(':').next().unwrap_or_default().to_string())
        .collect();
    Ok((answers, out.lines().next().unwrap_or_default().to_string()))
}

/// JSON Lines (`.jsonl`, through taper.data.json) and a JSON array
/// (`.json`, through taper.data.csv, so that a recipe written for CSV files
/// takes one), their nulls the CSV's `NA`s: each trains as the CSV file
/// does, to the bit (its doubles become the f32s the CSV's numbers parse
/// to), says which rows it left out by their line (or place in the array),
/// and `taper classify` of the file answers as of the CSV file.
#[test]
fn penguins_from_json_train_as_from_the_csv_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (csv, _) = penguins(dir.path(), "lines", "penguins.jsonl")?;
    let (want, _, out) =
        common::train_recipe(dir.path(), "csv", &common::penguins_recipe("csv", &csv))?;
    eprintln!("csv: {want}");
    let (by_csv, _) = answers(&out, &csv)?;
    for (layout, name, data, unit) in [
        ("lines", "penguins.jsonl", "json", "line"),
        ("array", "penguins.json", "csv", "record"),
    ] {
        let (_, json) = penguins(dir.path(), layout, name)?;
        let (got, said, _) =
            common::train_recipe(dir.path(), layout, &common::penguins_recipe(data, &json))?;
        for k in ["loss", "accuracy", "samples", "confusion"] {
            ensure!(
                got[k] == want[k],
                "{layout}: {k}: {got} vs the CSV's {want}"
            );
        }
        // The fourth bird has no measurements (the CSV's line 5).
        ensure!(
            said.contains("2 of 344 rows have a missing value and are left out")
                && said.contains(&format!("(the first on {unit} 4)")),
            "{layout}: {said}"
        );
        let (by_json, first) = answers(&out, &json)?;
        ensure!(by_json == by_csv, "{layout}: classify's answers differ");
        ensure!(
            first.starts_with(&format!("{}:1:", json.display())),
            "{layout}: rows are numbered from 1: {first}"
        );
    }
    Ok(())
}

/// A key of lists of label ids (`"labels": [2, 27]`, GoEmotions' layout)
/// is read as label sets, the labels sorted by value; a row without a key
/// has a missing value there (pandas' `read_json` gives NaN), and keys come
/// as columns in the order they first appear.
#[test]
fn json_lists_are_label_sets_and_absent_keys_missing_values() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("lists.jsonl");
    common::interop_check("pandas", &["json-lists", path.to_str().unwrap()])?;
    common::lists_read_as_label_sets(&path)?;

    let sparse = dir.path().join("sparse.jsonl");
    std::fs::write(
        &sparse,
        "{\"a\": 1.5, \"label\": \"x\"}\n\n{\"label\": \"y\", \"b\": true, \"a\": 2}\n{\"a\": 3, \"b\": false, \"label\": \"x\"}\n",
    )?;
    let opts = CsvOptions {
        label: Column::Name("label".into()),
        missing: Missing::Drop,
        ..CsvOptions::default()
    };
    let table = taper::data::csv(&sparse, &opts)?;
    let dropped: Vec<usize> = table.dropped().iter().map(|p| p.line()).collect();
    ensure!(dropped == [1], "the first row lacks `b`: {dropped:?}");
    let input = table.table_input().unwrap();
    let columns: Vec<String> = input.columns.iter().map(Column::name).collect();
    ensure!(columns == ["a", "b"], "{columns:?}");
    let (x, _) = table.gather(&[0, 1])?;
    ensure!(x.to_vec2::<f32>()? == [[2.0, 1.0], [3.0, 0.0]], "{x}");
    Ok(())
}

/// A CSV file through taper.data.json, CSV-only options, broken JSON, a
/// row that is not an object, a nested object, a key twice and a missing
/// value are refused, each naming the file and the line (or record).
#[test]
fn json_files_that_cannot_work_say_where_and_why() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (csv, jsonl) = penguins(dir.path(), "lines", "penguins.jsonl")?;
    let file = |name: &str, text: &str| -> Result<String> {
        let p = dir.path().join(name);
        std::fs::write(&p, text)?;
        Ok(p.display().to_string())
    };
    let broken = file(
        "broken.jsonl",
        "{\"a\": 1, \"y\": 0}\n{\"a\": 2, \"y\": 1\n",
    )?;
    let not_object = file("rows.jsonl", "{\"a\": 1, \"y\": 0}\n[2, 1]\n")?;
    let nested = file(
        "nested.json",
        "[{\"a\": 1, \"y\": 0}, {\"a\": {\"b\": 2}, \"y\": 1}]",
    )?;
    let twice = file("twice.jsonl", "{\"a\": 1, \"a\": 2, \"y\": 0}\n")?;
    // pandas' default `to_json()` (orient="columns"): a column an object.
    let columns = file(
        "columns.json",
        "{\"a\": {\"0\": 1, \"1\": 2}, \"y\": {\"0\": 0, \"1\": 1}}",
    )?;
    let jsonl = jsonl.display().to_string();
    let cases = [
        (
            format!("taper.data.json{{ path = {:?} }}", csv.display().to_string()),
            "not a `.jsonl`, `.ndjson` or `.json` file; read a CSV file with taper.data.csv".to_string(),
        ),
        (
            format!("taper.data.csv{{ path = {jsonl:?}, label = \"species\", header = true }}"),
            format!("{jsonl}: a JSON file's columns have names and types: it takes no `header`, `delimiter` or `decimal`"),
        ),
        (
            format!("taper.data.json{{ path = {broken:?}, label = \"y\" }}"),
            format!("{broken}: line 2, column 15: EOF while parsing an object"),
        ),
        (
            format!("taper.data.json{{ path = {not_object:?}, label = \"y\" }}"),
            format!("{not_object}: line 2: invalid type: sequence, expected an object"),
        ),
        (
            format!("taper.data.json{{ path = {nested:?}, label = \"y\" }}"),
            format!("{nested}: record 2, `a`: an object; taper reads numbers, strings, booleans and lists of them"),
        ),
        (
            format!("taper.data.json{{ path = {twice:?}, label = \"y\" }}"),
            format!("{twice}: line 1, `a`: the key comes twice in one object"),
        ),
        (
            format!("taper.data.json{{ path = {columns:?}, label = \"y\" }}"),
            "(pandas: `to_json(orient=\"records\", lines=True)`)".into(),
        ),
        (
            format!("taper.data.json{{ path = {jsonl:?}, label = \"species\", features = {{ \"bill_length_mm\" }} }}"),
            format!("{jsonl}: line 4, column 3 (`bill_length_mm`): a missing value"),
        ),
    ];
    for (i, (expr, says)) in cases.iter().enumerate() {
        let lua = dir.path().join("bad.lua");
        std::fs::write(&lua, format!("local d = {expr}\n"))?;
        let o = taper(&[
            "train",
            lua.to_str().unwrap(),
            "--out",
            dir.path().join(format!("o{i}")).to_str().unwrap(),
        ])?;
        let err = String::from_utf8_lossy(&o.stderr);
        ensure!(
            o.status.code() == Some(2) && err.contains("bad.lua:1:") && err.contains(says.as_str()),
            "case {i}: {err}"
        );
    }
    Ok(())
}
