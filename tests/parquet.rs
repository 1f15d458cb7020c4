//! `taper.data.parquet{...}`: Parquet files as pandas writes them (through
//! pyarrow) and Hugging Face datasets keep them, read as the same table a
//! CSV file of the same data is: the Palmer penguins written by pandas with
//! each of the usual codecs train to the bit as the CSV file does, and
//! `taper classify` reads the file's rows; a column of lists of label ids
//! is a multi-label classifier's label sets, and a column of embeddings a
//! feature per number.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Result};

fn taper(args: &[&str]) -> Result<std::process::Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()?)
}

/// The penguins CSV as Parquet, `compression` as pandas names it.
fn penguins(dir: &Path, compression: &str) -> Result<(PathBuf, PathBuf)> {
    let csv = common::fetched("data/penguins/penguins.csv")?;
    let out = dir.join(format!("penguins-{compression}.parquet"));
    let said = common::interop_check(
        "pandas, pyarrow",
        &[
            "parquet-write",
            csv.to_str().unwrap(),
            out.to_str().unwrap(),
            compression,
        ],
    )?;
    ensure!(said["rows"] == 344, "{said}");
    Ok((csv, out))
}

/// Trains `recipe` in `dir/name`: its last eval record, and the run folder.
fn run(dir: &Path, name: &str, recipe: &str) -> Result<(serde_json::Value, PathBuf)> {
    let lua = dir.join(format!("{name}.lua"));
    std::fs::write(&lua, recipe)?;
    let out = dir.join(name);
    let o = taper(&[
        "train",
        lua.to_str().unwrap(),
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ])?;
    ensure!(
        o.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let eval = common::records(&out, "eval").pop().expect("an eval record");
    Ok((eval, out))
}

/// Snappy (pandas' default), zstd, gzip and lz4 files, their nulls the
/// CSV's `NA`s: each trains as the CSV file does, to the bit (its doubles
/// become the f32s the CSV's numbers parse to), and `taper classify` of the
/// Parquet file answers as of the CSV file.
#[test]
fn penguins_from_parquet_train_as_from_the_csv_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (csv, _) = penguins(dir.path(), "snappy")?;
    let (want, out) = run(dir.path(), "csv", &common::penguins_recipe("csv", &csv))?;
    eprintln!("csv: {want}");
    let by_csv = taper(&["classify", out.to_str().unwrap(), csv.to_str().unwrap()])?;
    ensure!(
        by_csv.status.success(),
        "{}",
        String::from_utf8_lossy(&by_csv.stderr)
    );
    for compression in ["snappy", "zstd", "gzip", "lz4"] {
        let (_, parquet) = penguins(dir.path(), compression)?;
        // taper.data.csv reads a Parquet file too, so that a recipe written
        // for CSV files takes one.
        let data = if compression == "gzip" {
            "csv"
        } else {
            "parquet"
        };
        let (got, _) = run(
            dir.path(),
            compression,
            &common::penguins_recipe(data, &parquet),
        )?;
        for k in ["loss", "accuracy", "samples", "confusion"] {
            ensure!(
                got[k] == want[k],
                "{compression}: {k}: {got} vs the CSV's {want}"
            );
        }
        let by_parquet = taper(&["classify", out.to_str().unwrap(), parquet.to_str().unwrap()])?;
        ensure!(
            by_parquet.status.success(),
            "{}",
            String::from_utf8_lossy(&by_parquet.stderr)
        );
        // `FILE:LINE: ...`: the CSV's line 2 is the Parquet file's row 1.
        let answers = |o: &std::process::Output| -> Vec<String> {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(|l| l.splitn(3, ':').nth(2).unwrap_or_default().to_string())
                .collect()
        };
        ensure!(
            answers(&by_parquet) == answers(&by_csv),
            "{compression}: classify's answers differ"
        );
        ensure!(
            String::from_utf8_lossy(&by_parquet.stdout)
                .starts_with(&format!("{}:1:", parquet.display())),
            "rows are numbered from 1"
        );
    }
    Ok(())
}

/// A column of lists of label ids (`labels: [2, 27]`, as Hugging Face
/// datasets keep GoEmotions) is read as label sets: the labels sorted by
/// value, each row's 0s and 1s; the other columns are the features.
#[test]
fn a_column_of_lists_is_a_multi_label_classifiers_label_sets() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("lists.parquet");
    common::interop_check(
        "pandas, pyarrow",
        &["parquet-lists", path.to_str().unwrap()],
    )?;
    common::lists_read_as_label_sets(&path)?;
    Ok(())
}

