//! `taper.model.bert` from a DistilBERT or a RoBERTa classifier as
//! transformers saves them: a small one of each, its weights drawn by
//! transformers (seed 0) and its tokenizer real (MiniLM's WordPiece for
//! the DistilBERT, as distilbert-base-uncased's; for the RoBERTa a
//! byte-level BPE that tokenizers trains on Austen's passages, with
//! RoBERTa's special tokens), computes transformers' logits, and the
//! shipped recipe fine-tunes it into a folder transformers' pipeline runs
//! with taper's logits.

mod common;

use std::path::{Path, PathBuf};

use anyhow::{ensure, Result};
use candle_core::{Device, Tensor};
use serde_json::Value;
use taper::engine::ModelSpec;
use taper::interop::saved;

const FAMILIES: [&str; 2] = ["distilbert", "roberta"];

/// Text pairs of several lengths; the second is cut at 24 ids.
const PAIRS: [[&str; 2]; 3] = [
    ["Emma Woodhouse, handsome, clever, and rich.", "She was."],
    [
        "It is a truth universally acknowledged.",
        "A single man in possession of a good fortune must be in want of a wife.",
    ],
    ["Short.", "Also \"short\", with a comma."],
];

/// transformers' small `family` classifier of 3 classes saved to
/// `dir/family`, with its ids and logits for `texts`.
fn made(family: &str, dir: &Path, texts: &str) -> Result<(PathBuf, Value)> {
    let corpus = common::fetched("data/austen/train.csv")?;
    common::fetched("data/minilm/tokenizer.json")?;
    let saved = dir.join(family);
    let theirs = common::interop_check(
        "torch, transformers",
        &[
            "classifier-random",
            family,
            saved.to_str().unwrap(),
            "3",
            texts,
            corpus.to_str().unwrap(),
        ],
    )?;
    Ok((saved, theirs))
}

fn max_diff(a: &[Vec<f32>], b: &Value) -> Result<f64> {
    let b: Vec<Vec<f64>> = serde_json::from_value(b.clone())?;
    ensure!(a.len() == b.len(), "{} rows against {}", a.len(), b.len());
    Ok(a.iter()
        .zip(&b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (*p as f64 - q).abs()))
        .fold(0.0, f64::max))
}

/// Each family's classifier, imported, gives transformers' logits for text
/// pairs padded further than transformers padded them: a DistilBERT
/// without token types, a RoBERTa with its positions after the padding id
/// and its head's own dense layer, both with every weight renamed. The
/// import uses the file's head and leaves nothing of it out.
#[test]
fn distilbert_and_roberta_classifiers_give_transformers_logits() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pairs = serde_json::to_string(&PAIRS)?;
    for family in FAMILIES {
        let (saved, theirs) = made(family, dir.path(), &pairs)?;
        let imported = taper::interop::bert::import(&saved, 3, None)?;
        ensure!(imported.notes.is_empty(), "{family}: {:?}", imported.notes);
        let spec = imported.spec;
        ensure!(
            spec.describe().starts_with(&format!("{family} vocab")),
            "{}",
            spec.describe()
        );
        let pad = theirs["pad"].as_u64().unwrap() as u32;
        let ids: Vec<Vec<u32>> = serde_json::from_value(theirs["ids"].clone())?;
        ensure!(ids[1].len() == 24, "{family}: the long pair is cut at 24");
        let width = spec.context.min(30);
        let flat: Vec<u32> = ids
            .iter()
            .flat_map(|row| {
                row.iter()
                    .copied()
                    .chain(std::iter::repeat(pad))
                    .take(width)
            })
            .collect();
        let x = Tensor::from_vec(flat, (ids.len(), width), &Device::Cpu)?;
        let adamw = taper::engine::optim::OptimSpec::AdamW(Default::default());
        let trainer =
            taper::engine::Trainer::new(std::sync::Arc::new(spec), &adamw, Default::default())?;
        let ours: Vec<Vec<f32>> = trainer.frozen()?.forward(&x)?.to_vec2()?;
        let diff = max_diff(&ours, &theirs["logits"])?;
        eprintln!("{family}: taper vs transformers {diff:.2e} ({ours:?})");
        ensure!(diff < 1e-4, "{family}: logits differ by {diff}");
        let spread = (ours[0][0] - ours[2][0]).abs();
        ensure!(spread > 0.1, "{family}: the texts' logits barely differ");
    }
    Ok(())
}

