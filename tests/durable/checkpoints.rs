//! What a run leaves on disk: a checksum that catches a damaged checkpoint
//! (and `--resume` falling back to the one before), older checkpoints kept
//! as asked by the CLI or the recipe, sidecars that agree with their
//! checkpoint, and every run of a multi-run recipe resumed.

use super::*;

/// Flips one byte `back` bytes before the end of `path` (in the tensors).
fn flip(path: &Path, back: usize) {
    let mut b = std::fs::read(path).unwrap();
    let n = b.len();
    b[n - back] ^= 0x5a;
    std::fs::write(path, b).unwrap();
}

fn names(out: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".safetensors"))
        .collect();
    v.sort();
    v
}

/// Each `checkpoint` record's step, and whether the save succeeded.
fn saves(out: &Path) -> Vec<(u64, bool)> {
    records(out, "checkpoint")
        .iter()
        .map(|r| {
            (
                r["step"].as_u64().unwrap(),
                r["ok"].as_bool().unwrap_or(true),
            )
        })
        .collect()
}

fn run_ok(args: &[&str]) -> Output {
    let o = cmd(args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

fn run_fails(args: &[&str], code: i32, says: &str) {
    let o = cmd(args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{err}");
    assert!(err.contains(says), "expected `{says}` in: {err}");
}

#[test]
fn a_damaged_checkpoint_is_refused_and_resume_falls_back_to_the_one_before() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let three = ["scripts/digits.lua", "--set", "epochs=3"];
    run_ok(&recipe_args(&three, &out, &["--checkpoint-every", "20"]));
    assert_eq!(
        names(&out),
        ["checkpoint.safetensors", "checkpoint.step120.safetensors"]
    );
    let newest = out.join("checkpoint.safetensors");
    let good = std::fs::read(&newest).unwrap();
    flip(&newest, 10);
    // Named as a file, it is refused before anything runs.
    let copy = dir.path().join("copy");
    let mut args = recipe_args(&three, &copy, &["--resume"]);
    args.push(s(&newest));
    run_fails(&args, 2, "damaged: its tensors' checksum is crc32:");
    // A run folder continues from the newest checkpoint that verifies, says
    // so, and sets the damaged one aside.
    let four = ["scripts/digits.lua", "--set", "epochs=4"];
    let o = run_ok(&recipe_args(&four, &out, &["--resume", "auto"]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("checkpoint.safetensors: damaged"), "{err}");
    assert!(err.contains("renamed to"), "{err}");
    let runs = records(&out, "run");
    assert_eq!(runs.last().unwrap()["step"], 120, "resumed at step 120");
    let mut damaged = std::fs::read(out.join("checkpoint.safetensors.damaged")).unwrap();
    let n = damaged.len();
    damaged[n - 10] ^= 0x5a;
    assert_eq!(damaged, good, "set aside as it was");
    // When no checkpoint of the run verifies, nothing is trained over them.
    for name in names(&out).iter().filter(|n| n.ends_with(".safetensors")) {
        flip(&out.join(name), 4);
    }
    run_fails(
        &recipe_args(&four, &out, &["--resume", "auto"]),
        2,
        "no checkpoint of this run verifies",
    );
    // A truncated file (a copy cut short) is named, with what is wrong.
    let cut = dir.path().join("cut.safetensors");
    std::fs::write(&cut, &good[..good.len() / 2]).unwrap();
    let mut args = recipe_args(&three, &copy, &["--resume"]);
    args.push(s(&cut));
    run_fails(&args, 2, "cut.safetensors: damaged");
}

#[test]
fn older_checkpoints_are_kept_as_the_cli_or_the_recipe_asks() {
    let dir = tempfile::tempdir().unwrap();
    let digits = ["scripts/digits.lua", "--set", "epochs=2"];
    let three = dir.path().join("three");
    run_ok(&recipe_args(
        &digits,
        &three,
        &["--checkpoint-every", "10", "--keep-checkpoints", "3"],
    ));
    assert_eq!(
        names(&three),
        [
            "checkpoint.safetensors",
            "checkpoint.step70.safetensors",
            "checkpoint.step80.safetensors"
        ]
    );
    // The recipe's own options, and the command line over them.
    let recipe = dir.path().join("every.lua");
    std::fs::write(
        &recipe,
        r#"local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 16 }, outputs = 10 },
  data = taper.data.digits{ split = "train" }:batch(32),
  checkpoint_every = 15, keep_checkpoints = 4,
}
for _ in run:epochs(1) do
  for batch in run:batches() do run:step(batch) end
end
"#,
    )
    .unwrap();
    let own = dir.path().join("own");
    run_ok(&["train", s(&recipe), "--quiet", "--out", s(&own)]);
    let steps: Vec<u64> = records(&own, "checkpoint")
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [15, 30, 45, 45]);
    assert_eq!(
        names(&own),
        [
            "checkpoint.safetensors",
            "checkpoint.step15.safetensors",
            "checkpoint.step30.safetensors"
        ]
    );
    let cli = dir.path().join("cli");
    run_ok(&[
        "train",
        s(&recipe),
        "--quiet",
        "--out",
        s(&cli),
        "--checkpoint-every",
        "never",
        "--keep-checkpoints",
        "1",
    ]);
    assert_eq!(records(&cli, "checkpoint").len(), 1);
    assert_eq!(names(&cli), ["checkpoint.safetensors"]);
    // Bad values get the recipe line.
    for (opt, says) in [
        ("checkpoint_every = -5", "option `checkpoint_every` must be a positive number of steps, a time (\"10m\") or \"never\", got -5"),
        ("checkpoint_every = \"soon\"", "option `checkpoint_every`: `soon`: expected a number of steps"),
        ("keep_checkpoints = 0", "option `keep_checkpoints` must be a positive integer, got 0"),
    ] {
        let bad = dir.path().join("bad.lua");
        std::fs::write(
            &bad,
            format!("taper.run{{\n  model = taper.model.mlp{{ inputs = 2, outputs = 2 }},\n  {opt},\n}}\n"),
        )
        .unwrap();
        run_fails(&["train", s(&bad), "--quiet"], 2, &format!("bad.lua:1: taper.run: {says}"));
    }
}

#[test]
fn a_sidecar_left_behind_by_a_kill_is_rewritten_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    run_ok(&train_args(&out, &["--set", "epochs=1"]));
    let side = out.join("checkpoint.json");
    let truth = std::fs::read_to_string(&side).unwrap();
    // A kill between the checkpoint's rename and the sidecar's leaves the
    // sidecar of the save before; a kill before both, temporary files.
    let old = truth.replace("\"step\": 45", "\"step\": 40");
    assert_ne!(old, truth);
    std::fs::write(&side, old).unwrap();
    std::fs::write(out.join("checkpoint.safetensors.tmp"), "half").unwrap();
    assert_eq!(checkpoint::tidy(&out), 2);
    assert_eq!(std::fs::read_to_string(&side).unwrap(), truth);
    assert!(!out.join("checkpoint.safetensors.tmp").exists());
    assert_eq!(checkpoint::tidy(&out), 0, "nothing left to do");
}

