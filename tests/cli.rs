//! The `taper` binary: exit codes and one-line messages for bad input, failure
//! checkpoints, and resume.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::Result;
use candle_core::Device;
use taper::engine::checkpoint;

fn taper(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run taper")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn write(dir: &Path, name: &str, src: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, src).unwrap();
    p
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn syntax_error_exits_2_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let r = write(
        dir.path(),
        "x.lua",
        "local cfg = taper.config{ epochs = 1 }\nlocal a = = 1\n",
    );
    let o = taper(&["train", s(&r), "--out", s(&dir.path().join("out"))]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("x.lua:2:"), "{err}");
}

#[test]
fn unknown_option_exits_2_naming_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let r = write(
        dir.path(),
        "x.lua",
        "\n\ntaper.optim.adamw{ lr = 1e-3, betaz = {0.9, 0.99} }\n",
    );
    let o = taper(&["check", s(&r)]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("x.lua:3: taper.optim.adamw: unknown field `betaz`"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "one line: {err}");
}

#[test]
fn missing_recipe_unknown_device_and_missing_cuda_say_what_to_do() {
    let o = taper(&["train", "scripts/nope.lua"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("cannot read recipe scripts/nope.lua"), "{err}");

    let o = taper(&["train", "scripts/digits.lua", "--device", "tpu"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err.contains("unknown device `tpu`: use auto, cpu, cuda or cuda:N"),
        "{err}"
    );

    if !cfg!(feature = "cuda") {
        let o = taper(&["train", "scripts/digits.lua", "--device", "cuda"]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2));
        assert!(
            err.contains("built without CUDA") && err.contains("--features cuda"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn bad_set_exits_2() {
    let o = taper(&["check", "scripts/digits.lua", "--set", "epochz=3"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("unknown config key `epochz`"), "{err}");
    let o = taper(&["check", "scripts/digits.lua", "--set", "epochs=many"]);
    assert_eq!(o.status.code(), Some(2));
    let o = taper(&["check", "scripts/digits.lua", "--set", "noequals"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn check_validates_every_shipped_recipe() {
    for r in [
        "scripts/digits.lua",
        "scripts/digits_cnn.lua",
        "scripts/shakespeare.lua",
    ] {
        let o = taper(&["check", r]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{r}: {err}");
        assert!(out.contains(&format!("{r}: ok")), "{out}");
    }
}

const FAILING: &str = r#"
local cfg = taper.config{ epochs = 2, fail_at = 3 }
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 16 }, outputs = 10 },
  data = taper.data.digits{}:shuffle{ seed = 1 }:batch(64),
}
for epoch in run:epochs(cfg.epochs) do
  for batch in run:batches() do
    run:step(batch)
    if run.steps == cfg.fail_at then error("boom at step " .. run.steps) end
  end
end
"#;

#[test]
fn runtime_error_exits_1_after_writing_a_checkpoint_that_resumes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let r = write(dir.path(), "fail.lua", FAILING);
    let out = dir.path().join("out");
    let o = taper(&["train", s(&r), "--out", s(&out)]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("fail.lua:10: boom at step 3"), "{err}");
    assert!(err.contains("stack traceback"), "{err}");
    assert!(err.contains("checkpoint written to"), "{err}");
    let ckpt = out.join("checkpoint.safetensors");
    let (_, meta) = checkpoint::load(&ckpt, &Device::Cpu)?;
    assert_eq!(
        (meta.step, meta.epoch, meta.epoch_steps, meta.epoch_complete),
        (3, 1, 3, false)
    );

    // Resume finishes the run: the rest of epoch 1 (23 - 3 batches) and epoch 2.
    let out2 = dir.path().join("out2");
    let o = taper(&[
        "train",
        s(&r),
        "--resume",
        s(&ckpt),
        "--set",
        "fail_at=0",
        "--out",
        s(&out2),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    let (_, meta) = checkpoint::load(&out2.join("checkpoint.safetensors"), &Device::Cpu)?;
    assert_eq!((meta.step, meta.epoch, meta.epoch_complete), (46, 2, true));
    Ok(())
}

#[test]
fn resume_continues_the_same_run() -> Result<()> {
    // 4 epochs straight == 2 epochs, stop, resume for 2 more: identical weights.
    let dir = tempfile::tempdir()?;
    let (a, b, c) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("c"),
    );
    let quick = ["--quiet", "--set", "batch=128"];
    let run = |out: &Path, epochs: &str, extra: &[&str]| {
        let mut args = vec![
            "train",
            "scripts/digits.lua",
            "--out",
            s(out),
            "--set",
            epochs,
        ];
        args.extend(quick);
        args.extend(extra);
        let o = taper(&args);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    };
    run(&a, "epochs=4", &[]);
    run(&b, "epochs=2", &[]);
    let ckpt = b.join("checkpoint.safetensors");
    run(&c, "epochs=4", &["--resume", s(&ckpt)]);
    let (ta, ma) = checkpoint::load(&a.join("checkpoint.safetensors"), &Device::Cpu)?;
    let (tc, mc) = checkpoint::load(&c.join("checkpoint.safetensors"), &Device::Cpu)?;
    assert_eq!((ma.step, ma.epoch), (mc.step, mc.epoch));
    assert_eq!(ta.len(), tc.len());
    for (k, t) in &ta {
        let d = (t - &tc[k])?
            .abs()?
            .flatten_all()?
            .max(0)?
            .to_dtype(candle_core::DType::F64)?
            .to_scalar::<f64>()?;
        assert_eq!(d, 0.0, "{k} differs after resume");
    }
    // The metrics of the resumed run carry on from step and epoch 2.
    let m = std::fs::read_to_string(c.join("metrics.jsonl"))?;
    let first_epoch = m
        .lines()
        .find(|l| l.contains("\"event\":\"epoch\""))
        .unwrap();
    assert!(first_epoch.contains("\"epoch\":3"), "{first_epoch}");
    Ok(())
}

/// Learning rates that cannot be: refused before training, naming the
/// recipe line or the schedule; a run that diverges is not saved as if it
/// had trained.
#[test]
fn bad_learning_rates_and_diverged_weights_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "lr=NaN",
            2,
            "digits.lua:22: taper.optim.adamw: option `lr`: bad learning rate NaN",
        ),
        ("lr=-1", 2, "bad learning rate -1"),
        ("lr=inf", 2, "bad learning rate inf"),
        (
            "lr=1e30",
            1,
            "digits.lua:31: run:step: the loss of step 2 (epoch 1, batch 2) is NaN: the training diverged (lower the learning rate, now 1e30, clip gradients with clip_grad_norm, or look for extreme values in the data); its model is not saved, and no checkpoint was written before it: start again",
        ),
    ];
    for (i, (set, code, says)) in cases.iter().enumerate() {
        let out = dir.path().join(format!("out{i}"));
        let o = taper(&[
            "train",
            "scripts/digits.lua",
            "--quiet",
            "--set",
            set,
            "--set",
            "epochs=2",
            "--out",
            s(&out),
        ]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(*code), "{set}: {err}");
        assert!(err.contains(says), "{set}: {err}");
        assert!(!out.join("checkpoint.safetensors").exists(), "{set}");
    }
    // A schedule that plans a NaN rate.
    let r = write(
        dir.path(),
        "nan_schedule.lua",
        r#"local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 16 }, outputs = 10 },
  data = taper.data.digits{ split = "train" }:batch(32),
  schedule = function(step) return { lr = step < 3 and 1e-3 or 0/0 } end,
}
for _ in run:epochs(1) do for b in run:batches() do run:step(b) end end
"#,
    );
    let o = taper(&[
        "train",
        s(&r),
        "--quiet",
        "--out",
        s(&dir.path().join("sched")),
    ]);
    let (_, err) = text(&o);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("planned step 4: bad learning rate NaN"),
        "{err}"
    );
}

/// `taper train ... | head`: a closed stdout drops the printed lines, and the
/// run goes on to its end and its checkpoint (no panic on a broken pipe).
#[test]
fn a_closed_stdout_does_not_end_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(["train", "scripts/digits.lua", "--set", "epochs=3", "--out"])
        .arg(&out)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.join("checkpoint.safetensors").exists());
}

