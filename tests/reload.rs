//! Hot reload, end to end: `taper train --watch` runs in the background while
//! the test edits its scripts. Every wait polls `metrics.jsonl` or the
//! process with a deadline; the recipes hold still at a known point with
//! `run:reload_point{ wait = ... }`, so that edits land where the test says.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use candle_core::Device;
use serde_json::Value;
use taper::engine::checkpoint;

mod common;

const DEADLINE: Duration = Duration::from_secs(60);

fn taper(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start taper")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Trains `DIR/recipe.lua` without watching, to the end; returns `DIR/out`.
fn train_unwatched(dir: &Path) -> std::path::PathBuf {
    let out = dir.join("out");
    finish(taper(&[
        "train",
        s(&dir.join("recipe.lua")),
        "--quiet",
        "--out",
        s(&out),
    ]));
    out
}

/// Starts `taper train RECIPE --watch` writing into `DIR/out`.
fn watched(dir: &Path, recipe: &str) -> Child {
    let out = dir.join("out");
    taper(&[
        "train",
        s(&dir.join(recipe)),
        "--watch",
        "--quiet",
        "--out",
        s(&out),
    ])
}

/// Saves the way editors do: a temporary file renamed over the old one.
fn save(path: &Path, text: &str) {
    let tmp = path.with_extension("lua.swp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn records(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("out/metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn events(dir: &Path, event: &str) -> Vec<Value> {
    records(dir)
        .into_iter()
        .filter(|r| r["event"] == event)
        .collect()
}

/// Polls the metrics until a record matches, failing if the run ends first.
fn wait_for(child: &mut Child, dir: &Path, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        if let Some(r) = records(dir).into_iter().find(|r| pred(r)) {
            return r;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("taper exited ({status}) before {what}: {}", stderr(child));
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr(child: &mut Child) -> String {
    use std::io::Read;
    let mut s = String::new();
    if let Some(e) = child.stderr.as_mut() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

/// Waits for a successful end; returns what it wrote to stderr.
fn finish(mut child: Child) -> String {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < DEADLINE, "taper did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = child.wait().unwrap();
    let said = stderr(&mut child);
    assert!(status.success(), "taper failed: {said}");
    said
}

fn epoch_record(dir: &Path, epoch: u64) -> Value {
    events(dir, "epoch")
        .into_iter()
        .find(|r| r["epoch"] == epoch)
        .unwrap_or_else(|| panic!("no record of epoch {epoch}"))
}

fn assert_same_weights(a: &Path, b: &Path) {
    let (ta, ma) = checkpoint::load(&a.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    let (tb, mb) = checkpoint::load(&b.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    assert_eq!((ma.step, ma.epoch), (mb.step, mb.epoch));
    assert_eq!(ta.len(), tb.len());
    let values = |t: &candle_core::Tensor| {
        let t = t.flatten_all().unwrap();
        t.to_dtype(candle_core::DType::F64)
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
    };
    let differ: Vec<&String> = ta
        .keys()
        .filter(|k| values(&ta[*k]) != values(&tb[*k]))
        .collect();
    assert!(differ.is_empty(), "{differ:?} differ");
}

fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

/// The digits MLP, 23 steps per epoch. `{schedule}`, `{extra}` and
/// `{hold}` (code run after each epoch's batches) are filled in per test.
fn recipe(schedule: &str, hidden: u32, extra: &str, hold: &str) -> String {
    format!(
        r#"local train = taper.data.digits{{ split = "train" }}:shuffle{{ seed = 1 }}:batch(64)
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 64, hidden = {{ {hidden} }}, outputs = 10 }},
  optim = taper.optim.adamw{{ lr = 1e-3 }},
  data = train, seed = 1, schedule = {schedule}, {extra}
}}
for epoch in run:epochs(4) do
  for batch in run:batches() do run:step(batch) end
  {hold}
end
"#
    )
}

const HOLD_AT_2: &str = "if epoch == 2 and taper.generation == 0 then
    run:log{ holding = true }
    for _ = 1, 5 do run:reload_point{ wait = 30 } end
  end";

/// Waits until the run holds at its reload point.
fn holding(child: &mut Child, dir: &Path) {
    wait_for(child, dir, "the run to hold", |r| {
        r["event"] == "log" && r["holding"] == true
    });
}

#[test]
fn an_edited_schedule_module_applies_from_the_next_epoch() {
    let old = "return function(step, epoch) return { lr = 0.003 } end\n";
    let new = "return function(step, epoch) return { lr = 0.0005 * epoch } end\n";
    let dir = dir_with(&[
        ("sched.lua", old),
        ("recipe.lua", &recipe("require('sched')", 32, "", HOLD_AT_2)),
    ]);
    let mut child = watched(dir.path(), "recipe.lua");
    holding(&mut child, dir.path());
    save(&dir.path().join("sched.lua"), new);
    finish(child);

    let reloads = events(dir.path(), "reload");
    assert_eq!(reloads.len(), 1, "{reloads:?}");
    assert_eq!(reloads[0]["ok"], true, "{reloads:?}");
    assert_eq!(reloads[0]["generation"], 1);
    assert!(reloads[0]["files"][0]
        .as_str()
        .unwrap()
        .ends_with("sched.lua"));
    for (epoch, lr, step) in [(2, 0.003, 46), (3, 0.0015, 69), (4, 0.002, 92)] {
        let r = epoch_record(dir.path(), epoch);
        assert!((r["lr"].as_f64().unwrap() - lr).abs() < 1e-12, "{r}");
        assert_eq!(r["step"], step, "{r}");
    }

    // The same run with the switch written into its schedule.
    let switched = "function(step, epoch) if epoch <= 2 then return { lr = 0.003 } else return { lr = 0.0005 * epoch } end end";
    let reference = dir_with(&[("recipe.lua", &recipe(switched, 32, "", ""))]);
    let out = train_unwatched(reference.path());
    assert_same_weights(&dir.path().join("out"), &out);
}

/// What an OOM policy switched on (here: offload) outlives a reload that
/// leaves the recipe's setting as it was, while a setting the new version
/// declares differently (here: precision) applies.
#[test]
fn a_policy_choice_outlives_a_reload_that_leaves_its_setting_alone() {
    let version = |lr: &str, precision: &str| {
        format!(
            r#"local train = taper.data.digits{{ split = "train" }}:shuffle{{ seed = 1 }}:batch(64)
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 64, hidden = {{ 32 }}, outputs = 10 }},
  optim = taper.optim.adamw{{ lr = {lr} }},
  data = train, seed = 1, offload = false, precision = "{precision}",
  on_oom = function(e) if e.offload then return "stop" end return "offload" end,
}}
if taper.generation == 0 then run:inject_oom{{ step = 3, phase = "backward" }} end
for epoch in run:epochs(4) do
  for batch in run:batches() do run:step(batch) end
  run:log{{ seen = epoch, offload = run.offload, precision = run.precision }}
  {HOLD_AT_2}
end
"#
        )
    };
    let dir = dir_with(&[("recipe.lua", &version("1e-3", "f32"))]);
    let mut child = watched(dir.path(), "recipe.lua");
    holding(&mut child, dir.path());
    save(&dir.path().join("recipe.lua"), &version("2e-3", "bf16"));
    finish(child);

    let reloads = events(dir.path(), "reload");
    assert_eq!(reloads.len(), 1, "{reloads:?}");
    assert_eq!(reloads[0]["ok"], true, "{reloads:?}");
    let ooms = events(dir.path(), "oom");
    assert_eq!(ooms.len(), 1, "{ooms:?}");
    assert_eq!(ooms[0]["action"], "offload", "{ooms:?}");
    let seen: Vec<_> = events(dir.path(), "log")
        .into_iter()
        .filter(|r| r.get("seen").is_some())
        .map(|r| {
            (
                r["seen"].clone(),
                r["offload"].clone(),
                r["precision"].clone(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (1.into(), true.into(), "f32".into()),
            (2.into(), true.into(), "f32".into()),
            (3.into(), true.into(), "bf16".into()),
            (4.into(), true.into(), "bf16".into()),
        ],
        "the policy's offload stays; the edited precision applies"
    );
}

#[test]
fn a_broken_version_keeps_the_old_one_until_a_good_one_is_saved() {
    let good = recipe("nil", 32, "", HOLD_AT_2);
    let dir = dir_with(&[("recipe.lua", &good)]);
    let path = dir.path().join("recipe.lua");
    let mut child = watched(dir.path(), "recipe.lua");
    holding(&mut child, dir.path());

    // A syntax error on line 3.
    let broken = good.replacen("optim = taper", "optim = = taper", 1);
    save(&path, &broken);
    let failed = wait_for(&mut child, dir.path(), "the failed reload", |r| {
        r["event"] == "reload"
    });
    assert_eq!(failed["ok"], false);
    assert_eq!(failed["generation"], 0);
    let why = failed["error"].as_str().unwrap();
    assert!(why.contains("recipe.lua:4:"), "{why}");

    // Saving the same bytes again is not a change.
    std::fs::write(&path, &broken).unwrap();
    wait_for(&mut child, dir.path(), "the unchanged save", |r| {
        r["event"] == "watch"
    });

    // An error in the new version's top level, before its loop (after its
    // config, which is then not recorded: the version never ran).
    let throws = good.replacen(
        "local run",
        "taper.config{ note = 'tried' } error('not yet')\nlocal run",
        1,
    );
    save(&path, &throws);
    let failed = wait_for(&mut child, dir.path(), "the second failed reload", |r| {
        r["event"] == "reload" && r["error"].as_str().is_some_and(|e| e.contains("not yet"))
    });
    assert!(
        failed["error"].as_str().unwrap().contains("recipe.lua:2:"),
        "{failed}"
    );

    // A good version: a lower learning rate from epoch 3.
    let applied = format!(
        "taper.config{{ note = 'applied' }}\n{}",
        good.replace("lr = 1e-3", "lr = 2e-4")
    );
    save(&path, &applied);
    finish(child);
    let configs: Vec<_> = events(dir.path(), "config")
        .iter()
        .map(|r| (r["note"].clone(), r["generation"].clone()))
        .collect();
    assert_eq!(
        configs,
        [("applied".into(), 1.into())],
        "only the applied version's config"
    );
    let reloads = events(dir.path(), "reload");
    let oks: Vec<_> = reloads.iter().map(|r| r["ok"].clone()).collect();
    assert_eq!(oks, [false, false, true], "{reloads:?}");
    assert_eq!(reloads[2]["generation"], 1);
    assert_eq!(epoch_record(dir.path(), 2)["lr"], 1e-3);
    assert_eq!(epoch_record(dir.path(), 3)["lr"], 2e-4);
    assert_eq!(epoch_record(dir.path(), 4)["step"], 92);
}

#[test]
fn a_reload_that_changes_the_model_is_rejected_and_the_run_goes_on() {
    let hold = "if epoch == 2 and taper.generation == 0 then
    run:log{ holding = true }
    run:reload_point{ wait = 30 }
  end";
    // Watching turned on by the recipe (`watch = true`) rather than `--watch`.
    let dir = dir_with(&[("recipe.lua", &recipe("nil", 32, "watch = true,", hold))]);
    let out = dir.path().join("out");
    let mut child = taper(&[
        "train",
        s(&dir.path().join("recipe.lua")),
        "--quiet",
        "--out",
        s(&out),
    ]);
    holding(&mut child, dir.path());
    save(
        &dir.path().join("recipe.lua"),
        &recipe("nil", 64, "watch = true,", hold),
    );
    finish(child);
    let reloads = events(dir.path(), "reload");
    assert_eq!(reloads.len(), 1);
    let why = reloads[0]["error"].as_str().unwrap();
    // Not "--resume": a checkpoint cannot be resumed into another model.
    assert!(
        why.contains("architecture")
            && why.contains("start the edited recipe with another --out")
            && !why.contains("--resume"),
        "{why}"
    );
    assert!(why.contains("recipe.lua:2:"), "{why}");
    assert_eq!(epoch_record(dir.path(), 4)["step"], 92);
    let (_, meta) =
        checkpoint::load(&dir.path().join("out/checkpoint.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(meta.model, "mlp 64-32-10 relu");
}

/// Digits in batches of 50 (29 steps an epoch, 3 epochs); generation 0
/// holds at a reload point after step 40. `{on_reload}` goes into
/// `taper.run{}`, `{after_step}` on line 11, after each step.
fn held_at_40(on_reload: &str, after_step: &str) -> String {
    format!(
        r#"local train = taper.data.digits{{ split = "train" }}:shuffle{{ seed = 3 }}:batch(50)
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 64, hidden = {{ 24 }}, outputs = 10 }},
  optim = taper.optim.adamw{{ lr = 2e-3 }},
  data = train, seed = 2, state = {{ steps = 0 }}, {on_reload}
}}
for epoch in run:epochs(3) do
  for batch in run:batches() do
    run:step(batch)
    run.state.steps = run.state.steps + 1
    {after_step}
    if run.steps == 40 and taper.generation == 0 then
      run:log{{ holding = true }}
      run:reload_point{{ wait = 30 }}
    end
  end
end
run:log{{ steps = run.state.steps, migrated = run.state.migrated or false, generation = taper.generation }}
"#
    )
}

