//! The shipped recipes train real models on real data to a measured bar.

use std::path::Path;

mod common;

use anyhow::Result;
use serde_json::Value;
use taper::{Host, HostOptions};

fn train(recipe: &str, out: &Path, set: &[(&str, &str)]) -> Result<taper::host::Report> {
    let opts = HostOptions {
        out_dir: Some(out.to_path_buf()),
        overrides: set
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..HostOptions::default()
    };
    let mut host = Host::new(opts)?;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(recipe);
    Ok(host.run_file(&path)?)
}

fn records(out: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(out.join("metrics.jsonl"))?;
    Ok(text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?)
}

#[test]
fn digits_reaches_95_percent_held_out() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let report = train("scripts/digits.lua", dir.path(), &[("epochs", "10")])?;
    let ev = report.runs[0]
        .last_eval
        .clone()
        .expect("the recipe evaluates");
    assert_eq!(ev.samples, 360);
    assert!(ev.accuracy >= 0.95, "held-out accuracy {}", ev.accuracy);

    // metrics.jsonl: every record has event, step and epoch; evaluations
    // carry split, loss and accuracy; one epoch record per epoch.
    let recs = records(dir.path())?;
    for r in &recs {
        assert!(
            r["event"].is_string() && r["step"].is_u64() && r["epoch"].is_u64(),
            "{r}"
        );
    }
    let evals: Vec<_> = recs.iter().filter(|r| r["event"] == "eval").collect();
    assert!(!evals.is_empty());
    for e in &evals {
        assert_eq!(e["split"], "test");
        assert!(e["loss"].is_f64() && e["accuracy"].is_f64(), "{e}");
    }
    assert_eq!(recs.iter().filter(|r| r["event"] == "epoch").count(), 10);
    assert!(dir.path().join("checkpoint.safetensors").exists());
    Ok(())
}

#[test]
fn digits_in_bf16_and_f16_reach_the_f32_bar() -> Result<()> {
    for p in ["bf16", "f16"] {
        let dir = tempfile::tempdir()?;
        let report = train(
            "scripts/digits.lua",
            dir.path(),
            &[("epochs", "10"), ("precision", p)],
        )?;
        let ev = report.runs[0]
            .last_eval
            .clone()
            .expect("the recipe evaluates");
        assert!(
            ev.accuracy >= 0.95,
            "{p}: held-out accuracy {}",
            ev.accuracy
        );
        let run = records(dir.path())?
            .into_iter()
            .find(|r| r["event"] == "run")
            .expect("a run record");
        assert_eq!(run["precision"], p);
    }
    Ok(())
}

/// `--set dropout=0.2`: the recipe's 30 epochs end at a lower held-out
/// loss than without dropout (measured 0.077 against 0.089; over seeds 1-3
/// lower each time), and in bf16 dropout still reaches the bar.
#[test]
fn digits_with_dropout_end_at_a_lower_held_out_loss() -> Result<()> {
    let mut losses = Vec::new();
    for set in [[("dropout", "0.0")], [("dropout", "0.2")]] {
        let dir = tempfile::tempdir()?;
        let report = train("scripts/digits.lua", dir.path(), &set)?;
        let ev = report.runs[0].last_eval.clone().expect("an evaluation");
        eprintln!("{set:?}: loss {:.4}, accuracy {:.4}", ev.loss, ev.accuracy);
        assert!(ev.accuracy >= 0.97, "{set:?}: {}", ev.accuracy);
        losses.push(ev.loss);
    }
    assert!(losses[1] < losses[0], "{losses:?}");
    let dir = tempfile::tempdir()?;
    let set = [("epochs", "10"), ("precision", "bf16"), ("dropout", "0.2")];
    let report = train("scripts/digits.lua", dir.path(), &set)?;
    let ev = report.runs[0].last_eval.clone().expect("an evaluation");
    assert!(ev.accuracy >= 0.95, "bf16 with dropout: {}", ev.accuracy);
    Ok(())
}

#[test]
fn digits_with_8bit_adamw_state_reaches_95_percent() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let set = [("epochs", "10"), ("optim_state", "8bit")];
    let report = train("scripts/digits.lua", dir.path(), &set)?;
    let ev = report.runs[0]
        .last_eval
        .clone()
        .expect("the recipe evaluates");
    assert!(ev.accuracy >= 0.95, "held-out accuracy {}", ev.accuracy);
    // The 8192-weight first layer keeps 8-bit moments in the checkpoint.
    let ck = dir.path().join("checkpoint.safetensors");
    let (tensors, _) = taper::engine::checkpoint::load(&ck, &candle_core::Device::Cpu)?;
    let codes: Vec<_> = tensors
        .iter()
        .filter(|(k, _)| k.starts_with("optim.m8."))
        .collect();
    assert!(!codes.is_empty(), "no 8-bit moments in the checkpoint");
    assert!(codes
        .iter()
        .all(|(_, t)| t.dtype() == candle_core::DType::U8));
    Ok(())
}

