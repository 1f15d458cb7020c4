//! Multi-label classification (`taper.loss.bce{}`) on real data: the
//! Palmer penguins, each bird with three yes-or-no labels from its record
//! (a Gentoo? female? from Biscoe island?), predicted from its four
//! measurements. The run learns them; its evaluation's scores are those a
//! float64 computation gives from `taper classify`'s probabilities of the
//! same rows; bad setups are refused saying what to do.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Result};
use serde_json::Value;

const LABELS: [&str; 3] = ["gentoo", "female", "biscoe"];

/// The penguins with a sex and measurements, as a CSV file of the four
/// measurements and the three 0/1 labels; and each row's labels.
fn penguins(dir: &Path) -> Result<(PathBuf, Vec<[bool; 3]>)> {
    let source = common::fetched("data/penguins/penguins.csv")?;
    let mut reader = csv::Reader::from_path(source)?;
    let mut out = String::from(
        "bill_length_mm,bill_depth_mm,flipper_length_mm,body_mass_g,gentoo,female,biscoe\n",
    );
    let mut truth = Vec::new();
    for r in reader.records() {
        let r = r?;
        let (species, island, sex) = (&r[0], &r[1], &r[6]);
        if r.iter().any(|v| v == "NA" || v.is_empty()) {
            continue;
        }
        let labels = [species == "Gentoo", sex == "female", island == "Biscoe"];
        let bit = |b: bool| u8::from(b);
        out += &format!(
            "{},{},{},{},{},{},{}\n",
            &r[2],
            &r[3],
            &r[4],
            &r[5],
            bit(labels[0]),
            bit(labels[1]),
            bit(labels[2])
        );
        truth.push(labels);
    }
    let path = dir.join("penguins.csv");
    std::fs::write(&path, out)?;
    Ok((path, truth))
}

fn recipe(csv: &Path, loss: &str, standardize: &str) -> String {
    format!(
        r#"local birds = taper.data.csv{{ path = {csv:?}, target = {{ "gentoo", "female", "biscoe" }} }}
local train, test = birds:split{{ 0.8, 0.2, seed = 1 }}
train = train:named("train"):standardize{standardize}
local all = birds:named("all"):standardize(train)
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 4, hidden = {{ 32 }}, outputs = 3 }},
  optim = taper.optim.adamw{{ lr = 3e-3 }},
  loss = {loss},
  data = train:shuffle{{ seed = 1 }}:batch(16), seed = 1,
}}
for epoch in run:epochs(60) do
  for b in run:batches() do run:step(b) end
end
local e = run:evaluate(all)
assert(e.per_label.gentoo.f1 == e.per_label["gentoo"].f1 and e.f1_micro > 0)
"#,
        csv = csv.display().to_string()
    )
}

fn taper(args: &[&str]) -> Result<std::process::Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(args)
        .output()?)
}

/// `taper train LUA --quiet --out OUT`.
fn train(lua: &Path, out: &Path) -> Result<std::process::Output> {
    taper(&[
        "train",
        lua.to_str().unwrap(),
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ])
}

/// 60 epochs (about a second) learn the labels: of every bird's, 90% or
/// more decided right (measured 92.2%), every Gentoo told apart (F1 above
/// 0.97), and 70% of the birds with all three right (measured 76%). The
/// `eval` record's accuracy, exact match, micro and macro F1 and each
/// label's precision and recall are those of `taper classify`'s
/// probabilities (a yes at 50% or more) against the file's labels,
/// computed here in f64.
#[test]
fn penguins_labels_are_learned_and_scored_as_their_predictions_say() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (csv, truth) = penguins(dir.path())?;
    let lua = dir.path().join("multi.lua");
    std::fs::write(&lua, recipe(&csv, "taper.loss.bce{}", "{ target = false }"))?;
    let out = dir.path().join("run");
    let o = train(&lua, &out)?;
    ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let eval = common::records(&out, "eval").pop().expect("an eval record");
    eprintln!("{eval}");
    let score = |k: &str| eval[k].as_f64().unwrap();
    ensure!(score("accuracy") >= 0.9, "{eval}");
    ensure!(score("exact_match") >= 0.7, "{eval}");
    ensure!(
        eval["per_label"][0]["f1"].as_f64().unwrap() > 0.97,
        "{eval}"
    );

    let o = taper(&["classify", out.to_str().unwrap(), csv.to_str().unwrap()])?;
    ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines = String::from_utf8(o.stdout)?;
    let mut said = Vec::new();
    // A printed 50.0% could be a yes or a no: each such decision is tried
    // both ways.
    let mut unsure = Vec::new();
    for (row, line) in lines.lines().enumerate() {
        // `FILE:LINE: biscoe 99.1%, female 12.0%, gentoo 0.3%`
        let (_, answers) = line.rsplit_once(": ").unwrap();
        let mut yes = [false; 3];
        for a in answers.split(", ") {
            let (name, p) = a.split_once(' ').unwrap();
            let p: f64 = p.trim_end_matches('%').parse()?;
            let k = LABELS.iter().position(|l| *l == name).unwrap();
            yes[k] = p > 50.0;
            if p == 50.0 {
                unsure.push((row, k));
            }
        }
        said.push(yes);
    }
    ensure!(said.len() == truth.len(), "{} answers", said.len());
    ensure!(unsure.len() <= 4, "{} decisions at 50.0%", unsure.len());
    let matched = (0..1u32 << unsure.len()).any(|bits| {
        let mut said = said.clone();
        for (i, &(row, k)) in unsure.iter().enumerate() {
            said[row][k] = bits >> i & 1 == 1;
        }
        scores_agree(&eval, &said, &truth)
    });
    ensure!(
        matched,
        "the eval record's scores are not those of classify's answers: {eval}"
    );
    Ok(())
}

