//! Keeping the best model and stopping early
//! (`run:evaluate(data, { keep_best = ..., patience = ... })`), with the
//! shipped scripts/shakespeare.lua on a short text of one's own, where the
//! validation loss reaches its best and then climbs: the best model is kept,
//! is the model of its step, stops the run when asked, and the stop holds
//! through `--resume auto`.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use anyhow::{ensure, Result};
use candle_core::Device;
use taper::engine::checkpoint;

fn taper(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> Result<(String, String)> {
    let o = taper(args);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    ensure!(o.status.success(), "taper {args:?}: {err}");
    Ok((out, err))
}

/// The model's tensors in a checkpoint, by name, as f64.
fn model(path: &Path) -> Result<Vec<(String, Vec<f64>)>> {
    let (t, _) = checkpoint::load(path, &Device::Cpu)?;
    let mut m: Vec<(String, Vec<f64>)> = t
        .iter()
        .filter(|(k, _)| k.starts_with("model."))
        .map(|(k, v)| {
            let v = v.flatten_all()?.to_dtype(candle_core::DType::F64)?;
            Ok((k.clone(), v.to_vec1::<f64>()?))
        })
        .collect::<candle_core::Result<_>>()?;
    m.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(m)
}

fn shakespeare<'a>(
    text: &'a str,
    out: &'a str,
    epochs: &'a str,
    patience: &'a str,
) -> Vec<&'a str> {
    vec![
        "train",
        "scripts/shakespeare.lua",
        "--out",
        out,
        "--set",
        text,
        "--set",
        epochs,
        "--set",
        patience,
        "--set",
        "sample=0",
    ]
}

/// scripts/shakespeare.lua on 20 KB of Emma for 40 epochs, with a
/// checkpoint kept at every epoch's end (9 steps).
fn emma_run(dir: &Path, name: &str, patience: &str, extra: &[&str]) -> Result<(String, String)> {
    let emma = dir.join("emma.txt");
    if !emma.exists() {
        std::fs::write(&emma, common::emma(20_000)?)?;
    }
    let text = format!("text={}", emma.display());
    let out = dir.join(name);
    let mut args = shakespeare(&text, out.to_str().unwrap(), "epochs=40", patience);
    args.extend(extra);
    ok(&args)
}

const EVERY_EPOCH: [&str; 4] = ["--checkpoint-every", "9", "--keep-checkpoints", "100"];