/// scripts/minilm_classify.lua with `--set model=` a DistilBERT or a
/// RoBERTa folder trains it (its weights random, it learns 16 passages'
/// novels: scored on those same rows, 90% or more right after 60 steps,
/// from 6-25%) and exports a classifier of the family it started from:
/// transformers loads it with no weight missing or left over, gives
/// taper's logits, and its pipeline names taper's classes.
#[test]
fn the_shipped_recipe_fine_tunes_a_distilbert_and_a_roberta_for_transformers() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir()?;
    // Short enough for the RoBERTa's 24 positions: transformers' pipeline
    // does not cut texts.
    let texts = ["Emma was rich.", "Mr. Darcy bowed.", "Anne wrote."];
    let texts = serde_json::to_string(&texts)?;
    for family in FAMILIES {
        let (saved, _) = made(family, dir.path(), &texts)?;
        let out = dir.path().join(format!("{family}-run"));
        let export = dir.path().join(format!("{family}-export"));
        let mut host = taper::Host::new(taper::HostOptions {
            out_dir: Some(out.clone()),
            quiet: true,
            overrides: [
                ("model", saved.to_str().unwrap()),
                ("rows", "16"),
                ("test", "data/austen/train.csv"),
                ("test_rows", "16"),
                ("epochs", "60"),
                ("context", "24"),
                ("lr", "1e-3"),
                ("dropout", "0.0"),
                ("export", export.to_str().unwrap()),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            ..taper::HostOptions::default()
        })?;
        std::env::set_current_dir(root)?;
        host.run_file(&root.join("scripts/minilm_classify.lua"))?;
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(export.join("config.json"))?)?;
        ensure!(config["model_type"] == family, "{config}");
        let theirs = common::interop_check(
            "torch, transformers",
            &["bert-pipeline", export.to_str().unwrap(), &texts],
        )?;
        let opened = saved::open(&saved::locate(&out)?, &Device::Cpu)?;
        let model = opened.trainer.frozen()?;
        let classes = opened.meta.classes.clone().expect("class names");
        let pad = config["pad_token_id"].as_u64().unwrap() as u32;
        let ids: Vec<Vec<u32>> = serde_json::from_value(theirs["ids"].clone())?;
        for (i, row) in ids.iter().enumerate() {
            let row: Vec<u32> = row.iter().copied().filter(|&id| id != pad).collect();
            let x = Tensor::from_vec(row.clone(), (1, row.len()), &Device::Cpu)?;
            let ours: Vec<Vec<f32>> = model.forward(&x)?.to_vec2()?;
            let best = (0..ours[0].len())
                .max_by(|&a, &b| ours[0][a].total_cmp(&ours[0][b]))
                .unwrap();
            let diff = max_diff(&ours, &Value::Array(vec![theirs["logits"][i].clone()]))?;
            eprintln!(
                "{family}, text {i}: logits differ by {diff:.2e}; {}",
                classes[best]
            );
            ensure!(diff < 1e-4, "{family}, text {i}: logits differ by {diff}");
            ensure!(theirs["labels"][i] == classes[best].as_str(), "{theirs}");
        }
        let evals = common::records(&out, "eval");
        let accuracy = evals.last().and_then(|e| e["accuracy"].as_f64());
        eprintln!("{family}: accuracy on the rows it learned {accuracy:?}");
        ensure!(
            accuracy.is_some_and(|a| a >= 0.9),
            "{family}: accuracy on the rows it learned {accuracy:?}"
        );
    }
    Ok(())
}