/// A column of sentence embeddings (a float32 list a row, as Hugging Face
/// datasets keep an encoder's output) is read as a feature per number:
/// the Parquet and JSON Lines files, and the CSV files pandas writes of
/// the list column (an array's NumPy repr a cell, wrapped over lines; a
/// Python list of floats), train as the CSV file of the same
/// embeddings stacked by NumPy into a column each, `features = {
/// "embedding" }` standing for the 32 columns (to the bit; an array's
/// repr rounds to 8 digits, its loss as near); the classifier is as
/// accurate as NumPy's nearest centroid, and `taper classify` answers for
/// the Parquet file's rows and the arrays' CSV file's as for the CSV
/// file's, and refuses embeddings of another length (but for a run on
/// the first items of the lists, each named, which reads them from lists
/// of any length).
#[test]
fn a_column_of_embeddings_is_a_feature_per_number() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let said = common::interop_check("pandas, pyarrow", &["embeddings", d.to_str().unwrap()])?;
    let reference = said["nearest_centroid_accuracy"].as_f64().unwrap();
    let recipe_of = |ext: &str, features: &str, n: usize| {
        let path = |split: &str| {
            format!(
                "{:?}",
                d.join(format!("{split}.{ext}")).display().to_string()
            )
        };
        format!(
            r#"local f = {features}
local train = taper.data.csv{{ path = {}, label = "label", features = f }}:named("train"):standardize()
assert(#train:feature_names() == {n} and train:feature_names()[{n}] == "embedding[{last}]")
local test = taper.data.csv{{ path = {}, label = "label", features = f }}:named("test"):standardize(train)
local run = taper.run{{
  model = taper.model.mlp{{ inputs = {n}, outputs = 3 }},
  optim = taper.optim.adamw{{ lr = 1e-2 }}, data = train:shuffle{{ seed = 1 }}:batch(32), seed = 1,
}}
for e in run:epochs(20) do for b in run:batches() do run:step(b) end end
run:evaluate(test)
"#,
            path("train"),
            path("test"),
            last = n - 1,
        )
    };
    let recipe = |ext: &str, features: &str| recipe_of(ext, features, 32);
    let each = "{} for i = 0, 31 do f[#f + 1] = \"embedding[\" .. i .. \"]\" end";
    let (want, out) = run(d, "csv", &recipe("csv", each))?;
    eprintln!("csv: {want}; nearest centroid: {reference}");
    let accuracy = want["accuracy"].as_f64().unwrap();
    ensure!(
        accuracy >= reference - 0.03,
        "{accuracy} against {reference}"
    );
    for ext in ["parquet", "jsonl", "arrays.csv", "floats.csv"] {
        let (got, _) = run(d, ext, &recipe(ext, "{ \"embedding\" }"))?;
        for k in ["loss", "accuracy", "samples", "confusion"] {
            // NumPy's repr prints 8 digits, where a float32 may need 9: a
            // number may be an ulp off, and the loss with it.
            let near = |a: f64, b: f64| (a - b).abs() < 1e-5 * b.abs();
            let same = match (ext, k) {
                ("arrays.csv", "loss") => near(got[k].as_f64().unwrap(), want[k].as_f64().unwrap()),
                _ => got[k] == want[k],
            };
            ensure!(same, "{ext}: {k}: {got} vs the CSV's {want}");
        }
    }
    let classify = |run: &Path, file: &str| {
        taper(&[
            "classify",
            run.to_str().unwrap(),
            d.join(file).to_str().unwrap(),
        ])
    };
    let answers = |file: &str| -> Result<Vec<String>> {
        let o = classify(&out, file)?;
        ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        Ok(String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| l.splitn(3, ':').nth(2).unwrap_or_default().to_string())
            .collect())
    };
    let by_csv = answers("test.csv")?;
    ensure!(by_csv.len() == 200, "{by_csv:?}");
    for file in ["test.parquet", "test.arrays.csv"] {
        ensure!(
            answers(file)? == by_csv,
            "classify's answers for {file} differ"
        );
    }
    // Embeddings shorter or longer than the run's (whose first 32 would
    // be read) are refused, saying so.
    for (file, held) in [("test.short.parquet", 24), ("test.long.parquet", 40)] {
        let o = classify(&out, file)?;
        let err = String::from_utf8_lossy(&o.stderr);
        let says = format!("`embedding` holds lists of {held} numbers, where the run read lists of 32 (`embedding[0..32]`)");
        ensure!(!o.status.success() && err.contains(&says), "{file}: {err}");
    }
    // A run on the first 8 items of the lists, each named, reads them from
    // lists of any length: its checkpoint says it read no list whole.
    let first = "{} for i = 0, 7 do f[#f + 1] = \"embedding[\" .. i .. \"]\" end";
    let (_, first8) = run(d, "first8", &recipe_of("parquet", first, 8))?;
    for file in ["test.parquet", "test.long.parquet"] {
        let o = classify(&first8, file)?;
        let err = String::from_utf8_lossy(&o.stderr);
        ensure!(o.status.success(), "the first 8 items of {file}: {err}");
        let lines = String::from_utf8_lossy(&o.stdout).lines().count();
        ensure!(lines == 200, "{file}: {lines} answers");
    }
    Ok(())
}