#[test]
fn pruned_digits_keep_95_percent_at_50_and_80_percent_sparsity() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut host = Host::new(HostOptions {
        out_dir: Some(dir.path().to_path_buf()),
        ..HostOptions::default()
    })?;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/digits_prune.lua");
    host.run_file(&path)?;
    let results: Vec<mlua::Table> = host.globals()?.get("results")?;
    let got: Vec<(f64, f64)> = results
        .iter()
        .map(|t| Ok((t.get("sparsity")?, t.get("accuracy")?)))
        .collect::<mlua::Result<_>>()?;
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(
        (got[1].0 - 0.5).abs() < 1e-3 && (got[2].0 - 0.8).abs() < 1e-3,
        "{got:?}"
    );
    for (s, acc) in &got {
        assert!(*acc >= 0.95, "accuracy {acc} at sparsity {s}");
    }
    // The checkpoint's weights are 80% zeros, and its masks say which.
    let ck = dir.path().join("checkpoint.safetensors");
    let (tensors, _) = taper::engine::checkpoint::load(&ck, &candle_core::Device::Cpu)?;
    let mut masked = 0;
    for (k, t) in &tensors {
        let Some(name) = k.strip_prefix("mask.") else {
            continue;
        };
        masked += 1;
        let w: Vec<f32> = tensors[&format!("model.{name}")].flatten_all()?.to_vec1()?;
        let m: Vec<u8> = t.flatten_all()?.to_vec1()?;
        let zeros = w.iter().filter(|x| **x == 0.0).count() as f64 / w.len() as f64;
        assert!((zeros - 0.8).abs() < 0.01, "{name}: {zeros} zeros");
        assert!(
            w.iter().zip(&m).all(|(x, m)| *m == 1 || *x == 0.0),
            "{name}"
        );
    }
    assert_eq!(masked, 3, "one mask per weight matrix");
    Ok(())
}

/// One short distillation run (alpha = 1: pure distillation) with `seed`:
/// the T^2 KL to the teacher on held-out text of the distilled student and
/// of a student with the same seed and data trained on the labels.
fn distillation_objectives(seed: u32) -> Result<(f64, f64)> {
    let dir = tempfile::tempdir()?;
    let mut host = Host::new(HostOptions {
        out_dir: Some(dir.path().to_path_buf()),
        overrides: [("steps", "100"), ("teacher_epochs", "1"), ("alpha", "1")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([("seed".to_string(), seed.to_string())])
            .collect(),
        ..HostOptions::default()
    })?;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/shakespeare_distill.lua");
    host.run_file(&path)?;
    let results: mlua::Table = host.globals()?.get("results")?;
    let objective =
        |k: &str| -> mlua::Result<f64> { results.get::<mlua::Table>(k)?.get("objective") };
    let evals: Vec<_> = records(dir.path())?
        .into_iter()
        .filter(|r| r["event"] == "eval")
        .collect();
    assert_eq!(evals.len(), 3);
    assert!(
        evals[0].get("objective").is_none(),
        "the teacher has no objective"
    );
    assert!(evals[1]["objective"].is_f64() && evals[2]["objective"].is_f64());
    Ok((objective("distilled")?, objective("plain")?))
}

#[test]
fn distillation_brings_the_student_closer_to_the_teacher() -> Result<()> {
    // The distilled student ends closer to the teacher than the plain one,
    // in the median of three seeds. One seed's ratio swings with the last
    // bit of the arithmetic: seed 1 gave 0.33, then 0.78 with the attention
    // softmax's sums in eight lanes and 0.86 with its vectorized exp as
    // well, while seeds 0 and 2-4 stayed between 0.03 and 0.36. (At 40
    // steps the ratio ranged 0.24-0.91 over seeds 0-4.)
    let mut ratios = Vec::new();
    for seed in 1..=3 {
        let (distilled, plain) = distillation_objectives(seed)?;
        eprintln!("seed {seed}: KL to the teacher, distilled {distilled}, plain {plain}");
        ratios.push(distilled / plain);
    }
    ratios.sort_by(f64::total_cmp);
    assert!(ratios[1] < 0.8, "distilled / plain KL by seed: {ratios:?}");
    Ok(())
}

#[test]
fn digits_cnn_reaches_95_percent_held_out() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let report = train("scripts/digits_cnn.lua", dir.path(), &[("epochs", "10")])?;
    let ev = report.runs[0]
        .last_eval
        .clone()
        .expect("the recipe evaluates");
    assert!(ev.accuracy >= 0.95, "held-out accuracy {}", ev.accuracy);
    let logs = records(dir.path())?;
    assert!(logs
        .iter()
        .any(|r| r["event"] == "log" && r["note"] == "held-out"));
    Ok(())
}

/// Unigram cross-entropy of the validation text under the training text's
/// character frequencies: 3.33 nats (measured with a Python one-liner over
/// the built-in corpus). A model that learned nothing but frequencies sits here.
const UNIGRAM_NATS: f64 = 3.33;

#[test]
fn shakespeare_gpt_beats_unigram_baseline() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // A shortened schedule (250 steps, context 32). Measured on the 2-core
    // build machine: validation loss 2.366 (seed 1) and 2.368 (seed 2) in
    // about 17 s; the bar leaves 0.13 of margin.
    let set = [
        ("epochs", "1"),
        ("steps", "250"),
        ("context", "32"),
        ("width", "64"),
        ("layers", "2"),
        ("heads", "4"),
        ("lr", "1e-2"),
        ("sample", "40"),
    ];
    let report = train("scripts/shakespeare.lua", dir.path(), &set)?;
    let ev = report.runs[0]
        .last_eval
        .clone()
        .expect("the recipe evaluates");
    assert!(
        ev.loss < 2.5,
        "validation loss {} (unigram {UNIGRAM_NATS})",
        ev.loss
    );
    assert!(ev.loss < UNIGRAM_NATS - 0.8);
    Ok(())
}