/// Whether the `eval` record's scores are those of the decisions `said`
/// against `truth`, computed in f64: the share of decisions right, the
/// exact matches, micro and macro F1, each label's precision, recall and
/// positives.
fn scores_agree(eval: &Value, said: &[[bool; 3]], truth: &[[bool; 3]]) -> bool {
    let n = truth.len() as f64;
    let (mut right, mut exact) = (0.0, 0.0);
    let mut counts = [[0.0f64; 3]; 3]; // per label: tp, fp, fn
    for (s, t) in said.iter().zip(truth) {
        exact += f64::from(u8::from(s == t));
        for k in 0..3 {
            right += f64::from(u8::from(s[k] == t[k]));
            match (s[k], t[k]) {
                (true, true) => counts[k][0] += 1.0,
                (true, false) => counts[k][1] += 1.0,
                (false, true) => counts[k][2] += 1.0,
                _ => {}
            }
        }
    }
    let f1 = |c: [f64; 3]| 2.0 * c[0] / (2.0 * c[0] + c[1] + c[2]);
    let total = |i: usize| counts.iter().map(|c| c[i]).sum::<f64>();
    let close = |v: &Value, want: f64| v.as_f64().is_some_and(|v| (v - want).abs() < 1e-9);
    let overall = [
        ("accuracy", right / (3.0 * n)),
        ("exact_match", exact / n),
        ("f1_micro", f1([total(0), total(1), total(2)])),
        ("f1_macro", counts.iter().map(|&c| f1(c)).sum::<f64>() / 3.0),
    ];
    overall.iter().all(|(key, want)| close(&eval[key], *want))
        && counts.iter().enumerate().all(|(k, c)| {
            let row = &eval["per_label"][k];
            row["label"] == LABELS[k]
                && close(&row["precision"], c[0] / (c[0] + c[1]))
                && close(&row["recall"], c[0] / (c[0] + c[2]))
                && row["support"] == (c[0] + c[2]) as u64
        })
}

/// What cannot train a multi-label classifier is refused, saying what to
/// give: targets standardized with the features, a class label column,
/// and a `pos_weight` of another count than the labels.
#[test]
fn multi_label_setups_that_cannot_work_say_why() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (csv, _) = penguins(dir.path())?;
    let cases = [
        (
            recipe(&csv, "taper.loss.bce{}", "()"),
            "the loss (bce) takes 0 (no) to 1 (yes): a target standardized by data:standardize() (standardize the features alone: `train:standardize{ target = false }`)",
        ),
        (
            recipe(&csv, "taper.loss.bce{ pos_weight = { 1, 2 } }", "{ target = false }"),
            "multi.lua:5: taper.run: taper.loss.bce's `pos_weight` has 2 values, and the model gives 3 labels",
        ),
        (
            recipe(&csv, "taper.loss.bce{ pos_weight = 0 }", "{ target = false }"),
            "`pos_weight` is a number above 0, or a list of them (one per label); got [0.0]",
        ),
        (
            recipe(&csv, "taper.loss.cross_entropy{}", "{ target = false }"),
            "train numbers with `loss = taper.loss.mse{}`, or several 0/1 labels per sample with `loss = taper.loss.bce{}`",
        ),
        (
            recipe(&csv, "taper.loss.bce{}", "{ target = false }")
                .replace(r#"target = { "gentoo", "female", "biscoe" }"#, r#"label = "gentoo""#),
            "the loss (bce) takes each sample's labels as 0s and 1s, one per output",
        ),
    ];
    for (i, (src, says)) in cases.iter().enumerate() {
        let lua = dir.path().join("multi.lua");
        std::fs::write(&lua, src)?;
        let out = dir.path().join(format!("run{i}"));
        let o = train(&lua, &out)?;
        let err = String::from_utf8_lossy(&o.stderr);
        ensure!(!o.status.success() && err.contains(says), "case {i}: {err}");
    }
    Ok(())
}