/// A recipe with three runs (teacher, distilled student, plain student),
/// stopped in the student's epoch: the teacher resumes finished, the student
/// from its own checkpoint, and every run ends as in a straight run.
#[test]
fn every_run_of_a_distillation_recipe_resumes() {
    let recipe = &[
        "scripts/shakespeare_distill.lua",
        "--set",
        "steps=60",
        "--set",
        "teacher_epochs=1",
    ];
    let dir = tempfile::tempdir().unwrap();
    let straight = straight_run(recipe, dir.path()).with_file_name("");
    let out = dir.path().join("stopped");
    let mut child = cmd(&recipe_args(recipe, &out, &["--checkpoint-every", "20"]))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let student = |r: &Value| {
        r["path"]
            .as_str()
            .unwrap()
            .ends_with("checkpoint-2.safetensors")
    };
    while !records(&out, "checkpoint").iter().any(student) {
        assert!(child.try_wait().unwrap().is_none(), "ended early");
        assert!(start.elapsed() < DEADLINE, "no student checkpoint");
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let o = wait(child);
    assert_eq!(
        o.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let resumed_at = checkpoint::read_meta(&out.join("checkpoint-2.safetensors"))
        .unwrap()
        .step;
    assert!((20..60).contains(&resumed_at), "stopped at {resumed_at}");
    run_ok(&recipe_args(
        recipe,
        &out,
        &["--checkpoint-every", "20", "--resume", "auto"],
    ));
    let runs = records(&out, "run");
    let second: Vec<u64> = runs
        .iter()
        .filter(|r| r["run"] == 2)
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(second, [0, resumed_at], "the student resumed");
    for name in [
        "checkpoint.safetensors",
        "checkpoint-2.safetensors",
        "checkpoint-3.safetensors",
    ] {
        assert!(
            weights(&out.join(name)) == weights(&straight.join(name)),
            "{name} differs from a straight run's"
        );
    }
}

/// A learning rate configured differently since the checkpoint (`--set
/// lr=`) is the one the resumed run uses, and it says so; an unchanged one
/// keeps the checkpoint's (which a schedule or `run:set_lr` may have set).
#[test]
fn a_learning_rate_set_on_resume_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    run_ok(&train_args(&out, &["--set", "epochs=1"]));
    let o = run_ok(&train_args(
        &out,
        &["--set", "epochs=2", "--set", "lr=1e-5", "--resume", "auto"],
    ));
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        said.contains(
            "note: learning rate 0.00001 (configured since the checkpoint) replaces its 0.003"
        ),
        "{said}"
    );
    let meta = checkpoint::read_meta(&out.join("checkpoint.safetensors")).unwrap();
    assert_eq!((meta.lr, meta.configured_lr), (1e-5, Some(1e-5)));
    let epochs = records(&out, "epoch");
    assert_eq!(epochs.last().unwrap()["lr"], 1e-5);
    // Resumed again with the same configuration: the checkpoint's lr, no note.
    let o = run_ok(&train_args(
        &out,
        &["--set", "epochs=3", "--set", "lr=1e-5", "--resume", "auto"],
    ));
    assert!(!String::from_utf8_lossy(&o.stderr).contains("note: learning rate"));
}

