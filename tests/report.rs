//! `taper report` on a real run with OOMs, a hot reload and checkpoints (one failed),
//! opened in headless Chromium (Debian's `chromium`, which `.ci/run`
//! installs): the page runs with no script error, draws its five charts with
//! data, lists the events, and a screenshot is taken
//! (`target/report-test/report.png`, kept to look at).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(120);

/// Digits with the learning rate in its config: the test edits it while the
/// run waits at a reload point after epoch 2.
const RECIPE: &str = r#"local cfg = taper.config{ lr = 0.003, full = "" }
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 64 }, outputs = 10 },
  optim = taper.optim.adamw{ lr = cfg.lr },
  data = taper.data.digits{ split = "train" }:shuffle{ seed = 1 }:batch(32),
  watch = true,
}
local test = taper.data.digits{ split = "test" }:batch(120)
-- `full`: a temporary file of the checkpoint's that is /dev/full, so that
-- the first periodic save fails (a real ENOSPC) and the report marks it.
if cfg.full ~= "" and not run.state.full then
  run.state.full = true
  assert(os.execute("ln -s /dev/full " .. cfg.full))
end
for epoch in run:epochs(6) do
  for batch in run:batches() do run:step(batch) end
  if epoch % 2 == 0 then run:evaluate(test) end
  if epoch == 2 and not run.state.edited then
    run.state.edited = true
    run:log{ edit_now = true }
    run:reload_point{ wait = 60 }
  end
end
"#;

fn chromium() -> PathBuf {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(o) = Command::new("which").arg(name).output() {
            if o.status.success() {
                return PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
            }
        }
    }
    panic!("no chromium: install Debian's (`apt-get install chromium`), as .ci/run does");
}

