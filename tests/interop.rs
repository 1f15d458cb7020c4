//! Interop with the real tools, from PyPI, in the test virtualenv that
//! scripts/fetch-data.sh makes (scripts/tools/interop_check.py drives them):
//! transformers loads taper's Hugging Face export with the same logits and
//! tokenization, taper starts from a transformers-saved GPT-2 with the same
//! logits, llama.cpp runs taper's GGUF GPT and QLoRA adapters to the
//! same cross-entropy, onnxruntime runs taper's ONNX classifiers to the
//! same logits and accuracy, and pandas reads a CSV file as taper does.

mod common;

use std::path::Path;
use std::process::Command;

use anyhow::{ensure, Result};
use candle_core::{DType, Device, Module, Tensor};
use serde_json::Value;
use taper::engine::ModelSpec;
use taper::interop::saved;
use taper::{Host, HostOptions};

/// A Shakespeare GPT trained briefly, then exported by the recipe.
const RECIPE: &str = r#"
local train = taper.data.shakespeare{ split = "train", context = 48 }:take(32 * 16):shuffle{ seed = 1 }:batch(16)
local run = taper.run{
  model = taper.model.gpt{ vocab = train:vocab_size(), context = 48, width = 48, layers = 2, heads = 4 },
  optim = taper.optim.adamw{ lr = 6e-3 }, data = train, seed = 1,
}
for _ in run:epochs(1) do for b in run:batches() do run:step(b) end end
run:export{ path = "OUT/hf", format = "hf" }
run:export{ path = "OUT/gpt-f32.gguf", format = "gguf", type = "f32" }
run:export{ path = "OUT/gpt-q8_0.gguf", format = "gguf", type = "q8_0" }
"#;

fn check(args: &[&str]) -> Result<Value> {
    check_with("torch, transformers, llama_cpp", args)
}

fn check_with(modules: &str, args: &[&str]) -> Result<Value> {
    common::interop_check(modules, args)
}

/// Runs RECIPE into a fresh folder; returns it.
fn trained() -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    let mut host = Host::new(HostOptions {
        out_dir: Some(dir.path().to_path_buf()),
        quiet: true,
        ..HostOptions::default()
    })?;
    let src = RECIPE.replace("OUT", dir.path().to_str().unwrap());
    host.run_source("interop.lua", &src)?;
    Ok(dir)
}

/// Runs a shipped recipe quietly into `out`, with `set`'s values.
fn shipped(root: &Path, recipe: &str, out: &Path, set: &[(&str, &str)]) -> Result<()> {
    let mut host = Host::new(HostOptions {
        out_dir: Some(out.to_path_buf()),
        quiet: true,
        overrides: set
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..HostOptions::default()
    })?;
    // The recipe names its files relative to the repository.
    std::env::set_current_dir(root)?;
    host.run_file(&root.join(recipe))?;
    Ok(())
}

/// The logits `[t, vocab]` of one sequence through a model.
fn logits(model: &dyn Module, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
    let x = Tensor::new(ids, &Device::Cpu)?.unsqueeze(0)?;
    Ok(model.forward(&x)?.squeeze(0)?.to_vec2()?)
}

fn max_diff(a: &[Vec<f32>], b: &Value) -> f64 {
    let b: Vec<Vec<f64>> = serde_json::from_value(b.clone()).unwrap();
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(p, q)| (*p as f64 - q).abs())
        })
        .fold(0.0, f64::max)
}

const TEXT: &str = "ROMEO:\nBut soft, what light through yonder";

#[test]
fn transformers_loads_the_hf_export_with_the_same_logits_and_tokens() -> Result<()> {
    let dir = trained()?;
    let saved = saved::open(&dir.path().join("checkpoint.safetensors"), &Device::Cpu)?;
    let vocab = saved
        .vocab
        .as_ref()
        .expect("a text run's checkpoint holds its vocabulary");
    let ids = vocab.encode(TEXT)?;
    let ours = logits(saved.trainer.frozen()?.as_ref(), &ids)?;

    let hf = dir.path().join("hf");
    let ids_json = serde_json::to_string(&ids)?;
    let theirs = check(&["hf-logits", hf.to_str().unwrap(), &ids_json])?;
    let diff = max_diff(&ours, &theirs["logits"]);
    eprintln!("largest logit difference, taper vs transformers: {diff:.2e}");
    assert!(diff < 1e-4, "logits differ by {diff}");

    let tokens = check(&["hf-tokenize", hf.to_str().unwrap(), TEXT])?;
    let tokens: Vec<u32> = serde_json::from_value(tokens["ids"].clone())?;
    assert_eq!(tokens, ids, "transformers tokenizes the text differently");
    Ok(())
}

/// A trainer (AdamW) of `spec` on the CPU.
fn trainer(spec: std::sync::Arc<dyn ModelSpec>) -> Result<taper::engine::Trainer> {
    let adamw = taper::engine::optim::OptimSpec::AdamW(Default::default());
    Ok(taper::engine::Trainer::new(
        spec,
        &adamw,
        Default::default(),
    )?)
}

/// transformers' GPT-2 of random weights (vocabulary 80, context 40, width
/// 32, 2 layers, 4 heads), saved under `dir`, and 40 ids to run it on.
fn random_gpt2(dir: &Path) -> Result<(std::path::PathBuf, Vec<u32>)> {
    let model = dir.join("gpt2");
    check(&[
        "hf-random",
        model.to_str().unwrap(),
        "80",
        "40",
        "32",
        "2",
        "4",
    ])?;
    Ok((model, (0..40).map(|i| (i * 37 + 11) % 80).collect()))
}

#[test]
fn taper_starts_from_a_transformers_gpt2_with_the_same_logits() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (model, ids) = random_gpt2(dir.path())?;
    let m = model.to_str().unwrap();
    let theirs = check(&["hf-logits", m, &serde_json::to_string(&ids)?])?;

    let spec = taper::interop::hf::import(&model, None, None)?;
    let trainer = trainer(std::sync::Arc::new(spec))?;
    let ours = logits(trainer.frozen()?.as_ref(), &ids)?;
    let diff = max_diff(&ours, &theirs["logits"]);
    eprintln!("largest logit difference, transformers vs taper: {diff:.2e}");
    assert!(diff < 1e-4, "logits differ by {diff}");

    // Through a recipe: `from`, with a shorter context, trains; and its
    // checkpoint says where it started.
    let bin = dir.path().join("ids.bin");
    let bytes: Vec<u8> = (0..640u16)
        .flat_map(|i| ((i * 7) % 80).to_le_bytes())
        .collect();
    std::fs::write(&bin, bytes)?;
    let src = format!(
        r#"
local data = taper.data.tokens{{ path = "{}", context = 16 }}:batch(8)
local run = taper.run{{ model = taper.model.gpt{{ from = "{m}", context = 16 }}, optim = taper.optim.adamw{{ lr = 1e-3 }}, data = data }}
for _ in run:epochs(1) do for b in run:batches() do run:step(b) end end
"#,
        bin.display()
    );
    let out = dir.path().join("run");
    let mut host = Host::new(HostOptions {
        out_dir: Some(out.clone()),
        quiet: true,
        ..HostOptions::default()
    })?;
    host.run_source("from.lua", &src)?;
    let meta = taper::engine::checkpoint::read_meta(&out.join("checkpoint.safetensors"))?;
    let config = meta.model_config.expect("model config");
    assert_eq!(config["gpt"]["context"], 16);
    // The config's dropout (transformers' 0.1), as transformers would train.
    assert_eq!(config["gpt"]["dropout"], 0.1);
    assert_eq!(config["gpt"]["vocab"], 80);
    assert!(config["gpt"]["from"]
        .as_str()
        .unwrap()
        .ends_with("model.safetensors"));
    Ok(())
}

/// A GPT-2 that transformers saved in shards (`max_shard_size` 20 kB here;
/// transformers 4 shards a model over 5 GB by default, as GPT-2 XL's f32
/// weights, transformers 5 over 50 GB) starts a taper GPT through the
/// shards' index with transformers' logits.
#[test]
fn taper_starts_from_a_sharded_transformers_gpt2() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (model, ids) = random_gpt2(dir.path())?;
    let m = model.to_str().unwrap();
    let theirs = check(&["hf-logits", m, &serde_json::to_string(&ids)?])?;
    let files = check(&["legacy-weights", m, "shards", "20KB"])?;
    eprintln!("{files}");
    let spec = taper::interop::hf::import(&model, None, None)?;
    assert!(
        spec.from
            .as_deref()
            .is_some_and(|f| f.ends_with("model.safetensors.index.json")),
        "{:?} from {files}",
        spec.from
    );
    let trainer = trainer(std::sync::Arc::new(spec))?;
    let ours = logits(trainer.frozen()?.as_ref(), &ids)?;
    let diff = max_diff(&ours, &theirs["logits"]);
    eprintln!("largest logit difference, transformers vs taper: {diff:.2e}");
    assert!(diff < 1e-4, "logits differ by {diff}");
    Ok(())
}

/// transformers' classifier of 3 classes over the real MiniLM, saved to
/// `saved` (its head drawn from seed 0, times 50): three texts' ids, padded
/// as a batch, and its logits for them.
fn bert_classifier(saved: &Path) -> Result<Value> {
    let minilm = common::fetched("data/minilm/model.safetensors")?;
    let texts = serde_json::to_string(&[
        "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition.",
        "It is a truth universally acknowledged!",
        "Short.",
    ])?;
    check(&[
        "bert-classifier",
        minilm.parent().unwrap().to_str().unwrap(),
        saved.to_str().unwrap(),
        "3",
        &texts,
    ])
}

/// A transformers BertForSequenceClassification over the real MiniLM
/// (saved with `bert.` names and its head) computes the same logits in
/// taper as in transformers, for texts of several lengths padded as a batch.
#[test]
fn taper_starts_from_a_transformers_bert_classifier_with_the_same_logits() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let saved = dir.path().join("classifier");
    let theirs = bert_classifier(&saved)?;
    let ids: Vec<Vec<u32>> = serde_json::from_value(theirs["ids"].clone())?;
    let imported = taper::interop::bert::import(&saved, 3, Some(64))?;
    // The file's head is used, not a new one.
    ensure!(imported.notes.is_empty(), "notes: {:?}", imported.notes);
    let trainer = trainer(std::sync::Arc::new(imported.spec))?;
    // Padded further than transformers padded them: the padding is masked.
    let flat: Vec<u32> = ids
        .iter()
        .flat_map(|row| row.iter().copied().chain(std::iter::repeat(0)).take(40))
        .collect();
    let x = Tensor::from_vec(flat, (ids.len(), 40), &Device::Cpu)?;
    let ours: Vec<Vec<f32>> = trainer.frozen()?.forward(&x)?.to_vec2()?;
    let largest = theirs["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap().abs())
        })
        .fold(0.0, f64::max);
    let diff = max_diff(&ours, &theirs["logits"]);
    eprintln!("largest logit {largest:.3}, taper vs transformers: {diff:.2e}");
    ensure!(largest > 0.3, "logits too small to compare: {largest}");
    ensure!(diff < 1e-4, "logits differ by {diff}");
    // A classifier does not generate text: `run:generate` and `taper
    // sample` say so rather than sample from its class scores.
    let e = trainer
        .generate_until(&[101, 2009], 4, None, 0.0, 0, &mut || Ok(()))
        .expect_err("a BERT does not generate");
    ensure!(
        e.to_string().contains("does not predict the next token"),
        "{e}"
    );
    Ok(())
}