/// A periodic checkpoint that meets a full disk does not end the run: the
/// sidecar's temporary file is `/dev/full` (a real ENOSPC, no mount
/// needed), so the save at step 10 fails; the run warns, records it with
/// `ok: false`, trains on, and the saves at 20, 30, 40 and the end succeed.
/// A diverged model still stops the run at its periodic checkpoint.
#[test]
fn a_periodic_checkpoint_on_a_full_disk_is_a_warning_and_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let recipe = dir.path().join("full.lua");
    std::fs::write(
        &recipe,
        r#"local cfg = taper.config{ out = "", lr = 1e-3 }
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 16 }, outputs = 10 },
  optim = taper.optim.adamw{ lr = cfg.lr },
  data = taper.data.digits{}:batch(32), checkpoint_every = 10, seed = 1,
}
assert(os.execute("ln -s /dev/full " .. cfg.out .. "/checkpoint.json.tmp"))
for _ in run:epochs(1) do for b in run:batches() do run:step(b) end end
"#,
    )
    .unwrap();
    let set_out = format!("out={}", s(&out));
    let args = [
        "train",
        s(&recipe),
        "--quiet",
        "--out",
        s(&out),
        "--set",
        &set_out,
    ];
    let o = run_ok(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("step 10: the periodic checkpoint failed, training goes on")
            && err.contains("No space left on device"),
        "{err}"
    );
    assert_eq!(
        saves(&out),
        [(10, false), (20, true), (30, true), (40, true), (45, true)]
    );
    let (_, meta) = checkpoint::load(&out.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(meta.step, 45);
    let left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// A disk that holds exactly the checkpoints kept: the save at step 40
/// meets a full disk (its sidecar's temporary file is `/dev/full`, a real
/// ENOSPC), removes the oldest kept checkpoint, which this save would have
/// removed once written, and is tried again: every save succeeds, and the
/// folder keeps its three.
#[test]
fn a_save_on_a_full_disk_makes_room_from_the_oldest_kept_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let recipe = dir.path().join("room.lua");
    std::fs::write(
        &recipe,
        r#"local cfg = taper.config{ out = "" }
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 16 }, outputs = 10 },
  data = taper.data.digits{}:batch(32), checkpoint_every = 10, keep_checkpoints = 3, seed = 1,
}
for _ in run:epochs(1) do
  for b in run:batches() do
    run:step(b)
    if run.steps == 35 then
      assert(os.execute("ln -s /dev/full " .. cfg.out .. "/checkpoint.json.tmp"))
    end
  end