/// A CSV file through taper.data.parquet, CSV-only options for a Parquet
/// file, a file that is not Parquet and a missing value are refused,
/// saying what to do.
#[test]
fn parquet_options_and_files_that_cannot_work_say_why() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (csv, parquet) = penguins(dir.path(), "snappy")?;
    let broken = dir.path().join("broken.parquet");
    std::fs::write(&broken, "species,island\nAdelie,Dream\n")?;
    let lists = dir.path().join("lists.parquet");
    common::interop_check(
        "pandas, pyarrow",
        &["parquet-lists", lists.to_str().unwrap()],
    )?;
    let cases = [
        (
            format!("taper.data.csv{{ path = {:?}, delimiter = \";\" }}", parquet.display().to_string()),
            "taper.data.csv: ".to_string() + &format!("{}: a Parquet file's columns have names and types", parquet.display()),
        ),
        (
            format!("taper.data.parquet{{ path = {:?} }}", csv.display().to_string()),
            "not a `.parquet` file; read a CSV file with taper.data.csv".into(),
        ),
        (
            format!("taper.data.parquet{{ path = {:?}, label = \"species\", header = true }}", parquet.display().to_string()),
            "a Parquet file's columns have names and types: it takes no `header`, `delimiter` or `decimal`".into(),
        ),
        (
            format!("taper.data.parquet{{ path = {:?} }}", broken.display().to_string()),
            format!("{}: not a Parquet file", broken.display()),
        ),
        (
            format!("taper.data.parquet{{ path = {:?}, label = \"species\", features = {{ \"bill_length_mm\" }} }}", parquet.display().to_string()),
            format!("{}: row 4, column 3 (`bill_length_mm`): a missing value", parquet.display()),
        ),
        (
            format!("taper.data.parquet{{ path = {:?}, label = \"x2\", features = {{ \"x1\", \"labels\" }} }}", lists.display().to_string()),
            format!("{}: column 3 (`labels`) is a column of lists, read as a feature per item when each row's list holds numbers, as many as every other row's: row 2's list holds 1 item, where row 1's holds 2", lists.display()),
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
            !o.status.success() && err.contains("bad.lua:1:") && err.contains(says.as_str()),
            "case {i}: {err}"
        );
    }
    Ok(())
}

/// A CSV file of list cells as pandas' `to_csv` writes them reads as the
/// Parquet file does: `[2, 27]` a label set. An array NumPy summarized
/// (`...`, over 1000 items) is refused saying how to write it whole, and a
/// list cell in a file read without its header says why it is not read.
#[test]
fn csv_list_cells_as_pandas_writes_them_read_as_lists() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let lists = d.join("lists.csv");
    common::interop_check("pandas", &["csv-lists", lists.to_str().unwrap()])?;
    common::lists_read_as_label_sets(&lists)?;

    let summarized = d.join("summarized.csv");
    common::interop_check("pandas", &["csv-summarized", summarized.to_str().unwrap()])?;
    let opts = taper::data::CsvOptions {
        label: taper::data::Column::Name("label".into()),
        ..Default::default()
    };
    let e = taper::data::csv(&summarized, &opts).err().expect("refused");
    let e = e.to_string();
    ensure!(
        e.contains("summarized.csv: line 2, column 1 (`x`): NumPy wrote the array summarized")
            && e.contains("np.set_printoptions(threshold=sys.maxsize)"),
        "{e}"
    );
    let headerless = taper::data::CsvOptions {
        label: taper::data::Column::Index(-1),
        header: Some(false),
        ..Default::default()
    };
    let text = "\"[1.5, 2.0]\",0\n\"[0.5, 1.0]\",1\n";
    let e = taper::data::parse_csv(Path::new("h.csv"), text, &headerless)
        .err()
        .expect("refused")
        .to_string();
    ensure!(
        e.contains("line 1, column 1: `[1.5, 2.0]...` is a list, read as a feature per number only from a file whose first row names the columns"),
        "{e}"
    );
    Ok(())
}