/// 20 KB of Emma for 40 epochs (measured: validation loss 2.3287 at best,
/// at epoch 20, then up to 2.81): best.safetensors holds the model of the
/// best evaluation's step, bitwise; with `--set patience=5` the run stops
/// 5 evaluations after it (epoch 25) with the same best model;
/// `--resume auto` then trains no more, and one from best.safetensors into
/// a new folder trains on from the best.
#[test]
fn the_best_model_is_kept_and_patience_stops_the_run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let all = dir.path().join("all");
    let (out, _) = emma_run(dir.path(), "all", "patience=0", &EVERY_EPOCH)?;

    // The best is the lowest validation loss, at its step.
    let evals = common::records(&all, "eval");
    assert_eq!(evals.len(), 40);
    let lowest = evals
        .iter()
        .min_by(|a, b| {
            a["loss"]
                .as_f64()
                .unwrap()
                .total_cmp(&b["loss"].as_f64().unwrap())
        })
        .unwrap();
    let best_file = all.join("best.safetensors");
    let best = checkpoint::read_meta(&best_file)?.best.expect("best state");
    eprintln!("best {best:?}; the last loss {}", evals[39]["loss"]);
    assert_eq!(best.value, lowest["loss"].as_f64().unwrap());
    assert_eq!(best.step, lowest["step"].as_u64().unwrap());
    assert_eq!((best.metric.as_str(), best.split.as_str()), ("loss", "val"));
    assert!(
        evals[39]["loss"].as_f64().unwrap() > best.value + 0.2,
        "the loss climbs after its best"
    );
    assert!(best.epoch >= 5 && best.epoch <= 35, "{best:?}");
    let improved = common::records(&all, "best");
    assert!(improved.len() >= 5, "{improved:?}");
    assert_eq!(improved.last().unwrap()["step"], best.step);
    assert!(
        out.contains(&format!("best: {} (val loss", best_file.display())),
        "{out}"
    );
    // The best is the model of its step (the checkpoint kept there), not
    // the last one.
    let best_model = model(&best_file)?;
    let at_best = all.join(format!("checkpoint.step{}.safetensors", best.step));
    assert!(model(&at_best)? == best_model);
    assert!(model(&all.join("checkpoint.safetensors"))? != best_model);

    // Patience 5: five evaluations after the best, the run stops, with the
    // same best model.
    let early = dir.path().join("early");
    let (out, _) = emma_run(dir.path(), "early", "patience=5", &[])?;
    let n = common::records(&early, "eval").len() as u64;
    assert_eq!(n, best.epoch + 5, "{out}");
    assert_eq!(common::records(&early, "epoch").len() as u64, n);
    let stop = common::records(&early, "early_stop");
    assert_eq!(stop.len(), 1, "{stop:?}");
    assert_eq!(stop[0]["best_step"], best.step);
    assert_eq!(stop[0]["evaluations"], 5);
    assert!(
        out.contains("run 1 stops early: val loss has not fallen below its best"),
        "{out}"
    );
    assert!(model(&early.join("best.safetensors"))? == best_model);

    // The report names the best and the stop.
    ok(&["report", early.to_str().unwrap()])?;
    let page = std::fs::read_to_string(early.join("report.html"))?;
    for want in [
        "best val loss",
        "(the model kept)",
        "stopped early at step",
        "best.safetensors",
    ] {
        assert!(page.contains(want), "{want}");
    }

    // Rerun with --resume auto: the stop holds, with a note.
    let (_, err) = emma_run(dir.path(), "early", "patience=5", &["--resume", "auto"])?;
    assert!(err.contains("note: run 1 stopped early"), "{err}");
    assert_eq!(
        common::records(&early, "eval").len() as u64,
        n,
        "no more training"
    );

    // From the best model into a new folder: training goes on from there
    // (its first evaluation is the epoch after the best's).
    let best_arg = early.join("best.safetensors");
    emma_run(
        dir.path(),
        "on",
        "patience=2",
        &["--resume", best_arg.to_str().unwrap()],
    )?;
    let evals = common::records(&dir.path().join("on"), "eval");
    assert_eq!(evals[0]["epoch"], best.epoch + 1);
    assert!(evals.len() >= 2, "{evals:?}");

    // A run folder's newest checkpoint is what export takes; it says where
    // the best is.
    let gguf = dir.path().join("m.gguf");
    let (_, err) = ok(&[
        "export",
        all.to_str().unwrap(),
        "--out",
        gguf.to_str().unwrap(),
    ])?;
    assert!(
        err.contains("the run's best model (val loss")
            && err.contains("best.safetensors: give that file for it"),
        "{err}"
    );

    // Resumed from its checkpoint two evaluations after the best (one
    // counted; the second comes at the end of that checkpoint's epoch),
    // the patience run stops where it did: the count is in the checkpoint.
    let from = all.join(format!("checkpoint.step{}.safetensors", best.step + 18));
    let meta = checkpoint::read_meta(&from)?;
    assert_eq!(
        meta.best.as_ref().map(|b| b.evals_since),
        Some(1),
        "{meta:?}"
    );
    emma_run(
        dir.path(),
        "resumed",
        "patience=5",
        &["--resume", from.to_str().unwrap()],
    )?;
    let resumed = dir.path().join("resumed");
    assert_eq!(
        common::records(&resumed, "early_stop")[0]["step"],
        stop[0]["step"]
    );
    assert!(
        model(&resumed.join("checkpoint.safetensors"))?
            == model(&early.join("checkpoint.safetensors"))?
    );
    // No evaluation beat the one it resumed with: the best is still the
    // file of the run it came from.
    assert!(!resumed.join("best.safetensors").exists());
    let told = common::records(&resumed, "early_stop");
    assert_eq!(told[0]["path"], best_file.display().to_string());
    Ok(())
}

/// `model = "best"`: an evaluation of the kept model gives the best's own
/// score on the same data, to the bit, and the run's model is back after it
/// (the next evaluation gives the last one's score); its export equals the
/// export of best.safetensors.
#[test]
fn the_best_model_is_evaluated_and_exported_in_place_of_the_last() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let recipe = dir.path().join("best.lua");
    let onnx = dir.path().join("best.onnx");
    std::fs::write(
        &recipe,
        format!(
            r#"local train, val = taper.data.digits{{ split = "train" }}:split{{ 0.9, 0.1, seed = 1 }}
val = val:named("val"):batch(256)
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 64, hidden = {{ 64 }}, outputs = 10 }},
  optim = taper.optim.adamw{{ lr = 3e-3 }},
  data = train:named("train"):shuffle{{ seed = 1 }}:batch(32),
}}
local last
for epoch in run:epochs(40) do
  for batch in run:batches() do run:step(batch) end
  last = run:evaluate(val, {{ keep_best = "loss", patience = 3 }})