end
"#,
    )
    .unwrap();
    let set_out = format!("out={}", s(&out));
    let o = run_ok(&[
        "train",
        s(&recipe),
        "--quiet",
        "--out",
        s(&out),
        "--set",
        &set_out,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    let oldest = out.join("checkpoint.step10.safetensors");
    assert!(
        err.contains("step 40: the disk is full (")
            && err.contains("No space left on device")
            && err.contains(&format!(
                "removed {}, the oldest checkpoint kept, to make room for this one",
                s(&oldest)
            )),
        "{err}"
    );
    assert_eq!(
        saves(&out),
        [(10, true), (20, true), (30, true), (40, true), (45, true)]
    );
    assert_eq!(
        names(&out),
        [
            "checkpoint.safetensors",
            "checkpoint.step30.safetensors",
            "checkpoint.step40.safetensors"
        ]
    );
    let (_, meta) = checkpoint::load(&out.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(meta.step, 45);
}

/// A final checkpoint that meets a full disk ends the run with exit 1, and
/// says which checkpoint an earlier save left and how to continue from it;
/// that `--resume`, with room on the disk again, finishes the run. (One
/// checkpoint kept: with older ones, the save would remove them to make
/// room, and succeed.)
#[test]
fn a_final_checkpoint_on_a_full_disk_names_the_one_to_continue_from() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let recipe = dir.path().join("full.lua");
    std::fs::write(
        &recipe,
        r#"local cfg = taper.config{ out = "", full = true }
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 16 }, outputs = 10 },
  optim = taper.optim.adamw{ lr = 1e-3 },
  data = taper.data.digits{}:batch(32), checkpoint_every = 10, keep_checkpoints = 1, seed = 1,
}
for _ in run:epochs(1) do for b in run:batches() do run:step(b) end end
if cfg.full then assert(os.execute("ln -s /dev/full " .. cfg.out .. "/checkpoint.json.tmp")) end
"#,
    )
    .unwrap();
    let set_out = format!("out={}", s(&out));
    let base = [
        "train",
        s(&recipe),
        "--quiet",
        "--out",
        s(&out),
        "--set",
        &set_out,
    ];
    let o = cmd(&[&base[..], &["--set", "full=true"]].concat())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let newest = out.join("checkpoint.safetensors");
    let says = format!(
        "no checkpoint was written now; the newest one saved is {} (step 40): continue from it with --resume {}",
        newest.display(),
        out.display()
    );
    assert!(
        err.contains("No space left on device") && err.contains(&says),
        "{err}"
    );
    // The failed save removed its temporary file (the link) already.
    assert!(!out.join("checkpoint.json.tmp").exists());
    let again = [&base[..], &["--set", "full=false", "--resume", s(&out)]].concat();
    let o = cmd(&again).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (_, meta) = checkpoint::load(&newest, &Device::Cpu).unwrap();
    assert_eq!(meta.step, 45);
}