/// `--set text=FILE`: the same recipe on a UTF-8 file of one's own (words
/// with accents, so characters of two bytes), its last tenth held out. The
/// bar is far under the held-out characters' own unigram entropy, computed
/// here in float64: the model learned more than character frequencies.
/// The sample starts from the file's first characters.
#[test]
fn shakespeare_recipe_trains_on_a_text_file_of_ones_own() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let words = [
        "über", "naïve", "café", "straße", "déjà", "the", "and", "river", "stone", "œuvre",
    ];
    let mut state = 12345u64;
    let mut text = String::from("Ça commence ici.\n");
    while text.chars().count() < 60_000 {
        // A fixed sentence shape from a seeded LCG: structure a model can learn.
        let mut pick = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            words[(state >> 33) as usize % words.len()]
        };
        text += &format!("{} {} {}, {} {}.\n", pick(), pick(), pick(), pick(), pick());
    }
    let path = dir.path().join("book.txt");
    std::fs::write(&path, &text)?;
    let chars: Vec<char> = text.chars().collect();
    let held_out = &chars[chars.len() - chars.len() / 10..];
    let mut counts = std::collections::HashMap::new();
    for c in held_out {
        *counts.entry(*c).or_insert(0.0f64) += 1.0;
    }
    let n = held_out.len() as f64;
    let unigram: f64 = counts.values().map(|k| -(k / n) * (k / n).ln()).sum();

    let out = dir.path().join("out");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_taper"))
        .args([
            "train",
            "scripts/shakespeare.lua",
            "--set",
            "epochs=2",
            "--set",
            "steps=60",
        ])
        .args([
            "--set",
            "context=32",
            "--set",
            "lr=1e-2",
            "--set",
            "sample=20",
        ])
        .arg("--set")
        .arg(format!("text={}", path.display()))
        .arg("--out")
        .arg(&out)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()?;
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let evals: Vec<Value> = records(&out)?
        .into_iter()
        .filter(|r| r["event"] == "eval")
        .collect();
    let loss = evals.last().expect("the recipe evaluates")["loss"]
        .as_f64()
        .unwrap();
    // Measured 0.49 nats against a unigram entropy of 2.99; the choice of
    // each word (one of ten) alone costs about 0.4 nats a character.
    assert!(
        loss < 0.8 && loss < unigram - 2.0,
        "held-out loss {loss}, unigram entropy {unigram}"
    );
    assert!(stdout.contains("book.txt: "), "{stdout}");
    assert!(stdout.contains("\nÇa commence ici"), "{stdout}");
    // A prompt with a character the text lacks: the ones it has are listed.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_taper"))
        .arg("sample")
        .arg(&out)
        .args(["--prompt", "Zebra"])
        .output()?;
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("character 'Z' is not in the vocabulary; its ") && err.contains("ß"),
        "{err}"
    );
    Ok(())
}

/// The real data sets of scripts/fetch-data.sh (CI runs it first; a fresh
/// checkout fetches here).

#[test]
fn fashion_mnist_cnn_learns() -> Result<()> {
    common::fetched("data/fashion-mnist/t10k-labels-idx1-ubyte.gz")?;
    let dir = tempfile::tempdir()?;
    // Shortened: 12,000 training images, one epoch; measured 83.59% on the
    // 10,000 test images in 22 s. The full recipe (2 epochs of 60,000)
    // measured 90.17% (README).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = root.join("data/fashion-mnist").display().to_string();
    let set = [
        ("epochs", "1"),
        ("train_samples", "12000"),
        ("data", data.as_str()),
    ];
    let report = train("scripts/fashion_mnist.lua", dir.path(), &set)?;
    let ev = report.runs[0]
        .last_eval
        .clone()
        .expect("the recipe evaluates");
    assert_eq!(ev.samples, 10_000);
    assert!(ev.accuracy >= 0.80, "test accuracy {}", ev.accuracy);
    // Prefetch is on in this recipe: the loop waited for data for only a
    // small part of the epoch (figures in the benchmark, not asserted).
    let recs = records(dir.path())?;
    let epoch = recs
        .iter()
        .find(|r| r["event"] == "epoch")
        .expect("an epoch record");
    assert!(epoch["data_wait_s"].is_f64(), "{epoch}");
    Ok(())
}

/// The recipe with `net = "pytorch"`: the net of PyTorch's MNIST example
/// (two 3x3 convolutions without padding, one max-pool after the second,
/// 1,199,882 parameters). Shortened: 8,000 training images, one epoch;
/// measured 79.33% on the 10,000 test images.
#[test]
fn fashion_mnist_trains_pytorchs_mnist_example_net() -> Result<()> {
    common::fetched("data/fashion-mnist/t10k-labels-idx1-ubyte.gz")?;
    let dir = tempfile::tempdir()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = root.join("data/fashion-mnist").display().to_string();
    let set = [
        ("net", "pytorch"),
        ("epochs", "1"),
        ("train_samples", "8000"),
        ("data", data.as_str()),
    ];
    let report = train("scripts/fashion_mnist.lua", dir.path(), &set)?;
    let recs = records(dir.path())?;
    let run = recs
        .iter()
        .find(|r| r["event"] == "run")
        .expect("a run record");
    assert_eq!(run["parameters"], 1_199_882, "{run}");
    let model = run["model"].as_str().expect("the model's description");
    assert!(
        model.contains(
            "conv[32, 64] 3x3 pad 0 pool[false, true] hidden[128] -> 10 relu dropout [0.25, 0.5]"
        ),
        "{model}"
    );
    let ev = report.runs[0].last_eval.clone().expect("an evaluation");
    assert_eq!(ev.samples, 10_000);
    assert!(ev.accuracy >= 0.77, "test accuracy {}", ev.accuracy);
    Ok(())
}

