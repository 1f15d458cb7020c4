//! A small llama GGUF file written for a test, and a QLoRA recipe over it
//! that needs no fetched data: on the GPU machine (no network, and too
//! little carry for SmolLM2's 98 MB) it is how a llama trains on CUDA.
//!
//! Its shapes are SmolLM2's in miniature: Q4_1 projections, a Q8_0 token
//! embedding tied to the head, f32 norms, grouped-query heads (4 query
//! heads to 2 key/value heads).

use std::path::Path;

use anyhow::Result;
use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};

pub const VOCAB: usize = 96;
const DIM: usize = 64;
const FFN: usize = 128;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;

/// Values spread over `±scale`, the same every run.
fn spread(shape: (usize, usize), seed: u64, scale: f32) -> Result<Tensor> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let v: Vec<f32> = (0..shape.0 * shape.1)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            scale * ((s >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        })
        .collect();
    Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
}

/// Writes the model to `path`.
pub fn write(path: &Path) -> Result<()> {
    let hd = DIM / HEADS;
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut seed = 1;
    let mut add = |name: String, shape: (usize, usize), scale: f32, dtype| -> Result<()> {
        seed += 1;
        let t = spread(shape, seed, scale)?;
        tensors.push((name, QTensor::quantize(&t, dtype)?));
        Ok(())
    };
    add(
        "token_embd.weight".into(),
        (VOCAB, DIM),
        0.1,
        GgmlDType::Q8_0,
    )?;
    let ones = |name: String| -> Result<(String, QTensor)> {
        let t = (spread((1, DIM), name.len() as u64, 0.1)? + 1.0)?.flatten_all()?;
        Ok((name, QTensor::quantize(&t, GgmlDType::F32)?))
    };
    let mut norms = vec![ones("output_norm.weight".into())?];
    for i in 0..LAYERS {
        norms.push(ones(format!("blk.{i}.attn_norm.weight"))?);
        norms.push(ones(format!("blk.{i}.ffn_norm.weight"))?);
        let w = 1.0 / (DIM as f32).sqrt();
        for (p, shape) in [
            ("attn_q", (DIM, DIM)),
            ("attn_k", (KV_HEADS * hd, DIM)),
            ("attn_v", (KV_HEADS * hd, DIM)),
            ("attn_output", (DIM, DIM)),
            ("ffn_gate", (FFN, DIM)),
            ("ffn_up", (FFN, DIM)),
            ("ffn_down", (DIM, FFN)),
        ] {
            add(format!("blk.{i}.{p}.weight"), shape, w, GgmlDType::Q4_1)?;
        }
    }
    tensors.extend(norms);
    use gguf_file::Value;
    let meta = [
        ("general.architecture", Value::String("llama".into())),
        ("llama.embedding_length", Value::U32(DIM as u32)),
        ("llama.block_count", Value::U32(LAYERS as u32)),
        ("llama.attention.head_count", Value::U32(HEADS as u32)),
        ("llama.attention.head_count_kv", Value::U32(KV_HEADS as u32)),
        ("llama.feed_forward_length", Value::U32(FFN as u32)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
    ];
    let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut f = std::fs::File::create(path)?;
    gguf_file::write(&mut f, &meta, &refs)?;
    Ok(())
}

/// QLoRA over the file at `path` on built-in Shakespeare (its 65
/// characters are ids below [`VOCAB`]), 64 steps of 4 x 16 tokens with the
/// chunked loss; `results.before` and `results.after` are the held-out
/// losses. `precision` is the run's (`f32`, `bf16`, `f16`).
pub fn recipe(path: &Path, precision: &str) -> String {
    format!(
        r#"
local function text(split, n)
  return taper.data.shakespeare{{ split = split, context = 16 }}:take(n)
end
local train = text("train", 256):shuffle{{ seed = 1 }}:batch(4)
local val = text("val", 32):batch(16)
local run = taper.run{{
  model = taper.model.llama_gguf{{
    path = {path:?}, context = 16, lora_rank = 4,
    lora_targets = {{ "attn_q", "attn_v", "ffn_down" }},
  }},
  optim = taper.optim.adamw{{ lr = 1e-2, weight_decay = 0 }},
  loss = taper.loss.cross_entropy{{ chunk = 24 }},
  data = train,
  seed = 1,
  precision = "{precision}",
}}
local before = run:evaluate(val).loss
for _ in run:epochs(1) do
  for batch in run:batches() do run:step(batch) end
end
results = {{ before = before, after = run:evaluate(val).loss }}
"#,
        path = path.display().to_string()
    )
}

/// Runs [`recipe`] on `device`: the held-out loss before and after.
pub fn train(device: &str, precision: &str) -> Result<(f64, f64)> {
    let dir = tempfile::tempdir()?;
    let model = dir.path().join("tiny-llama.gguf");
    write(&model)?;
    let mut host = taper::Host::new(taper::HostOptions {
        device: device.into(),
        out_dir: Some(dir.path().join("run")),
        quiet: true,
        ..taper::HostOptions::default()
    })?;
    host.run_source("tiny_llama.lua", &recipe(&model, precision))?;
    let results: mlua::Table = host.globals()?.get("results")?;
    Ok((results.get("before")?, results.get("after")?))
}
