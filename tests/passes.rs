//! Model passes from a recipe: pruning masks survive training and a
//! checkpoint round trip; bad selections are clear errors.

use std::path::Path;

use anyhow::Result;
use candle_core::Device;
use taper::engine::checkpoint;
use taper::{host::render_error, Host, HostOptions};

const RECIPE: &str = r#"
local cfg = taper.config{ epochs = 2, prune = 1 }
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 32 }, outputs = 10 },
  optim = taper.optim.adamw{ lr = 3e-3 },
  data = taper.data.digits{}:shuffle{ seed = 1 }:batch(64),
}
if cfg.prune == 1 then
  local p = run:prune{ sparsity = 0.6, params = "weight$", scope = "global" }
  assert(math.abs(p.sparsity - 0.6) < 1e-3, p.sparsity)
end
for epoch in run:epochs(cfg.epochs) do
  for batch in run:batches() do run:step(batch) end
end
"#;

fn run(dir: &Path, set: &[(&str, &str)], resume: bool) -> taper::Result<taper::host::Report> {
    let opts = HostOptions {
        out_dir: Some(dir.to_path_buf()),
        resume: resume.then(|| dir.join("checkpoint.safetensors")),
        overrides: set
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..HostOptions::default()
    };
    Host::new(opts)?.run_source("prune.lua", RECIPE)
}

/// The fraction of zeros among the selected weights, and whether every
/// masked weight is zero.
fn zeros(dir: &Path) -> Result<(f64, bool)> {
    let (t, _) = checkpoint::load(&dir.join("checkpoint.safetensors"), &Device::Cpu)?;
    let (mut z, mut n, mut ok) = (0usize, 0usize, true);
    for (k, m) in t.iter().filter(|(k, _)| k.starts_with("mask.")) {
        let name = &k["mask.".len()..];
        assert!(name.ends_with("weight"), "{name} was not selected");
        let w: Vec<f32> = t[&format!("model.{name}")].flatten_all()?.to_vec1()?;
        let m: Vec<u8> = m.flatten_all()?.to_vec1()?;
        z += w.iter().filter(|x| **x == 0.0).count();
        n += w.len();
        ok &= w.iter().zip(&m).all(|(x, m)| *m == 1 || *x == 0.0);
    }
    Ok((z as f64 / n.max(1) as f64, ok))
}

#[test]
fn masks_survive_training_and_resume() -> Result<()> {
    let dir = tempfile::tempdir()?;
    run(dir.path(), &[], false)?;
    let (z, ok) = zeros(dir.path())?;
    assert!(ok && (z - 0.6).abs() < 0.01, "{z} zeros after training");
    // Resumed without pruning again: the masks come from the checkpoint.
    run(dir.path(), &[("epochs", "4"), ("prune", "0")], true)?;
    let (z2, ok2) = zeros(dir.path())?;
    assert!(ok2 && (z2 - z).abs() < 1e-9, "{z2} zeros after resuming");
    Ok(())
}

#[test]
fn bad_prune_options_are_recipe_errors() {
    let src = |o: &str| {
        format!(
            "local run = taper.run{{ model = taper.model.mlp{{ inputs = 4, outputs = 2 }} }}\nrun:prune{{ {o} }}"
        )
    };
    let err = |o: &str| {
        let e = Host::new(HostOptions::default())
            .unwrap()
            .run_source("p.lua", &src(o))
            .expect_err("should fail");
        assert_eq!(e.exit_code(), 2);
        render_error(&e)
    };
    let msg = err("sparsity = 0.5, params = 'conv'");
    assert!(
        msg.starts_with("p.lua:2: run:prune: no parameter matches `conv`; the model has:"),
        "{msg}"
    );
    let msg = err("sparsity = 1.5");
    assert!(
        msg.contains("sparsity 1.5 must be between 0 and 1"),
        "{msg}"
    );
    let msg = err("sparsity = 0.5, scope = 'row'");
    assert!(msg.contains("unknown scope `row` (layer, global)"), "{msg}");
    let msg = err("amount = 0.5");
    assert!(msg.contains("unknown field `amount`"), "{msg}");
}