end
assert(run.best.stopped and run.best.evals_since == 3)
local best = run:evaluate(val, {{ model = "best" }})
assert(best.loss == run.best.value, best.loss .. " vs " .. run.best.value)
assert(best.loss < last.loss)
local again = run:evaluate(val)
assert(again.loss == last.loss, again.loss .. " vs " .. last.loss)
run:export{{ path = "{}", format = "onnx", model = "best" }}
"#,
            onnx.display()
        ),
    )?;
    let out = dir.path().join("o");
    let (said, _) = ok(&[
        "train",
        recipe.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ])?;
    assert!(said.contains("  val (the best model, step "), "{said}");
    let evals = common::records(&out, "eval");
    let by_best = &evals[evals.len() - 2];
    assert_eq!(by_best["model"], "best");
    let b = checkpoint::read_meta(&out.join("best.safetensors"))?
        .best
        .unwrap();
    assert_eq!(by_best["model_step"], b.step);
    assert!(b.step < evals.last().unwrap()["step"].as_u64().unwrap());
    let same = dir.path().join("same.onnx");
    let best = out.join("best.safetensors");
    ok(&[
        "export",
        best.to_str().unwrap(),
        "--format",
        "onnx",
        "--out",
        same.to_str().unwrap(),
    ])?;
    assert!(
        std::fs::read(&onnx)? == std::fs::read(&same)?,
        "the exports differ"
    );
    Ok(())
}

/// `taper check` trains nothing, so keeps no best model: a recipe that
/// evaluates and exports its best after the loop (as
/// scripts/image_folder.lua exports it) is checked to its end with the
/// run's own model in its place, where `taper train` of a run that has
/// not saved a best is an error at the recipe's line.
#[test]
fn taper_check_goes_through_a_recipe_that_uses_its_best_model() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let recipe = dir.path().join("after.lua");
    let onnx = dir.path().join("after.onnx");
    std::fs::write(
        &recipe,
        format!(
            r#"local test = taper.data.digits{{ split = "test" }}:batch(360)
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 64, hidden = {{ 32 }}, outputs = 10 }},
  optim = taper.optim.adamw{{ lr = 3e-3 }},
  data = taper.data.digits{{ split = "train" }}:batch(64),
}}
for epoch in run:epochs(2) do
  for batch in run:batches() do run:step(batch) end
end
local e = run:evaluate(test, {{ model = "best" }})
run:export{{ path = "{}", format = "onnx", model = "best" }}
print(("checked: %.1f"):format(e.loss))
"#,
            onnx.display()
        ),
    )?;
    let (said, _) = ok(&["check", recipe.to_str().unwrap()])?;
    assert!(
        said.contains("checked: ") && said.contains(": ok"),
        "{said}"
    );
    let out = dir.path().join("o");
    let o = taper(&[
        "train",
        recipe.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "after.lua:10: run:evaluate: model = \"best\": run 1 has no best model saved yet"
        ),
        "{err}"
    );
    Ok(())
}