/// Text pairs (`taper.data.csv{ text = { "a", "b" } }`) as transformers'
/// tokenizer and classifier take them: `tokenizer(a, b, truncation=True,
/// max_length=24)` (`[CLS] a [SEP] b [SEP]`, the longer text cut first)
/// gives taper's ids, and the classifier with its `token_type_ids` (the
/// second text's type 1) gives taper's logits, whose BERT finds the types
/// from the `[SEP]` of the tokenizer saved beside it.
#[test]
fn text_pairs_read_and_classify_as_in_transformers() -> Result<()> {
    use taper::data::{Column, CsvOptions, Source, TextOptions};
    let minilm = common::fetched("data/minilm/model.safetensors")?;
    let dir = tempfile::tempdir()?;
    let saved = dir.path().join("classifier");
    let pairs = [
        [
            "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed to unite some of the best blessings of existence.",
            "She was rich.",
        ],
        [
            "It is a truth universally acknowledged.",
            "A single man in possession of a good fortune must be in want of a wife, however little known his feelings may be.",
        ],
        ["Short.", "Also \"short\", with a comma."],
    ];
    let theirs = check(&[
        "bert-classifier",
        minilm.parent().unwrap().to_str().unwrap(),
        saved.to_str().unwrap(),
        "3",
        &serde_json::to_string(&pairs)?,
        "24",
    ])?;
    let quoted = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let mut rows = String::from("first,second,label\n");
    for (i, [a, b]) in pairs.iter().enumerate() {
        rows += &format!("{},{},{}\n", quoted(a), quoted(b), i);
    }
    let path = dir.path().join("pairs.csv");
    std::fs::write(&path, rows)?;
    let opts = CsvOptions {
        label: Column::Name("label".into()),
        text: Some(TextOptions {
            columns: vec![Column::Name("first".into()), Column::Name("second".into())],
            tokenizer: saved.join("tokenizer.json"),
            context: 24,
        }),
        ..CsvOptions::default()
    };
    let data = taper::data::csv(&path, &opts)?;
    let (x, _) = data.gather(&[0, 1, 2])?;
    let ours: Vec<Vec<u32>> = x.to_vec2()?;
    let ids: Vec<Vec<u32>> = serde_json::from_value(theirs["ids"].clone())?;
    let unpadded = |rows: &[Vec<u32>]| -> Vec<Vec<u32>> {
        rows.iter()
            .map(|r| r.iter().copied().filter(|&id| id != 0).collect())
            .collect()
    };
    ensure!(
        unpadded(&ours) == unpadded(&ids),
        "taper's ids {ours:?}, transformers' {ids:?}"
    );
    // The first two pairs were cut (the first's first text, the second's
    // second), to 24 ids.
    ensure!(ours[..2].iter().all(|r| !r.contains(&0)), "{ours:?}");
    let types: Vec<Vec<u32>> = serde_json::from_value(theirs["types"].clone())?;
    ensure!(types.iter().all(|t| t.contains(&1)), "{types:?}");

    let imported = taper::interop::bert::import(&saved, 3, Some(24))?;
    ensure!(imported.spec.sep == Some(102), "{:?}", imported.spec.sep);
    let logits = |spec: taper::engine::Bert| -> Result<Vec<Vec<f32>>> {
        let trainer = trainer(std::sync::Arc::new(spec))?;
        Ok(trainer.frozen()?.forward(&x)?.to_vec2()?)
    };
    let diff = max_diff(&logits(imported.spec.clone())?, &theirs["logits"]);
    eprintln!("text pairs: taper vs transformers {diff:.2e}");
    ensure!(diff < 1e-4, "logits differ by {diff}");
    // Every id of type 0 instead: the types matter to these logits.
    let untyped = taper::engine::Bert {
        sep: None,
        ..imported.spec
    };
    let off = max_diff(&logits(untyped)?, &theirs["logits"]);
    ensure!(
        off > 1e-2,
        "without token types the logits moved by {off} only"
    );

    // A run on the pairs (its steps too small to move the weights) keeps
    // their reading in its checkpoint: `taper classify RUN pairs.csv`
    // reads both columns again and names transformers' likeliest classes.
    let run = dir.path().join("run");
    let mut host = taper::Host::new(taper::HostOptions {
        out_dir: Some(run.clone()),
        quiet: true,
        ..taper::HostOptions::default()
    })?;
    let recipe = format!(
        r#"local pairs = taper.data.csv{{ path = {path:?}, text = {{ "first", "second" }}, label = "label",
  tokenizer = {tokenizer:?}, context = 24 }}
local run = taper.run{{
  model = taper.model.bert{{ from = {saved:?}, outputs = 3, dropout = 0 }},
  optim = taper.optim.adamw{{ lr = 1e-12, weight_decay = 0 }}, data = pairs:batch(3),
}}
for _ in run:epochs(1) do for batch in run:batches() do run:step(batch) end end
"#,
        path = path.display().to_string(),
        tokenizer = saved.join("tokenizer.json").display().to_string(),
        saved = saved.display().to_string(),
    );
    host.run_source("pairs.lua", &recipe)?;
    let expected: Vec<Vec<f64>> = serde_json::from_value(theirs["logits"].clone())?;
    let mut named = Vec::new();
    taper::interop::saved::classify_checkpoint(
        &run,
        std::slice::from_ref(&path),
        1,
        &mut |_, answer| {
            if let taper::interop::saved::Answer::Classes(g) = answer {
                named.push(g[0].class.clone());
            }
        },
        &mut |what, why| panic!("{what}: {why}"),
    )?;
    let likeliest: Vec<String> = expected
        .iter()
        .map(|r| {
            let best = (0..r.len()).max_by(|&i, &j| r[i].total_cmp(&r[j])).unwrap();
            format!("class {best}")
        })
        .collect();
    ensure!(
        named == likeliest,
        "classify: {named:?}, transformers: {likeliest:?}"
    );

    // The same BERT in a folder without its tokenizer knows no separator:
    // a run on pairs is refused rather than read every id as type 0.
    let bare = dir.path().join("bare");
    std::fs::create_dir(&bare)?;
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(saved.join(f), bare.join(f))?;
    }
    let e = taper::Host::new(taper::HostOptions {
        out_dir: Some(dir.path().join("bare-run")),
        quiet: true,
        ..taper::HostOptions::default()
    })?
    .run_source(
        "pairs.lua",
        &recipe.replace(
            &format!("from = {:?}", saved.display().to_string()),
            &format!("from = {:?}", bare.display().to_string()),
        ),
    )
    .expect_err("pairs need a separator");
    ensure!(
        format!("{e:#}").contains("pairs.lua:3: taper.run: the data is text pairs")
            && format!("{e:#}").contains("this BERT knows no separator id"),
        "{e:#}"
    );
    Ok(())
}

/// Dropout in training as transformers applies it: over 300 passes in
/// training mode, each logit's mean and spread across the masks are
/// transformers' (whose masks come from torch's generator, so only their
/// distribution can agree). Checked with the pooled output's dropout off,
/// where the encoder's sites make the spread (without the attention
/// weights' dropout, or the attention outputs', it would be about 0.75x;
/// without the embeddings', 0.9x), and on.
#[test]
fn bert_dropout_spreads_the_logits_as_transformers_does() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let saved = dir.path().join("classifier");
    let made = bert_classifier(&saved)?;
    let ids: Vec<Vec<u32>> = serde_json::from_value(made["ids"].clone())?;
    let x = Tensor::from_vec(ids.concat(), (ids.len(), ids[0].len()), &Device::Cpu)?;
    let draws = 300;
    for classifier in [0.0, 0.1] {
        let theirs = check(&[
            "bert-dropout",
            saved.to_str().unwrap(),
            &serde_json::to_string(&ids)?,
            &draws.to_string(),
            &classifier.to_string(),
        ])?;
        let mut spec = taper::interop::bert::import(&saved, 3, None)?.spec;
        spec.classifier_dropout = classifier;
        ensure!(
            (spec.dropout, spec.attention_dropout) == (0.1, 0.1),
            "{spec:?}"
        );
        let passes = training_passes(std::sync::Arc::new(spec), &x, draws)?;
        let (ratios, worst) = spread_against(&passes, &theirs);
        let ratio = ratios.iter().sum::<f64>() / ratios.len() as f64;
        eprintln!(
            "classifier dropout {classifier}: spread {ratio:.3}x transformers' \
             ({ratios:.2?}); means within {worst:.1} standard errors"
        );
        ensure!(
            (0.93..1.07).contains(&ratio),
            "spread {ratio}x transformers'"
        );
        ensure!(
            worst < 4.5,
            "a mean {worst} standard errors from transformers'"
        );
    }
    Ok(())
}

/// `spec`'s outputs for `x` in `draws` passes of training's forward (with
/// dropout; steps 0, 1, ... of seed 1), each flattened.
fn training_passes(
    spec: std::sync::Arc<dyn ModelSpec>,
    x: &Tensor,
    draws: u64,
) -> Result<Vec<Vec<f32>>> {
    let trainer = trainer(spec.clone())?;
    let model = spec.build_train(trainer.params().frozen_builder(DType::F32, &Device::Cpu))?;
    (0..draws)
        .map(|step| {
            let draw = taper::engine::Draw {
                seed: 1,
                step,
                first: 0,
            };
            Ok(model.forward_train(x, draw)?.flatten_all()?.to_vec1()?)
        })
        .collect()
}

/// Each value's spread (standard deviation) over taper's `passes`, as a
/// ratio to transformers' (`theirs`: `mean` and `sd`, flattened, from as
/// many passes), and the largest difference of the means in standard
/// errors.
fn spread_against(passes: &[Vec<f32>], theirs: &Value) -> (Vec<f64>, f64) {
    let n = passes.len() as f64;
    let (mut ratios, mut worst) = (Vec::new(), 0f64);
    for j in 0..passes[0].len() {
        let v: Vec<f64> = passes.iter().map(|p| p[j] as f64).collect();
        let mean = v.iter().sum::<f64>() / n;
        let sd = (v.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        let their_mean = theirs["mean"][j].as_f64().unwrap();
        let their_sd = theirs["sd"][j].as_f64().unwrap();
        let se = ((sd * sd + their_sd * their_sd) / n).sqrt();
        worst = worst.max((mean - their_mean).abs() / se);
        ratios.push(sd / their_sd);
    }
    (ratios, worst)
}

/// GPT-2's dropout in training as transformers applies it (the embeddings'
/// sum, the attention weights, each block's attention and MLP outputs, at
/// the config's 0.1): over 200 passes in training mode, the logits' spread
/// across the masks is transformers' (averaged over the 3,200 logits of 40
/// positions), and each logit's mean agrees.
#[test]
fn gpt2_dropout_spreads_the_logits_as_transformers_does() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (model, ids) = random_gpt2(dir.path())?;
    let m = model.to_str().unwrap();
    let draws = 200;
    let ids_json = serde_json::to_string(&ids)?;
    let theirs = check(&["gpt2-dropout", m, &ids_json, &draws.to_string()])?;
    let spec = std::sync::Arc::new(taper::interop::hf::import(&model, None, None)?);
    ensure!(spec.dropout == 0.1, "the config's rate: {}", spec.dropout);
    let x = Tensor::new(ids.as_slice(), &Device::Cpu)?.unsqueeze(0)?;
    let passes = training_passes(spec, &x, draws)?;
    let (ratios, worst) = spread_against(&passes, &theirs);
    let ratio = ratios.iter().sum::<f64>() / ratios.len() as f64;
    eprintln!("spread {ratio:.3}x transformers'; means within {worst:.1} standard errors");
    ensure!(
        (0.95..1.05).contains(&ratio),
        "spread {ratio}x transformers'"
    );
    ensure!(
        worst < 5.0,
        "a mean {worst} standard errors from transformers'"
    );
    Ok(())
}

