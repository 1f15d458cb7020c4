//! Embedding taper in a Rust program: register a model of your own under
//! `taper.model`, then run a Lua recipe that uses it.
//!
//!     cargo run --release --example embed

use candle_core::{Module, Result, Tensor};
use candle_nn::{Linear, VarBuilder};
use serde::Deserialize;
use taper::engine::ModelSpec;
use taper::{Host, HostOptions};

/// A residual MLP: `inputs -> width`, then `blocks` of `x + relu(W x)`, then
/// `width -> outputs`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResMlp {
    inputs: usize,
    width: usize,
    blocks: usize,
    outputs: usize,
}

struct ResMlpNet {
    stem: Linear,
    blocks: Vec<Linear>,
    head: Linear,
}

impl Module for ResMlpNet {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.stem.forward(x)?.relu()?;
        for b in &self.blocks {
            h = (&h + b.forward(&h)?.relu()?)?;
        }
        self.head.forward(&h)
    }
}

impl ModelSpec for ResMlp {
    fn describe(&self) -> String {
        format!(
            "resmlp {}x{} blocks {}",
            self.inputs, self.width, self.blocks
        )
    }
    fn build(&self, vb: VarBuilder) -> Result<Box<dyn Module>> {
        let blocks = (0..self.blocks)
            .map(|i| candle_nn::linear(self.width, self.width, vb.pp(format!("block{i}"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(ResMlpNet {
            stem: candle_nn::linear(self.inputs, self.width, vb.pp("stem"))?,
            blocks,
            head: candle_nn::linear(self.width, self.outputs, vb.pp("head"))?,
        }))
    }
}

const RECIPE: &str = r#"
local run = taper.run{
  model = taper.model.resmlp{ inputs = 64, width = 64, blocks = 2, outputs = 10 },
  optim = taper.optim.adamw{ lr = 2e-3 },
  data = taper.data.digits{ split = "train" }:shuffle{ seed = 7 }:batch(32),
}
for epoch in run:epochs(8) do
  for batch in run:batches() do run:step(batch) end
end
local ev = run:evaluate(taper.data.digits{ split = "test" })
print(("%s: test accuracy %.1f%%"):format(tostring(run), ev.accuracy * 100))
"#;

/// Runs the embedded recipe and returns its held-out accuracy.
pub fn run(quiet: bool) -> anyhow::Result<f64> {
    let mut host = Host::new(HostOptions {
        quiet,
        ..HostOptions::default()
    })?;
    host.register_model::<ResMlp>("resmlp")?;
    let report = host.run_source("embedded.lua", RECIPE)?;
    let ev = report.runs[0]
        .last_eval
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("no evaluation"))?;
    Ok(ev.accuracy)
}

#[allow(dead_code)] // the test harness includes this file without calling main
fn main() -> anyhow::Result<()> {
    taper::memory::tune_malloc();
    run(false)?;
    Ok(())
}