/// With `min_delta`, an evaluation better by that much or less does not
/// count (Keras' and Lightning's EarlyStopping): digits' val loss falls by
/// less than 0.05 after its first epochs, so the run stops `patience`
/// evaluations after the last fall that large, and the kept best is that
/// evaluation's model, though later ones were lower.
#[test]
fn min_delta_is_the_least_improvement_that_counts() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let recipe = dir.path().join("delta.lua");
    std::fs::write(
        &recipe,
        r#"local delta = tonumber(taper.config{ delta = 0.0 }.delta)
local train, val = taper.data.digits{ split = "train" }:split{ 0.9, 0.1, seed = 1 }
val = val:named("val"):batch(256)
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 64 }, outputs = 10 },
  optim = taper.optim.adamw{ lr = 3e-3 },
  data = train:named("train"):shuffle{ seed = 1 }:batch(32),
}
local losses = {}
for epoch in run:epochs(12) do
  for batch in run:batches() do run:step(batch) end
  local e = run:evaluate(val, { keep_best = "loss", patience = 2, min_delta = delta })
  losses[#losses + 1] = ("%.17g"):format(e.loss)
end
print(("best %d %.17g stopped %s delta %s"):format(run.best.epoch, run.best.value, tostring(run.best.stopped), tostring(run.best.min_delta)))
print("losses " .. table.concat(losses, " "))
"#,
    )?;
    let run = |delta: &str, out: &str| -> Result<(u64, f64, bool, Vec<f64>)> {
        let out = dir.path().join(out);
        let (said, _) = ok(&[
            "train",
            recipe.to_str().unwrap(),
            "--set",
            &format!("delta={delta}"),
            "--out",
            out.to_str().unwrap(),
        ])?;
        let best = said.lines().find(|l| l.starts_with("best ")).unwrap();
        let w: Vec<&str> = best.split(' ').collect();
        let losses = said.lines().find(|l| l.starts_with("losses ")).unwrap();
        let losses = losses
            .split(' ')
            .skip(1)
            .map(|v| v.parse().unwrap())
            .collect();
        Ok((w[1].parse()?, w[2].parse()?, w[4] == "true", losses))
    };
    let (epoch, value, stopped, losses) = run("0.05", "delta")?;
    let said = std::fs::read_to_string(dir.path().join("delta/metrics.jsonl"))?;
    assert!(said.contains("early_stop"), "no early_stop record");
    eprintln!("min_delta 0.05: best at epoch {epoch} ({value}), losses {losses:?}");
    // The epoch the rule picks: each best beats the one before by more
    // than 0.05; the run stops two evaluations after the last.
    let mut best = (0, f64::INFINITY);
    for (i, &l) in losses.iter().enumerate() {
        if l < best.1 - 0.05 {
            best = (i + 1, l);
        }
    }
    assert_eq!((epoch, value), (best.0 as u64, best.1));
    assert!(stopped && losses.len() == best.0 + 2, "{losses:?}");
    assert!(
        losses.iter().skip(best.0).any(|&l| l < value),
        "a later loss was lower, by no more than min_delta: {losses:?}"
    );
    // Without it, the run goes on longer and keeps a lower loss.
    let (_, plain, _, longer) = run("0", "plain")?;
    assert!(longer.len() > losses.len() && plain < value, "{longer:?}");
    let meta = checkpoint::read_meta(&dir.path().join("delta/checkpoint.safetensors"))?;
    assert_eq!(meta.best.unwrap().min_delta, 0.05);
    Ok(())
}

/// A score the evaluation lacks, a name that is no score, and a patience
/// without `keep_best` are errors at the recipe's line.
#[test]
fn keep_best_options_are_checked() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cases = [
        (
            r#"{ keep_best = "r2" }"#,
            "keep_best = \"r2\": this evaluation has no such score; it has loss, accuracy, balanced_accuracy, macro_f1",
        ),
        (
            r#"{ keep_best = "acc" }"#,
            "keep_best = \"acc\" is not a score; one of loss, accuracy,",
        ),
        (r#"{ patience = 3 }"#, "option `patience` is about evaluations that do not beat the best one: it needs `keep_best`"),
        (r#"{ min_delta = 0.01 }"#, "option `min_delta` is about evaluations that do not beat the best one: it needs `keep_best`"),
        (
            r#"{ keep_best = "loss", min_delta = -0.1 }"#,
            "option `min_delta` is how much better than the best an evaluation must be to count, a number 0 or more (in the score's units), got -0.1",
        ),
        (
            r#"{ keep_best = "loss", patience = 0 }"#,
            "option `patience` must be a whole number of evaluations, 1 or more, got 0",
        ),
        (r#"{ keep_best = 1 }"#, "option `keep_best` must be the name of a score"),
        (
            r#"{ model = "best" }"#,
            "run:evaluate: model = \"best\": run 1 has no best model saved yet",
        ),
        (
            r#"{ model = "best", keep_best = "loss" }"#,
            "would compare the best model with itself",
        ),
        (
            r#"{ model = "worst" }"#,
            "option `model` is \"best\" (the model an evaluation with keep_best kept) or \"last\" (the run's own, the default), got \"worst\"",
        ),
    ];
    for (i, (opts, want)) in cases.iter().enumerate() {
        let recipe = dir.path().join(format!("r{i}.lua"));
        std::fs::write(
            &recipe,
            format!(
                r#"local data = taper.data.digits{{ split = "train" }}:take(64):batch(32)
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 64, hidden = {{ 8 }}, outputs = 10 }},
  optim = taper.optim.adamw{{ lr = 1e-3 }},
  data = data,
}}
for epoch in run:epochs(1) do
  for batch in run:batches() do run:step(batch) end
  run:evaluate(data, {opts})
end
"#
            ),
        )?;
        let out = dir.path().join(format!("o{i}"));
        let o = taper(&[
            "train",
            recipe.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{opts}: {err}");
        assert!(err.contains(&format!("r{i}.lua:9:")), "{opts}: {err}");
        assert!(err.contains(want), "{opts}: {err}");
    }
    Ok(())
}