/// A resume refused before its run exists (the recipe's model was edited)
/// says why and nothing more: no checkpoint was tried, so the same
/// `--resume` is not offered as the way on.
#[test]
fn a_resume_refused_for_another_model_does_not_offer_the_same_resume() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let recipe = dir.path().join("digits.lua");
    let shipped = std::fs::read_to_string("scripts/digits.lua").unwrap();
    std::fs::write(&recipe, &shipped).unwrap();
    let base = [
        "train",
        s(&recipe),
        "--quiet",
        "--out",
        s(&out),
        "--set",
        "epochs=2",
    ];
    let o = cmd(&base).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let wider = shipped.replacen("hidden = { 128, 64 }", "hidden = { 256, 64 }", 1);
    assert_ne!(wider, shipped, "scripts/digits.lua's hidden sizes changed");
    std::fs::write(&recipe, wider).unwrap();
    let o = cmd(&[&base[..], &["--resume", "auto"]].concat())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    // A usage error at the recipe's `taper.run` line, with the way on, and
    // no traceback.
    assert_eq!(o.status.code(), Some(2), "{err}");
    let line = shipped
        .lines()
        .position(|l| l.contains("taper.run{"))
        .expect("scripts/digits.lua calls taper.run")
        + 1;
    assert!(
        err.contains(&format!(
            "{}:{line}: taper.run: resuming ",
            recipe.display()
        )) && err.contains(
            "it holds `mlp 64-128-64-10 relu`, the recipe builds `mlp 64-256-64-10 relu`"
        ) && err.contains("start it in another folder (--out)"),
        "{err}"
    );
    assert!(
        !err.contains("continue from it") && !err.contains("traceback"),
        "{err}"
    );
}

/// Dropout is a regularizer, not part of what the model is (no weight
/// depends on it): the shipped digits recipe trained without it resumes
/// with `--set dropout=0.2`, says so, and its checkpoints hold the new rate
/// (anything else about the model still refuses the resume: the test
/// above).
#[test]
fn a_resume_may_change_the_dropout() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let base = ["train", "scripts/digits.lua", "--quiet", "--out", s(&out)];
    let o = cmd(&[&base[..], &["--set", "epochs=1"]].concat())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let set = [
        "--set",
        "epochs=2",
        "--set",
        "dropout=0.2",
        "--resume",
        "auto",
    ];
    let o = cmd(&[&base[..], &set].concat()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("note: dropout as the recipe declares it (dropout 0 -> 0.2) from here on"),
        "{err}"
    );
    let meta = checkpoint::read_meta(&out.join("checkpoint.safetensors")).unwrap();
    assert_eq!(
        (meta.epoch, meta.model.as_str()),
        (2, "mlp 64-128-64-10 relu dropout 0.2")
    );
}

/// A run stopped mid-epoch (os.exit after step 3: 150 of 600 samples) and
/// resumed: into the same data, quietly; into data of another size (500
/// samples), with a note that says what the rest of the epoch will be. The
/// resumed epoch's record counts the samples before the stop.
#[test]
fn a_mid_epoch_resume_into_data_of_another_size_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("take.lua");
    std::fs::write(
        &recipe,
        r#"local cfg = taper.config{ n = 600, stop = 0 }
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 16 }, outputs = 10 },
  data = taper.data.digits{}:take(cfg.n):shuffle{ seed = 1 }:batch(50), seed = 1,
}
for _ in run:epochs(2) do
  for b in run:batches() do
    run:step(b)
    if run.steps == cfg.stop then os.exit(7) end
  end
end
"#,
    )
    .unwrap();
    for (n, note) in [("n=600", false), ("n=500", true)] {
        let out = dir.path().join(n);
        let base = ["train", s(&recipe), "--quiet", "--out", s(&out)];
        let o = cmd(&[&base[..], &["--set", "stop=3"]].concat())
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(7),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let o = cmd(&[&base[..], &["--set", n, "--resume", "auto"]].concat())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        let says = "note: the training data has 500 samples now, and epoch 1 stopped after 150 of its 600: it goes on from sample 150 of the new data's order";
        assert_eq!(err.contains(says), note, "{n}: {err}");
        let samples: Vec<Value> = records(&out, "epoch")
            .iter()
            .map(|r| r["samples"].clone())
            .collect();
        // Epoch 1: 150 before the stop and the rest of the data's order after it.
        let total = if note { 500 } else { 600 };
        assert_eq!(samples, [json!(total), json!(total)], "{n}");
    }
}

