//! Class weights (`taper.loss.cross_entropy{ weight = ... }`, PyTorch's
//! `CrossEntropyLoss(weight=)`): a rare class a plain loss gives up on is
//! found with `"balanced"` weights, and wrong weights are refused at the
//! recipe's line.

use std::fmt::Write;
use std::path::Path;

use anyhow::Result;
use taper::{host::render_error, Host, HostOptions};

fn run(src: &str) -> taper::Result<taper::host::Report> {
    Host::new(HostOptions::default())?.run_source("recipe.lua", src)
}

fn recipe_error(r: taper::Result<taper::host::Report>) -> String {
    let e = r.expect_err("the recipe should fail");
    let msg = render_error(&e);
    assert_eq!(e.exit_code(), 2, "not a recipe error: {msg}");
    msg
}

/// Two overlapping Gaussian clouds in the plane: `rare` (1 in 20, centred
/// at (1.5, 1.5)) among `common` (at the origin), unit deviation.
fn write_clouds(path: &Path, n: usize, seed: u64) {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut uniform = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut normal = move || {
        let (u, v) = (uniform(), uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    };
    let mut csv = String::from("x,y,kind\n");
    for i in 0..n {
        let (kind, centre) = if i % 20 == 7 {
            ("rare", 1.5)
        } else {
            ("common", 0.0)
        };
        writeln!(
            csv,
            "{:.5},{:.5},{kind}",
            centre + normal(),
            centre + normal()
        )
        .unwrap();
    }
    std::fs::write(path, csv).unwrap();
}

/// The rare class's recall and the balanced accuracy on held-out data,
/// trained with `loss`.
fn rare_recall(dir: &Path, loss: &str) -> Result<(f64, f64)> {
    let src = format!(
        r#"
local train = taper.data.csv{{ path = "{dir}/train.csv", label = "kind" }}
local test = taper.data.csv{{ path = "{dir}/test.csv", label = "kind", classes = train:classes() }}
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 2, hidden = {{ 16 }}, outputs = 2 }},
  optim = taper.optim.adamw{{ lr = 1e-2 }},
  data = train:shuffle{{ seed = 1 }}:batch(50),
  loss = {loss},
  seed = 1,
}}
for _ in run:epochs(60) do for b in run:batches() do run:step(b) end end
local r = run:evaluate(test)
assert(r.per_class.rare.support == 100, r.per_class.rare.support)
result = {{ recall = r.per_class.rare.recall, balanced = r.balanced_accuracy }}
"#,
        dir = dir.display()
    );
    let mut host = Host::new(HostOptions::default())?;
    host.run_source("recipe.lua", &src)?;
    let result: mlua::Table = host.globals()?.get("result")?;
    Ok((result.get("recall")?, result.get("balanced")?))
}

#[test]
fn balanced_weights_find_a_rare_class_the_plain_loss_gives_up() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_clouds(&dir.path().join("train.csv"), 2000, 1);
    write_clouds(&dir.path().join("test.csv"), 2000, 2);
    let (plain, plain_balanced) = rare_recall(dir.path(), "taper.loss.cross_entropy{}")?;
    let (weighted, weighted_balanced) = rare_recall(
        dir.path(),
        r#"taper.loss.cross_entropy{ weight = "balanced" }"#,
    )?;
    // The same weights given by name: scikit-learn's n / (k * count) is
    // 2000 / (2 * 1900) and 2000 / (2 * 100).
    let (named, _) = rare_recall(
        dir.path(),
        "taper.loss.cross_entropy{ weight = { common = 2000 / 3800, rare = 10 } }",
    )?;
    eprintln!(
        "rare recall: plain {plain:.3} (balanced accuracy {plain_balanced:.3}), weighted {weighted:.3} ({weighted_balanced:.3}), by name {named:.3}"
    );
    // The clouds' centres are d = 2.12 apart. The Bayes classifier of the
    // plain loss cuts at d / 2 + ln(19) / d = 2.45 from the common centre and
    // finds 37% of the rare points; with balanced weights it cuts halfway
    // (1.06) and finds 86% (here: 41% and 78%, on 100 rare test points).
    assert!(plain < 0.55, "plain recall {plain}");
    assert!(weighted > 0.7, "weighted recall {weighted}");
    assert!(
        weighted_balanced > plain_balanced + 0.08,
        "balanced accuracy {plain_balanced} -> {weighted_balanced}"
    );
    assert_eq!(named, weighted, "balanced and the same weights by name");
    Ok(())
}

#[test]
fn class_weights_are_checked_at_the_recipes_line() {
    let mlp = "taper.model.mlp{ inputs = 64, outputs = 10 }";
    let digits = r#"taper.data.digits{ split = "train" }:batch(32)"#;
    let cases = [
        (
            format!("local l = taper.loss.cross_entropy{{ weight = {{ 1, 2 }} }}\ntaper.run{{ model = {mlp}, loss = l }}"),
            "recipe.lua:2: taper.run: taper.loss.cross_entropy: option `weight`: 2 weights for a model of 10 classes",
        ),
        (
            format!("taper.run{{ model = {mlp}, data = {digits},\n loss = taper.loss.cross_entropy{{ weight = {{ seven = 2 }} }} }}"),
            "weights by class name, and the training data has no class names",
        ),
        (
            format!("taper.run{{ model = {mlp},\n loss = taper.loss.cross_entropy{{ weight = \"balanced\" }} }}"),
            "\"balanced\" counts the training data's labels, and the run has none it can count",
        ),
        (
            "taper.loss.cross_entropy{ weight = \"balance\" }".to_string(),
            "recipe.lua:1: taper.loss.cross_entropy: option `weight` must be a list of numbers (one per class, label 0 first), a table of numbers by class name, or \"balanced\", not \"balance\"",
        ),
        (
            "taper.loss.cross_entropy{ weight = { 1, \"x\" } }".to_string(),
            "option `weight`: [2] is string, not a number",
        ),
        (
            "taper.loss.cross_entropy{ weight = { 1, 2, cat = 3 } }".to_string(),
            "option `weight` mixes a list and names",
        ),
        (
            format!("local r = taper.run{{ model = {mlp}, data = {digits} }}\nr:evaluate(taper.data.digits{{ split = \"test\" }}, {{ loss = taper.loss.cross_entropy{{ weight = \"balanced\" }} }})"),
            "recipe.lua:2: run:evaluate: option `loss`: a cross-entropy with class weights",
        ),
    ];
    for (src, want) in cases {
        let msg = recipe_error(run(&src));
        assert!(msg.contains(want), "{src}\n--> {msg}");
    }
    // Right weights by label train; `balanced` over the digits counts their labels.
    run(&format!(
        "local r = taper.run{{ model = {mlp}, data = {digits},\n loss = taper.loss.cross_entropy{{ weight = {{ 1, 1, 1, 1, 1, 1, 1, 1, 1, 2 }}, label_smoothing = 0.1 }} }}\nfor b in r:batches() do r:step(b) end\nlocal r2 = taper.run{{ model = {mlp}, data = {digits}, loss = taper.loss.cross_entropy{{ weight = \"balanced\" }} }}\nfor b in r2:batches() do r2:step(b) end"
    ))
    .unwrap();
}
