//! A table read from several files: `path` as a pattern
//! (`"train-*.parquet"`, as a Hugging Face dataset's shards are named) or a
//! list of files, read in order as one table, as `pd.concat` of each file
//! gives it. The Palmer penguins cut by pandas into three consecutive parts
//! (the first all Adelie, so no part alone has every class) train to the
//! bit as the whole file does; a part whose columns come in another order
//! is read in the first's; a row's messages name its own file.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Result};
use taper::data::{Column, CsvOptions, Missing, Source};

/// The penguins CSV, and `dir` holding it in three parts as CSV, Parquet
/// and JSON Lines files.
fn shards(dir: &Path) -> Result<PathBuf> {
    let csv = common::fetched("data/penguins/penguins.csv")?;
    let said = common::interop_check(
        "pandas, pyarrow",
        &["shards", csv.to_str().unwrap(), dir.to_str().unwrap(), "3"],
    )?;
    ensure!(
        said["species"][0] == serde_json::json!(["Adelie"]),
        "{said}"
    );
    Ok(csv)
}

fn lua_string(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}

/// A pattern of Parquet shards (taper.data.parquet) and a list of CSV
/// parts (taper.data.csv) train as the whole CSV file does, to the bit:
/// the classes are the parts' together, the rows in the files' order; the
/// rows left out are counted over every file, the first named by its file.
#[test]
fn penguins_in_parts_train_as_the_whole_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let csv = shards(dir.path())?;
    let whole = common::penguins_recipe_of("csv", &lua_string(&csv));
    let (want, _, _) = common::train_recipe(dir.path(), "whole", &whole)?;
    let pattern = dir.path().join("train-*-of-00003.parquet");
    let parts: Vec<String> = (0..3)
        .map(|k| lua_string(&dir.path().join(format!("part-{k}.csv"))))
        .collect();
    let cases = [
        (
            "parquet",
            lua_string(&pattern),
            "-of-00003.parquet (3 files)",
            "train-00000-of-00003.parquet, row 4",
        ),
        (
            "csv",
            format!("{{ {} }}", parts.join(", ")),
            "part-0.csv and 2 more files",
            "part-0.csv, line 5",
        ),
    ];
    for (data, path, table, first) in cases {
        let recipe = common::penguins_recipe_of(data, &path);
        let (got, said, _) = common::train_recipe(dir.path(), data, &recipe)?;
        for k in ["loss", "accuracy", "samples", "confusion"] {
            ensure!(
                got[k] == want[k],
                "{data}: {k}: {got} vs the whole file's {want}"
            );
        }
        ensure!(
            said.contains(&format!(
                "{table}: 2 of 344 rows have a missing value and are left out"
            )) && said.contains(&format!("{first})")),
            "{data}: {said}"
        );
    }
    Ok(())
}