/// `taper bench ... | head` and `taper sample ... | head`: no panic on a
/// closed stdout either.
#[test]
fn benchmarks_and_samples_survive_a_closed_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let run = |args: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_taper"))
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    run(&["bench", "records", "--steps", "3", "--rounds", "1"]);
    run(&[
        "bench",
        "products",
        "--device",
        "cpu",
        "--precision",
        "f32",
        "--rows",
        "64",
        "--width",
        "16",
        "--vocab",
        "100",
        "--reps",
        "1",
        "--rounds",
        "1",
    ]);
    run(&[
        "bench",
        "elementwise",
        "--device",
        "cpu",
        "--precision",
        "f32",
        "--rows",
        "64",
        "--width",
        "16",
        "--reps",
        "1",
        "--rounds",
        "1",
    ]);
    run(&[
        "bench", "quant", "--rows", "4", "--reps", "1", "--rounds", "1",
    ]);
    let o = out.to_str().unwrap();
    run(&[
        "train",
        "scripts/shakespeare.lua",
        "--set",
        "steps=3",
        "--set",
        "epochs=1",
        "--set",
        "sample=0",
        "--quiet",
        "--out",
        o,
    ]);
    run(&["sample", o, "--tokens", "5"]);
}

/// `taper export` of a model a format does not fit: exit 2, saying why.
#[test]
fn export_refuses_a_format_the_model_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let taper = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_taper"))
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap()
    };
    let o = out.to_str().unwrap();
    let trained = taper(&[
        "train",
        "scripts/digits.lua",
        "--set",
        "epochs=1",
        "--quiet",
        "--out",
        o,
    ]);
    assert!(trained.status.success());
    let hf = dir.path().join("hf");
    let e = taper(&["export", o, "--format", "hf", "--out", hf.to_str().unwrap()]);
    assert_eq!(e.status.code(), Some(2));
    let msg = String::from_utf8_lossy(&e.stderr);
    assert!(
        msg.contains("format hf is for taper.model.gpt and taper.model.bert; this model is mlp"),
        "{msg}"
    );
    // GGUF fits any model (architecture taper for an MLP).
    let gguf = dir.path().join("m.gguf");
    let ok = taper(&[
        "export",
        o,
        "--type",
        "f32",
        "--out",
        gguf.to_str().unwrap(),
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("architecture taper"));
    // ONNX takes the MLP; a GGUF `--type` with it is refused, writing nothing.
    let onnx = dir.path().join("m.onnx");
    let o_onnx = onnx.to_str().unwrap();
    let e = taper(&[
        "export", o, "--format", "onnx", "--type", "f16", "--out", o_onnx,
    ]);
    assert_eq!(e.status.code(), Some(2));
    let msg = String::from_utf8_lossy(&e.stderr);
    assert!(
        msg.contains("format onnx writes f32 weights; --type is for gguf"),
        "{msg}"
    );
    assert!(!onnx.exists());
    let ok = taper(&["export", o, "--format", "onnx", "--out", o_onnx]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let said = String::from_utf8_lossy(&ok.stdout);
    assert!(said.contains("input [batch, 64], output logits"), "{said}");
    assert!(onnx.metadata().unwrap().len() > 4 * (64 * 128 + 128 * 64 + 64 * 10));
    // `taper classify` needs a run on images: it would not know how to
    // read one for the digits MLP.
    let png = dir.path().join("a.png");
    image::GrayImage::new(8, 8).save(&png).unwrap();
    let e = taper(&["classify", o, png.to_str().unwrap()]);
    assert_eq!(e.status.code(), Some(2));
    let msg = String::from_utf8_lossy(&e.stderr);
    assert!(
        msg.contains("its run did not train on an image folder (taper.data.images)"),
        "{msg}"
    );
    // `from` starts a model of the checkpoint's kind, from its options alone.
    let from = dir.path().join("from.lua");
    let from_run = dir.path().join("from-run");
    for (model, says) in [
        (
            format!("taper.model.cnn{{ from = {o:?} }}"),
            "it holds a mlp model, not a cnn".to_string(),
        ),
        (
            format!("taper.model.mlp{{ from = {o:?}, hidden = {{ 3 }} }}"),
            "taper.model.mlp with `from`: unknown option `hidden`".to_string(),
        ),
        (
            format!("taper.model.mlp{{ from = {o:?}, outputs = 0 }}"),
            "option `outputs` must be a positive whole number, got 0".to_string(),
        ),
        (
            format!("taper.model.mlp{{ from = {o:?}, dropout = 1 }}"),
            "option `dropout` must be a rate from 0 up to (not including) 1, got 1".to_string(),
        ),
    ] {
        std::fs::write(
            &from,
            format!(
                "local m = {model}
"
            ),
        )
        .unwrap();
        let e = taper(&[
            "train",
            from.to_str().unwrap(),
            "--quiet",
            "--out",
            from_run.to_str().unwrap(),
        ]);
        assert_eq!(e.status.code(), Some(2));
        let msg = String::from_utf8_lossy(&e.stderr);
        assert!(msg.contains("from.lua:1: ") && msg.contains(&says), "{msg}");
    }
    // Fine-tuning with more dropout than the first run trained with.
    std::fs::write(
        &from,
        format!("print(taper.model.mlp{{ from = {o:?}, dropout = 0.25 }})\n"),
    )
    .unwrap();
    let said = taper(&[
        "train",
        from.to_str().unwrap(),
        "--out",
        from_run.to_str().unwrap(),
    ]);
    assert!(
        said.status.success(),
        "{}",
        String::from_utf8_lossy(&said.stderr)
    );
    let said = String::from_utf8_lossy(&said.stdout);
    assert!(
        said.contains("mlp 64-128-64-10 relu dropout 0.25"),
        "{said}"
    );
    // A GPT is not an ONNX classifier: refused by name, from a recipe too.
    let recipe = dir.path().join("gpt.lua");
    std::fs::write(
        &recipe,
        r#"local train = taper.data.shakespeare{ split = "train", context = 16 }:take(32):batch(16)
local run = taper.run{
  model = taper.model.gpt{ vocab = train:vocab_size(), context = 16, width = 16, layers = 1, heads = 2 },
  optim = taper.optim.adamw{ lr = 1e-3 }, data = train,
}
run:export{ path = "gpt.onnx", format = "onnx" }
"#,
    )
    .unwrap();
    let gpt_out = dir.path().join("gpt");
    let e = taper(&[
        "train",
        recipe.to_str().unwrap(),
        "--quiet",
        "--out",
        gpt_out.to_str().unwrap(),
    ]);
    assert_eq!(e.status.code(), Some(2));
    let msg = String::from_utf8_lossy(&e.stderr);
    assert!(
        msg.contains("gpt.lua:6: run:export: format onnx is for taper.model.mlp and taper.model.cnn; this model is gpt"),
        "{msg}"
    );
}

/// Runs started in the same second (a sweep, a loop over seeds) without
/// `--out`: each gets its own folder, `-2` and `-3` after the first, with
/// one run's records in each. The second used to be refused ("the folder
/// holds a run"), or, started at the same moment, to append to the first's.
#[test]
fn runs_started_together_get_their_own_default_folders() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/digits.lua");
    let runs: Vec<_> = (0..3)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_taper"))
                .args(["train", s(&recipe), "--set", "epochs=1", "--quiet"])
                .current_dir(dir.path())
                .spawn()
        })
        .collect::<std::io::Result<_>>()?;
    for mut r in runs {
        assert!(r.wait()?.success());
    }
    let mut folders: Vec<PathBuf> = std::fs::read_dir(dir.path().join("runs"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    folders.sort();
    assert_eq!(folders.len(), 3, "{folders:?}");
    for f in &folders {
        let records = std::fs::read_to_string(f.join("metrics.jsonl"))?;
        let starts = records.lines().filter(|l| l.contains(r#""event":"run""#));
        assert_eq!(starts.count(), 1, "{}", f.display());
    }
    Ok(())
}

/// `taper classify` on a run on a CSV file reads new rows by the run's
/// column names, wherever they are in the file and whatever other columns
/// it has; a file without one of them is refused, naming it.
#[test]
fn classify_reads_csv_rows_by_the_runs_column_names() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut train = String::from("id,a,b,kind\n");
    for i in 0..200 {
        let (a, b) = ((i * 37 % 101) as f32, (i * 53 % 97) as f32 * 10.0);
        let kind = if a * 10.0 > b { "over" } else { "under" };
        train += &format!("{i},{a},{b},{kind}\n");
    }
    let data = write(dir.path(), "train.csv", &train);
    let recipe = format!(
        r#"
local d = taper.data.csv{{ path = {data:?}, label = "kind", features = {{ "a", "b" }} }}:standardize()
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 2, hidden = {{ 16 }}, outputs = 2 }},
  optim = taper.optim.adamw{{ lr = 1e-2 }}, data = d:shuffle{{ seed = 1 }}:batch(20), seed = 1,
}}
for _ in run:epochs(5) do for b in run:batches() do run:step(b) end end
"#
    );
    let r = write(dir.path(), "t.lua", &recipe);
    let out = dir.path().join("out");
    let o = taper(&["train", s(&r), "--out", s(&out), "--quiet"]);
    assert!(o.status.success(), "{}", text(&o).1);

    let same = write(dir.path(), "same.csv", "a,b\n10,5\n1,900\n");
    let moved = write(dir.path(), "moved.csv", "b,note,a\n5,x,10\n900,y,1\n");
    let answers = |file: &Path| {
        let o = taper(&["classify", s(&out), s(file), "--top", "2"]);
        assert!(o.status.success(), "{}", text(&o).1);
        let (said, _) = text(&o);
        said.lines()
            .map(|l| l.split_once(": ").unwrap().1.to_string())
            .collect::<Vec<_>>()
    };
    let first = answers(&same);
    assert_eq!(first.len(), 2);
    assert!(
        first[0].starts_with("over ") && first[1].starts_with("under "),
        "{first:?}"
    );
    assert_eq!(answers(&moved), first);

    let lacking = write(dir.path(), "lacking.csv", "a,c\n1,2\n");
    let o = taper(&["classify", s(&out), s(&lacking)]);
    assert_eq!(o.status.code(), Some(2));
    let (_, err) = text(&o);
    assert!(
        err.contains("lacking.csv: feature column `b` is not in the header, which names `a`, `c`"),
        "{err}"
    );
    Ok(())
}

