//! GGUF export: a trained digits MLP written as f32, Q8_0, Q4_0 and Q4_1 is read
//! back by llama.cpp's own reader (PyPI `gguf`, in the test virtualenv that
//! scripts/fetch-data.sh makes) within each type's quantization error, and
//! the dequantized model keeps its accuracy.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use anyhow::{ensure, Result};
use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use serde_json::Value;
use taper::data::{digits, Pipeline};
use taper::engine::optim::OptimSpec;
use taper::engine::{checkpoint, Activation, Mlp, Trainer, TrainerOptions};
use taper::{Host, HostOptions};

const RECIPE: &str = r#"
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 128, 64 }, outputs = 10 },
  optim = taper.optim.adamw{ lr = 3e-3, weight_decay = 1e-4 },
  data = taper.data.digits{ split = "train" }:shuffle{ seed = 1 }:batch(32),
  seed = 1,
}
for _ in run:epochs(20) do for b in run:batches() do run:step(b) end end
run:evaluate(taper.data.digits{ split = "test" })
for _, f in ipairs{ "f32", "q8_0", "q4_0", "q4_1" } do
  run:export{ path = "OUT/digits-" .. f .. ".gguf", format = f }
end
"#;

/// The file as llama.cpp's reader sees it.
fn read_independently(file: &Path) -> Result<Value> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(common::test_python("gguf")?)
        .arg(root.join("scripts/tools/read_gguf.py"))
        .arg(file)
        .output()?;
    ensure!(
        out.status.success(),
        "read_gguf.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Held-out accuracy of the MLP with these weights.
fn accuracy(weights: HashMap<String, Tensor>) -> Result<f64> {
    let spec = Mlp {
        inputs: 64,
        hidden: vec![128, 64],
        outputs: 10,
        activation: Activation::Relu,
        dropout: 0.0,
    };
    let t = Trainer::new(
        Arc::new(spec),
        &OptimSpec::AdamW(Default::default()),
        TrainerOptions::default(),
    )?;
    t.params().load(&weights).map_err(anyhow::Error::msg)?;
    let test = Pipeline::new(Arc::new(digits("test")?)).batch(256, false);
    Ok(t.evaluate(test.epoch(1, 256, 0))?.accuracy)
}

#[test]
fn gguf_exports_read_back_independently_and_keep_accuracy() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut host = Host::new(HostOptions {
        out_dir: Some(dir.path().to_path_buf()),
        ..HostOptions::default()
    })?;
    let src = RECIPE.replace("OUT", dir.path().to_str().unwrap());
    let report = host.run_source("export.lua", &src)?;
    let trained = report.runs[0]
        .last_eval
        .clone()
        .expect("evaluated")
        .accuracy;
    let (ck, _) = checkpoint::load(&dir.path().join("checkpoint.safetensors"), &Device::Cpu)?;

    // Per 32-value block with maximum |x| = a, the error bound of each type
    // (plus the f16 rounding of the block's scale).
    for (fmt, ty, bound, max_drop) in [
        ("f32", "F32", 0.0, 0.0),
        ("q8_0", "Q8_0", 1.0 / 254.0, 0.01),
        ("q4_0", "Q4_0", 1.0 / 8.0, 0.03),
        // A minimum and a step of (max - min) / 15: at most half a step off.
        ("q4_1", "Q4_1", 1.0 / 15.0, 0.03),
    ] {
        let file = dir.path().join(format!("digits-{fmt}.gguf"));
        let back = read_independently(&file)?;
        assert_eq!(back["metadata"]["general.architecture"], "taper");
        assert_eq!(back["metadata"]["taper.model"], "mlp 64-128-64-10 relu");
        let tensors = back["tensors"].as_object().unwrap();
        assert_eq!(tensors.len(), 6);
        for (name, t) in tensors {
            let want = &ck[&format!("model.{name}")];
            let want_v: Vec<f32> = want.flatten_all()?.to_vec1()?;
            let shape: Vec<usize> = serde_json::from_value(t["shape"].clone())?;
            assert_eq!(shape, want.dims(), "{fmt} {name}");
            let is_matrix = want.rank() == 2;
            assert_eq!(
                t["type"],
                if is_matrix { ty } else { "F32" },
                "{fmt} {name}"
            );
            let got: Vec<f64> = serde_json::from_value(t["values"].clone())?;
            for (g, x) in got.chunks(32).zip(want_v.chunks(32)) {
                let a = x.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
                for (gi, xi) in g.iter().zip(x) {
                    let xi = *xi as f64;
                    let tol = if is_matrix {
                        a * bound * 1.01 + xi.abs() * 1e-3
                    } else {
                        0.0
                    };
                    assert!((gi - xi).abs() <= tol + 1e-7, "{fmt} {name}: {gi} vs {xi}");
                }
            }
        }
        // The dequantized model, through candle's reader this time.
        let mut f = std::fs::File::open(&file)?;
        let content = gguf_file::Content::read(&mut f)?;
        let mut weights = HashMap::new();
        for name in content.tensor_infos.keys() {
            let q = content.tensor(&mut f, name, &Device::Cpu)?;
            weights.insert(name.clone(), q.dequantize(&Device::Cpu)?);
        }
        let acc = accuracy(weights)?;
        eprintln!("{fmt}: held-out accuracy {acc:.4} (trained {trained:.4})");
        assert!(
            acc >= trained - max_drop - 1e-9,
            "{fmt}: accuracy {acc} vs {trained} trained"
        );
    }
    Ok(())
}