/// A step-level safe point: reloaded in the middle of epoch 2, the run goes
/// on from the same sample, so its weights equal a run that never reloaded;
/// `run.state` survives and `on_reload` migrates it.
#[test]
fn a_mid_epoch_reload_continues_from_the_data_cursor_with_the_state() {
    let v2 = held_at_40(
        "on_reload = function(old) old.migrated = true; return old end,",
        "",
    );
    let dir = dir_with(&[("recipe.lua", &held_at_40("", ""))]);
    let mut child = watched(dir.path(), "recipe.lua");
    holding(&mut child, dir.path());
    save(&dir.path().join("recipe.lua"), &v2);
    finish(child);
    let reload = &events(dir.path(), "reload")[0];
    assert_eq!(
        (reload["ok"].clone(), reload["step"].clone()),
        (true.into(), 40.into())
    );
    let log = events(dir.path(), "log")
        .into_iter()
        .find(|r| r.get("steps").is_some())
        .unwrap();
    // 1437 samples in batches of 50: 29 steps per epoch.
    assert_eq!(log["steps"], 87, "{log}");
    assert_eq!(log["migrated"], true, "{log}");
    assert_eq!(epoch_record(dir.path(), 2)["samples"], 1437);

    let reference = dir_with(&[("recipe.lua", &v2)]);
    let out = train_unwatched(reference.path());
    assert_same_weights(&dir.path().join("out"), &out);
}