/// JSON Lines parts, every other one with its keys in reverse order, read
/// through a pattern: the same samples and inputs as the whole CSV file's,
/// the columns in the first part's order, and columns given by index are
/// those of the first part.
#[test]
fn parts_with_their_columns_in_another_order_read_as_the_whole_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let csv = shards(dir.path())?;
    let opts = CsvOptions {
        label: Column::Name("species".into()),
        categorical: vec![
            (Column::Name("island".into()), None),
            (Column::Name("sex".into()), None),
        ],
        missing: Missing::Drop,
        ..CsvOptions::default()
    };
    let whole = taper::data::csv(&csv, &opts)?;
    let pattern = dir.path().join("part-*.jsonl");
    let paths: Vec<PathBuf> = (0..3)
        .map(|k| dir.path().join(format!("part-{k}.jsonl")))
        .collect();
    let parts = taper::data::csv_files(&pattern, &paths, &opts)?;
    ensure!(
        parts.len() == whole.len() && parts.len() == 333,
        "{}",
        parts.len()
    );
    let (a, b) = (whole.table_input().unwrap(), parts.table_input().unwrap());
    ensure!(
        a.columns == b.columns && a.categories == b.categories,
        "{a:?} vs {b:?}"
    );
    ensure!(parts.classes() == whole.classes(), "{:?}", parts.classes());
    let all: Vec<usize> = (0..whole.len()).collect();
    let ((xa, ya), (xb, yb)) = (whole.gather(&all)?, parts.gather(&all)?);
    ensure!(
        xa.to_vec2::<f32>()? == xb.to_vec2::<f32>()?,
        "the inputs differ"
    );
    ensure!(
        ya.to_vec1::<u32>()? == yb.to_vec1::<u32>()?,
        "the labels differ"
    );
    // Columns given by index are the first part's: `species` is column 0
    // there and the last in the reversed parts.
    let by_index = CsvOptions {
        label: Column::Index(0),
        categorical: vec![(Column::Index(1), None), (Column::Index(6), None)],
        ..opts
    };
    let indexed = taper::data::csv_files(&pattern, &paths, &by_index)?;
    ensure!(
        indexed.table_input() == parts.table_input(),
        "{:?}",
        indexed.table_input()
    );
    let (xc, yc) = indexed.gather(&all)?;
    ensure!(
        xc.to_vec2::<f32>()? == xb.to_vec2::<f32>()?
            && yc.to_vec1::<u32>()? == yb.to_vec1::<u32>()?,
        "by index, the samples differ"
    );
    Ok(())
}

/// Files whose columns differ, files of two kinds, a pattern that matches
/// nothing, a file named twice, an empty list and a `path` of another type
/// are refused, each naming the file or the pattern; a row's error names
/// its own file.
#[test]
fn tables_of_files_that_cannot_be_one_say_which_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = |name: &str, text: &str| -> Result<String> {
        let p = dir.path().join(name);
        std::fs::write(&p, text)?;
        Ok(p.display().to_string())
    };
    let a = file("a.csv", "x,z,y\n1,2,0\n3,4,1\n")?;
    let b = file("b.csv", "x,w,y\n1,2,0\n")?;
    let c = file("c.csv", "x,z,y\n5,6,1\n7,oops,0\n")?;
    let j = file("j.jsonl", "{\"x\": 1, \"z\": 2, \"y\": 0}\n")?;
    let none = dir.path().join("nothing-*.csv").display().to_string();
    let cases = [
        (
            format!("{{ {a:?}, {b:?} }}"),
            format!("{b}: its columns (`x`, `w`, `y`) are not those of {a} (`x`, `z`, `y`): the files read as one table have the same columns"),
        ),
        (
            format!("{{ {a:?}, {j:?} }}"),
            format!("{j}: not a file of the kind of {a}"),
        ),
        (
            format!("{none:?}"),
            format!("`path` {none:?}: matches no file"),
        ),
        (
            format!("{{ {a:?}, {:?} }}", dir.path().join("?.csv").display().to_string()),
            format!("{a} is named twice in `path`: its rows would be read twice"),
        ),
        ("{}".into(), "`path`".into()),
        (
            "3".into(),
            "`path`: a file, a pattern (`data/train-*.parquet`) or a list of them".into(),
        ),
        (
            format!("{{ {a:?}, {c:?} }}"),
            format!("{c}: line 3, column 2 (`z`): `oops` is not a number"),
        ),
    ];
    for (i, (path, says)) in cases.iter().enumerate() {
        let lua = dir.path().join("bad.lua");
        std::fs::write(
            &lua,
            format!("local d = taper.data.csv{{ path = {path}, label = \"y\" }}\n"),
        )?;
        let o = Command::new(env!("CARGO_BIN_EXE_taper"))
            .args(["train", lua.to_str().unwrap(), "--out"])
            .arg(dir.path().join(format!("o{i}")))
            .output()?;
        let err = String::from_utf8_lossy(&o.stderr);
        ensure!(
            o.status.code() == Some(2) && err.contains("bad.lua:1:") && err.contains(says.as_str()),
            "case {i}: {err}"
        );
    }
    Ok(())
}