/// The image folder recipe on the folder fetch-data.sh writes: its
/// 2,000 val PNGs are Fashion-MNIST's first 2,000 test images, pixel for
/// pixel and class for class (as read by `taper.data.images` and
/// `taper.data.idx`), and one epoch of its 10,000 train images reaches
/// 80% (measured 85.8%; three epochs, the recipe's default, 88.1%).
#[test]
fn image_folder_cnn_learns_from_pngs_that_hold_the_idx_images() -> Result<()> {
    use taper::data::Source;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    common::fetched("data/fashion-mnist-png/val/bag")?;
    let folder = taper::data::images(
        &root.join("data/fashion-mnist-png/val"),
        None,
        1,
        1.0,
        "val",
    )?;
    let fashion = root.join("data/fashion-mnist");
    let idx = taper::data::idx(
        &fashion.join("t10k-images-idx3-ubyte.gz"),
        &fashion.join("t10k-labels-idx1-ubyte.gz"),
        "test",
        1.0,
    )?;
    let names = [
        "t-shirt",
        "trouser",
        "pullover",
        "dress",
        "coat",
        "sandal",
        "shirt",
        "sneaker",
        "bag",
        "ankle-boot",
    ];
    // Each set as (class name, pixels), sorted: the folder is in class order.
    let rows = |src: &dyn Source,
                n: usize,
                name: &dyn Fn(u32) -> String|
     -> Result<Vec<(String, Vec<u8>)>> {
        let (x, y) = src.gather(&(0..n).collect::<Vec<_>>())?;
        let (x, y) = (x.to_vec2::<f32>()?, y.to_vec1::<u32>()?);
        let mut v: Vec<_> = x
            .iter()
            .zip(&y)
            .map(|(r, &l)| (name(l), r.iter().map(|&p| p as u8).collect()))
            .collect();
        v.sort();
        Ok(v)
    };
    let classes = folder.classes().to_vec();
    assert_eq!(folder.len(), 2000);
    assert_eq!(
        rows(&folder, 2000, &|l| classes[l as usize].clone())?,
        rows(&idx, 2000, &|l| names[l as usize].to_string())?
    );

    let dir = tempfile::tempdir()?;
    let report = train("scripts/image_folder.lua", dir.path(), &[("epochs", "1")])?;
    let ev = report.runs[0]
        .last_eval
        .clone()
        .expect("the recipe evaluates");
    assert_eq!(ev.samples, 2000);
    assert!(ev.accuracy >= 0.80, "val accuracy {}", ev.accuracy);
    let evals = records(dir.path())?;
    let eval = evals.iter().find(|r| r["event"] == "eval").unwrap();
    assert_eq!(eval["split"], "val");
    Ok(())
}

/// The image folder recipe on one folder of classes, without train/ and
/// val/ (`holdout`): a fifth of it, drawn at random, is the val set, and
/// three epochs on the other 1,600 images reach 70% (measured 79.25%).
#[test]
fn image_folder_holds_out_part_of_a_folder_of_classes() -> Result<()> {
    let val = common::fetched("data/fashion-mnist-png/val/bag")?;
    let dir = tempfile::tempdir()?;
    let pets = dir.path().join("pets");
    std::fs::create_dir(&pets)?;
    for class in std::fs::read_dir(val.parent().unwrap())? {
        let class = class?.path();
        std::os::unix::fs::symlink(&class, pets.join(class.file_name().unwrap()))?;
    }
    let out = dir.path().join("run");
    let report = train(
        "scripts/image_folder.lua",
        &out,
        &[
            ("epochs", "3"),
            ("holdout", "0.2"),
            ("data", pets.to_str().unwrap()),
        ],
    )?;
    let ev = report.runs[0]
        .last_eval
        .clone()
        .expect("the recipe evaluates");
    assert_eq!(ev.samples, 400);
    eprintln!("val accuracy {}", ev.accuracy);
    assert!(ev.accuracy >= 0.7, "val accuracy {}", ev.accuracy);
    let epoch = records(&out)?
        .into_iter()
        .find(|r| r["event"] == "epoch")
        .unwrap();
    assert_eq!(epoch["samples"], 1600);
    Ok(())
}

/// The recipe's convolutions as PyTorch's CIFAR-10 tutorial has them:
/// 5x5 kernels without padding (28, 24, 12, 8, 4). Three epochs reached
/// 86.55% (88.10% with the default 3x3).
#[test]
fn image_folder_trains_with_5x5_kernels_without_padding() -> Result<()> {
    common::fetched("data/fashion-mnist-png/val/bag")?;
    let dir = tempfile::tempdir()?;
    let set = [("epochs", "2"), ("kernel", "5"), ("padding", "0")];
    let report = train("scripts/image_folder.lua", dir.path(), &set)?;
    let ev = report.runs[0]
        .last_eval
        .clone()
        .expect("the recipe evaluates");
    eprintln!("val accuracy {}", ev.accuracy);
    assert!(ev.accuracy >= 0.8, "val accuracy {}", ev.accuracy);
    let run = records(dir.path())?
        .into_iter()
        .find(|r| r["event"] == "run")
        .unwrap();
    assert_eq!(
        run["model"],
        "cnn 1x28x28 conv[16, 32] 5x5 pad 0 hidden[128] -> 10 relu"
    );
    Ok(())
}

#[test]
fn mnist_csv_mlp_learns() -> Result<()> {
    common::fetched("data/mnist/mnist_5k.csv.gz")?;
    let dir = tempfile::tempdir()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = root
        .join("data/mnist/mnist_5k.csv.gz")
        .display()
        .to_string();
    let report = train(
        "scripts/mnist_csv.lua",
        dir.path(),
        &[("path", path.as_str())],
    )?;
    let ev = report.runs[0]
        .last_eval
        .clone()
        .expect("the recipe evaluates");
    assert_eq!(ev.samples, 1000);
    assert!(ev.accuracy >= 0.90, "test accuracy {}", ev.accuracy);
    Ok(())
}