/// A reload that changes the model's dropout only (a regularizer: no
/// weight depends on it) applies from the next step: the run ends where a
/// run resumed at that step with the new rate ends, to the bit, and not
/// where the old rate would have taken it.
#[test]
fn a_reload_may_change_the_dropout_from_the_next_step() {
    let with_dropout = |text: String| {
        let edited = text.replacen("outputs = 10 }", "outputs = 10, dropout = 0.3 }", 1);
        assert_ne!(edited, text);
        edited
    };
    let dir = dir_with(&[("recipe.lua", &held_at_40("", ""))]);
    let mut child = watched(dir.path(), "recipe.lua");
    holding(&mut child, dir.path());
    save(
        &dir.path().join("recipe.lua"),
        &with_dropout(held_at_40("", "")),
    );
    let said = finish(child);
    assert!(
        said.contains("note: dropout 0 -> 0.3 from step 41 on, over the same weights"),
        "{said}"
    );
    let reload = &events(dir.path(), "reload")[0];
    assert_eq!((&reload["ok"], &reload["step"]), (&true.into(), &40.into()));
    let (_, meta) =
        checkpoint::load(&dir.path().join("out/checkpoint.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(meta.model, "mlp 64-24-10 relu dropout 0.3");

    // Without dropout to the end, saving after step 40 on the way.
    let reference = tempfile::tempdir().unwrap();
    let mid = reference.path().join("mid.safetensors");
    let save_at_40 = format!("if run.steps == 40 then run:save([[{}]]) end", s(&mid));
    std::fs::write(
        reference.path().join("recipe.lua"),
        held_at_40("", &save_at_40),
    )
    .unwrap();
    let kept = train_unwatched(reference.path());
    // Resumed from step 40 with the new rate.
    let resumed = tempfile::tempdir().unwrap();
    let recipe = resumed.path().join("recipe.lua");
    std::fs::write(&recipe, with_dropout(held_at_40("", ""))).unwrap();
    let out = resumed.path().join("out");
    let args = ["train", s(&recipe), "--quiet", "--out", s(&out)];
    finish(taper(&[&args[..], &["--resume", s(&mid)]].concat()));
    assert_same_weights(&dir.path().join("out"), &out);
    let w = |d: &Path| {
        let (t, _) = checkpoint::load(&d.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
        t["model.fc0.weight"]
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    assert_ne!(w(&kept), w(&out), "the new rate changed nothing");
}

#[test]
fn a_version_that_fails_in_its_loop_hands_the_run_back_without_losing_a_batch() {
    // Held at step 40 (mid-epoch) by generation 0; the saved version fails
    // right after its first step, in its own code. The run goes back to
    // generation 0's text from the data cursor, and ends where a run that
    // never reloaded ends, to the bit.
    let good = held_at_40("", "");
    let dir = dir_with(&[("recipe.lua", &good)]);
    let mut child = watched(dir.path(), "recipe.lua");
    holding(&mut child, dir.path());
    save(
        &dir.path().join("recipe.lua"),
        &held_at_40("", "local seen = run.state.seen.count"),
    );
    finish(child);
    let reloads = events(dir.path(), "reload");
    assert_eq!(reloads.len(), 2, "{reloads:?}");
    assert_eq!(
        (&reloads[0]["ok"], &reloads[0]["step"]),
        (&true.into(), &40.into())
    );
    let back = &reloads[1];
    assert_eq!(
        (
            &back["failed"],
            &back["back_to"],
            &back["generation"],
            &back["step"]
        ),
        (&1.into(), &0.into(), &2.into(), &41.into()),
        "{back}"
    );
    let why = back["error"].as_str().unwrap();
    assert!(
        why.contains("recipe.lua:11:") && why.contains("'seen'"),
        "{why}"
    );
    let log = events(dir.path(), "log")
        .into_iter()
        .find(|r| r.get("steps").is_some())
        .unwrap();
    // 1437 samples in batches of 50: 29 steps per epoch, each taken once.
    assert_eq!(
        (&log["steps"], &log["generation"]),
        (&87.into(), &2.into()),
        "{log}"
    );
    for epoch in 1..=3 {
        assert_eq!(epoch_record(dir.path(), epoch)["samples"], 1437);
    }
    let reference = dir_with(&[("recipe.lua", &good)]);
    let out = train_unwatched(reference.path());
    assert_same_weights(&dir.path().join("out"), &out);
}

/// An OOM policy module edited into one that fails when asked: the run goes
/// back to the module as the earlier version used it (not as saved), and
/// that policy handles the next OOM.
#[test]
fn a_policy_module_that_fails_goes_back_to_the_one_that_ran() {
    let inject = "if epoch == 1 and taper.generation == 0 then
    run:inject_oom{ step = 50, phase = \"backward\" }
    run:inject_oom{ step = 60, phase = \"backward\" }
  end
  ";
    let dir = dir_with(&[
        ("policy.lua", "return function(e) return \"split\" end\n"),
        (
            "recipe.lua",
            &recipe(
                "nil",
                32,
                "on_oom = require('policy'),",
                &format!("{inject}{HOLD_AT_2}"),
            ),
        ),
    ]);
    let mut child = watched(dir.path(), "recipe.lua");
    holding(&mut child, dir.path());
    save(
        &dir.path().join("policy.lua"),
        "return function(e) return e.no_such.field end\n",
    );
    finish(child);
    let reloads = events(dir.path(), "reload");
    assert_eq!(reloads.len(), 2, "{reloads:?}");
    assert_eq!(
        (&reloads[0]["ok"], &reloads[0]["generation"]),
        (&true.into(), &1.into())
    );
    let back = &reloads[1];
    assert_eq!(
        (&back["failed"], &back["back_to"], &back["step"]),
        (&1.into(), &0.into(), &49.into()),
        "{back}"
    );
    let why = back["error"].as_str().unwrap();
    assert!(
        why.contains("policy.lua:1:") && why.contains("no_such"),
        "{why}"
    );
    let ooms: Vec<_> = events(dir.path(), "oom")
        .iter()
        .map(|r| (r["step"].clone(), r["action"].clone()))
        .collect();
    assert_eq!(ooms, [(60.into(), "split".into())]);
    assert_eq!(epoch_record(dir.path(), 4)["step"], 92);
}

#[test]
fn a_first_version_that_fails_ends_the_run_as_before() {
    // No earlier version to go back to: the error ends the run (exit 1),
    // with its checkpoint.
    let text = recipe(
        "nil",
        16,
        "",
        "if epoch == 2 then local t = nil; t.x = 1 end",
    );
    let dir = dir_with(&[("recipe.lua", &text)]);
    let mut child = watched(dir.path(), "recipe.lua");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < DEADLINE, "taper did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(1));
    let err = stderr(&mut child);
    assert!(err.contains("recipe.lua:9:"), "{err}");
    assert!(events(dir.path(), "reload").is_empty());
    let saved = events(dir.path(), "checkpoint");
    assert_eq!(saved.last().unwrap()["reason"], "failed", "{saved:?}");
}

#[test]
fn without_watch_reload_points_return_at_once() {
    let hold = "if epoch == 2 then assert(run:reload_point{ wait = 30 } == false) end";
    let dir = dir_with(&[("recipe.lua", &recipe("nil", 16, "", hold))]);
    let start = Instant::now();
    train_unwatched(dir.path());
    assert!(start.elapsed() < Duration::from_secs(25));
}

/// `run.state` goes into checkpoints (when it holds plain values), so a
/// resumed run has it too.
#[test]
fn run_state_is_checkpointed_and_resumed() {
    let src = r#"local cfg = taper.config{ epochs = 2 }
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 16 }, outputs = 10 },
  data = taper.data.digits{ split = "train" }:batch(64), state = { steps = 0, seen = {} },
}
for epoch in run:epochs(cfg.epochs) do
  for batch in run:batches() do
    run:step(batch)
    run.state.steps = run.state.steps + 1
  end
  run.state.seen[#run.state.seen + 1] = epoch
end
run:log{ steps = run.state.steps, epochs_seen = #run.state.seen }
"#;
    let dir = dir_with(&[("recipe.lua", src)]);
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let recipe = dir.path().join("recipe.lua");
    finish(taper(&["train", s(&recipe), "--quiet", "--out", s(&a)]));
    let ckpt = a.join("checkpoint.safetensors");
    finish(taper(&[
        "train",
        s(&recipe),
        "--quiet",
        "--out",
        s(&b),
        "--set",
        "epochs=3",
        "--resume",
        s(&ckpt),
    ]));
    let text = std::fs::read_to_string(b.join("metrics.jsonl")).unwrap();
    let log: Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| r["event"] == "log")
        .unwrap();
    assert_eq!(
        (log["steps"].clone(), log["epochs_seen"].clone()),
        (69.into(), 3.into()),
        "{log}"
    );
}

/// Starts a shipped recipe, copied into DIR (so that the test can edit its
/// copy), watched, from the repository root (its data paths are relative to
/// it), with `--set` options that make it run until killed.
fn watched_shipped(dir: &Path, recipe: &str, set: &[&str]) -> Child {
    let text = std::fs::read_to_string(Path::new("scripts").join(recipe)).unwrap();
    std::fs::write(dir.join(recipe), text).unwrap();
    let path = dir.join(recipe);
    let out = dir.join("out");
    let mut args = vec!["train", s(&path), "--watch", "--quiet", "--out", s(&out)];
    for kv in set {
        args.extend(["--set", kv]);
    }
    taper(&args)
}

/// The edit a user makes most: a config default (here `lr`) changed in the
/// recipe while it runs. Returns the edited text and the new value.
fn with_new_lr(text: &str) -> (String, f64) {
    let at = text
        .find(" lr = ")
        .expect("every shipped recipe declares lr")
        + " lr = ".len();
    let end = at + text[at..].find([',', ' ', '\n']).unwrap();
    let old: f64 = text[at..end].parse().unwrap();
    let new = old / 2.0;
    (format!("{}{new:e}{}", &text[..at], &text[end..]), new)
}

/// Every recipe in scripts/, as shipped (each calls taper.config{}): an
/// edit saved during a watched run is applied at its next safe point, and
/// a broken save after it is survived.
fn shipped_recipe_reloads(recipe: &str, set: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(recipe);
    let mut child = watched_shipped(dir.path(), recipe, set);
    wait_for(&mut child, dir.path(), "the config record", |r| {
        r["event"] == "config"
    });
    let text = std::fs::read_to_string(&path).unwrap();
    let (edited, lr) = with_new_lr(&text);
    save(&path, &edited);
    let applied = wait_for(&mut child, dir.path(), "the reload", |r| {
        r["event"] == "reload"
    });
    assert_eq!(applied["ok"], true, "{recipe}: {applied}");
    assert_eq!(applied["generation"], 1, "{recipe}: {applied}");
    let config = events(dir.path(), "config");
    let new = config
        .iter()
        .find(|r| r["generation"] == 1)
        .unwrap_or_else(|| panic!("{recipe}: no config record of generation 1: {config:?}"));
    assert_eq!(new["lr"].as_f64(), Some(lr), "{recipe}: {new}");

    // A save with a syntax error on its last line: the edited version goes on.
    let lines = edited.lines().count() + 2;
    save(&path, &format!("{edited}\nlocal = 1\n"));
    let failed = wait_for(&mut child, dir.path(), "the failed reload", |r| {
        r["event"] == "reload" && r["ok"] == false
    });
    assert_eq!(failed["generation"], 1, "{recipe}: {failed}");
    let why = failed["error"].as_str().unwrap();
    assert!(
        why.contains(&format!("{recipe}:{lines}:")),
        "{recipe}: {why}"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "{recipe}: exited after a broken save: {}",
        stderr(&mut child)
    );

    // A save that loads and is applied, but fails in its loop (a misspelt
    // method): the run goes back to the edited version and goes on.
    let typo = edited.replacen("run:step(batch)", "run:step(batch) run:evalute(batch)", 1);
    let line = 1 + typo
        .lines()
        .position(|l| l.contains("run:evalute("))
        .unwrap();
    save(&path, &typo);
    let back = wait_for(&mut child, dir.path(), "going back", |r| {
        r["event"] == "reload" && r.get("back_to").is_some()
    });
    assert_eq!(
        (
            &back["failed"],
            &back["back_to"],
            &back["generation"],
            &back["ok"]
        ),
        (&2.into(), &1.into(), &3.into(), &true.into()),
        "{recipe}: {back}"
    );
    let why = back["error"].as_str().unwrap();
    assert!(
        why.contains(&format!("{recipe}:{line}:")) && why.contains("evalute"),
        "{recipe}: {why}"
    );
    let step = back["step"].as_u64().unwrap();
    wait_for(&mut child, dir.path(), "a step after going back", |r| {
        r["step"].as_u64().is_some_and(|s| s > step) && r["event"] != "reload"
    });

    // A save that forgets the step's argument: a taper method given nil
    // (mlua's BadArgument) is the version's own error too.
    let forgot = edited.replacen("run:step(batch)", "run:step()", 1);
    save(&path, &forgot);
    let again = wait_for(&mut child, dir.path(), "going back again", |r| {
        r["event"] == "reload" && r["failed"] == 4
    });
    assert_eq!(
        (&again["back_to"], &again["generation"]),
        (&3.into(), &5.into()),
        "{recipe}: {again}"
    );
    let why = again["error"].as_str().unwrap();
    assert!(
        why.contains(&format!("{recipe}:"))
            && why.contains("run:step: argument 1 must be a batch (from run:batches() or data:batches()), got nil"),
        "{recipe}: {why}"
    );
    let step = again["step"].as_u64().unwrap();
    wait_for(
        &mut child,
        dir.path(),
        "a step after going back again",
        |r| r["step"].as_u64().is_some_and(|s| s > step) && r["event"] != "reload",
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // A reloaded version builds its model again, but the run goes on with
    // its weights: a note that a head starts afresh is the first version's.
    let said = stderr(&mut child);
    assert!(
        said.matches("starts afresh").count() <= 1,
        "{recipe}: {said}"
    );
}

/// The shipped mass regression, edited under `--watch` to give the sex
/// column's categories in the other order: the same width, but each
/// one-hot input would move. The reload is refused, naming the first input
/// that moved, and the run goes on.
#[test]
fn a_reload_that_moves_a_tables_inputs_is_rejected() {
    mass_edit_is_refused(
        r#"categorical = { "species", "sex" },"#,
        r#"categorical = { "species", sex = { "male", "female" } },"#,
        &[
            "a reload cannot change the model's inputs",
            "input 3 is `sex_male` in the new data's and `sex_female` in the run's",
        ],
    );
}

/// The same recipe edited to predict another column (`year`, not a
/// feature): the model's output learned the mass, so the reload is refused,
/// naming both targets, and the run goes on.
#[test]
fn a_reload_that_changes_a_regressions_target_is_rejected() {
    mass_edit_is_refused(
        r#"target = "body_mass_g","#,
        r#"target = "year","#,
        &[
            "a reload cannot change the model's targets",
            "target 0 is `year` in the new data's and `body_mass_g` in the run's",
            "start the edited recipe with another --out",
        ],
    );
}

/// `penguins_mass.lua` under `--watch`, `old` edited to `new`: the reload
/// is refused saying each of `says`, and the run goes on.
fn mass_edit_is_refused(old: &str, new: &str, says: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let recipe = "penguins_mass.lua";
    let path = dir.path().join(recipe);
    let mut child = watched_shipped(dir.path(), recipe, &["epochs=100000"]);
    wait_for(&mut child, dir.path(), "the config record", |r| {
        r["event"] == "config"
    });
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(old), "the recipe says {old}");
    save(&path, &text.replace(old, new));
    let refused = wait_for(&mut child, dir.path(), "the refused reload", |r| {
        r["event"] == "reload"
    });
    assert_eq!(refused["ok"], false, "{refused}");
    let why = refused["error"].as_str().unwrap();
    assert!(says.iter().all(|s| why.contains(s)), "{why}");
    let step = refused["step"].as_u64().unwrap_or(0);
    wait_for(&mut child, dir.path(), "a step after the refusal", |r| {
        r["step"].as_u64().is_some_and(|s| s > step) && r["event"] != "reload"
    });
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn shipped_digits_reloads() {
    shipped_recipe_reloads("digits.lua", &["epochs=100000"]);
}

#[test]
fn shipped_digits_cnn_reloads() {
    shipped_recipe_reloads("digits_cnn.lua", &["epochs=100000"]);
}

#[test]
fn shipped_digits_prune_reloads() {
    shipped_recipe_reloads("digits_prune.lua", &["epochs=100000"]);
}

#[test]
fn shipped_fashion_mnist_reloads() {
    common::fetched("data/fashion-mnist/t10k-labels-idx1-ubyte.gz").unwrap();
    shipped_recipe_reloads("fashion_mnist.lua", &["epochs=100000", "train_samples=256"]);
}

#[test]
fn shipped_image_folder_reloads() {
    common::fetched("data/fashion-mnist-png/val/bag").unwrap();
    shipped_recipe_reloads("image_folder.lua", &["epochs=100000", "train_samples=256"]);
}

#[test]
fn shipped_mnist_csv_reloads() {
    common::fetched("data/mnist/mnist_5k.csv.gz").unwrap();
    shipped_recipe_reloads("mnist_csv.lua", &["epochs=100000"]);
}

#[test]
fn shipped_penguins_reloads() {
    common::fetched("data/penguins/penguins.csv").unwrap();
    shipped_recipe_reloads("penguins.lua", &["epochs=100000"]);
}

#[test]
fn shipped_penguins_size_reloads() {
    common::fetched("data/penguins/penguins.csv").unwrap();
    shipped_recipe_reloads("penguins_size.lua", &["epochs=100000"]);
}

#[test]
fn shipped_penguins_mass_reloads() {
    common::fetched("data/penguins/penguins.csv").unwrap();
    shipped_recipe_reloads("penguins_mass.lua", &["epochs=100000"]);
}

#[test]
fn shipped_shakespeare_reloads() {
    shipped_recipe_reloads("shakespeare.lua", &["epochs=100000", "steps=4", "sample=0"]);
}

#[test]
fn shipped_shakespeare_distill_reloads() {
    shipped_recipe_reloads(
        "shakespeare_distill.lua",
        &["teacher_epochs=100000", "steps=4"],
    );
}

#[test]
fn shipped_smollm2_qlora_reloads() {
    common::fetched("data/smollm2/tokenizer.json").unwrap();
    // One long epoch: the recipe's reload points every 10 steps apply the edits.
    shipped_recipe_reloads(
        "smollm2_qlora.lua",
        &["layers=1", "steps=100000", "context=16", "val_windows=2"],
    );
}

#[test]
fn shipped_smollm2_chat_reloads() {
    common::fetched("data/smollm2/tokenizer.json").unwrap();
    // Many epochs: the recipe's reload points every 10 steps apply the edits.
    shipped_recipe_reloads(
        "smollm2_chat.lua",
        &["layers=1", "epochs=100000", "chats=64", "answers=0"],
    );
}

#[test]
fn shipped_minilm_classify_reloads() {
    common::fetched("data/minilm/tokenizer.json").unwrap();
    common::fetched("data/austen/test.csv").unwrap();
    // Many epochs: the recipe's reload points every 10 steps apply the edits.
    shipped_recipe_reloads(
        "minilm_classify.lua",
        &["epochs=100000", "rows=64", "test_rows=16", "context=32"],
    );
}

/// Every recipe in scripts/ has a reload test above.
#[test]
fn every_shipped_recipe_has_a_reload_test() {
    let me = std::fs::read_to_string(file!()).unwrap();
    for e in std::fs::read_dir("scripts").unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if let Some(stem) = name.strip_suffix(".lua") {
            assert!(
                me.contains(&format!("fn shipped_{stem}_reloads()")),
                "scripts/{name} has no reload test in tests/reload.rs"
            );
        }
    }
}

/// A recipe replaced by a FIFO, or by a symlink to /dev/zero, during a
/// watched run: the reload fails with a clear error and the run goes on.
#[test]
fn a_recipe_replaced_by_a_fifo_or_dev_zero_is_refused() {
    let good = recipe("nil", 32, "", HOLD_AT_2);
    let dir = dir_with(&[("recipe.lua", &good)]);
    let path = dir.path().join("recipe.lua");
    let mut child = watched(dir.path(), "recipe.lua");
    holding(&mut child, dir.path());

    let fifo = dir.path().join("fifo.tmp");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    std::fs::rename(&fifo, &path).unwrap();
    let failed = wait_for(&mut child, dir.path(), "the FIFO's reload", |r| {
        r["event"] == "reload"
    });
    assert_eq!(failed["ok"], false, "{failed}");
    let why = failed["error"].as_str().unwrap();
    assert!(why.contains("not a regular file (a FIFO)"), "{why}");

    let link = dir.path().join("zero.tmp");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    std::fs::rename(&link, &path).unwrap();
    let failed = wait_for(&mut child, dir.path(), "the /dev/zero reload", |r| {
        r["event"] == "reload"
            && r["error"]
                .as_str()
                .is_some_and(|e| e.contains("character device"))
    });
    assert_eq!(failed["ok"], false, "{failed}");

    save(&path, &good);
    finish(child);
    let oks: Vec<_> = events(dir.path(), "reload")
        .iter()
        .map(|r| r["ok"].clone())
        .collect();
    assert_eq!(oks.last(), Some(&Value::Bool(true)), "{oks:?}");
    assert_eq!(epoch_record(dir.path(), 4)["step"], 92);
}

/// A reloaded version may change its config defaults, but a `--set` value
/// still wins over the new default.
#[test]
fn set_values_win_over_a_reloaded_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("digits.lua");
    let mut child = watched_shipped(dir.path(), "digits.lua", &["epochs=100000", "lr=0.002"]);
    wait_for(&mut child, dir.path(), "the config record", |r| {
        r["event"] == "config"
    });
    let text = std::fs::read_to_string(&path).unwrap();
    let (edited, _) = with_new_lr(&text);
    save(&path, &edited.replace("batch = 32", "batch = 16"));
    let applied = wait_for(&mut child, dir.path(), "the reload", |r| {
        r["event"] == "reload"
    });
    assert_eq!(applied["ok"], true, "{applied}");
    let new = events(dir.path(), "config")
        .into_iter()
        .find(|r| r["generation"] == 1)
        .expect("a config record of generation 1");
    assert_eq!(new["lr"], 0.002, "--set wins: {new}");
    assert_eq!(new["batch"], 16, "the new default applies: {new}");
    // The run trains on at the --set rate.
    let later = wait_for(&mut child, dir.path(), "an epoch after the reload", |r| {
        r["event"] == "epoch" && r["step"].as_u64() > applied["step"].as_u64()
    });
    assert_eq!(later["lr"], 0.002, "{later}");
    child.kill().unwrap();
    child.wait().unwrap();
}