/// The penguins as [`penguins`] writes them, with a column of label sets
/// besides (`tags`: `biscoe|gentoo`, `female`, or empty for none), its
/// labels in varied order.
fn penguin_tags(dir: &Path) -> Result<PathBuf> {
    let (plain, truth) = penguins(dir)?;
    let text = std::fs::read_to_string(plain)?;
    let mut lines = text.lines();
    let mut out = format!("{},tags\n", lines.next().unwrap());
    for (i, (line, labels)) in lines.zip(&truth).enumerate() {
        let mut tags: Vec<&str> = LABELS
            .iter()
            .zip(labels)
            .filter(|(_, &yes)| yes)
            .map(|(l, _)| *l)
            .collect();
        if i % 2 == 1 {
            tags.reverse();
        }
        out += &format!("{line},{}\n", tags.join("|"));
    }
    let path = dir.join("tags.csv");
    std::fs::write(&path, out)?;
    Ok(path)
}

const MEASURES: &str =
    r#"features = { "bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g" }"#;

/// A multi-label recipe on `birds` (a `taper.data.csv{}` expression),
/// whose training part is standardized with `standardize`.
fn tags_recipe(birds: &str, standardize: &str) -> String {
    format!(
        r#"local birds = {birds}
local train, test = birds:split{{ 0.8, 0.2, seed = 1 }}
train = train:named("train"):standardize{standardize}
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 4, hidden = {{ 32 }}, outputs = 3 }},
  optim = taper.optim.adamw{{ lr = 3e-3 }},
  loss = taper.loss.bce{{}},
  data = train:shuffle{{ seed = 1 }}:batch(16), seed = 1,
}}
for epoch in run:epochs(30) do
  for b in run:batches() do run:step(b) end
end
run:evaluate(test:named("test"):standardize(train))
"#
    )
}

/// A column of label sets (`label = "tags", label_sep = "|"`) is read as
/// pandas' `str.get_dummies("|")` splits it: the same labels, sorted, and
/// the same 0s and 1s, an empty cell none; given `classes`, in their
/// order, a run on it is the run on the 0/1 columns, to the bit. Its
/// `data:standardize()` leaves the labels as they are.
#[test]
fn a_column_of_label_sets_reads_as_pandas_splits_it_and_trains_as_its_columns() -> Result<()> {
    use taper::data::{Column, CsvOptions, Source};
    let dir = tempfile::tempdir()?;
    let tags = penguin_tags(dir.path())?;
    let theirs = common::interop_check(
        "pandas",
        &["label-sets", tags.to_str().unwrap(), "tags", "|"],
    )?;
    let opts = CsvOptions {
        label: Column::Name("tags".into()),
        label_sep: Some("|".into()),
        features: Some(
            [
                "bill_length_mm",
                "bill_depth_mm",
                "flipper_length_mm",
                "body_mass_g",
            ]
            .map(|c| Column::Name(c.into()))
            .to_vec(),
        ),
        ..CsvOptions::default()
    };
    let birds = taper::data::csv(&tags, &opts)?;
    let input = birds.table_input().unwrap();
    ensure!(
        serde_json::json!(input.label_names()) == theirs["columns"],
        "{:?} vs pandas' {}",
        input.label_names(),
        theirs["columns"]
    );
    let all: Vec<usize> = (0..birds.len()).collect();
    let (_, y) = birds.gather(&all)?;
    let ours: Vec<Vec<f32>> = y.to_vec2()?;
    let pandas: Vec<Vec<f32>> = serde_json::from_value(theirs["values"].clone())?;
    ensure!(ours == pandas, "the 0s and 1s differ from pandas'");
    ensure!(
        ours.iter().any(|r| r.iter().all(|&v| v == 0.0)),
        "no empty set"
    );

    let columns = format!(
        r#"taper.data.csv{{ path = {:?}, target = {{ "gentoo", "female", "biscoe" }}, {MEASURES} }}"#,
        tags.display().to_string()
    );
    let sets = format!(
        r#"taper.data.csv{{ path = {:?}, label = "tags", label_sep = "|", classes = {{ "gentoo", "female", "biscoe" }}, {MEASURES} }}"#,
        tags.display().to_string()
    );
    let mut evals = Vec::new();
    for (name, src) in [
        ("columns", tags_recipe(&columns, "{ target = false }")),
        ("sets", tags_recipe(&sets, "()")),
    ] {
        let lua = dir.path().join(format!("{name}.lua"));
        std::fs::write(&lua, src)?;
        let out = dir.path().join(name);
        let o = train(&lua, &out)?;
        ensure!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let mut eval = common::records(&out, "eval").pop().expect("an eval record");
        for k in [
            "t",
            "run",
            "elapsed_s",
            "peak_bytes",
            "samples_per_s",
            "split",
        ] {
            eval.as_object_mut().unwrap().remove(k);
        }
        evals.push(eval);
    }
    eprintln!("{}", evals[1]);
    ensure!(evals[0]["loss"] == evals[1]["loss"], "{evals:?}");
    ensure!(evals[0]["per_label"] == evals[1]["per_label"], "{evals:?}");
    ensure!(evals[1]["f1_micro"].as_f64().unwrap() > 0.8, "{evals:?}");
    Ok(())
}