/// The Palmer penguins CSV as pandas writes it: named columns, species
/// names for labels, two rows of missing measurements left out, features
/// standardized with the training part's statistics.
#[test]
fn penguins_mlp_learns_from_a_table_with_names_and_missing_values() -> Result<()> {
    common::fetched("data/penguins/penguins.csv")?;
    let dir = tempfile::tempdir()?;
    let report = train("scripts/penguins.lua", dir.path(), &[])?;
    let ev = report.runs[0]
        .last_eval
        .clone()
        .expect("the recipe evaluates");
    // 344 rows less the 2 with missing values, a fifth of them held out.
    assert_eq!(ev.samples, 68);
    // Measured 98.5-100% over five seeds; without standardization 45-70%.
    assert!(ev.accuracy >= 0.95, "test accuracy {}", ev.accuracy);
    let (_, meta) = taper::engine::checkpoint::load(
        &dir.path().join("checkpoint.safetensors"),
        &candle_core::Device::Cpu,
    )?;
    let classes = ["Adelie", "Chinstrap", "Gentoo"].map(String::from);
    assert_eq!(meta.classes.as_deref(), Some(&classes[..]));
    // "balanced" weights are n / (3 * count): their reciprocals are the
    // classes' shares of the training part, times 3. Chinstraps, the
    // fewest, weigh most.
    let run = &records(dir.path())?
        .into_iter()
        .find(|r| r["event"] == "run")
        .expect("a run record");
    let w: Vec<f64> = serde_json::from_value(run["class_weights"].clone())?;
    let shares: f64 = w.iter().map(|w| 1.0 / w).sum();
    assert!((shares - 3.0).abs() < 1e-5, "{w:?}");
    assert!(w[1] > w[0] && w[1] > w[2], "{w:?}");
    Ok(())
}

/// Regression of two targets on the penguins CSV: mass in grams and flipper
/// length in millimetres, each scored in its own units, and the checkpoint
/// keeping both targets in order. (`tests/interop.rs` checks each target's
/// scores against NumPy on onnxruntime's predictions.)
#[test]
fn penguins_size_regression_predicts_grams_and_millimetres() -> Result<()> {
    common::fetched("data/penguins/penguins.csv")?;
    let dir = tempfile::tempdir()?;
    let report = train("scripts/penguins_size.lua", dir.path(), &[])?;
    let ev = report.runs[0]
        .last_eval
        .clone()
        .expect("the recipe evaluates");
    assert_eq!(ev.samples, 67);
    let g = ev.regression.expect("a regression's scores");
    // Measured: mass R² 0.869, RMSE 308 g; flipper R² 0.860, RMSE 5.1 mm
    // (seeds 1-5: 0.85-0.92 and 0.83-0.86).
    let [mass, flipper] = g.targets[..] else {
        panic!("two targets: {g:?}")
    };
    assert!(mass.r2 > 0.84 && mass.rmse < 340.0, "{mass:?}");
    assert!(flipper.r2 > 0.82 && flipper.rmse < 6.5, "{flipper:?}");
    let last = common::records(dir.path(), "eval").pop().unwrap();
    assert_eq!(last["per_target"][1]["target"], "flipper_length_mm");
    assert_eq!(last["per_target"][0]["rmse"].as_f64(), Some(mass.rmse));
    let (_, meta) = taper::engine::checkpoint::load(
        &dir.path().join("checkpoint.safetensors"),
        &candle_core::Device::Cpu,
    )?;
    let input = meta.table_input.expect("a CSV run keeps its reading");
    let names: Vec<String> = input.targets.iter().map(|c| c.name()).collect();
    assert_eq!(names, ["body_mass_g", "flipper_length_mm"]);
    let m = input.target_standardize.expect("the targets' statistics");
    assert!(
        (m.mean[1] - 200.0).abs() < 5.0 && (m.std[1] - 14.0).abs() < 2.0,
        "{m:?}"
    );
    Ok(())
}

/// Regression on the penguins CSV: body mass from the species, the sex (one
/// input per category) and three measurements, the target standardized
/// with the features and the errors reported in grams. (`tests/interop.rs`
/// checks the scores against NumPy and a linear model, and the inputs
/// against pandas' get_dummies.)
#[test]
fn penguins_mass_regression_predicts_grams() -> Result<()> {
    common::fetched("data/penguins/penguins.csv")?;
    let dir = tempfile::tempdir()?;
    let report = train("scripts/penguins_mass.lua", dir.path(), &[])?;
    let ev = report.runs[0]
        .last_eval
        .clone()
        .expect("the recipe evaluates");
    // 333 of 344 birds have every column used (sex is missing for 11).
    assert_eq!(ev.samples, 67);
    let g = ev.regression.expect("a regression's scores");
    // Measured: R² 0.880, RMSE 296 g (the masses' deviation is 800 g);
    // without species and sex, R² 0.818 and RMSE 342 g.
    assert!(g.r2() > 0.85, "R² {}", g.r2());
    assert!(
        g.rmse() < 330.0 && g.mae() < g.rmse(),
        "rmse {} g, mae {} g",
        g.rmse(),
        g.mae()
    );
    let evals = common::records(dir.path(), "eval");
    let last = evals.last().unwrap();
    assert!(last.get("accuracy").is_none(), "{last}");
    assert_eq!(last["rmse"].as_f64(), Some(g.rmse()));
    let (_, meta) = taper::engine::checkpoint::load(
        &dir.path().join("checkpoint.safetensors"),
        &candle_core::Device::Cpu,
    )?;
    let input = meta.table_input.expect("a CSV run keeps its reading");
    assert_eq!(
        input.targets,
        [taper::data::Column::Name("body_mass_g".into())]
    );
    assert_eq!(
        input.input_names().join(" "),
        "species_Adelie species_Chinstrap species_Gentoo sex_female sex_male \
         bill_length_mm bill_depth_mm flipper_length_mm"
    );
    // `taper classify`'s reading: a species the run never saw is passed
    // over, named; a known one is encoded as in training.
    let rows = dir.path().join("new.csv");
    std::fs::write(
        &rows,
        "species,sex,bill_length_mm,bill_depth_mm,flipper_length_mm\n\
         Emperor,male,39.1,18.7,181\nGentoo,female,39.1,18.7,181\n",
    )?;
    let read = input.read(&rows)?;
    assert_eq!(read.lines, [3]);
    assert_eq!(read.values.len(), input.width());
    assert_eq!(&read.values[..5], [0.0, 0.0, 1.0, 1.0, 0.0]);
    assert_eq!(read.missing.len(), 1);
    assert!(
        read.missing[0].1
            == "`Emperor` in column 1 (`species`) is not a category the run trained on (`Adelie`, `Chinstrap`, `Gentoo`)",
        "{:?}",
        read.missing
    );
    let m = input.target_standardize.expect("the target's statistics");
    assert!(
        (m.mean[0] - 4200.0).abs() < 100.0 && (m.std[0] - 800.0).abs() < 100.0,
        "{m:?}"
    );
    Ok(())
}