/// A run whose loss turns NaN stops at that step (exit 1), naming the
/// recipe line and the checkpoint to go back to, with a `diverged` record;
/// the diverged model is saved over nothing. `--resume` from that
/// checkpoint, with the cause removed, ends with the same weights as a run
/// that never diverged. A recipe that catches the error and saves anyway is
/// refused: the weights hold NaN.
#[test]
fn a_run_that_diverges_stops_there_and_resumes_from_its_last_good_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("blow.lua");
    std::fs::write(
        &recipe,
        r#"local cfg = taper.config{ blow_at = 25, catch = "" }
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 16 }, outputs = 10 },
  data = taper.data.digits{}:batch(32), checkpoint_every = 10, seed = 1,
}
for _ in run:epochs(2) do
  for b in run:batches() do
    if run.steps + 1 == cfg.blow_at then run:set_lr(1e30) end
    local ok, e = pcall(run.step, run, b)
    if not ok and cfg.catch ~= "" then run:save(cfg.catch) elseif not ok then error(e, 0) end
  end
end
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = cmd(&["train", s(&recipe), "--quiet", "--out", s(&out)])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let says = format!(
        "blow.lua:9: run:step: the loss of step 26 (epoch 1, batch 26) is NaN: the training diverged (lower the learning rate, now 1e30, clip gradients with clip_grad_norm, or look for extreme values in the data); its model is not saved, and the last good checkpoint, {0}/checkpoint.safetensors (step 20), is kept: continue from it with --resume {0}",
        s(&out)
    );
    assert!(err.contains(&says), "expected `{says}` in: {err}");
    assert!(!err.contains("traceback"), "{err}");
    let saved: Vec<u64> = records(&out, "checkpoint")
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(saved, [10, 20]);
    let d = records(&out, "diverged");
    assert_eq!(d.len(), 1);
    assert_eq!((&d[0]["step"], &d[0]["batch"]), (&json!(26), &json!(26)));
    assert_eq!(d[0]["checkpoint_step"], 20);
    let (_, meta) = checkpoint::load(&out.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(meta.step, 20);
    // The report marks it.
    run_ok(&["report", s(&out)]);
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    let marked = r#""kind":"diverged","label":"diverged: the loss of step 26 (epoch 1, batch 26) is NaN","step":26"#;
    assert!(page.contains(marked), "no diverged marker");

    let fixed = ["--set", "blow_at=0"];
    let mut args = vec!["train", s(&recipe), "--quiet", "--resume", s(&out)];
    args.extend(fixed);
    run_ok(&args);
    let straight = dir.path().join("straight");
    let mut args = vec!["train", s(&recipe), "--quiet", "--out", s(&straight)];
    args.extend(fixed);
    run_ok(&args);
    assert_eq!(
        weights(&out.join("checkpoint.safetensors")),
        weights(&straight.join("checkpoint.safetensors"))
    );

    let caught = dir.path().join("caught");
    let set_catch = format!("catch={}", s(&caught.join("x.safetensors")));
    let args = [
        "train",
        s(&recipe),
        "--quiet",
        "--out",
        s(&caught),
        "--set",
        &set_catch,
    ];
    run_fails(
        &args,
        1,
        "x.safetensors: `model.fc0.bias` holds NaN or infinite values (the training diverged",
    );
    assert!(!caught.join("x.safetensors").exists());
}

/// Resuming under other optimizer settings says so (the learning rate has
/// its own note, tested in `tests/cli.rs`).
#[test]
fn resuming_under_other_optimizer_settings_is_noted() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    run_ok(&[
        "train",
        "scripts/digits.lua",
        "--quiet",
        "--set",
        "epochs=1",
        "--out",
        s(&out),
    ]);
    let o = run_ok(&[
        "train",
        "scripts/digits.lua",
        "--quiet",
        "--set",
        "epochs=2",
        "--set",
        "weight_decay=0.5",
        "--resume",
        s(&out),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("weight_decay 0.5` replaces the checkpoint's `adamw"),
        "{err}"
    );
}