/// Data whose label sets name other labels than the training data's is
/// refused, saying how to read it with the training data's; a label
/// outside the given classes names its line; `label_sep` with `target`
/// columns, or empty, is refused at the recipe's line.
#[test]
fn label_sets_that_cannot_work_say_why() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let train_csv = dir.path().join("train.csv");
    std::fs::write(&train_csv, "x,tags\n1,a|b\n2,b\n3,c\n4,\n")?;
    let val_csv = dir.path().join("val.csv");
    std::fs::write(&val_csv, "x,tags\n1,a\n2,c|a\n3,d\n")?;
    let recipe = |val: &str| {
        format!(
            r#"local train = taper.data.csv{{ path = {:?}, label = "tags", label_sep = "|" }}
assert(table.concat(train:classes(), ",") == "a,b,c")
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 1, outputs = #train:classes() }},
  optim = taper.optim.adamw{{ lr = 1e-3 }}, loss = taper.loss.bce{{}}, data = train:batch(2),
}}
run:evaluate({val})
"#,
            train_csv.display().to_string()
        )
    };
    let val = |extra: &str| {
        format!(
            r#"taper.data.csv{{ path = {:?}, label = "tags", label_sep = "|"{extra} }}"#,
            val_csv.display().to_string()
        )
    };
    let cases = [
        (
            recipe(&val("")),
            "the model's outputs are the run's labels, in its order; read it with the training data's: taper.data.csv{ path = ..., label_sep = ..., classes = train:classes() }",
        ),
        (
            recipe(&val(", classes = train:classes()")),
            "val.csv: line 4, column 2 (`tags`): label `d` is not one of the classes (`a`, `b`, `c`)",
        ),
        (
            recipe(&val(", label_sep = \"\"").replace(r#"label_sep = "|", "#, "")),
            "sets.lua:7: taper.data.csv: `label_sep` is what a cell's labels are split at",
        ),
        (
            recipe(&val("")).replace(
                r#"label = "tags", label_sep = "|" }"#,
                r#"target = "x", label_sep = "|" }"#,
            ),
            "sets.lua:1: taper.data.csv: `label_sep` splits a `label` column's cells",
        ),
    ];
    for (i, (src, says)) in cases.iter().enumerate() {
        let lua = dir.path().join("sets.lua");
        std::fs::write(&lua, src)?;
        let out = dir.path().join(format!("run{i}"));
        let o = train(&lua, &out)?;
        let err = String::from_utf8_lossy(&o.stderr);
        ensure!(!o.status.success() && err.contains(says), "case {i}: {err}");
    }
    // A cell's labels lose the spaces around them; empty pieces and
    // missing cells are no label.
    let spaced = dir.path().join("spaced.csv");
    std::fs::write(&spaced, "x,tags\n1, a | b \n2,NA\n3,b||c|\n")?;
    let opts = taper::data::CsvOptions {
        label: taper::data::Column::Name("tags".into()),
        label_sep: Some("|".into()),
        ..Default::default()
    };
    let table = taper::data::csv(&spaced, &opts)?;
    let (_, y) = taper::data::Source::gather(&table, &[0, 1, 2])?;
    ensure!(
        y.to_vec2::<f32>()? == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]],
        "{y}"
    );
    // Labels that are numbers are sorted by value (GoEmotions' `2,27`).
    let numbers = dir.path().join("numbers.tsv");
    std::fs::write(&numbers, "x\ttags\n1\t2,27\n2\t10\n3\t2\n")?;
    let opts = taper::data::CsvOptions {
        delimiter: b'\t',
        label_sep: Some(",".into()),
        ..opts
    };
    let table = taper::data::csv(&numbers, &opts)?;
    let names = taper::data::Source::table_input(&table).and_then(|t| t.label_names());
    ensure!(
        names == Some(vec!["2".into(), "10".into(), "27".into()]),
        "{names:?}"
    );
    Ok(())
}