/// Data missing under `data/`, where scripts/fetch-data.sh puts the
/// recipes' data sets, says to fetch it; elsewhere (a user's own folder),
/// what its folder holds instead.
#[test]
fn missing_data_says_to_fetch() {
    let dir = tempfile::tempdir().unwrap();
    let error = |data: &str| {
        let out = tempfile::tempdir().unwrap();
        let e = train("scripts/fashion_mnist.lua", out.path(), &[("data", data)])
            .expect_err("no data there");
        let e = e.downcast::<taper::Error>().expect("a taper error");
        assert_eq!(e.exit_code(), 2);
        taper::host::render_error(&e)
    };
    let msg = error("data/not-fetched");
    assert!(
        msg.contains("data/not-fetched/train-images-idx3-ubyte.gz does not exist")
            && msg.contains("scripts/fetch-data.sh"),
        "{msg}"
    );
    let mine = dir.path().join("mine");
    std::fs::create_dir_all(mine.join("images")).unwrap();
    let msg = error(mine.to_str().unwrap());
    assert!(
        msg.contains("train-images-idx3-ubyte.gz does not exist; ")
            && msg.contains("mine holds `images`")
            && !msg.contains("fetch-data"),
        "{msg}"
    );
}

/// `from`: the image folder recipe starts from a run it trained before.
/// On the same classes, ten steps on 640 images reach 80% (measured
/// 84.65%; from scratch the same ten steps reach 12.75%). On a folder of two
/// of those classes, the head starts afresh with two outputs and every
/// other weight is the first run's.
#[test]
fn image_folder_fine_tunes_from_a_trained_run() -> Result<()> {
    let val = common::fetched("data/fashion-mnist-png/val/bag")?;
    let dir = tempfile::tempdir()?;
    let first = dir.path().join("first");
    train("scripts/image_folder.lua", &first, &[("epochs", "1")])?;
    let from = first.to_str().unwrap();

    let tuned = dir.path().join("tuned");
    let set = [("epochs", "1"), ("train_samples", "640"), ("from", from)];
    let report = train("scripts/image_folder.lua", &tuned, &set)?;
    let ev = report.runs[0]
        .last_eval
        .clone()
        .expect("the recipe evaluates");
    assert!(ev.accuracy >= 0.8, "val accuracy {}", ev.accuracy);

    let two = dir.path().join("two");
    std::fs::create_dir(&two)?;
    for class in ["bag", "coat"] {
        std::os::unix::fs::symlink(val.parent().unwrap().join(class), two.join(class))?;
    }
    let out = dir.path().join("two-run");
    let set = [
        ("epochs", "1"),
        ("holdout", "0.2"),
        ("data", two.to_str().unwrap()),
        ("from", from),
    ];
    train("scripts/image_folder.lua", &out, &set)?;
    let ckpt = |d: &Path| d.join("checkpoint.safetensors");
    let meta = taper::engine::checkpoint::read_meta(&ckpt(&out))?;
    assert_eq!(meta.model_config.unwrap()["cnn"]["outputs"], 2);
    assert_eq!(meta.classes.unwrap(), ["bag", "coat"]);
    // The convolutions started from the first run's: a few steps later
    // they are still near them (a fresh start would be as far as they are
    // large).
    let conv0 = |d: &Path| -> Result<candle_core::Tensor> {
        let (t, _) = taper::engine::checkpoint::load(&ckpt(d), &candle_core::Device::Cpu)?;
        Ok(t["model.conv0.weight"].clone())
    };
    let (a, b) = (conv0(&first)?, conv0(&out)?);
    let moved = ((&b - &a)?.sqr()?.sum_all()?.to_scalar::<f32>()?
        / a.sqr()?.sum_all()?.to_scalar::<f32>()?)
    .sqrt();
    eprintln!("conv0 moved {moved:.4} of its size");
    assert!(moved < 0.2, "conv0 moved {moved} of its size");
    // The head is new, every other weight from the first run.
    let started = taper::engine::warm_start::start_from(
        &ckpt(&first),
        "cnn",
        taper::engine::checkpoint::read_meta(&ckpt(&first))?
            .model_config
            .as_ref(),
        taper::engine::checkpoint::load(&ckpt(&first), &candle_core::Device::Cpu)?.0,
        (Some(2), None),
    )?;
    assert_eq!(started.new_head, Some(("fc1".to_string(), 10)));
    let initial: Vec<String> = taper::engine::ModelSpec::initial_params(&started.spec)?
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        initial,
        [
            "conv0.bias",
            "conv0.weight",
            "conv1.bias",
            "conv1.weight",
            "fc0.bias",
            "fc0.weight"
        ]
    );
    Ok(())
}