fn records(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The run: two injected OOMs, a checkpoint every 50 steps (the first on a
/// full disk), a memory limit, and the recipe's lr edited on disk while it
/// waits at its reload point.
fn run_with_events(dir: &Path) -> PathBuf {
    let recipe = dir.join("recipe.lua");
    std::fs::write(&recipe, RECIPE).unwrap();
    let out = dir.join("out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(["train", "recipe.lua", "--quiet", "--out", "out", "--watch"])
        .args(["--inject-oom", "step=30,phase=backward"])
        .args(["--inject-oom", "step=150,phase=forward,times=2"])
        .args(["--checkpoint-every", "50", "--mem-limit", "3MiB"])
        .args(["--set", "full=out/checkpoint.json.tmp"])
        .current_dir(dir)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !records(&out).iter().any(|r| r["edit_now"] == true) {
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        assert!(start.elapsed() < DEADLINE, "no edit_now record");
        std::thread::sleep(Duration::from_millis(20));
    }
    let tmp = dir.join("recipe.lua.new");
    // The edited version also misspells a method at epoch 4: the run goes
    // back to the first version there.
    let edited = RECIPE.replace("lr = 0.003", "lr = 0.001").replace(
        "if epoch % 2 == 0 then run:evaluate(test) end",
        "if epoch % 2 == 0 then run:evaluate(test) end\n  if epoch == 4 then run:evalute(test) end",
    );
    std::fs::write(&tmp, edited).unwrap();
    std::fs::rename(&tmp, &recipe).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let events = records(&out);
    let count = |e: &str| events.iter().filter(|r| r["event"] == e).count();
    assert_eq!(count("oom"), 3, "three OOMs recovered");
    assert!(
        events
            .iter()
            .any(|r| r["event"] == "reload" && r["ok"] == true),
        "a reload applied"
    );
    assert!(
        events
            .iter()
            .any(|r| r["event"] == "reload" && r["back_to"] == 0),
        "generation 1 failed and the run went back"
    );
    assert!(count("checkpoint") >= 4);
    assert!(
        events
            .iter()
            .any(|r| r["event"] == "checkpoint" && r["ok"] == false && r["step"] == 50),
        "the first periodic save failed"
    );
    out
}

const HEADLESS: [&str; 4] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
];

/// The page as the browser leaves it, after its scripts ran (none of which
/// failed), and its URL.
fn rendered(browser: &Path, page: &Path) -> (String, String) {
    let url = format!("file://{}", page.display());
    let dom = Command::new(browser)
        .args(HEADLESS)
        .args([
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
        ])
        .args(["--dump-dom", &url])
        .output()
        .unwrap();
    assert!(dom.status.success());
    let (dom, log) = (
        String::from_utf8_lossy(&dom.stdout).into_owned(),
        String::from_utf8_lossy(&dom.stderr).into_owned(),
    );
    assert!(!log.contains("Uncaught"), "script errors: {log}");
    assert!(!dom.contains("data-errors"), "script errors in the page");
    (url, dom)
}

/// `taper report RUN --out PAGE`, rendered in Chromium: its DOM.
fn report_dom(browser: &Path, run: &Path, page: &Path) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .arg("report")
        .arg(run)
        .arg("--out")
        .arg(page)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    rendered(browser, page).1
}

/// A regression run's report: its evaluations as RMSE in the target's
/// units (no accuracy chart), and R² in the summary.
#[test]
fn a_regression_runs_report_charts_its_rmse() {
    let browser = chromium();
    let csv = common::fetched("data/penguins/penguins.csv").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mass");
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(["train", "scripts/penguins_mass.lua", "--quiet", "--set"])
        .arg(format!("path={}", csv.display()))
        .arg("--out")
        .arg(&out)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dom = report_dom(&browser, &out, &dir.path().join("report.html"));
    assert!(
        dom.contains("data-title=\"Evaluation RMSE\""),
        "no RMSE chart"
    );
    assert!(
        !dom.contains("data-title=\"Evaluation accuracy\""),
        "an accuracy chart"
    );
    assert!(dom.contains("last eval R²"), "no R² in the summary");
}

/// A regression of two targets in other units (grams, millimetres): a
/// chart of each target's RMSE, none of their mean, and each target's RMSE
/// and R² in the summary.
#[test]
fn a_regression_of_two_targets_charts_each_targets_rmse() {
    let browser = chromium();
    let csv = common::fetched("data/penguins/penguins.csv").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("two.lua");
    std::fs::write(
        &recipe,
        format!(
            r#"local birds = taper.data.csv{{ path = {csv:?},
              target = {{ "body_mass_g", "flipper_length_mm" }},
              features = {{ "species", "bill_length_mm", "bill_depth_mm" }},
              categorical = {{ "species" }}, missing = "drop" }}
            local train, test = birds:split{{ 0.8, 0.2, seed = 1 }}
            train = train:named("train"):standardize()
            test = test:named("test"):standardize(train)
            local run = taper.run{{
              model = taper.model.mlp{{ inputs = #birds:feature_names(), hidden = {{ 16 }}, outputs = 2 }},
              loss = taper.loss.mse{{}},
              data = train:shuffle{{ seed = 1 }}:batch(16),
            }}
            for epoch in run:epochs(6) do
              for b in run:batches() do run:step(b) end
              if epoch % 2 == 0 then run:evaluate(test) end
            end
            "#
        ),
    )
    .unwrap();
    let out = dir.path().join("two");
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .arg("train")
        .arg(&recipe)
        .arg("--quiet")
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dom = report_dom(&browser, &out, &dir.path().join("report.html"));
    for title in [
        "data-title=\"Evaluation RMSE: body_mass_g\"",
        "data-title=\"Evaluation RMSE: flipper_length_mm\"",
        "last eval RMSE (body_mass_g)",
        "last eval R² (flipper_length_mm)",
        "last eval R² (the mean of 2 targets)",
    ] {
        assert!(dom.contains(title), "no {title}");
    }
    assert!(
        !dom.contains("data-title=\"Evaluation RMSE\""),
        "a chart of the mean RMSE of targets in other units"
    );
    // Two targets per sample are not tokens: throughput is in samples.
    let steps = common::records(&out, "step");
    assert!(!steps.is_empty() && steps.iter().all(|s| s.get("tokens_per_s").is_none()));
}

#[test]
fn a_report_of_a_run_with_ooms_and_a_reload_renders_in_chromium() {
    let browser = chromium();
    let dir = tempfile::tempdir().unwrap();
    let out = run_with_events(dir.path());
    // A second run to overlay: the same recipe, no events.
    let plain = dir.path().join("plain");
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args([
            "train",
            "scripts/digits.lua",
            "--quiet",
            "--set",
            "epochs=6",
            "--out",
        ])
        .arg(&plain)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(o.status.success());
    let keep = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/report-test");
    std::fs::create_dir_all(&keep).unwrap();
    let page = keep.join("report.html");
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .arg("report")
        .args([&out, &plain])
        .arg("--out")
        .arg(&page)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http"),
        "self-contained"
    );

    let (url, dom) = rendered(&browser, &page);
    assert!(dom.contains("data-rendered=\"5\""), "five charts drawn");
    assert_eq!(dom.matches("<canvas").count(), 5, "one canvas per chart");
    // Step records every 10 steps of 270 (two runs); evaluations 3 + 2.
    for (title, least) in [
        ("Loss", 50),
        ("Evaluation accuracy", 5),
        ("Learning rate", 50),
        ("Throughput", 50),
        ("Memory", 50),
    ] {
        let at = dom
            .find(&format!("data-title=\"{title}\""))
            .unwrap_or_else(|| panic!("no `{title}` chart"));
        let head = &dom[..at];
        let points = head[head.rfind("data-points=\"").expect("points") + 13..]
            .split('"')
            .next()
            .unwrap()
            .parse::<usize>()
            .unwrap();
        assert!(points >= least, "`{title}` has {points} points");
    }
    assert!(
        dom.contains("generation 1 failed, back to generation 0"),
        "no going-back marker"
    );
    for kind in [
        "oom",
        "reload",
        "reload-failed",
        "checkpoint",
        "checkpoint-failed",
    ] {
        assert!(
            dom.contains(&format!("data-kind=\"{kind}\"")),
            "no {kind} event listed"
        );
    }
    assert!(
        dom.contains("OOM (backward): split 32 -&gt; 16"),
        "the OOM's action"
    );
    assert!(dom.contains("limit MiB"), "the memory limit drawn");
    // The classifier's last evaluation, class by class.
    for row in [
        "last eval balanced accuracy",
        "last eval macro F1",
        "last eval by class",
    ] {
        assert!(dom.contains(row), "no `{row}` row");
    }
    assert!(
        dom.contains("0 F1 ") && dom.contains("; 9 F1 ") && dom.contains(" samples)"),
        "each digit's F1"
    );

    let headless = HEADLESS;
    let shot = keep.join("report.png");
    let _ = std::fs::remove_file(&shot);
    let o = Command::new(&browser)
        .args(headless)
        .args(["--window-size=1200,2000", "--virtual-time-budget=5000"])
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 50_000,
        "a screenshot with charts"
    );
}

/// A folder without records is exit 2 naming the file; a record cut short by
/// a kill (the last line, no newline) is passed over with a warning; a bad
/// line elsewhere is exit 2 with file:line.
#[test]
fn report_input_errors_name_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let report = |run: &Path| {
        Command::new(env!("CARGO_BIN_EXE_taper"))
            .arg("report")
            .arg(run)
            .output()
            .unwrap()
    };
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = report(&empty);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("empty/metrics.jsonl"));

    let cut = dir.path().join("cut");
    std::fs::create_dir_all(&cut).unwrap();
    let good = r#"{"event":"step","step":10,"epoch":1,"time":0.1,"run":1,"loss":2.0,"lr":0.1}"#;
    std::fs::write(
        cut.join("metrics.jsonl"),
        format!("{good}\n{{\"event\":\"ste"),
    )
    .unwrap();
    let o = report(&cut);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("metrics.jsonl:2: a record cut short"));
    assert!(cut.join("report.html").exists());

    std::fs::write(cut.join("metrics.jsonl"), format!("{{oops\n{good}\n")).unwrap();
    let o = report(&cut);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("metrics.jsonl:1: not a JSON record"));
}