/// A European spreadsheet's CSV, as Excel writes it (a byte order mark, `;`
/// between columns, decimal commas, CRLF), read with `delimiter = ";",
/// decimal = ","` as pandas' `read_csv(sep=";", decimal=",")` reads it,
/// trains the same model, bit for bit, as the same table written with
/// points and commas; `taper classify` reads new rows in that format. Read
/// without `decimal`, the file says to give it.
#[test]
fn a_european_spreadsheets_decimal_commas_are_read_with_decimal() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut plain, mut european) = (
        String::from("a,b,kind\n"),
        String::from("\u{feff}a;b;kind\r\n"),
    );
    for i in 0..120 {
        let (a, b) = ((i * 37 % 101) as f32 / 8.0, (i * 53 % 97) as f32 * 1.25);
        let kind = if a * 10.0 > b { "over" } else { "under" };
        plain += &format!("{a},{b},{kind}\n");
        european += &format!(
            "{};{};{kind}\r\n",
            a.to_string().replace('.', ","),
            b.to_string().replace('.', ",")
        );
    }
    let plain = write(dir.path(), "plain.csv", &plain);
    let european = write(dir.path(), "european.csv", &european);
    let train = |data: &Path, opts: &str, out: &Path| {
        let recipe = format!(
            r#"
local d = taper.data.csv{{ path = {data:?}, label = "kind"{opts} }}:standardize()
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 2, hidden = {{ 16 }}, outputs = 2 }},
  optim = taper.optim.adamw{{ lr = 1e-2 }}, data = d:shuffle{{ seed = 1 }}:batch(20), seed = 1,
}}
for _ in run:epochs(6) do for b in run:batches() do run:step(b) end end
"#
        );
        let r = write(dir.path(), "t.lua", &recipe);
        taper(&["train", s(&r), "--out", s(out), "--quiet"])
    };
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let o = train(&plain, "", &a);
    assert!(o.status.success(), "{}", text(&o).1);
    let o = train(&european, r#", delimiter = ";", decimal = ",""#, &b);
    assert!(o.status.success(), "{}", text(&o).1);
    let (ta, _) = checkpoint::load(&a.join("checkpoint.safetensors"), &Device::Cpu)?;
    let (tb, mb) = checkpoint::load(&b.join("checkpoint.safetensors"), &Device::Cpu)?;
    for (k, t) in &ta {
        let values = |t: &candle_core::Tensor| -> Result<Vec<f64>> {
            Ok(t.flatten_all()?
                .to_dtype(candle_core::DType::F64)?
                .to_vec1()?)
        };
        let same = values(t)? == values(&tb[k])?;
        assert!(same, "{k} differs");
    }
    assert_eq!(mb.table_input.unwrap().decimal, ",");

    let rows = write(
        dir.path(),
        "rows.csv",
        "\u{feff}a;b\r\n10,5;5,25\r\n0,125;90,5\r\n",
    );
    let o = taper(&["classify", s(&b), s(&rows)]);
    let (said, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let kinds: Vec<_> = said
        .lines()
        .map(|l| l.split(": ").nth(1).unwrap().split(' ').next().unwrap())
        .collect();
    assert_eq!(kinds, ["over", "under"], "{said}");
    // The same rows saved as UTF-16 (Excel's "Unicode Text", Notepad's
    // "Unicode"), with its byte order mark.
    let utf16: Vec<u8> = "\u{feff}a;b\r\n10,5;5,25\r\n0,125;90,5\r\n"
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    let rows16 = dir.path().join("rows16.csv");
    std::fs::write(&rows16, utf16)?;
    let o = taper(&["classify", s(&b), s(&rows16)]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert_eq!(text(&o).0.replace("rows16.csv", "rows.csv"), said);

    let o = train(&european, r#", delimiter = ";""#, &dir.path().join("c"));
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o).1;
    assert!(
        err.contains("european.csv: line 3, column 1 (`a`): `4,625` is not a number with `.` as the decimal mark; it reads as one with a decimal comma: give `decimal = \",\"`"),
        "{err}"
    );
    Ok(())
}

/// `taper sample`, `classify` and `export` on a folder without a checkpoint
/// say why there is none: the run in it has not saved one yet (here, it
/// ended before its first step), or the folder is not a run's.
#[test]
fn commands_on_a_folder_without_a_checkpoint_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(
        dir.path(),
        "early.lua",
        "local run = taper.run{ model = taper.model.mlp{ inputs = 64, outputs = 10 } }\nerror(\"before the first step\")\n",
    );
    let out = dir.path().join("out");
    let o = taper(&["train", s(&recipe), "--out", s(&out)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o).1);
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let onnx = dir.path().join("model.onnx");
    for args in [
        vec!["sample"],
        vec!["classify", s(&recipe)],
        vec!["export", "--format", "onnx", "--out", s(&onnx)],
    ] {
        for (folder, says) in [
            (
                &out,
                "no checkpoint yet: the run in this folder writes one every `checkpoint_every`",
            ),
            (
                &empty,
                "not a run folder: it holds no checkpoint and no records",
            ),
        ] {
            let mut a = vec![args[0], s(folder)];
            a.extend_from_slice(&args[1..]);
            let o = taper(&a);
            let err = text(&o).1;
            assert_eq!(o.status.code(), Some(2), "{a:?}: {err}");
            assert!(
                err.contains(&format!("{}: {says}", s(folder))),
                "{a:?}: {err}"
            );
        }
    }
}

/// A recipe as a Windows editor may save it (a UTF-8 byte-order mark, CRLF
/// line ends), or with a `#!` first line, is read as Lua's own `loadfile`
/// reads it: it trains, and an error names the file's own line.
#[test]
fn a_recipe_with_a_byte_order_mark_or_a_hash_line_trains() {
    let dir = tempfile::tempdir().unwrap();
    let shipped = std::fs::read_to_string("scripts/digits.lua").unwrap();
    let windows = format!("\u{feff}{}", shipped.replace('\n', "\r\n"));
    let hash = format!("#!/usr/bin/env -S taper train\n{shipped}");
    for (name, src) in [("bom.lua", windows), ("hash.lua", hash)] {
        let recipe = write(dir.path(), name, &src);
        let out = dir.path().join(name).with_extension("out");
        let o = taper(&[
            "train",
            s(&recipe),
            "--set",
            "epochs=1",
            "--quiet",
            "--out",
            s(&out),
        ]);
        assert!(o.status.success(), "{name}: {}", text(&o).1);
        let broken = write(dir.path(), name, &format!("{src}\r\nlocal x = nil + 1\r\n"));
        let lines = src.lines().count() + 2;
        let again = dir.path().join(name).with_extension("again");
        let o = taper(&[
            "train",
            s(&broken),
            "--set",
            "epochs=1",
            "--quiet",
            "--out",
            s(&again),
        ]);
        let err = text(&o).1;
        assert!(err.contains(&format!("{name}:{lines}:")), "{name}: {err}");
    }
}

/// `taper.data.images` given a folder of splits (`train/`, `val/`) instead
/// of a split's folder warns, naming the folder to give.
#[test]
fn an_image_folder_of_splits_gets_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pets");
    for split in ["train", "val"] {
        for class in ["cat", "dog"] {
            let p = root.join(format!("{split}/{class}/0.png"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            image::RgbImage::from_pixel(2, 2, image::Rgb([1, 2, 3]))
                .save(&p)
                .unwrap();
        }
    }
    let recipe = write(
        dir.path(),
        "pets.lua",
        &format!(
            "local d = taper.data.images{{ path = \"{}\" }}\n",
            root.display()
        ),
    );
    let out = dir.path().join("out");
    let o = taper(&["train", s(&recipe), "--quiet", "--out", s(&out)]);
    let err = text(&o).1;
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("taper: warning: taper.data.images: ")
            && err.contains("they look like splits, not classes")
            && err.contains(&format!(
                "give the split's folder as `path` ({})",
                root.join("train").display()
            )),
        "{err}"
    );
}

/// Files in an image folder that are not images taper reads (a GIF, a
/// phone's HEIC) are passed over, as torchvision's `ImageFolder` does, but
/// said, for the shipped recipe's training and validation folders and for
/// `taper classify` on a folder; hidden files and Windows' `Thumbs.db` are
/// passed over without a word.
#[test]
fn files_an_image_folder_passes_over_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pets");
    for split in ["train", "val"] {
        for class in ["cat", "dog"] {
            let d = root.join(format!("{split}/{class}"));
            std::fs::create_dir_all(&d).unwrap();
            for (i, shade) in [0u8, 60].into_iter().enumerate() {
                let v = if class == "cat" { shade } else { 255 - shade };
                image::RgbImage::from_pixel(4, 4, image::Rgb([v, v, v]))
                    .save(d.join(format!("{i}.png")))
                    .unwrap();
            }
            std::fs::write(d.join("2.gif"), b"GIF89a").unwrap();
            std::fs::write(d.join("IMG_0001.HEIC"), b"").unwrap();
            std::fs::write(d.join("Thumbs.db"), b"").unwrap();
            std::fs::write(d.join(".DS_Store"), b"").unwrap();
        }
    }
    let out = dir.path().join("out");
    let data = format!("data={}", root.display());
    let o = taper(&[
        "train",
        "scripts/image_folder.lua",
        "--out",
        s(&out),
        "--set",
        &data,
        "--set",
        "size=4",
        "--set",
        "channels=3",
        "--set",
        "epochs=1",
    ]);
    let (said, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        said.contains("2 classes (cat, dog), 4 train / 4 val images"),
        "{said}"
    );
    for split in ["train", "val"] {
        let want = format!(
            "taper: warning: taper.data.images: {}: passed over: 4 files not of a type read as an image (.gif: 2, such as ",
            root.join(split).display()
        );
        assert_eq!(err.matches(&want).count(), 1, "{want} in {err}");
    }
    assert!(
        err.contains("; .heic: 2, such as ") && err.contains("convert the others to PNG or JPEG"),
        "{err}"
    );
    assert!(
        !err.contains("Thumbs") && !err.contains("DS_Store"),
        "{err}"
    );

    let cats = root.join("val/cat");
    let o = taper(&["classify", s(&out), s(&cats)]);
    let (said, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(said.lines().count(), 2, "{said}");
    assert!(
        err.contains(&format!(
            "taper classify: {}: passed over: 2 files not of a type read as an image (.gif: 1, such as ",
            cats.display()
        )),
        "{err}"
    );
}

/// `t.csv` in `dir`: 40 rows of two number features `a`, `b` and a label `c`.
fn two_features(dir: &Path) -> PathBuf {
    let rows: String = (0..40)
        .map(|i| format!("{},{},{}\n", i * 10, (i * 7) % 13, i % 2))
        .collect();
    write(dir, "t.csv", &format!("a,b,c\n{rows}"))
}

/// A test part evaluated under the training part's name (`all`: a split
/// whose parts were not named), whose eval records would read as the
/// training data's, is warned of once, at the recipe's line. Named parts,
/// the training data itself and a `take` of it are not.
#[test]
fn evaluating_other_data_under_the_training_datas_name_is_warned_of_once() {
    let dir = tempfile::tempdir().unwrap();
    let csv = two_features(dir.path());
    let recipe = |named: bool| {
        format!(
            r#"local d = taper.data.csv{{ path = {:?}, label = "c" }}
local train, test = d:split{{ 0.5, 0.5, seed = 1 }}
{}
local run = taper.run{{ model = taper.model.mlp{{ inputs = 2, outputs = 2 }}, data = train:batch(4) }}
for _ in run:epochs(2) do
  for b in run:batches() do run:step(b) end
  run:evaluate(train)
  run:evaluate(train:take(8))
  run:evaluate(test)
end
"#,
            s(&csv),
            if named {
                "train, test = train:named(\"train\"), test:named(\"test\")"
            } else {
                ""
            }
        )
    };
    for named in [false, true] {
        let r = write(dir.path(), "r.lua", &recipe(named));
        let out = dir.path().join(format!("out-{named}"));
        let o = taper(&["train", s(&r), "--quiet", "--out", s(&out)]);
        let (_, err) = text(&o);
        assert!(o.status.success(), "{err}");
        let warned = err
            .matches("r.lua:9: run:evaluate on data named `all`, as the run's training data is, but other samples")
            .count();
        assert_eq!(warned, usize::from(!named), "{err}");
        assert_eq!(
            err.matches("run:evaluate on data named").count(),
            warned,
            "{err}"
        );
    }
}

/// Evaluating raw table rows with a model trained on standardized ones (a
/// test part whose `:standardize(train)` was forgotten) is warned of, once,
/// at the recipe's line; standardized as the training data was, it is not.
#[test]
fn evaluating_unstandardized_data_is_warned_of_once() {
    let dir = tempfile::tempdir().unwrap();
    let csv = two_features(dir.path());
    let recipe = |forget: bool| {
        format!(
            r#"local d = taper.data.csv{{ path = {:?}, label = "c" }}
local train, test = d:split{{ 0.5, 0.5 }}
train = train:standardize()
test = {}
local run = taper.run{{ model = taper.model.mlp{{ inputs = 2, outputs = 2 }}, data = train:batch(4) }}
for _ in run:epochs(2) do
  for b in run:batches() do run:step(b) end
  run:evaluate(test)
end
"#,
            s(&csv),
            if forget {
                "test"
            } else {
                "test:standardize(train)"
            }
        )
    };
    for forget in [true, false] {
        let r = write(dir.path(), "r.lua", &recipe(forget));
        let out = dir.path().join(format!("out-{forget}"));
        let o = taper(&["train", s(&r), "--quiet", "--out", s(&out)]);
        let (_, err) = text(&o);
        assert!(o.status.success(), "{err}");
        let warned = err
            .matches("r.lua:8: run:evaluate on all data that is not standardized, while the run trained on standardized data")
            .count();
        assert_eq!(warned, usize::from(forget), "{err}");
    }
}

/// Data that does not fit the model: `taper plan` says so (before, candle's
/// "shape mismatch in matmul", exit 1), and training names the sample at
/// the step's line as ever, the run's start having planned nothing on it.
#[test]
fn a_plan_of_data_the_model_does_not_take_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let r = write(
        dir.path(),
        "wrong.lua",
        "local run = taper.run{\n\
         \x20 model = taper.model.mlp{ inputs = 5, hidden = { 4 }, outputs = 10 },\n\
         \x20 optim = taper.optim.adamw{ lr = 1e-3 },\n\
         \x20 data = taper.data.digits{}:batch(8),\n\
         }\n\
         for _ in run:epochs(1) do\n\
         \x20 for batch in run:batches() do run:step(batch) end\n\
         end\n",
    );
    let says = "each sample has 64 input values (shape [64]), the model takes 5";
    let o = taper(&["plan", s(&r)]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("the run's first training batch: {says}")),
        "{err}"
    );
    let o = taper(&["train", s(&r), "--out", s(&dir.path().join("out"))]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("wrong.lua:7: run:step: ") && err.contains(says),
        "{err}"
    );
}