/// A folder whose weights are PyTorch's pickle (as transformers saved them
/// before safetensors) is refused with the Python line that writes them as
/// safetensors; that line, run, makes a folder taper starts from with the
/// same logits.
#[test]
fn pickled_weights_are_refused_with_a_line_that_converts_them() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pairs = serde_json::to_string(&PAIRS)?;
    let python = common::test_python("torch, transformers")?;
    let (saved, theirs) = made("distilbert", dir.path(), &pairs)?;
    let files = common::interop_check(
        "torch, transformers",
        &["legacy-weights", saved.to_str().unwrap(), "pickle"],
    )?;
    eprintln!("{files}");
    let e = taper::interop::bert::import(&saved, 3, None)
        .err()
        .expect("no model.safetensors")
        .to_string();
    ensure!(e.contains("PyTorch's pickle (pytorch_model.bin)"), "{e}");
    let line = e.split('`').nth(1).expect("a line in backticks");
    let ran = std::process::Command::new(&python)
        .args(["-c", &format!("import transformers; {line}")])
        .output()?;
    ensure!(
        ran.status.success(),
        "{line}: {}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let spec = taper::interop::bert::import(&saved, 3, None)?.spec;
    let ours = logits(spec, &theirs)?;
    let diff = max_diff(&ours, &theirs["logits"])?;
    ensure!(diff < 1e-4, "logits differ by {diff} once converted");
    Ok(())
}

/// taper's logits, through a fresh trainer of `spec`, for the padded ids
/// transformers ran (`theirs["ids"]`).
fn logits(spec: taper::engine::Bert, theirs: &Value) -> Result<Vec<Vec<f32>>> {
    let ids: Vec<Vec<u32>> = serde_json::from_value(theirs["ids"].clone())?;
    let width = ids[0].len();
    let x = Tensor::from_vec(ids.concat(), (ids.len(), width), &Device::Cpu)?;
    let adamw = taper::engine::optim::OptimSpec::AdamW(Default::default());
    let trainer =
        taper::engine::Trainer::new(std::sync::Arc::new(spec), &adamw, Default::default())?;
    Ok(trainer.frozen()?.forward(&x)?.to_vec2()?)
}

/// A RoBERTa whose weights transformers wrote in shards (as
/// `save_pretrained` writes a model larger than its `max_shard_size`: here
/// 40 kB, so a small model has several) is read through the shards' index
/// with transformers' logits; started with a shorter context, its export
/// takes the positions past it from the shards, so transformers' logits
/// for the full texts are the starting model's.
#[test]
fn sharded_weights_are_read_through_their_index() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pairs = serde_json::to_string(&PAIRS)?;
    let (saved, theirs) = made("roberta", dir.path(), &pairs)?;
    let files = common::interop_check(
        "torch, transformers",
        &["legacy-weights", saved.to_str().unwrap(), "shards", "40KB"],
    )?;
    eprintln!("{files}");
    let names: Vec<&str> = files["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let shards = names.iter().filter(|n| n.ends_with(".safetensors")).count();
    ensure!(
        shards >= 2 && names.contains(&"model.safetensors.index.json"),
        "{names:?}"
    );
    ensure!(!names.contains(&"model.safetensors"), "{names:?}");
    let imported = taper::interop::bert::import(&saved, 3, None)?;
    ensure!(imported.notes.is_empty(), "{:?}", imported.notes);
    let ours = logits(imported.spec, &theirs)?;
    let diff = max_diff(&ours, &theirs["logits"])?;
    eprintln!("sharded: taper vs transformers {diff:.2e}");
    ensure!(diff < 1e-4, "logits differ by {diff}");

    // Started at context 8: the export's positions after the 8 come from
    // the shards.
    let spec = taper::interop::bert::import(&saved, 3, Some(8))?.spec;
    ensure!(
        spec.from
            .as_deref()
            .is_some_and(|f| f.ends_with("model.safetensors.index.json")),
        "{:?}",
        spec.from
    );
    let params = spec
        .initial
        .as_ref()
        .expect("starting weights")
        .iter()
        .cloned()
        .collect();
    let export = dir.path().join("export");
    let model = taper::interop::Model {
        spec: &spec,
        params,
        vocab: None,
        classes: None,
        image_input: None,
        table_input: None,
        sample_input: None,
        array_input: None,
        multi_label: false,
        step: 0,
    };
    let written = taper::interop::export(
        &model,
        &export,
        "hf",
        taper::quant::ExportFormat::F32,
        false,
    )?;
    ensure!(!written.detail.contains("gone"), "{}", written.detail);
    let ids = serde_json::to_string(&theirs["ids"])?;
    let again = common::interop_check(
        "torch, transformers",
        &["bert-logits", export.to_str().unwrap(), &ids],
    )?;
    let again: Vec<Vec<f32>> = serde_json::from_value(again["logits"].clone())?;
    let diff = max_diff(&again, &theirs["logits"])?;
    eprintln!("its export from context 8: transformers vs the start {diff:.2e}");
    ensure!(diff < 1e-4, "the export's logits differ by {diff}");
    Ok(())
}