/// scripts/minilm_classify.lua, trained briefly, writes its classifier for
/// transformers: it loads with no weight missing or left over, its
/// tokenizer and model give taper's logits within 1e-4, and the pipeline
/// names the classes; it takes a text longer than the run's context too
/// (the export keeps the original positions after those it trained).
#[test]
fn transformers_runs_the_minilm_classifier_export_as_taper_does() -> Result<()> {
    common::fetched("data/minilm/tokenizer.json")?;
    common::fetched("data/austen/test.csv")?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir()?;
    let export = dir.path().join("classifier");
    shipped(
        root,
        "scripts/minilm_classify.lua",
        dir.path(),
        &[
            ("rows", "64"),
            ("test_rows", "16"),
            ("epochs", "1"),
            ("context", "48"),
            ("export", export.to_str().unwrap()),
        ],
    )?;
    let long = "She was convinced that he had been the cause of it all, and that his regard for her, which she had once believed steady and sincere, had given way to the persuasions of his sisters and the coldness of his friend, whose influence over him she could not but lament.";
    let texts = serde_json::to_string(&[
        "Emma Woodhouse, handsome, clever, and rich.",
        "Mr. Darcy bowed.",
        long,
    ])?;
    let theirs = check(&["bert-pipeline", export.to_str().unwrap(), &texts])?;
    let ids: Vec<Vec<u32>> = serde_json::from_value(theirs["ids"].clone())?;
    ensure!(ids[2].len() > 48, "the long text is {} ids", ids[2].len());
    let saved = saved::open(&saved::locate(dir.path())?, &Device::Cpu)?;
    let model = saved.trainer.frozen()?;
    let classes = saved.meta.classes.clone().expect("class names");
    for (i, row) in ids.iter().enumerate() {
        // taper's model takes its context: the first 47 ids and [SEP].
        let mut row: Vec<u32> = row.iter().copied().filter(|&id| id != 0).collect();
        let cut = row.len() > 48;
        if cut {
            row.truncate(47);
            row.push(102);
        }
        let x = Tensor::from_vec(row.clone(), (1, row.len()), &Device::Cpu)?;
        let ours: Vec<Vec<f32>> = model.forward(&x)?.to_vec2()?;
        let best = (0..ours[0].len())
            .max_by(|&a, &b| ours[0][a].total_cmp(&ours[0][b]))
            .unwrap();
        if cut {
            // transformers saw the whole text; taper's run, its context.
            eprintln!("text {i}: {} ids, past taper's context", ids[i].len());
            continue;
        }
        let diff = max_diff(&ours, &Value::Array(vec![theirs["logits"][i].clone()]));
        eprintln!("text {i}: logits differ by {diff:.2e}; {}", classes[best]);
        ensure!(diff < 1e-4, "text {i}: logits differ by {diff}");
        ensure!(theirs["labels"][i] == classes[best].as_str(), "{theirs}");
    }
    Ok(())
}

/// A transformers config taper's GPT is not: a clear error naming the file.
#[test]
fn a_gpt2_variant_taper_cannot_run_is_refused_by_name() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = serde_json::json!({
        "model_type": "gpt2", "vocab_size": 10, "n_positions": 8, "n_embd": 8,
        "n_layer": 1, "n_head": 2, "activation_function": "relu",
    });
    std::fs::write(dir.path().join("config.json"), config.to_string())?;
    std::fs::write(dir.path().join("model.safetensors"), b"")?;
    let e = taper::interop::hf::import(dir.path(), None, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("config.json") && e.contains("activation_function `relu`"),
        "{e}"
    );
    Ok(())
}

/// Mean cross-entropy of each next id under these logits, in f64.
fn cross_entropy(logits: &[Vec<f32>], ids: &[u32]) -> f64 {
    let n = ids.len() - 1;
    (0..n)
        .map(|i| log_sum_exp(&logits[i]) - logits[i][ids[i + 1] as usize] as f64)
        .sum::<f64>()
        / n as f64
}

/// The first held-out window of the Shakespeare validation split.
fn held_out(context: usize) -> Result<Vec<u32>> {
    use taper::data::Source;
    let val = taper::data::shakespeare("val", context - 1, None)?;
    let (x, y) = val.gather(&[0])?;
    let mut ids: Vec<u32> = x.squeeze(0)?.to_vec1()?;
    ids.push(*y.squeeze(0)?.to_vec1::<u32>()?.last().unwrap());
    Ok(ids)
}

#[test]
fn llama_cpp_runs_the_gguf_gpt_to_tapers_perplexity() -> Result<()> {
    let dir = trained()?;
    let saved = saved::open(&dir.path().join("checkpoint.safetensors"), &Device::Cpu)?;
    let ids = held_out(48)?;
    let ours = cross_entropy(&logits(saved.trainer.frozen()?.as_ref(), &ids)?, &ids);
    let vocab = saved.vocab.as_ref().unwrap();
    let text = vocab.decode(&ids);
    for (file, tolerance) in [("gpt-f32.gguf", 0.01), ("gpt-q8_0.gguf", 0.01)] {
        let path = dir.path().join(file);
        let theirs = check(&[
            "llama",
            path.to_str().unwrap(),
            &serde_json::to_string(&ids)?,
            "--text",
            &text,
        ])?;
        let ce = theirs["ce"].as_f64().unwrap();
        let ratio = (ce - ours).exp();
        eprintln!(
            "{file}: llama.cpp cross-entropy {ce:.5}, taper {ours:.5}: perplexity ratio {ratio:.5}"
        );
        assert!(
            (ratio - 1.0).abs() < tolerance,
            "{file}: perplexity ratio {ratio}"
        );
        // llama.cpp's own tokenizer, from the file, splits the text as taper.
        let tokens: Vec<u32> = serde_json::from_value(theirs["tokens"].clone())?;
        assert_eq!(tokens, ids, "{file}: llama.cpp tokenizes differently");
    }
    Ok(())
}

/// scripts/smollm2_qlora.lua trains adapters on every block of SmolLM2-135M
/// and exports them; llama.cpp runs the original file with the adapter, and
/// the merged model alone, to taper's cross-entropy.
///
/// Two forwards of a 4-bit model do not agree to the last digit: each
/// quantizes its activations to 8 bits, and a rounding that flips moves a
/// 32-token cross-entropy by 0.01-0.04 (the base model alone in llama.cpp,
/// its K/V cache in f16 or f32: 0.013 apart). So the test measures on two
/// windows the adapter was trained on, where it moves the loss by more than
/// a nat, and compares what the adapter changes: each position's
/// log-probabilities of the window's ids, taper's against llama.cpp's base
/// model, and llama.cpp's with the adapter (or merged) against the same.
/// A cross-entropy alone would not do: it is flat near the trained adapter,
/// and with the adapter's scale 30% off it moved by only 0.04.
#[test]
fn llama_cpp_runs_the_qlora_adapter_and_the_merged_model() -> Result<()> {
    let tokenizer = common::fetched("data/smollm2/tokenizer.json")?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir()?;
    let exported = dir.path().join("export");
    let set = [
        ("steps", "3"),
        ("batch", "2"),
        ("context", "32"),
        ("lr", "1e-2"),
        ("val_windows", "2"),
        ("export", exported.to_str().unwrap()),
    ];
    shipped(root, "scripts/smollm2_qlora.lua", dir.path(), &set)?;
    // The same adapters for PEFT (checked in transformers by the chat test).
    for f in ["adapter_model.safetensors", "adapter_config.json"] {
        ensure!(exported.join("peft").join(f).exists(), "no peft/{f}");
    }
    let saved = saved::open(&dir.path().join("checkpoint.safetensors"), &Device::Cpu)?;
    let model = saved.trainer.frozen()?;

    // The recipe trains on the first steps x batch windows of its text (then
    // shuffled): windows 0 and 1 are among them.
    use taper::data::Source;
    let text = root.join("src/data/builtin/shakespeare.txt.gz");
    let train = taper::data::text(&text, Some(&tokenizer), "train", 32, None, 0.1)?;
    let base = root.join("data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let adapter = exported.join("adapter.gguf");
    let merged = exported.join("merged-q8_0.gguf");
    let runs: [(&str, &Path, Option<&Path>); 3] = [
        ("base", &base, None),
        ("base + adapter", &base, Some(&adapter)),
        ("merged q8_0", &merged, None),
    ];
    // Per run: the mean cross-entropy, and every log-probability in a row.
    let (mut ours, mut theirs) = ((0.0, vec![]), vec![(0.0, vec![]); 3]);
    for window in [0, 1] {
        let (x, _) = train.gather(&[window])?;
        let ids: Vec<u32> = x.squeeze(0)?.to_vec1()?;
        let rows = logits(model.as_ref(), &ids)?;
        ours.0 += cross_entropy(&rows, &ids) / 2.0;
        ours.1.extend(log_probs(&rows, &ids));
        let ids_json = serde_json::to_string(&ids)?;
        for ((_, file, lora), run) in runs.iter().zip(&mut theirs) {
            let mut args = vec!["llama", file.to_str().unwrap(), &ids_json];
            if let Some(l) = lora {
                args.extend(["--lora", l.to_str().unwrap()]);
            }
            let out = check(&args)?;
            run.0 += out["ce"].as_f64().unwrap() / 2.0;
            let rows: Vec<Vec<f64>> = serde_json::from_value(out["logprobs"].clone())?;
            run.1.extend(rows.into_iter().flatten());
        }
    }
    let moved = theirs[0].0 - ours.0;
    eprintln!(
        "cross-entropy: taper {:.5}, llama.cpp's base model {:.5}",
        ours.0, theirs[0].0
    );
    assert!(
        moved > 0.5,
        "the adapter moved the loss on its training windows by only {moved:.4}"
    );
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|d| d * d).sum::<f64>().sqrt();
    let change =
        |lp: &[f64]| -> Vec<f64> { lp.iter().zip(&theirs[0].1).map(|(a, b)| a - b).collect() };
    let ours_change = change(&ours.1);
    let size = norm(&mut ours_change.iter().copied());
    for ((what, ..), (ce, lp)) in runs.iter().zip(&theirs).skip(1) {
        let miss = norm(&mut change(lp).iter().zip(&ours_change).map(|(a, b)| a - b)) / size;
        eprintln!(
            "{what}: llama.cpp's cross-entropy {ce:.5}; it misses {:.1}% of the adapter's change",
            100.0 * miss
        );
        assert!(
            miss < 0.1,
            "{what}: llama.cpp misses {:.1}% of the adapter's change in log-probabilities",
            100.0 * miss
        );
        assert!(
            (ce - ours.0).abs() < 0.05,
            "{what}: llama.cpp's cross-entropy {ce:.4}, taper's {:.4}",
            ours.0
        );
    }
    Ok(())
}

/// Each position's log-probabilities of the sequence's ids, in a row.
fn log_probs(logits: &[Vec<f32>], ids: &[u32]) -> Vec<f64> {
    logits
        .iter()
        .flat_map(|row| {
            let lse = log_sum_exp(row);
            ids.iter().map(move |&t| row[t as usize] as f64 - lse)
        })
        .collect()
}

/// `log Σ exp` of a row of logits, in f64.
fn log_sum_exp(row: &[f32]) -> f64 {
    let top = row.iter().fold(f64::MIN, |m, &x| m.max(x as f64));
    top + row
        .iter()
        .map(|&x| (x as f64 - top).exp())
        .sum::<f64>()
        .ln()
}

/// A GPT on BPE-tokenized text (SmolLM2's tokenizer.json): the GGUF file
/// carries the tokenizer's vocabulary, merges and pre-tokenizer (`smollm`:
/// digits one by one), and llama.cpp splits text into taper's ids.
#[test]
fn llama_cpp_tokenizes_a_bpe_gpt_export_as_taper() -> Result<()> {
    let tokenizer = common::fetched("data/smollm2/tokenizer.json")?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir()?;
    let src = format!(
        r#"
local function text(split)
  return taper.data.text{{ path = "{}", tokenizer = "{}", context = 32, split = split }}
end
local train = text("train"):take(64):batch(16)
local run = taper.run{{
  model = taper.model.gpt{{ vocab = train:vocab_size(), context = 32, width = 32, layers = 1, heads = 2 }},
  optim = taper.optim.adamw{{ lr = 3e-3 }}, data = train, seed = 1,
}}
for _ in run:epochs(1) do for b in run:batches() do run:step(b) end end
run:export{{ path = "{}", type = "f32" }}
"#,
        root.join("src/data/builtin/shakespeare.txt.gz").display(),
        tokenizer.display(),
        dir.path().join("bpe.gguf").display()
    );
    let mut host = Host::new(HostOptions {
        out_dir: Some(dir.path().join("run")),
        quiet: true,
        ..HostOptions::default()
    })?;
    host.run_source("bpe.lua", &src)?;
    let saved = saved::open(&dir.path().join("run/checkpoint.safetensors"), &Device::Cpu)?;
    let vocab = saved.vocab.as_ref().unwrap();
    let text = "ROMEO:\nIn 1597, Act 2: 'tis 42 o'clock, what light  breaks?\n\n";
    let ids = vocab.encode(text)?;
    let ours = cross_entropy(&logits(saved.trainer.frozen()?.as_ref(), &ids)?, &ids);
    let gguf = dir.path().join("bpe.gguf");
    let theirs = check(&[
        "llama",
        gguf.to_str().unwrap(),
        &serde_json::to_string(&ids)?,
        "--text",
        text,
    ])?;
    let tokens: Vec<u32> = serde_json::from_value(theirs["tokens"].clone())?;
    assert_eq!(tokens, ids, "llama.cpp tokenizes differently");
    let ratio = (theirs["ce"].as_f64().unwrap() - ours).exp();
    eprintln!("BPE GPT: perplexity ratio llama.cpp / taper {ratio:.5}");
    assert!((ratio - 1.0).abs() < 0.01, "perplexity ratio {ratio}");
    Ok(())
}

