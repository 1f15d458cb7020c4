//! Helpers shared by integration tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Result};

/// `file` (relative to the repository) as an absolute path, running
/// scripts/fetch-data.sh first if it is missing (fetched data and the test
/// virtualenv are never committed).
#[allow(dead_code)] // not every test binary needs fetched data
pub fn fetched(file: &str) -> Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = root.join(file);
    if !path.exists() {
        let ok = Command::new("bash")
            .arg("scripts/fetch-data.sh")
            .current_dir(root)
            .status()?
            .success();
        ensure!(
            ok && path.exists(),
            "{file} is missing: run `bash scripts/fetch-data.sh`"
        );
    }
    Ok(path)
}

/// The test virtualenv's python, once it can import `modules` (running
/// scripts/fetch-data.sh first when a module is missing, as in a virtualenv
/// made before the module was added).
#[allow(dead_code)] // not every test binary needs the virtualenv
pub fn test_python(modules: &str) -> Result<PathBuf> {
    // Modules this test binary has seen import: checking takes a Python
    // start and the imports (3 s or more for torch), as long as a quick call.
    static IMPORTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".venv-test/bin/python");
    let seen = || IMPORTED.lock().unwrap_or_else(|e| e.into_inner());
    if seen().iter().any(|m| m == modules) {
        return Ok(python);
    }
    let imports = || {
        Command::new(&python)
            .args(["-c", &format!("import {modules}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !imports() {
        let ok = Command::new("bash")
            .arg("scripts/fetch-data.sh")
            .current_dir(root)
            .status()?
            .success();
        ensure!(
            ok && imports(),
            "the test virtualenv cannot import {modules}: run `bash scripts/fetch-data.sh`"
        );
    }
    seen().push(modules.to_string());
    Ok(python)
}

/// scripts/tools/interop_check.py in the test virtualenv, once it can
/// import `modules`: its last line of output, as JSON.
#[allow(dead_code)] // not every test binary drives the real tools
pub fn interop_check(modules: &str, args: &[&str]) -> Result<serde_json::Value> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = test_python(modules)?;
    let out = Command::new(python)
        .arg(root.join("scripts/tools/interop_check.py"))
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "interop_check.py {}: {}",
        args[0],
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    Ok(serde_json::from_str(last)?)
}

/// interop_check.py's `calls` (each an argument list, as for
/// [`interop_check`]) in one run of it (`batch`: the tools imported once,
/// where each run takes seconds to import torch): their results, in order.
#[allow(dead_code)] // not every test binary drives the real tools
pub fn interop_checks(modules: &str, calls: &[Vec<String>]) -> Result<Vec<serde_json::Value>> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("calls.json");
    std::fs::write(&file, serde_json::to_string(calls)?)?;
    let results = interop_check(modules, &["batch", &file.to_string_lossy()])?;
    let results: Vec<serde_json::Value> = serde_json::from_value(results)?;
    ensure!(
        results.len() == calls.len(),
        "interop_check.py batch: {} results for {} calls",
        results.len(),
        calls.len()
    );
    Ok(results)
}

/// The first `bytes` of Jane Austen's Emma (at most; whole characters), as
/// passages of the fetched Austen data: a short text of one's own.
#[allow(dead_code)] // not every test binary trains on a text
pub fn emma(bytes: usize) -> Result<String> {
    let data = fetched("data/austen/train.csv")?;
    let mut reader = csv::Reader::from_path(data)?;
    let mut text = String::new();
    for r in reader.records() {
        let r = r?;
        if &r[1] == "emma" {
            text += &r[0];
            text += "\n\n";
        }
        if text.len() >= bytes {
            break;
        }
    }
    let cut = (0..=bytes.min(text.len()))
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    text.truncate(cut);
    Ok(text)
}

/// The records of one `event` in a run folder's `metrics.jsonl`; none while
/// the file is missing or a line is half-written (a run still going).
#[allow(dead_code)] // not every test binary reads records
pub fn records(out: &Path, event: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["event"] == event)
        .collect()
}