/// scripts/shakespeare.lua on a short text of one's own (20 KB of Emma)
/// for 40 epochs: without dropout the model learns the training text by
/// heart and its validation loss climbs after its best; with `--set
/// dropout=0.2` it ends at its best. Measured: 2.329 at best, 2.811 at the
/// end, against 2.306 and 2.307.
#[test]
fn dropout_keeps_a_gpt_on_a_short_text_from_learning_it_by_heart() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("emma.txt");
    std::fs::write(&path, common::emma(20_000)?)?;
    let mut ends = Vec::new();
    for dropout in ["0.0", "0.2"] {
        let out = dir.path().join(format!("d{dropout}"));
        let file = path.to_str().unwrap();
        let set = [
            ("text", file),
            ("epochs", "40"),
            ("sample", "0"),
            ("dropout", dropout),
        ];
        train("scripts/shakespeare.lua", &out, &set)?;
        let losses: Vec<f64> = records(&out)?
            .iter()
            .filter(|r| r["event"] == "eval")
            .map(|r| r["loss"].as_f64().unwrap())
            .collect();
        let best = losses.iter().copied().fold(f64::INFINITY, f64::min);
        let last = *losses.last().unwrap();
        eprintln!("dropout {dropout}: best {best:.3}, last {last:.3}");
        ends.push((best, last));
    }
    let [(_, plain), (best, dropped)] = ends[..] else {
        unreachable!()
    };
    assert!(plain > 2.6, "without dropout, the last loss {plain}");
    assert!(
        dropped < best + 0.02 && dropped < 2.4,
        "with it, {dropped} (best {best})"
    );
    Ok(())
}

/// scripts/minilm_classify.lua fine-tunes MiniLM on passages of Jane
/// Austen's novels (with transformers' dropout): after 30 steps it names
/// the novel of more than 40% of 120 held-out passages (six novels; the new
/// head's guesses: 9-23%).
#[test]
fn minilm_classify_learns_which_novel_a_passage_is_from() -> Result<()> {
    common::fetched("data/minilm/tokenizer.json")?;
    common::fetched("data/austen/test.csv")?;
    let dir = tempfile::tempdir()?;
    train(
        "scripts/minilm_classify.lua",
        dir.path(),
        &[
            ("rows", "480"),
            ("test_rows", "120"),
            ("epochs", "1"),
            ("context", "64"),
            ("lr", "2e-4"),
        ],
    )?;
    let all = records(dir.path())?;
    let evals: Vec<&Value> = all.iter().filter(|r| r["event"] == "eval").collect();
    let [before, after] = evals[..] else {
        panic!("two evaluations: {evals:?}")
    };
    let accuracy = |r: &Value| r["accuracy"].as_f64().unwrap();
    // Measured (seeds 1, 2, 3): 9.2% -> 50.8%, 22.5% -> 50.0%, 17.5% ->
    // 46.7%, the cross-entropy 1.79 -> 1.50-1.56 (without dropout, seeds
    // 1 and 2: 60.8%, 56.7%).
    eprintln!(
        "held out: {:.3} -> {:.3}, loss {} -> {}",
        accuracy(before),
        accuracy(after),
        before["loss"],
        after["loss"]
    );
    assert!(accuracy(before) < 0.3, "{before}");
    assert!(accuracy(after) > 0.4, "{after}");
    assert!(after["loss"].as_f64() < Some(before["loss"].as_f64().unwrap() - 0.2));
    assert_eq!(after["samples"], 120);

    // `taper classify RUN FILE.csv` reads the held-out rows as the run
    // read them (its column of text, its tokenizer and context): as many
    // named right as the evaluation counted; a row without a text is
    // passed over, named.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut reader = csv::Reader::from_path(root.join("data/austen/test.csv"))?;
    let rows: Vec<(String, String)> = reader
        .records()
        .take(120)
        .map(|r| r.map(|r| (r[0].to_string(), r[1].to_string())))
        .collect::<Result<_, _>>()?;
    let file = dir.path().join("held_out.csv");
    let mut out = String::from("novel,text\n");
    for (text, novel) in &rows {
        out += &format!("{novel},\"{}\"\n", text.replace('"', "\"\""));
    }
    out += "emma,\n";
    std::fs::write(&file, out)?;
    let (mut right, mut answered, mut skipped) = (0, 0, Vec::new());
    taper::interop::saved::classify_checkpoint(
        dir.path(),
        std::slice::from_ref(&file),
        1,
        &mut |what, answer| {
            let line: usize = what.rsplit(':').next().unwrap().parse().unwrap();
            let taper::interop::saved::Answer::Classes(guesses) = answer else {
                panic!("a class")
            };
            answered += 1;
            right += usize::from(guesses[0].class == rows[line - 2].1);
        },
        &mut |what, why| skipped.push(format!("{what}: {why}")),
    )?;
    assert_eq!(answered, 120);
    assert_eq!(right as f64 / 120.0, accuracy(after), "{right} of 120");
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(
        skipped[0].contains("held_out.csv:122: a missing value"),
        "{skipped:?}"
    );
    Ok(())
}