/// A multi-label classifier (`taper.loss.bce{}`: a passage's labels, whether
/// it has the word "she", and "he") fine-tuned from the DistilBERT exports
/// as one: `problem_type` multi-label, its labels the target columns, and
/// transformers' pipeline gives each label the sigmoid `taper classify
/// --text` gives it.
#[test]
fn a_multi_label_text_classifier_exports_for_transformers_pipeline() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let texts = [
        "She said nothing.",
        "He was gone.",
        "Mr. Darcy bowed to her.",
    ];
    let (saved, _) = made("distilbert", dir.path(), &serde_json::to_string(&texts)?)?;
    let source = common::fetched("data/austen/train.csv")?;
    let mut csv = String::from("text,she,he\n");
    for r in csv::Reader::from_path(source)?.records().take(160) {
        let text = r?[0].to_string();
        let words: Vec<String> = text
            .split(|c: char| !c.is_alphabetic())
            .map(str::to_lowercase)
            .collect();
        let has = |w: &str| u8::from(words.iter().any(|x| x == w));
        csv += &format!(
            "\"{}\",{},{}\n",
            text.replace('"', "\"\""),
            has("she"),
            has("he")
        );
    }
    let data = dir.path().join("texts.csv");
    std::fs::write(&data, csv)?;
    let export = dir.path().join("export");
    let recipe = format!(
        r#"local d = taper.data.csv{{ path = {data:?}, text = "text", target = {{ "she", "he" }},
  tokenizer = {tokenizer:?}, context = 24 }}
local run = taper.run{{
  model = taper.model.bert{{ from = {saved:?}, outputs = 2, dropout = 0 }},
  optim = taper.optim.adamw{{ lr = 1e-3 }}, loss = taper.loss.bce{{}}, data = d:batch(16), seed = 1,
}}
for _ in run:epochs(2) do for b in run:batches() do run:step(b) end end
run:export{{ path = {export:?}, format = "hf" }}
"#,
        data = data.display().to_string(),
        tokenizer = saved.join("tokenizer.json").display().to_string(),
        saved = saved.display().to_string(),
        export = export.display().to_string(),
    );
    let out = dir.path().join("run");
    let mut host = taper::Host::new(taper::HostOptions {
        out_dir: Some(out.clone()),
        quiet: true,
        ..taper::HostOptions::default()
    })?;
    host.run_source("multi.lua", &recipe)?;
    let theirs = common::interop_check(
        "torch, transformers",
        &[
            "pipeline-scores",
            export.to_str().unwrap(),
            &serde_json::to_string(&texts)?,
        ],
    )?;
    ensure!(
        theirs["problem_type"] == "multi_label_classification",
        "{theirs}"
    );
    let mut asked = vec!["classify".to_string(), out.display().to_string()];
    for t in texts {
        asked.extend(["--text".to_string(), t.to_string()]);
    }
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(&asked)
        .output()?;
    ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines = String::from_utf8(o.stdout)?;
    for (i, line) in lines.lines().enumerate() {
        // `text 1: she 61.2%, he 20.3%`: every label, most likely first.
        let (_, answers) = line.split_once(": ").unwrap();
        let mut n = 0;
        for a in answers.split(", ") {
            let (label, p) = a.split_once(' ').unwrap();
            let ours: f64 = p.trim_end_matches('%').parse::<f64>()? / 100.0;
            let their = theirs["scores"][i][label].as_f64().unwrap();
            ensure!(
                (ours - their).abs() < 0.0006,
                "text {i}, {label}: {ours} against {their}"
            );
            n += 1;
        }
        ensure!(n == 2, "{line}");
    }
    Ok(())
}