/// A BERT-style tokenizer.json: `[CLS] text [SEP]` around each text, and
/// `[PAD]` (id 0) its padding token.
#[allow(dead_code)] // not every test binary tokenizes texts
pub const BERT_TOKENIZER: &str = r#"{
  "version": "1.0", "truncation": null,
  "padding": { "strategy": { "Fixed": 128 }, "direction": "Right", "pad_to_multiple_of": null, "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]" },
  "added_tokens": [
    { "id": 0, "content": "[PAD]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true },
    { "id": 2, "content": "[CLS]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true },
    { "id": 3, "content": "[SEP]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true }
  ],
  "normalizer": null, "pre_tokenizer": { "type": "BertPreTokenizer" },
  "post_processor": { "type": "TemplateProcessing",
    "single": [ { "SpecialToken": { "id": "[CLS]", "type_id": 0 } }, { "Sequence": { "id": "A", "type_id": 0 } }, { "SpecialToken": { "id": "[SEP]", "type_id": 0 } } ],
    "pair": [ { "SpecialToken": { "id": "[CLS]", "type_id": 0 } }, { "Sequence": { "id": "A", "type_id": 0 } }, { "SpecialToken": { "id": "[SEP]", "type_id": 0 } }, { "Sequence": { "id": "B", "type_id": 1 } }, { "SpecialToken": { "id": "[SEP]", "type_id": 1 } } ],
    "special_tokens": { "[CLS]": { "id": "[CLS]", "ids": [2], "tokens": ["[CLS]"] }, "[SEP]": { "id": "[SEP]", "ids": [3], "tokens": ["[SEP]"] } } },
  "decoder": null,
  "model": { "type": "WordLevel", "vocab": { "[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "the": 4, "cat": 5, "sat": 6, "on": 7, "mat": 8, ",": 9 }, "unk_token": "[UNK]" }
}"#;

/// A recipe that classifies the Palmer penguins of `path` through
/// `taper.data.{data}`: the species from the four measurements and the
/// island (one-hot), the rows missing a value left out; 20 epochs, then an
/// evaluation of a fifth of the birds.
#[allow(dead_code)] // not every test binary reads tables
pub fn penguins_recipe(data: &str, path: &Path) -> String {
    penguins_recipe_of(data, &format!("{:?}", path.display().to_string()))
}

/// [`penguins_recipe`] of `path`, a Lua expression: a string, or a list of
/// files.
#[allow(dead_code)] // not every test binary reads tables
pub fn penguins_recipe_of(data: &str, path: &str) -> String {
    format!(
        r#"local birds = taper.data.{data}{{ path = {path}, label = "species",
  features = {{ "bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g", "island" }},
  categorical = {{ "island" }}, missing = "drop" }}
assert(table.concat(birds:classes(), ",") == "Adelie,Chinstrap,Gentoo")
local train, test = birds:split{{ 0.8, 0.2, seed = 1 }}
train = train:named("train"):standardize()
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 7, hidden = {{ 16 }}, outputs = 3 }},
  optim = taper.optim.adamw{{ lr = 1e-2 }}, data = train:shuffle{{ seed = 1 }}:batch(16), seed = 1,
}}
for e in run:epochs(20) do for b in run:batches() do run:step(b) end end
run:evaluate(test:named("test"):standardize(train))
"#
    )
}

/// Trains `recipe` with `taper train` in `dir/name`: its last eval record,
/// what it printed (stderr, then stdout), and the run folder.
#[allow(dead_code)] // not every test binary trains recipes of tables
pub fn train_recipe(
    dir: &Path,
    name: &str,
    recipe: &str,
) -> Result<(serde_json::Value, String, PathBuf)> {
    let lua = dir.join(format!("{name}.lua"));
    std::fs::write(&lua, recipe)?;
    let out = dir.join(name);
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args([
            "train",
            lua.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()?;
    let said =
        String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout);
    ensure!(o.status.success(), "{name}: {said}");
    let eval = records(&out, "eval").pop().expect("an eval record");
    Ok((eval, said, out))
}

/// interop_check.py's `lists_frame()` table at `path` (a Parquet or JSON
/// file of two features and `labels`, a list of label ids per row) reads as
/// label sets: the labels sorted by value, each row's 0s and 1s; the other
/// columns are the features.
#[allow(dead_code)] // not every test binary reads tables
pub fn lists_read_as_label_sets(path: &Path) -> Result<()> {
    use taper::data::{Column, CsvOptions, Source};
    let opts = CsvOptions {
        label: Column::Name("labels".into()),
        ..CsvOptions::default()
    };
    let table = taper::data::csv(path, &opts)?;
    let input = table.table_input().unwrap();
    ensure!(
        input.label_names() == Some(vec!["2".into(), "10".into(), "27".into()]),
        "{input:?}"
    );
    let (x, y) = table.gather(&[0, 1, 2, 3])?;
    ensure!(
        x.to_vec2::<f32>()? == [[0.5, 1.0], [1.5, 2.0], [-2.0, 3.0], [3.25, 4.0]],
        "{x}"
    );
    ensure!(
        y.to_vec2::<f32>()?
            == [
                [1.0, 0.0, 1.0],
                [0.0, 1.0, 0.0],
                [0.0, 0.0, 0.0],
                [1.0, 1.0, 1.0]
            ],
        "{y}"
    );
    Ok(())
}