/// scripts/minilm_classify.lua on text pairs (`--set pair=COLUMN`): two
/// passages, from one novel or from two. It runs, evaluates every held-out
/// pair, and its checkpoint reads both columns again. (Whether MiniLM
/// learns the task is another matter: 75 steps left it at 50%;
/// `tests/interop.rs` checks the pairs' ids and logits against
/// transformers'.)
#[test]
fn minilm_classify_takes_text_pairs() -> Result<()> {
    common::fetched("data/minilm/tokenizer.json")?;
    let dir = tempfile::tempdir()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut reader = csv::Reader::from_path(root.join("data/austen/test.csv"))?;
    let rows: Vec<(String, String)> = reader
        .records()
        .take(40)
        .map(|r| r.map(|r| (r[0].to_string(), r[1].to_string())))
        .collect::<Result<_, _>>()?;
    let quoted = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let mut pairs = String::from("first,second,same\n");
    for (a, b) in rows.iter().zip(rows.iter().rev()) {
        let same = if a.1 == b.1 { "yes" } else { "no" };
        pairs += &format!("{},{},{same}\n", quoted(&a.0), quoted(&b.0));
    }
    let file = dir.path().join("pairs.csv");
    std::fs::write(&file, pairs)?;
    let f = file.to_str().unwrap();
    train(
        "scripts/minilm_classify.lua",
        &dir.path().join("run"),
        &[
            ("train", f),
            ("test", f),
            ("text", "first"),
            ("pair", "second"),
            ("label", "same"),
            ("rows", "16"),
            ("test_rows", "24"),
            ("epochs", "1"),
            ("context", "48"),
        ],
    )?;
    let all = records(&dir.path().join("run"))?;
    let evals: Vec<&Value> = all.iter().filter(|r| r["event"] == "eval").collect();
    assert_eq!(evals.len(), 2, "{evals:?}");
    assert_eq!(evals[1]["samples"], 24);
    let (_, meta) = taper::engine::checkpoint::load(
        &dir.path().join("run/checkpoint.safetensors"),
        &candle_core::Device::Cpu,
    )?;
    let columns = serde_json::to_value(&meta.table_input.unwrap().columns)?;
    assert_eq!(columns, serde_json::json!(["first", "second"]));

    // `taper classify RUN --text A --pair B` answers as for the file's rows
    // (lines 2 and 3), to the digit; a pair run without `--pair` is refused.
    let classify = |args: &[&str]| -> Result<std::process::Output> {
        Ok(std::process::Command::new(env!("CARGO_BIN_EXE_taper"))
            .arg("classify")
            .arg(dir.path().join("run"))
            .args(args)
            .args(["--top", "2"])
            .output()?)
    };
    let from_file = classify(&[f])?;
    let lines: Vec<String> = String::from_utf8(from_file.stdout)?
        .lines()
        .take(2)
        .map(|l| l.split_once(": ").unwrap().1.to_string())
        .collect();
    let (a, b) = (rows.iter(), rows.iter().rev());
    let given: Vec<[&str; 2]> = a
        .zip(b)
        .take(2)
        .map(|(a, b)| [&a.0[..], &b.0[..]])
        .collect();
    let o = classify(&[
        "--text",
        given[0][0],
        "--pair",
        given[0][1],
        "--text",
        given[1][0],
        "--pair",
        given[1][1],
    ])?;
    let out = String::from_utf8(o.stdout)?;
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let expected = format!("text 1: {}\ntext 2: {}\n", lines[0], lines[1]);
    assert_eq!(out, expected);
    let o = classify(&["--text", given[0][0]])?;
    let err = String::from_utf8(o.stderr)?;
    assert!(
        !o.status.success() && err.contains("give each text's second one (`--pair`)"),
        "{err}"
    );
    Ok(())
}

/// Chat fine-tuning of SmolLM2 with LoRA on the recipe's own task (sums
/// asked and answered in words), the replies alone trained: the held-out
/// replies' cross-entropy falls to under a third and their next-token
/// accuracy passes 90%, the prompts never scored; the model then answers
/// held-out questions in the replies' words. (`tests/interop.rs` checks the
/// tokens and the trained positions against transformers.)
#[test]
fn smollm2_chat_learns_the_replies_and_not_the_prompts() -> Result<()> {
    common::fetched("data/smollm2/tokenizer.json")?;
    let dir = tempfile::tempdir()?;
    train(
        "scripts/smollm2_chat.lua",
        dir.path(),
        &[("chats", "64"), ("epochs", "1"), ("answers", "3")],
    )?;
    let all = records(dir.path())?;
    let evals: Vec<&Value> = all.iter().filter(|r| r["event"] == "eval").collect();
    let [before, after] = evals[..] else {
        panic!("two evaluations: {evals:?}")
    };
    let loss = |r: &Value| r["loss"].as_f64().unwrap();
    let accuracy = |r: &Value| r["accuracy"].as_f64().unwrap();
    // Measured: 0.928 -> 0.137, 75.0% -> 96.1%.
    eprintln!(
        "held-out replies: {:.4} -> {:.4}, {:.3} -> {:.3}",
        loss(before),
        loss(after),
        accuracy(before),
        accuracy(after)
    );
    assert!(loss(after) < loss(before) / 3.0, "{before} -> {after}");
    assert!(accuracy(after) > 0.9, "{after}");
    // Six held-out conversations, each scored on its reply's tokens alone
    // ("41 plus 34 is 75.<|im_end|>\n": about 13), not its 40 prompt tokens.
    let scored = after["samples"].as_u64().unwrap();
    assert!(
        (6 * 10..=6 * 16).contains(&scored),
        "{scored} positions scored"
    );
    // The checkpoint keeps the chat template: `taper sample --chat` renders
    // a message with it, and the reply ends at the template's end token.
    use taper::interop::saved::{sample_checkpoint, Prompt};
    let reply = sample_checkpoint(dir.path(), Prompt::Chat("What is 3 plus 4?"), 24, 0.0, 0)?;
    eprintln!("What is 3 plus 4? -> {reply:?}");
    let said = reply
        .strip_prefix("3 plus 4 is ")
        .and_then(|r| r.strip_suffix('.'));
    assert!(said.is_some_and(|n| n.parse::<u32>().is_ok()), "{reply:?}");
    Ok(())
}