/// An image folder as torchvision's `ImageFolder` reads it, with
/// `Resize((16, 16))` and `ToTensor()`, and with `Grayscale()` after the
/// resize (scripts/tools/image_folder.py, with Pillow): the same classes,
/// order and labels; the pixels within 1/255 of Pillow's (resizing rounds
/// differently), and within 8/255 for JPEG, whose decoders differ (libjpeg
/// and zune-jpeg; 5/255 at most here, 0.42/255 on average).
#[test]
fn an_image_folder_reads_as_torchvision_imagefolder() -> Result<()> {
    use taper::data::Source;
    let dir = tempfile::tempdir()?;
    let python = common::test_python("PIL")?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(python)
        .arg(root.join("scripts/tools/image_folder.py"))
        .args([dir.path().to_str().unwrap(), "16", "16"])
        .output()?;
    ensure!(
        out.status.success(),
        "image_folder.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want: Value = serde_json::from_slice(&out.stdout)?;
    let samples = want["samples"].as_array().unwrap();
    for channels in [3, 1] {
        let src = taper::data::images(dir.path(), Some((16, 16)), channels, 255.0, "all")?;
        let classes: Vec<String> = serde_json::from_value(want["classes"].clone())?;
        assert_eq!(src.classes(), classes);
        assert_eq!(src.len(), samples.len());
        let (x, y) = src.gather(&(0..src.len()).collect::<Vec<_>>())?;
        let (x, y) = (x.to_vec2::<f32>()?, y.to_vec1::<u32>()?);
        for (i, s) in samples.iter().enumerate() {
            let path = s["path"].as_str().unwrap();
            assert_eq!(y[i] as u64, s["label"].as_u64().unwrap(), "{path}");
            let key = if channels == 3 { "rgb" } else { "grey" };
            let want: Vec<f64> = serde_json::from_value(s[key].clone())?;
            let diffs: Vec<f64> = x[i]
                .iter()
                .zip(&want)
                .map(|(a, b)| (*a as f64 - b).abs() * 255.0)
                .collect();
            let mean = diffs.iter().sum::<f64>() / diffs.len() as f64;
            let max = diffs.iter().cloned().fold(0.0, f64::max);
            // Measured: PNG and BMP at most 1/255 (rounding; 0 for the
            // 16x16 BMP, not resized), mean 0.2/255; JPEG 5/255, mean 0.42/255.
            let jpeg = path.ends_with(".jpg") || path.ends_with(".jpeg");
            let (max_ok, mean_ok) = if jpeg { (8.0, 0.6) } else { (1.0001, 0.25) };
            assert!(
                max <= max_ok && mean < mean_ok,
                "{path} {key}: max {max:.2}/255, mean {mean:.3}/255 from Pillow's"
            );
        }
    }
    Ok(())
}

/// `taper classify RUN CSV`, which succeeded.
fn classify_rows(run: &Path, csv: &Path) -> Result<std::process::Output> {
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .arg("classify")
        .arg(run)
        .arg(csv)
        .output()?;
    ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    Ok(o)
}

/// `taper export RUN --format onnx --out MODEL`.
fn export_onnx(run: &Path, model: &Path) -> Result<()> {
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .arg("export")
        .arg(run)
        .args(["--format", "onnx", "--out"])
        .arg(model)
        .output()?;
    ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    Ok(())
}

/// `x` as interop_check.py reads an input: JSON of its shape and values.
fn input_json(x: &Tensor) -> Result<tempfile::NamedTempFile> {
    let input = tempfile::NamedTempFile::new()?;
    let data: Vec<f32> = x.flatten_all()?.to_vec1()?;
    std::fs::write(
        input.path(),
        serde_json::to_string(&serde_json::json!({ "shape": x.dims(), "data": data }))?,
    )?;
    Ok(input)
}

/// A CNN with each activation computes the logits of the PyTorch model the
/// reference describes (interop_check.py torch-cnn: `Conv2d`, the
/// activation and `MaxPool2d(2)` per stage, `Flatten`, then `Linear`
/// layers with the activation between them), given taper's weights: within
/// 1e-5, relative to the largest. An odd size checks the pool's floor; the
/// stages of PyTorch's MNIST example (3x3 without padding, one pool after
/// the second) and of its CIFAR-10 tutorial (5x5 without padding), each
/// activation too.
#[test]
fn a_cnn_computes_the_pytorch_model_its_reference_describes() -> Result<()> {
    use std::sync::Arc;
    use taper::engine::optim::OptimSpec;
    use taper::engine::{Activation, Cnn, ModelSpec, Trainer, TrainerOptions};
    let dir = tempfile::tempdir()?;
    let shapes = [
        ([3, 9, 7], 3, None, None),
        ([1, 12, 12], 3, Some(0), Some(vec![false, true])),
        ([3, 16, 16], 5, Some(0), None),
    ];
    // Each model's logits here, and the files PyTorch's side reads (all in
    // one run of the tools).
    let (mut cases, mut calls) = (Vec::new(), Vec::new());
    for (i, (activation, (input, kernel, padding, pool))) in [
        Activation::Relu,
        Activation::Gelu,
        Activation::Tanh,
        Activation::Silu,
    ]
    .into_iter()
    .flat_map(|a| shapes.clone().map(|s| (a, s)))
    .enumerate()
    {
        let spec = Cnn {
            input,
            channels: vec![4, 6],
            hidden: vec![8],
            outputs: 5,
            activation,
            dropout: 0.0.into(),
            kernel,
            padding,
            pool,
        };
        let options = serde_json::to_string(&spec)?;
        let spec: Arc<dyn ModelSpec> = Arc::new(spec);
        let trainer = Trainer::new(
            spec.clone(),
            &OptimSpec::AdamW(Default::default()),
            TrainerOptions::default(),
        )?;
        let x = Tensor::randn(
            0f32,
            1.0,
            vec![3, input[0], input[1], input[2]],
            &Device::Cpu,
        )?;
        let ours = trainer.frozen()?.forward(&x)?.to_vec2::<f32>()?;
        let weights = dir.path().join(format!("cnn{i}.safetensors"));
        candle_core::safetensors::save(&trainer.params().tensors(), &weights)?;
        let input = input_json(&x)?;
        calls.push(vec![
            "torch-cnn".to_string(),
            weights.to_string_lossy().into_owned(),
            options,
            input.path().to_string_lossy().into_owned(),
        ]);
        cases.push((format!("{activation:?}, {}", spec.describe()), ours, input));
    }
    let results = common::interop_checks("torch", &calls)?;
    for ((what, ours, _input), theirs) in cases.iter().zip(&results) {
        let largest = ours.iter().flatten().fold(1f32, |m, v| m.max(v.abs())) as f64;
        let diff = max_diff(ours, &theirs["logits"]) / largest;
        eprintln!("{what}: logits differ from PyTorch's by {diff:.1e} (relative)");
        assert!(diff < 1e-5, "{what}: logits differ by {diff}");
    }
    Ok(())
}

/// MLPs and CNNs with each activation, exported as ONNX: onnx's full check
/// (with shape inference) passes each, and onnxruntime's logits are
/// taper's within 1e-5 (relative to the largest), for a CNN input as
/// `[batch, channels, height, width]`, odd sizes included (a pool drops
/// the last row or column, as taper's does).
#[test]
fn onnxruntime_runs_the_onnx_export_with_the_same_logits() -> Result<()> {
    use std::sync::Arc;
    use taper::engine::optim::OptimSpec;
    use taper::engine::{Activation, Cnn, Mlp, ModelSpec, Trainer, TrainerOptions};
    let dir = tempfile::tempdir()?;
    let mut nets: Vec<(Arc<dyn ModelSpec>, Vec<usize>)> = vec![(
        Arc::new(Cnn {
            input: [2, 5, 3],
            channels: vec![],
            hidden: vec![],
            outputs: 3,
            activation: Activation::Relu,
            dropout: 0.0.into(),
            kernel: 3,
            padding: None,
            pool: None,
        }),
        vec![4, 2, 5, 3],
    )];
    for activation in [
        Activation::Relu,
        Activation::Gelu,
        Activation::Tanh,
        Activation::Silu,
    ] {
        nets.push((
            Arc::new(Mlp {
                inputs: 12,
                hidden: vec![10, 7],
                outputs: 5,
                activation,
                dropout: 0.0,
            }),
            vec![3, 12],
        ));
        nets.push((
            Arc::new(Cnn {
                input: [3, 9, 7],
                channels: vec![4, 6],
                hidden: vec![8],
                outputs: 5,
                activation,
                dropout: 0.0.into(),
                kernel: 3,
                padding: None,
                pool: None,
            }),
            vec![3, 3, 9, 7],
        ));
    }
    // Other kernels: 5x5 without padding (PyTorch's CIFAR-10 tutorial net
    // in small), an even 4x4 with padding 1, and PyTorch's MNIST example's
    // stages (3x3 without padding, one pool after the second).
    for (input, kernel, padding, pool) in [
        ([3, 16, 16], 5, 0, None),
        ([3, 9, 7], 4, 1, None),
        ([1, 12, 12], 3, 0, Some(vec![false, true])),
    ] {
        nets.push((
            Arc::new(Cnn {
                input,
                channels: vec![4, 6],
                hidden: vec![8],
                outputs: 5,
                activation: Activation::Relu,
                dropout: 0.0.into(),
                kernel,
                padding: Some(padding),
                pool,
            }),
            vec![3, input[0], input[1], input[2]],
        ));
    }
    // Each export's logits here, and onnxruntime's (all in one run of the
    // tools).
    let (mut cases, mut calls) = (Vec::new(), Vec::new());
    for (i, (spec, shape)) in nets.into_iter().enumerate() {
        let describe = spec.describe();
        let trainer = Trainer::new(
            spec.clone(),
            &OptimSpec::AdamW(Default::default()),
            TrainerOptions::default(),
        )?;
        let x = Tensor::randn(0f32, 1.0, shape, &Device::Cpu)?;
        let ours = trainer.frozen()?.forward(&x)?.to_vec2::<f32>()?;
        let path = dir.path().join(format!("m{i}.onnx"));
        let model = taper::interop::Model {
            spec: spec.as_ref(),
            params: trainer.params().tensors(),
            vocab: None,
            classes: None,
            image_input: None,
            table_input: None,
            sample_input: None,
            array_input: None,
            multi_label: false,
            step: 7,
        };
        let ty = taper::quant::ExportFormat::parse("f32").unwrap();
        taper::interop::export(&model, &path, "onnx", ty, false)?;
        let input = input_json(&x)?;
        calls.push(vec![
            "onnx-logits".to_string(),
            path.to_string_lossy().into_owned(),
            input.path().to_string_lossy().into_owned(),
        ]);
        cases.push((describe, ours, input));
    }
    let results = common::interop_checks("onnx, onnxruntime", &calls)?;
    for ((describe, ours, _input), theirs) in cases.iter().zip(&results) {
        let largest = ours.iter().flatten().fold(1f32, |m, v| m.max(v.abs())) as f64;
        let diff = max_diff(ours, &theirs["logits"]) / largest;
        eprintln!(
            "{describe}: opset {}, logits differ by {diff:.1e} (relative)",
            theirs["opset"]
        );
        assert!(diff < 1e-5, "{describe}: logits differ by {diff}");
        assert_eq!(theirs["metadata"]["taper.model"], describe.as_str());
        assert_eq!(theirs["metadata"]["taper.step"], "7");
    }
    Ok(())
}

/// The image folder recipe, trained briefly, exporting ONNX at its end (its
/// kept best model: one epoch, so the one evaluation's); `taper export
/// --format onnx` of `OUT/best.safetensors` writes the same bytes.
/// onnxruntime, fed the val PNGs as a user reads them with Pillow and
/// naming classes from the model's metadata, scores the accuracy taper's
/// evaluation recorded.
#[test]
fn onnxruntime_classifies_an_image_folder_as_the_run_did() -> Result<()> {
    classifies_as_the_run_did(false)
}

/// The same with the images standardized per channel by the training
/// images' statistics: the checkpoint keeps them, `taper classify` applies
/// them, and the ONNX graph does (`Sub`, `Div`), so onnxruntime is still fed
/// the pixels as Pillow reads them, divided by the scale.
#[test]
fn onnxruntime_classifies_a_standardized_image_folder_as_the_run_did() -> Result<()> {
    classifies_as_the_run_did(true)
}

fn classifies_as_the_run_did(standardize: bool) -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    common::fetched("data/fashion-mnist-png/val/bag")?;
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("run");
    let taper = |args: &[&str]| -> Result<()> {
        let o = Command::new(env!("CARGO_BIN_EXE_taper"))
            .args(args)
            .current_dir(root)
            .output()?;
        ensure!(
            o.status.success(),
            "taper {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Ok(())
    };
    taper(&[
        "train",
        "scripts/image_folder.lua",
        "--quiet",
        "--set",
        "epochs=1",
        "--set",
        "train_samples=2000",
        "--set",
        &format!("standardize={standardize}"),
        "--set",
        &format!("export={}", dir.path().join("recipe.onnx").display()),
        "--out",
        out.to_str().unwrap(),
    ])?;
    let eval = common::records(&out, "eval");
    let accuracy = eval.last().expect("the recipe evaluates")["accuracy"]
        .as_f64()
        .unwrap();
    let model = dir.path().join("fashion.onnx");
    export_onnx(&out.join("best.safetensors"), &model)?;
    ensure!(
        std::fs::read(&model)? == std::fs::read(dir.path().join("recipe.onnx"))?,
        "the recipe's export and the best model's differ"
    );
    let val = root.join("data/fashion-mnist-png/val");
    let theirs = check_with(
        "onnx, onnxruntime, PIL",
        &[
            "onnx-classify",
            model.to_str().unwrap(),
            val.to_str().unwrap(),
        ],
    )?;
    eprintln!(
        "val accuracy: taper {accuracy}, onnxruntime {}",
        theirs["accuracy"]
    );
    assert_eq!(theirs["images"], 2000);
    assert_eq!(theirs["classes"][0], "ankle-boot");
    // One image in 2,000 may fall the other way on a rounding difference.
    let diff = (theirs["accuracy"].as_f64().unwrap() - accuracy).abs();
    assert!(
        diff <= 0.0005 + 1e-9,
        "accuracy {accuracy} against {}",
        theirs["accuracy"]
    );
    assert!(
        accuracy > 0.5,
        "{accuracy}: the run did not learn (measured 0.643)"
    );
    // Class by class: the eval record's confusion matrix, macro F1 and
    // balanced accuracy against NumPy's over onnxruntime's predictions
    // (within the one image that may fall the other way).
    let last = eval.last().unwrap();
    let ours: Vec<Vec<i64>> = serde_json::from_value(last["confusion"].clone())?;
    let want: Vec<Vec<i64>> = serde_json::from_value(theirs["confusion"].clone())?;
    let moved: i64 = ours
        .iter()
        .flatten()
        .zip(want.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .sum();
    assert!(moved <= 2, "confusion {ours:?} against {want:?}");
    for key in ["macro_f1", "balanced_accuracy"] {
        let (a, b) = (last[key].as_f64().unwrap(), theirs[key].as_f64().unwrap());
        eprintln!("{key}: taper {a}, numpy {b}");
        assert!((a - b).abs() <= 0.002, "{key}: taper {a}, numpy {b}");
    }
    let per_class = last["per_class"].as_array().unwrap();
    assert_eq!(per_class.len(), 10);
    assert_eq!(per_class[0]["class"], "ankle-boot");

    // `taper classify` reads the files as the run did: its answers score
    // the same accuracy, to the image.
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(["classify", out.to_str().unwrap(), val.to_str().unwrap()])
        .output()?;
    ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines = String::from_utf8(o.stdout)?;
    let right = lines
        .lines()
        .filter(|l| {
            let (file, answer) = l.rsplit_once(": ").unwrap();
            let class = Path::new(file).parent().unwrap().file_name().unwrap();
            answer.split(' ').next() == class.to_str()
        })
        .count();
    assert_eq!(lines.lines().count(), 2000);
    assert_eq!(
        right as f64 / 2000.0,
        accuracy,
        "taper classify against the run's eval"
    );
    // Its answers make the eval record's confusion matrix, to the image.
    let names: Vec<String> = serde_json::from_value(theirs["classes"].clone())?;
    let at = |name: &str| names.iter().position(|n| n == name).unwrap();
    let mut confusion = vec![vec![0i64; names.len()]; names.len()];
    for l in lines.lines() {
        let (file, answer) = l.rsplit_once(": ").unwrap();
        let class = Path::new(file).parent().unwrap().file_name().unwrap();
        confusion[at(class.to_str().unwrap())][at(answer.split(' ').next().unwrap())] += 1;
    }
    assert_eq!(confusion, ours, "taper classify against the eval record");
    Ok(())
}

/// The penguins CSV as pandas reads it (`dropna` over the columns used,
/// labels coded by sorted class name) and NumPy standardizes it in f64: the
/// same rows, labels and classes, and features within 1e-5.
#[test]
fn a_csv_file_reads_and_standardizes_as_pandas_and_numpy_do() -> Result<()> {
    use std::sync::Arc;
    use taper::data::{csv, Column, CsvOptions, Missing, Pipeline, Source, Stats};

    let path = common::fetched("data/penguins/penguins.csv")?;
    let features = [
        "bill_length_mm",
        "bill_depth_mm",
        "flipper_length_mm",
        "body_mass_g",
    ];
    let table = csv(
        &path,
        &CsvOptions {
            label: Column::Name("species".into()),
            features: Some(features.map(|f| Column::Name(f.into())).to_vec()),
            missing: Missing::Drop,
            ..CsvOptions::default()
        },
    )?;
    let theirs = check_with(
        "pandas, numpy",
        &[
            "csv-standardize",
            path.to_str().unwrap(),
            "species",
            &serde_json::to_string(&features)?,
        ],
    )?;
    assert_eq!(theirs["dropped"], table.dropped().len());
    let classes: Vec<String> = serde_json::from_value(theirs["classes"].clone())?;
    assert_eq!(table.classes(), Some(&classes[..]));
    let data = Pipeline::new(Arc::new(table)).standardize(Stats::Own)?;
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for b in data.epoch(1, 100, 0) {
        let b = b?;
        xs.extend(b.x.to_vec2::<f32>()?);
        ys.extend(b.y.to_vec1::<u32>()?);
    }
    let labels: Vec<u32> = serde_json::from_value(theirs["labels"].clone())?;
    assert_eq!(ys, labels);
    let want: Vec<Vec<f64>> = serde_json::from_value(theirs["x"].clone())?;
    assert_eq!(xs.len(), want.len());
    let worst = xs
        .iter()
        .flatten()
        .zip(want.iter().flatten())
        .map(|(a, b)| (*a as f64 - b).abs())
        .fold(0.0, f64::max);
    eprintln!("{} rows, largest difference {worst:e}", xs.len());
    assert!(worst < 1e-5, "{worst}");
    Ok(())
}

/// Columns of categories (`categorical`) as pandas' `get_dummies` encodes
/// them, in place among the features: the same input names (`color_blue`),
/// the same categories in the same order (a column of numbers by value: 9,
/// 10, 100; text by code point), and, standardized, the numbers at mean 0
/// and deviation 1 while the one-hot inputs stay 0 and 1 (scikit-learn's
/// ColumnTransformer with a StandardScaler on the numbers).
#[test]
fn columns_of_categories_read_as_pandas_get_dummies() -> Result<()> {
    use std::sync::Arc;
    use taper::data::{csv, Column, CsvOptions, Missing, Pipeline, Source, Stats};

    let dir = tempfile::tempdir()?;
    let path = dir.path().join("shop.csv");
    let mut text = String::from("price,color,size,weight,kind\n");
    let colors = ["red", "blue", "\"dark, red\"", "Green", "blue"];
    for i in 0..40 {
        let color = if i == 7 { "" } else { colors[i % 5] };
        let size = [100, 9, 10][i % 3];
        let weight = 0.5 + (i * 37 % 11) as f64 / 4.0;
        text += &format!("{}.25,{color},{size},{weight},k{}\n", i * 3 % 17, i % 2);
    }
    std::fs::write(&path, text)?;
    let features = ["price", "color", "size", "weight"];
    let categorical = ["color", "size"];
    let table = csv(
        &path,
        &CsvOptions {
            label: Column::Name("kind".into()),
            features: Some(features.map(|f| Column::Name(f.into())).to_vec()),
            categorical: categorical.map(|c| (Column::Name(c.into()), None)).to_vec(),
            missing: Missing::Drop,
            ..CsvOptions::default()
        },
    )?;
    let theirs = check_with(
        "pandas, numpy",
        &[
            "csv-dummies",
            path.to_str().unwrap(),
            "kind",
            &serde_json::to_string(&features)?,
            &serde_json::to_string(&categorical)?,
        ],
    )?;
    let input = table.table_input().expect("a CSV file's reading");
    let names: Vec<String> = serde_json::from_value(theirs["names"].clone())?;
    assert_eq!(input.input_names(), names);
    assert_eq!(table.width(), names.len());
    assert_eq!(
        table.dropped().iter().map(|p| p.line()).collect::<Vec<_>>(),
        [9]
    );
    assert!(
        table.describe().contains("2 columns of categories"),
        "{}",
        table.describe()
    );
    let rows = |data: &Pipeline| -> Result<Vec<Vec<f32>>> {
        let mut xs = Vec::new();
        for b in data.epoch(1, 16, 0) {
            xs.extend(b?.x.to_vec2::<f32>()?);
        }
        Ok(xs)
    };
    let worst = |ours: &[Vec<f32>], want: &Value| -> Result<f64> {
        let want: Vec<Vec<f64>> = serde_json::from_value(want.clone())?;
        assert_eq!(ours.len(), want.len());
        Ok(ours
            .iter()
            .flatten()
            .zip(want.iter().flatten())
            .map(|(a, b)| (*a as f64 - b).abs())
            .fold(0.0, f64::max))
    };
    let data = Pipeline::new(Arc::new(table));
    let raw = rows(&data)?;
    assert_eq!(raw.len() as u64, theirs["rows"].as_u64().unwrap());
    assert_eq!(worst(&raw, &theirs["x"])?, 0.0, "the raw inputs");
    let z = rows(&data.standardize(Stats::Own)?)?;
    let diff = worst(&z, &theirs["z"])?;
    eprintln!(
        "{} rows of {} inputs, standardized within {diff:e}",
        z.len(),
        names.len()
    );
    assert!(diff < 1e-5, "{diff}");
    Ok(())
}

/// The penguins recipe's MLP, exported as ONNX, takes raw CSV values: its
/// graph divides and standardizes them as the run did. onnxruntime, on the
/// rows pandas reads (`dropna` over the feature columns), gives taper's
/// logits for the same rows, and `taper classify` names the same classes.
#[test]
fn an_onnx_export_of_a_csv_run_takes_raw_values() -> Result<()> {
    let csv = common::fetched("data/penguins/penguins.csv")?;
    let dir = tempfile::tempdir()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut host = Host::new(HostOptions {
        out_dir: Some(dir.path().to_path_buf()),
        quiet: true,
        overrides: vec![
            ("epochs".into(), "20".into()),
            ("path".into(), csv.display().to_string()),
        ],
        ..HostOptions::default()
    })?;
    host.run_file(&root.join("scripts/penguins.lua"))?;
    drop(host);
    let model = dir.path().join("penguins.onnx");
    export_onnx(dir.path(), &model)?;
    let theirs = check_with(
        "onnx, onnxruntime, pandas",
        &["onnx-table", model.to_str().unwrap(), csv.to_str().unwrap()],
    )?;

    // taper's own logits, on the rows as `taper classify` reads them.
    let saved = saved::open(&dir.path().join("checkpoint.safetensors"), &Device::Cpu)?;
    let input = saved
        .meta
        .table_input
        .clone()
        .expect("a CSV run keeps its reading");
    let rows = input.read(&csv)?;
    assert_eq!(
        rows.missing.iter().map(|m| m.0).collect::<Vec<_>>(),
        vec![5, 273]
    );
    let lines: Vec<usize> = serde_json::from_value(theirs["lines"].clone())?;
    assert_eq!(rows.lines, lines, "the rows pandas keeps");
    let x = Tensor::from_vec(rows.values, (lines.len(), input.width()), &Device::Cpu)?;
    let ours = saved.trainer.frozen()?.forward(&x)?.to_vec2::<f32>()?;
    let largest = ours.iter().flatten().fold(1f32, |m, v| m.max(v.abs())) as f64;
    let diff = max_diff(&ours, &theirs["logits"]) / largest;
    eprintln!("{} rows, logits within {diff:e} relative", lines.len());
    assert!(diff < 1e-6, "{diff}");

    // `taper classify`: a line per row, the class of the largest logit.
    let o = classify_rows(dir.path(), &csv)?;
    let err = String::from_utf8(o.stderr)?;
    assert!(
        err.contains(":5: passed over: a missing value (`NA`) in column 3 (`bill_length_mm`)"),
        "{err}"
    );
    let classes: Vec<String> = serde_json::from_value(theirs["classes"].clone())?;
    let printed = String::from_utf8(o.stdout)?;
    assert_eq!(printed.lines().count(), lines.len());
    for ((line, text), logits) in lines.iter().zip(printed.lines()).zip(&ours) {
        let best = (0..logits.len())
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .unwrap();
        let want = format!("{}:{line}: {} ", csv.display(), classes[best]);
        assert!(text.starts_with(&want), "{text} against {want}");
    }
    Ok(())
}

/// NumPy's own files as users save them (`np.save`, format 1 and 2;
/// `np.savez`; `np.savez_compressed`) are the same samples through
/// `taper.data.numpy` as the same arrays written by the safetensors library
/// through `taper.data.safetensors`; what it cannot read (big-endian,
/// Fortran order, strings) is refused saying how to save it; a damaged
/// archive is caught by its CRC-32, a cut one named; and a classifier
/// trains on a compressed archive.
#[test]
fn numpy_files_are_read_as_numpy_wrote_them() -> Result<()> {
    use taper::data::{numpy, samples, Source, Targets};
    let dir = tempfile::tempdir()?;
    let d = |name: &str| dir.path().join(name);
    check_with(
        "numpy, safetensors",
        &["numpy-write", dir.path().to_str().unwrap()],
    )?;
    let all: Vec<usize> = (0..300).collect();
    let values = |t: &Tensor| -> Result<Vec<f32>> {
        Ok(t.flatten_all()?
            .to_dtype(candle_core::DType::F32)?
            .to_vec1()?)
    };
    let (npz, packed) = (d("data.npz"), d("packed.npz"));
    let (xf, yf, massf, x2f) = (d("x.npy"), d("y.npy"), d("mass.npy"), d("x2.npy"));
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let (ys, masses) = (path(&yf), path(&massf));
    let cases: Vec<(Option<&Path>, String, Targets, &str, Targets)> = vec![
        (
            Some(&npz),
            "x".into(),
            Targets::Labels("y"),
            "x",
            Targets::Labels("y"),
        ),
        (
            Some(&packed),
            "x.npy".into(),
            Targets::Values("mass"),
            "x",
            Targets::Values("mass"),
        ),
        (
            Some(&packed),
            "pixels".into(),
            Targets::Labels("y"),
            "pixels",
            Targets::Labels("y"),
        ),
        (
            None,
            path(&xf),
            Targets::Labels(&ys),
            "x",
            Targets::Labels("y"),
        ),
        (
            None,
            path(&x2f),
            Targets::Values(&masses),
            "x",
            Targets::Values("mass"),
        ),
    ];
    for (archive, x, y, sx, sy) in &cases {
        let ours = numpy(*archive, x, *y, 255.0, "all")?.gather(&all)?;
        let theirs = samples(&d("same.safetensors"), sx, *sy, 255.0, "all")?.gather(&all)?;
        assert_eq!(ours.0.dims(), theirs.0.dims(), "{x}");
        assert_eq!(ours.1.dims(), theirs.1.dims(), "{x}");
        assert_eq!(ours.1.dtype(), theirs.1.dtype(), "{x}");
        assert_eq!(values(&ours.0)?, values(&theirs.0)?, "{x}");
        assert_eq!(values(&ours.1)?, values(&theirs.1)?, "{x}");
    }

    let refused = |archive: Option<&Path>, x: &Path, y: &Path| -> String {
        match numpy(
            archive,
            x.to_str().unwrap(),
            Targets::Labels(y.to_str().unwrap()),
            1.0,
            "all",
        ) {
            Ok(_) => "read".into(),
            Err(e) => e.to_string(),
        }
    };
    let e = refused(None, &d("big.npy"), &yf);
    assert!(
        e.contains("big.npy: ")
            && e.contains("element type `>f4` is big-endian; save it little-endian"),
        "{e}"
    );
    let e = refused(None, &d("fortran.npy"), &yf);
    assert!(e.contains("in Fortran (column-major) order; save it in C order: np.save(f, np.ascontiguousarray(a))"), "{e}");
    let e = refused(None, &xf, &d("names.npy"));
    assert!(
        e.contains("names.npy: ") && e.contains("holds strings or Python objects (`<U9`)"),
        "{e}"
    );
    let e = match numpy(Some(&npz), "x", Targets::Labels("label"), 1.0, "all") {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("data.npz: no array named `label` (it has: mass, pixels, x, y)"),
        "{e}"
    );

    let cut = d("cut.npy");
    std::fs::write(&cut, &std::fs::read(&xf)?[..3000])?;
    let e = refused(None, &cut, &yf);
    assert!(
        e.contains("cut.npy: offset 4928: array `cut` runs past the end of the file (3000 bytes)"),
        "{e}"
    );

    // One byte changed inside x.npy's data, stored and compressed; the
    // archive cut in half (its directory, at the end, is gone).
    for (name, says) in [
        ("data.npz", "its CRC-32 is not the one the archive records"),
        ("packed.npz", "x.npy: offset "),
    ] {
        let mut bytes = std::fs::read(d(name))?;
        bytes[1000] ^= 0x40;
        let damaged = d(&format!("damaged-{name}"));
        std::fs::write(&damaged, &bytes)?;
        let e = refused(Some(&damaged), Path::new("x"), Path::new("y"));
        assert!(
            e.contains(&format!("damaged-{name}: x.npy: offset")) && e.contains(says),
            "{e}"
        );
        std::fs::write(&damaged, &bytes[..bytes.len() / 2])?;
        let e = refused(Some(&damaged), Path::new("x"), Path::new("y"));
        assert!(
            e.contains("not an .npz archive (a zip of .npy files)"),
            "{e}"
        );
    }

    // A classifier on the compressed archive: y is a linear function of x.
    let run = d("run");
    Host::new(HostOptions {
        out_dir: Some(run.clone()),
        quiet: true,
        ..HostOptions::default()
    })?
    .run_source(
        "recipe.lua",
        &format!(
            r#"
            local data = taper.data.numpy{{ path = {packed:?} }}
            local train, test = data:split{{ 0.8, 0.2, seed = 1 }}
            train = train:standardize()
            local run = taper.run{{
              model = taper.model.mlp{{ inputs = 4, hidden = {{ 32 }}, outputs = 3 }},
              optim = taper.optim.adamw{{ lr = 1e-2 }},
              data = train:shuffle():batch(16),
            }}
            for _ in run:epochs(30) do for b in run:batches() do run:step(b) end end
            run:evaluate(test:named("test"):standardize(train))
            run:evaluate(data:named("all"):standardize(train))
            "#
        ),
    )?;
    let evals = common::records(&run, "eval");
    let acc = evals[0]["accuracy"].as_f64().unwrap();
    eprintln!("numpy archive: held-out accuracy {acc}");
    assert!(acc > 0.9, "{acc}");

    // `taper classify` of NumPy's own x.npy: read as the run read its
    // inputs (standardized by the training part's statistics), its answers
    // score as the run's evaluation of the same samples did.
    let o = classify_rows(&run, &xf)?;
    let labels = numpy(Some(&npz), "x", Targets::Labels("y"), 1.0, "all")?
        .gather(&all)?
        .1
        .to_vec1::<u32>()?;
    let printed = String::from_utf8(o.stdout)?;
    let mut right = 0;
    for (i, (line, label)) in printed.lines().zip(&labels).enumerate() {
        let said = line
            .strip_prefix(&format!("{}[{i}]: class ", xf.display()))
            .unwrap_or_else(|| panic!("{line}"));
        let class: u32 = said.split(' ').next().unwrap().parse()?;
        right += usize::from(class == *label);
    }
    assert_eq!(printed.lines().count(), 300);
    let all_acc = evals[1]["accuracy"].as_f64().unwrap();
    assert_eq!(right as f64 / 300.0, all_acc, "{printed}");
    // The same samples in an archive; other arrays are refused, named.
    let o = classify_rows(&run, &npz)?;
    assert_eq!(String::from_utf8(o.stdout)?.lines().count(), 300);
    let refused = |file: &Path| -> Result<String> {
        let o = Command::new(env!("CARGO_BIN_EXE_taper"))
            .arg("classify")
            .arg(&run)
            .arg(file)
            .output()?;
        ensure!(o.status.code() == Some(2), "{o:?}");
        Ok(String::from_utf8(o.stderr)?)
    };
    let e = refused(&d("pixels.npy"))?;
    assert!(
        e.contains("pixels.npy: array `pixels` holds samples of shape [2, 2]; the run trained on samples of shape [4]"),
        "{e}"
    );
    let floats = d("floats.safetensors");
    candle_core::safetensors::save(
        &std::collections::HashMap::from([(
            "x",
            Tensor::from_vec(vec![7u8; 12], (3, 4), &Device::Cpu)?,
        )]),
        &floats,
    )?;
    let e = refused(&floats)?;
    assert!(
        e.contains("tensor `x` holds bytes (u8, divided by the scale) (U8); the run trained on floats (F32)"),
        "{e}"
    );
    Ok(())
}

/// A standardized run on a safetensors file (whose samples carry no reading
/// of their own, unlike a CSV row or an image file) exports to ONNX with its
/// standardization in the graph: onnxruntime, given the file's samples as
/// they are, scores as taper's `eval` records do: a regression's RMSE, MAE
/// and R² in the target's units, and a classifier's accuracy. Features of
/// scales 1000 and 0.01 make a graph without the standardization wrong.
#[test]
fn a_standardized_safetensors_run_exports_its_standardization_to_onnx() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("samples.safetensors");
    let n = 300;
    let mut s = 3u64;
    let mut uniform = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let (mut x, mut mass, mut kind) = (Vec::new(), Vec::new(), Vec::new());
    let mut both = Vec::new();
    for _ in 0..n {
        let (a, b) = (uniform(), uniform());
        x.extend([(1000.0 + 500.0 * a) as f32, (0.01 * b) as f32]);
        mass.push(2000.0 + 800.0 * a - 400.0 * b + 30.0 * (uniform() - 0.5));
        kind.push(i64::from(a + b > 0.7) + i64::from(a + b > 1.3));
        // Two targets of scales 800 and 0.03: the mass, and a small one.
        both.extend([*mass.last().unwrap(), 0.01 * a + 0.02 * b]);
    }
    candle_core::safetensors::save(
        &std::collections::HashMap::from([
            ("x", Tensor::from_vec(x, (n, 2), &Device::Cpu)?),
            ("mass", Tensor::from_vec(mass, n, &Device::Cpu)?),
            ("kind", Tensor::from_vec(kind, n, &Device::Cpu)?),
            (
                "both",
                Tensor::from_vec(both.clone(), (n, 2), &Device::Cpu)?,
            ),
        ]),
        &file,
    )?;
    for (name, outputs, loss) in [
        ("mass", 1, "mse"),
        ("kind", 3, "cross_entropy"),
        ("both", 2, "mse"),
    ] {
        let y = match loss {
            "mse" => format!("target = {name:?}"),
            _ => format!("y = {name:?}"),
        };
        let out = dir.path().join(name);
        let recipe = format!(
            r#"
            local data = taper.data.safetensors{{ path = {file:?}, {y} }}:standardize()
            local run = taper.run{{
              model = taper.model.mlp{{ inputs = 2, hidden = {{ 16 }}, outputs = {outputs} }},
              optim = taper.optim.adamw{{ lr = 1e-2 }},
              loss = taper.loss.{loss}{{}},
              data = data:shuffle():batch(32),
            }}
            for _ in run:epochs(20) do for b in run:batches() do run:step(b) end end
            run:evaluate(data:batch(100))
            "#
        );
        Host::new(HostOptions {
            out_dir: Some(out.clone()),
            quiet: true,
            ..HostOptions::default()
        })?
        .run_source("recipe.lua", &recipe)?;
        let ours = common::records(&out, "eval").pop().expect("an eval record");
        let model = dir.path().join(format!("{name}.onnx"));
        export_onnx(&out, &model)?;
        let theirs = check_with(
            "onnx, onnxruntime, safetensors",
            &[
                "onnx-samples",
                model.to_str().unwrap(),
                file.to_str().unwrap(),
                "x",
                name,
            ],
        )?;
        assert_eq!(theirs["rows"], ours["samples"]);
        let keys: &[&str] = if loss == "mse" {
            &["rmse", "mae", "r2"]
        } else {
            &["accuracy"]
        };
        for k in keys {
            let (a, b) = (ours[k].as_f64().unwrap(), theirs[k].as_f64().unwrap());
            eprintln!("{name} {k}: taper {a}, NumPy on onnxruntime's outputs {b}");
            assert!((a - b).abs() <= 1e-4 * b.abs(), "{k}: {a} vs {b}");
        }
        // Several targets: each scored in its own units.
        if outputs == 2 {
            for t in 0..2 {
                let (a, b) = (&ours["per_target"][t], &theirs["per_target"][t]);
                assert_eq!(a["target"], format!("target[{t}]"));
                for k in ["rmse", "mae", "r2"] {
                    let (x, y) = (a[k].as_f64().unwrap(), b[k].as_f64().unwrap());
                    eprintln!("{name}[{t}] {k}: taper {x}, NumPy {y}");
                    assert!((x - y).abs() <= 1e-4 * y.abs(), "{k}: {x} vs {y}");
                }
                assert!(a["r2"].as_f64().unwrap() > 0.9, "{ours}");
            }
            // `taper classify` of the file: each sample's two values, in
            // the targets' units, whose errors are the record's.
            let o = classify_rows(&out, &file)?;
            let printed = String::from_utf8(o.stdout)?;
            let mut squared = [0.0f64; 2];
            for (i, line) in printed.lines().enumerate() {
                let said = line
                    .strip_prefix(&format!("{}[{i}]: ", file.display()))
                    .unwrap_or_else(|| panic!("{line}"));
                for (t, part) in said.split(", ").enumerate() {
                    let v: f64 = part
                        .strip_suffix(&format!(" target[{t}]"))
                        .unwrap_or_else(|| panic!("{line}"))
                        .parse()?;
                    squared[t] += (v - both[i * 2 + t]).powi(2);
                }
            }
            assert_eq!(printed.lines().count(), n);
            for (t, sq) in squared.iter().enumerate() {
                let (rmse, want) = (
                    (sq / n as f64).sqrt(),
                    ours["per_target"][t]["rmse"].as_f64().unwrap(),
                );
                assert!((rmse - want).abs() <= 1e-4 * want, "{rmse} vs {want}");
            }
        }
        if loss == "mse" {
            assert!(ours["r2"].as_f64().unwrap() > 0.9, "{ours}");
        } else {
            assert!(ours["accuracy"].as_f64().unwrap() > 0.9, "{ours}");
        }
    }
    Ok(())
}

/// The penguin mass regression (`scripts/penguins_mass.lua`): its ONNX
/// export takes CSV values (species and sex one-hot encoded by pandas'
/// get_dummies, under taper's input names) and gives grams; NumPy's errors of those
/// predictions on the test rows are the run's `eval` record (RMSE, MAE and
/// R² in grams, from a model trained on standardized targets); `taper
/// classify` prints the same predictions; and the MLP does at least as well
/// as a least-squares linear model of the same features.
#[test]
fn a_regression_run_scores_as_numpy_and_exports_grams_to_onnxruntime() -> Result<()> {
    let csv = common::fetched("data/penguins/penguins.csv")?;
    let dir = tempfile::tempdir()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let opts = || HostOptions {
        out_dir: Some(dir.path().to_path_buf()),
        quiet: true,
        overrides: vec![("path".into(), csv.display().to_string())],
        ..HostOptions::default()
    };
    let mut host = Host::new(opts())?;
    host.run_file(&root.join("scripts/penguins_mass.lua"))?;
    drop(host);
    let (ours, theirs) = scored_by_numpy(
        dir.path(),
        &csv,
        r#"target = "body_mass_g",
          features = { "species", "sex", "bill_length_mm", "bill_depth_mm", "flipper_length_mm" }"#,
    )?;
    let (r2, linear) = (
        ours["r2"].as_f64().unwrap(),
        theirs["linear"]["r2"].as_f64().unwrap(),
    );
    eprintln!("R² {r2}; a least-squares linear model of the same features: {linear}");
    assert!(r2 > 0.75 && r2 > linear - 0.02, "R² {r2}, linear {linear}");

    // `taper classify`: a line per row, its predicted grams.
    let o = classify_rows(dir.path(), &csv)?;
    let pred: Vec<f64> = serde_json::from_value(theirs["pred"].clone())?;
    let lines: Vec<usize> = serde_json::from_value(theirs["lines"].clone())?;
    let printed = String::from_utf8(o.stdout)?;
    assert_eq!(printed.lines().count(), lines.len());
    for ((line, text), want) in lines.iter().zip(printed.lines()).zip(&pred) {
        let (at, said) = text.rsplit_once(": ").unwrap();
        assert!(at.ends_with(&format!(":{line}")), "{text}");
        let grams: f64 = said.strip_suffix(" body_mass_g").unwrap().parse()?;
        assert!(
            (grams - want).abs() <= 1e-4 * want.abs(),
            "{text}: onnxruntime {want}"
        );
    }
    Ok(())
}

/// The penguins regression run in `dir` (its data read with `reading`, split
/// as `scripts/penguins_mass.lua` splits it): its last `eval` record, and
/// NumPy's scores of its ONNX export's predictions on the test rows, which
/// the record's `rmse`, `mae` and `r2` are checked against (within 1e-4).
fn scored_by_numpy(dir: &Path, csv: &Path, reading: &str) -> Result<(Value, Value)> {
    let ours = common::records(dir, "eval").pop().expect("an eval record");
    let split = dir.join("split.json");
    write_split(csv, reading, &split)?;
    let model = dir.join("model.onnx");
    export_onnx(dir, &model)?;
    let theirs = check_with(
        "onnx, onnxruntime, pandas",
        &[
            "onnx-regression",
            model.to_str().unwrap(),
            csv.to_str().unwrap(),
            split.to_str().unwrap(),
        ],
    )?;
    assert_eq!(theirs["test_rows"], ours["samples"]);
    for k in ["rmse", "mae", "r2"] {
        let (a, b) = (ours[k].as_f64().unwrap(), theirs[k].as_f64().unwrap());
        eprintln!("{k}: taper {a}, NumPy on onnxruntime's predictions {b}");
        assert!((a - b).abs() <= 1e-4 * b.abs(), "{k}: {a} vs {b}");
    }
    Ok((ours, theirs))
}

/// Writes the penguins split of `scripts/penguins_mass.lua` (0.8/0.2, seed 1)
/// of the CSV file read with `reading` (its `target` and `features`; species
/// and sex as categories, rows missing a value dropped) to `split` as JSON:
/// each part's raw features and targets (a row of them per sample), as
/// taper's data gives them.
fn write_split(csv: &Path, reading: &str, split: &Path) -> Result<()> {
    Host::new(HostOptions::default())?.run_source(
        "split.lua",
        &format!(
            r#"
            local birds = taper.data.csv{{ path = {csv:?}, {reading},
              categorical = {{ "species", "sex" }}, missing = "drop" }}
            local train, test = birds:split{{ 0.8, 0.2, seed = 1 }}
            local function rows(d)
              local xs, ys = {{}}, {{}}
              for b in d:batch(64):map(function(x, y)
                for i = 1, #x do
                  xs[#xs + 1] = "[" .. table.concat(x[i], ",") .. "]"
                  ys[#ys + 1] = "[" .. table.concat(y[i], ",") .. "]"
                end
                return {{ x = x, y = y }}
              end):batches() do end
              return '{{"x": [' .. table.concat(xs, ",") .. '], "y": [' .. table.concat(ys, ",") .. "]}}"
            end
            local f = assert(io.open({split:?}, "w"))
            f:write('{{"train": ', rows(train), ', "test": ', rows(test), '}}')
            f:close()
            "#
        ),
    )?;
    Ok(())
}

/// A regression of two targets in different units (a penguin's mass in
/// grams and flipper length in millimetres, from its species, sex and
/// bill): the `eval` record scores each target as NumPy does on
/// onnxruntime's predictions of the ONNX export (RMSE, MAE and R² in each
/// target's units, from a model trained on targets standardized each with
/// its own statistics; `rmse`, `mae` and `r2` their means, as scikit-learn's
/// `multioutput="uniform_average"`); each R² is at least a least-squares
/// linear model's; `taper classify` prints both predictions of each row;
/// and data read with the targets in another order is refused.
#[test]
fn a_regression_of_two_targets_scores_each_as_numpy_and_onnxruntime() -> Result<()> {
    let csv = common::fetched("data/penguins/penguins.csv")?;
    let dir = tempfile::tempdir()?;
    let reading = r#"target = { "body_mass_g", "flipper_length_mm" },
          features = { "species", "sex", "bill_length_mm", "bill_depth_mm" }"#;
    let recipe = |train_reading: &str, test_reading: &str| {
        format!(
            r#"
            local function read(reading)
              return taper.data.csv{{ path = {csv:?}, categorical = {{ "species", "sex" }},
                missing = "drop", target = reading.target, features = reading.features }}
            end
            local birds = read{{ {train_reading} }}
            local train, test = birds:split{{ 0.8, 0.2, seed = 1 }}
            local _, other = read{{ {test_reading} }}:split{{ 0.8, 0.2, seed = 1 }}
            train = train:named("train"):standardize()
            test = other:named("test"):standardize(train)
            local run = taper.run{{
              model = taper.model.mlp{{ inputs = #birds:feature_names(), hidden = {{ 32 }}, outputs = 2 }},
              optim = taper.optim.adamw{{ lr = 3e-3, weight_decay = 1e-4 }},
              loss = taper.loss.mse{{}},
              data = train:shuffle{{ seed = 1 }}:batch(16),
              seed = 1,
            }}
            for _ in run:epochs(80) do for b in run:batches() do run:step(b) end end
            local e = run:evaluate(test)
            assert(e.per_target.flipper_length_mm.rmse < 10, "per_target in run:evaluate")
            "#
        )
    };
    let opts = || HostOptions {
        out_dir: Some(dir.path().to_path_buf()),
        quiet: true,
        ..HostOptions::default()
    };
    Host::new(opts())?.run_source("two.lua", &recipe(reading, reading))?;
    let (ours, theirs) = scored_by_numpy(dir.path(), &csv, reading)?;
    for t in 0..2 {
        let (a, b) = (&ours["per_target"][t], &theirs["per_target"][t]);
        assert_eq!(a["target"], b["target"]);
        for k in ["rmse", "mae", "r2"] {
            let (x, y) = (a[k].as_f64().unwrap(), b[k].as_f64().unwrap());
            eprintln!(
                "{} {k}: taper {x}, NumPy on onnxruntime's predictions {y}",
                a["target"]
            );
            assert!(
                (x - y).abs() <= 1e-4 * y.abs(),
                "{} {k}: {x} vs {y}",
                a["target"]
            );
        }
        let (r2, linear) = (
            a["r2"].as_f64().unwrap(),
            theirs["linear"]["per_target"][t]["r2"].as_f64().unwrap(),
        );
        // Measured: mass 0.8694 (least squares 0.8683), flipper 0.8595
        // (0.8716).
        eprintln!("{}: R² {r2}, least squares {linear}", a["target"]);
        assert!(r2 > 0.75 && r2 > linear - 0.02, "R² {r2}, linear {linear}");
    }

    // `taper classify`: both predictions of each row, named.
    let o = classify_rows(dir.path(), &csv)?;
    let pred: Vec<[f64; 2]> = serde_json::from_value(theirs["pred"].clone())?;
    let printed = String::from_utf8(o.stdout)?;
    assert_eq!(printed.lines().count(), pred.len());
    for (text, want) in printed.lines().zip(&pred) {
        let (_, said) = text.rsplit_once(": ").unwrap();
        let (mass, flipper) = said.split_once(", ").unwrap();
        let mass: f64 = mass.strip_suffix(" body_mass_g").unwrap().parse()?;
        let flipper: f64 = flipper
            .strip_suffix(" flipper_length_mm")
            .unwrap()
            .parse()?;
        for (got, want) in [(mass, want[0]), (flipper, want[1])] {
            assert!((got - want).abs() <= 1e-4 * want.abs(), "{text}: {want}");
        }
    }

    // Test data whose targets are in another order would score each output
    // against the other target: refused, named.
    let swapped = r#"target = { "flipper_length_mm", "body_mass_g" },
          features = { "species", "sex", "bill_length_mm", "bill_depth_mm" }"#;
    let elsewhere = tempfile::tempdir()?;
    let err = Host::new(HostOptions {
        out_dir: Some(elsewhere.path().to_path_buf()),
        ..opts()
    })?
    .run_source("two.lua", &recipe(reading, swapped))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("test's targets (2) are not the run's (2): the same names in another order; target 0 is `flipper_length_mm` in test's and `body_mass_g` in the run's"),
        "{err}"
    );
    // Nor can the run be resumed on data whose targets are in another
    // order: each output learned one.
    let again = tempfile::tempdir()?;
    let err = Host::new(HostOptions {
        out_dir: Some(again.path().to_path_buf()),
        resume: Some(dir.path().join("checkpoint.safetensors")),
        ..opts()
    })?
    .run_source("two.lua", &recipe(swapped, swapped))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains(
            "the data's targets (2) are not the checkpoint's (2): the same names in another order"
        ) && err.contains("each of its model's outputs learned one of the checkpoint's targets"),
        "{err}"
    );
    Ok(())
}

/// `taper.data.chat` renders SmolLM2's conversations with the chat template
/// in its GGUF file and tokenizes them as transformers' `apply_chat_template`
/// does, and trains the tokens that transformers' assistant mask marks
/// (the template marked with `{% generation %}`): every other position is
/// ignored, and so is the padding. A conversation the assistant opens
/// (SmolLM2's template then adds its system prompt before the first reply)
/// is one of them.
#[test]
fn a_chat_is_tokenized_and_masked_as_transformers_apply_chat_template() -> Result<()> {
    let tokenizer = common::fetched("data/smollm2/tokenizer.json")?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = root.join("data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let dir = tempfile::tempdir()?;
    let jsonl = dir.path().join("chats.jsonl");
    let lines = [
        r#"{"messages": [{"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "5."}]}"#,
        r#"{"messages": [{"role": "system", "content": "Answer in German."}, {"role": "user", "content": "7 × 8?"}, {"role": "assistant", "content": "56 — sechsundfünfzig ☃"}, {"role": "user", "content": "And  9 x 9 ?\n"}, {"role": "assistant", "content": " 81\n\nEinundachtzig."}]}"#,
        "",
        r#"{"prompt": [{"role": "user", "content": "Name a colour."}], "completion": [{"role": "assistant", "content": "Blue"}]}"#,
        r#"{"messages": [{"role": "assistant", "content": "Hello! Ask me a sum."}, {"role": "user", "content": "2 plus 2?"}, {"role": "assistant", "content": "4."}]}"#,
    ];
    std::fs::write(&jsonl, lines.join("\n"))?;
    let context = 128;
    let chats = taper::data::chat(
        &jsonl,
        taper::data::ChatOptions {
            tokenizer: &tokenizer,
            template: &model,
            context,
            split: "all",
            train_on: taper::data::TrainOn::Assistant,
        },
    )?;
    use taper::data::Source;
    assert_eq!(chats.len(), 4);
    let (x, y) = chats.gather(&[0, 1, 2, 3])?;
    let (x, y) = (x.to_vec2::<u32>()?, y.to_vec2::<u32>()?);
    let reference = check_with(
        "transformers, gguf",
        &[
            "chat-tokens",
            model.to_str().unwrap(),
            tokenizer.to_str().unwrap(),
            jsonl.to_str().unwrap(),
        ],
    )?;
    let ignore = taper::engine::loss::IGNORE;
    for k in 0..4 {
        let ids: Vec<u32> = serde_json::from_value(reference["ids"][k].clone())?;
        let mask: Vec<u32> = serde_json::from_value(reference["mask"][k].clone())?;
        let n = ids.len();
        assert!(n < context, "conversation {k}: {n} tokens");
        let want_x: Vec<u32> = (0..context)
            .map(|p| if p + 1 < n { ids[p] } else { 0 })
            .collect();
        let want_y: Vec<u32> = (0..context)
            .map(|p| match p + 1 < n && mask[p + 1] == 1 {
                true => ids[p + 1],
                false => ignore,
            })
            .collect();
        assert_eq!(x[k], want_x, "conversation {k}: ids");
        assert_eq!(y[k], want_y, "conversation {k}: trained positions");
        let trained = want_y.iter().filter(|&&t| t != ignore).count();
        eprintln!("conversation {k}: {n} tokens, {trained} trained");
        assert!(trained > 0);
    }
    Ok(())
}

/// scripts/smollm2_chat.lua fine-tunes SmolLM2 on its conversations and
/// exports the adapter (for llama.cpp and for PEFT) and a merged model;
/// llama.cpp's chat completion (the file's own chat template) then replies
/// in the words the run trained, as `taper sample --chat` does, where the
/// original model does not; and so does transformers with PEFT's adapter
/// ([`peft_replies_as_taper`]).
#[test]
fn llama_cpp_and_peft_chat_with_the_fine_tuned_model_as_taper_does() -> Result<()> {
    common::fetched("data/smollm2/tokenizer.json")?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir()?;
    let exported = dir.path().join("export");
    let set = [
        ("chats", "64"),
        ("epochs", "1"),
        ("answers", "0"),
        ("export", exported.to_str().unwrap()),
    ];
    shipped(root, "scripts/smollm2_chat.lua", dir.path(), &set)?;
    let question = "What is 3 plus 4?";
    let ours = saved::sample_checkpoint(dir.path(), saved::Prompt::Chat(question), 24, 0.0, 0)?;
    let base = root.join("data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let (adapter, merged) = (
        exported.join("adapter.gguf"),
        exported.join("merged-q8_0.gguf"),
    );
    let reply = |args: &[&Path]| -> Result<String> {
        let mut a = vec!["llama-chat", args[0].to_str().unwrap(), question];
        a.extend(args[1..].iter().map(|p| p.to_str().unwrap()));
        let v = check_with("llama_cpp", &a)?;
        Ok(v["reply"].as_str().unwrap_or_default().to_string())
    };
    let (original, with_adapter, alone) = (
        reply(&[&base])?,
        reply(&[&base, &adapter])?,
        reply(&[&merged])?,
    );
    eprintln!(
        "taper: {ours:?}\noriginal: {original:?}\nadapter: {with_adapter:?}\nmerged: {alone:?}"
    );
    let trained = |r: &str| {
        r.strip_prefix("3 plus 4 is ")
            .and_then(|n| n.strip_suffix('.'))
            .is_some_and(|n| n.parse::<u32>().is_ok())
    };
    ensure!(trained(&ours), "taper: {ours:?}");
    ensure!(
        !trained(&original),
        "the original model already replies so: {original:?}"
    );
    ensure!(
        trained(&with_adapter),
        "llama.cpp with the adapter: {with_adapter:?}"
    );
    ensure!(trained(&alone), "llama.cpp on the merged model: {alone:?}");
    peft_replies_as_taper(
        dir.path(),
        &base,
        &exported.join("peft"),
        question,
        &trained,
    )
}

/// transformers reads the GGUF file and PEFT loads the run's `peft` export
/// over it, as a user would: the greedy reply is the trained one (the
/// original model's is not), and the log-probabilities of a trained
/// reply's tokens are taper's model's within 0.02 nats, where the adapter
/// moves them by more than 1. (Not the prompt's: on its unlikely tokens the
/// two bases differ by up to 0.6, transformers multiplying by the
/// dequantized weights and taper by the quantized blocks.)
fn peft_replies_as_taper(
    run: &Path,
    base: &Path,
    adapter: &Path,
    question: &str,
    trained: &dyn Fn(&str) -> bool,
) -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tokenizer = root.join("data/smollm2/tokenizer.json");
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let (base, tokenizer, adapter) = (path(base), path(&tokenizer), path(adapter));
    let v = check_with(
        "peft",
        &[
            "peft-chat",
            &base,
            &tokenizer,
            &adapter,
            question,
            "3 plus 4 is 7.",
        ],
    )?;
    let (reply, original) = (
        v["reply"].as_str().unwrap_or_default(),
        v["original"].as_str().unwrap_or_default(),
    );
    eprintln!("peft: {reply:?}\npeft, adapter disabled: {original:?}");
    ensure!(
        trained(reply),
        "transformers with the PEFT adapter: {reply:?}"
    );
    ensure!(!trained(original), "without the adapter: {original:?}");
    let ids: Vec<u32> = serde_json::from_value(v["ids"].clone())?;
    let theirs: Vec<f64> = serde_json::from_value(v["logprobs"].clone())?;
    let before: Vec<f64> = serde_json::from_value(v["base_logprobs"].clone())?;
    let saved = saved::open(&saved::locate(run)?, &Device::Cpu)?;
    let model = saved.trainer.frozen()?;
    let ours: Vec<f64> = logits(model.as_ref(), &ids[..ids.len() - 1])?
        .iter()
        .zip(&ids[1..])
        .map(|(row, &next)| {
            let max = row.iter().fold(f32::MIN, |m, &z| m.max(z)) as f64;
            let sum: f64 = row.iter().map(|&z| (z as f64 - max).exp()).sum();
            row[next as usize] as f64 - max - sum.ln()
        })
        .collect();
    let most = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    };
    let from = v["reply_from"].as_u64().unwrap_or_default() as usize - 1;
    let (apart, moved) = (
        most(&ours[from..], &theirs[from..]),
        most(&theirs[from..], &before[from..]),
    );
    eprintln!("the reply's log-probabilities: taper and PEFT within {apart:.4} nats; the adapter moves them by up to {moved:.3}");
    ensure!(
        apart < 0.02 && moved > 1.0,
        "taper and PEFT differ by {apart} where the adapter moves {moved}"
    );
    Ok(())
}
