//! QLoRA on SmolLM2-135M (fetched by scripts/fetch-data.sh from PyPI): the
//! adapters train and lower the held-out loss, and the frozen quantized base
//! is byte for byte what the file holds. Two blocks of the model keep the
//! test short.

mod common;
#[path = "common/tiny_llama.rs"]
mod tiny_llama;

use std::path::Path;

use anyhow::Result;
use candle_core::quantized::gguf_file;
use candle_core::Device;
use taper::engine::checkpoint;
use taper::engine::ModelSpec;
use taper::quant::LlamaGguf;
use taper::{Host, HostOptions};

const MODEL: &str = "data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

#[test]
fn adapters_train_and_the_quantized_base_stays_as_stored() -> Result<()> {
    common::fetched("data/smollm2/tokenizer.json")?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::env::set_current_dir(root)?;
    let dir = tempfile::tempdir()?;
    let set = [
        ("layers", "2"),
        ("steps", "8"),
        ("context", "32"),
        ("lr", "3e-3"),
        ("val_windows", "8"),
    ];
    let mut host = Host::new(HostOptions {
        out_dir: Some(dir.path().to_path_buf()),
        overrides: set
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..HostOptions::default()
    })?;
    host.run_file(&root.join("scripts/smollm2_qlora.lua"))?;
    let results: mlua::Table = host.globals()?.get("results")?;
    let (before, after): (f64, f64) = (results.get("before")?, results.get("after")?);
    eprintln!("held-out cross-entropy {before:.4} -> {after:.4}");
    assert!(after < before - 0.1, "held-out loss {before} -> {after}");

    // Only adapters are parameters: 2 blocks x (q, v) x (A, B).
    let (ck, _) = checkpoint::load(&dir.path().join("checkpoint.safetensors"), &Device::Cpu)?;
    let model: Vec<&String> = ck.keys().filter(|k| k.starts_with("model.")).collect();
    assert_eq!(model.len(), 8, "{model:?}");
    assert!(model
        .iter()
        .all(|k| k.ends_with("lora_a") || k.ends_with("lora_b")));

    // The frozen weights the run used are the file's, byte for byte.
    let spec: LlamaGguf = serde_json::from_value(serde_json::json!({ "path": MODEL }))?;
    let used = spec.weights()?;
    let mut f = std::fs::File::open(MODEL)?;
    let content = gguf_file::Content::read(&mut f)?;
    for name in content.tensor_infos.keys() {
        let stored = content.tensor(&mut f, name, &Device::Cpu)?;
        assert!(
            stored.data()? == used.tensors[name].data()?,
            "{name} changed"
        );
    }
    Ok(())
}

/// A llama written by the test (no fetched data) trains its adapters
/// through a recipe on the CPU, in f32, bf16 and f16 (f32 masters; the
/// frozen products widen their input to f32). `tests/cuda_kernels.rs` trains the
/// same on a GPU and compares.
#[test]
fn a_written_llama_trains_its_adapters_in_f32_bf16_and_f16() -> Result<()> {
    let (before, after) = tiny_llama::train("cpu", "f32")?;
    eprintln!("held-out cross-entropy {before:.4} -> {after:.4}");
    // Better than guessing uniformly (ln 96 = 4.56) by 0.4 nats at least.
    assert!(
        after < before - 0.5 && after < 4.16,
        "held-out loss {before} -> {after}"
    );
    for precision in ["bf16", "f16"] {
        let (b16, a16) = tiny_llama::train("cpu", precision)?;
        eprintln!("{precision}: {b16:.4} -> {a16:.4}");
        assert!(
            (b16 - before).abs() < 1e-2 * before && (a16 - after).abs() < 2e-2 * after,
            "{precision} {b16} -> {a16} against f32 {before} -> {after}"
        );
    }
    Ok(())
}

/// What cannot work is refused where the recipe asks for it: each bad
/// option, and a file that is missing, truncated, not GGUF or not a llama,
/// is an error at the recipe's line naming the option or the file (and the
/// tensor a truncated file lacks), with exit code 2, before any run starts.
#[test]
fn bad_llama_options_and_files_are_refused_at_the_recipe_line() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let good = dir.path().join("tiny.gguf");
    tiny_llama::write(&good)?;
    let bytes = std::fs::read(&good)?;
    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() * 3 / 4])?;
    let noise = dir.path().join("noise.gguf");
    std::fs::write(
        &noise,
        (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect::<Vec<u8>>(),
    )?;
    let other = dir.path().join("other.gguf");
    let t = candle_core::Tensor::zeros((32, 32), candle_core::DType::F32, &Device::Cpu)?;
    let meta = [(
        "general.architecture".to_string(),
        gguf_file::Value::String("gpt2".into()),
    )];
    taper::quant::export_gguf(
        &other,
        &[("w".into(), t)],
        &meta,
        taper::quant::ExportFormat::F32,
    )?;
    let p = |f: &Path| f.display().to_string();
    let cases: Vec<(String, String, &str)> = vec![
        (
            p(&good),
            "lora_rank = 0".into(),
            "lora_rank must be at least 1",
        ),
        (
            p(&good),
            "lora_alpha = 0".into(),
            "lora_alpha must be positive",
        ),
        (
            p(&good),
            "lora_targets = {}".into(),
            "lora_targets is empty",
        ),
        (
            p(&good),
            r#"lora_targets = { "attn_x" }"#.into(),
            "unknown lora target `attn_x`",
        ),
        (
            p(&good),
            "layers = 0".into(),
            "layers must be 1 to the file's 2 blocks",
        ),
        (p(&good), "layers = 3".into(), "has 2 blocks"),
        (p(&good), "context = 0".into(), "context must be at least 1"),
        (p(&good), r#"train = "half""#.into(), "unknown train `half`"),
        (p(&good), r#"base = "q5_k""#.into(), "unknown base `q5_k`"),
        (
            p(&good),
            "lora_dropout = 1".into(),
            "lora_dropout 1 is not a rate in [0, 1)",
        ),
        (
            p(&good),
            r#"train = "full", lora_dropout = 0.1"#.into(),
            r#"lora_dropout 0.1: train = "full" has no adapters"#,
        ),
        (
            p(&dir.path().join("absent.gguf")),
            String::new(),
            "absent.gguf does not exist",
        ),
        (p(&truncated), String::new(), "truncated.gguf: tensor "),
        (p(&noise), String::new(), "noise.gguf: not a GGUF file"),
        (p(&other), String::new(), "its architecture is `gpt2`"),
    ];
    for (path, opt, says) in cases {
        let src = format!(
            "local n = 1\nlocal m = taper.model.llama_gguf{{ path = {path:?}, context = 16, {opt} }}\nresults = {{}}\n"
        );
        let mut host = Host::new(HostOptions {
            quiet: true,
            ..HostOptions::default()
        })?;
        let e = host
            .run_source("bad.lua", &src)
            .expect_err(&format!("{path} with `{opt}` was accepted"));
        let msg = e.to_string();
        assert!(
            msg.contains("bad.lua:2: taper.model.llama_gguf: ") && msg.contains(says),
            "{path} with `{opt}`: {msg}"
        );
        assert_eq!(e.exit_code(), 2, "{msg}");
        assert!(
            !msg.contains("candle_core::"),
            "a backtrace in the message: {msg}"
        );
    }
    Ok(())
}

/// A checkpoint names its GGUF file by an absolute path: a run whose recipe
/// gave a relative one is sampled and exported from another folder.
#[test]
fn a_llama_checkpoint_finds_its_file_from_any_folder() -> Result<()> {
    use std::process::Command;
    let (dir, elsewhere) = (tempfile::tempdir()?, tempfile::tempdir()?);
    tiny_llama::write(&dir.path().join("tiny.gguf"))?;
    std::fs::write(
        dir.path().join("recipe.lua"),
        tiny_llama::recipe(Path::new("tiny.gguf"), "f32"),
    )?;
    let taper = |args: &[&str], cwd: &Path| -> Result<String> {
        let o = Command::new(env!("CARGO_BIN_EXE_taper"))
            .args(args)
            .current_dir(cwd)
            .output()?;
        let err = String::from_utf8_lossy(&o.stderr);
        anyhow::ensure!(o.status.success(), "taper {args:?}: {err}");
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    };
    taper(
        &["train", "recipe.lua", "--quiet", "--out", "run"],
        dir.path(),
    )?;
    let run = dir.path().join("run");
    let run = run.to_str().unwrap();
    let said = taper(
        &["sample", run, "--prompt", "ROMEO:", "--tokens", "8"],
        elsewhere.path(),
    )?;
    assert!(
        said.starts_with("ROMEO:") && said.len() > "ROMEO:".len(),
        "{said}"
    );
    taper(
        &["export", run, "--format", "gguf", "--out", "m.gguf"],
        elsewhere.path(),
    )?;
    assert!(elsewhere.path().join("m.gguf").is_file());
    Ok(())
}

/// `format = "gguf"` on a llama run writes the llama file with the training
/// in it (LoRA: the base with the adapters merged; `full`: the trained
/// weights), as llama.cpp reads it: the model the run trained, also when it
/// used only the first blocks or requantized the base. Loaded back as a
/// `llama_gguf`, it gives the held-out loss the run ended with, not the
/// base's. An adapter (`gguf-lora`, `peft`) of the first blocks only is
/// refused.
#[test]
fn a_llama_run_exports_a_llama_file_with_its_training_in_it() -> Result<()> {
    for (train, more) in [
        ("lora", ""),
        ("full", ""),
        ("lora", r#"layers = 1, base = "q8_0","#),
    ] {
        let dir = tempfile::tempdir()?;
        let (base, out) = (dir.path().join("tiny.gguf"), dir.path().join("out.gguf"));
        let adapter = dir.path().join("adapter.gguf");
        let peft = dir.path().join("peft");
        tiny_llama::write(&base)?;
        let src = format!(
            r#"
local val = taper.data.shakespeare{{ split = "val", context = 16 }}:take(32):batch(16)
local function llama(path, train, more)
  local opts = {{ path = path, context = 16, lora_rank = 4, train = train }}
  for k, v in pairs(more or {{}}) do opts[k] = v end
  return taper.model.llama_gguf(opts)
end
local run = taper.run{{
  model = llama({base:?}, "{train}", {{ {more} }}),
  optim = taper.optim.adamw{{ lr = 1e-2, weight_decay = 0 }},
  data = taper.data.shakespeare{{ split = "train", context = 16 }}:take(64):batch(4),
  seed = 1,
}}
local before = run:evaluate(val).loss
for _ in run:epochs(1) do
  for batch in run:batches() do run:step(batch) end
end
local trained = run:evaluate(val).loss
run:export{{ path = {out:?}, type = "f32" }}
-- An adapter of the first blocks would run over all the file's in llama.cpp.
local adapter_ok, adapter_err = pcall(run.export, run, {{ path = {adapter:?}, format = "gguf-lora" }})
local peft_ok, peft_err = pcall(run.export, run, {{ path = {peft:?}, format = "peft" }})
local again = taper.run{{ model = llama({out:?}, "lora"), optim = taper.optim.adamw{{}}, data = val }}
results = {{ before = before, trained = trained, exported = again:evaluate(val).loss,
  adapter_ok = adapter_ok, adapter_err = tostring(adapter_err),
  peft_ok = peft_ok, peft_err = tostring(peft_err) }}
"#,
            base = base.display().to_string(),
            out = out.display().to_string(),
            adapter = adapter.display().to_string(),
            peft = peft.display().to_string(),
        );
        let mut host = Host::new(HostOptions {
            out_dir: Some(dir.path().join("run")),
            quiet: true,
            ..HostOptions::default()
        })?;
        host.run_source("export.lua", &src)?;
        let r: mlua::Table = host.globals()?.get("results")?;
        let (before, trained, exported): (f64, f64, f64) =
            (r.get("before")?, r.get("trained")?, r.get("exported")?);
        eprintln!("{train} {more}: held-out {before:.4} -> {trained:.4}; exported {exported:.4}");
        assert!(
            trained < before - 0.3,
            "{train} {more}: {before} -> {trained}"
        );
        // The run's products round their input to 8 bits (Q4_1); the
        // exported f32 weights' do not: 2e-4 nats here. The model with
        // both blocks, where the run used one, is 0.04 nats off.
        assert!(
            (exported - trained).abs() < 1e-3 * trained,
            "{train} {more}: the exported model's loss {exported}, the run's {trained}"
        );
        let mut f = std::fs::File::open(&out)?;
        let content = gguf_file::Content::read(&mut f)?;
        let arch = content.metadata["general.architecture"].to_string()?;
        assert_eq!(arch, "llama");
        for (format, ok, err, written) in [
            ("gguf-lora", "adapter_ok", "adapter_err", adapter.clone()),
            (
                "peft",
                "peft_ok",
                "peft_err",
                peft.join("adapter_model.safetensors"),
            ),
        ] {
            let (ok, err): (bool, String) = (r.get(ok)?, r.get(err)?);
            match (train, more.is_empty()) {
                ("lora", true) => assert!(ok && written.exists(), "{format}: {err}"),
                ("lora", false) => {
                    assert!(
                        !ok && err.contains("first 1 of the 2 blocks"),
                        "{format}, an adapter of 1 of 2 blocks: {err}"
                    );
                    assert!(!written.exists(), "{format}: a refused adapter was written");
                }
                _ => assert!(err.contains("not LoRA adapters"), "{format}: {err}"),
            }
        }
    }
    Ok(())
}

/// `train = "full"`: the comparison QLoRA is measured against. Every weight
/// of the used blocks (and the embedding, norms) is an f32 parameter that
/// starts at the file's dequantized values and trains.
#[test]
fn full_fine_tuning_starts_from_the_dequantized_weights() -> Result<()> {
    use std::sync::Arc;
    use taper::data::Batch;
    use taper::engine::optim::OptimSpec;
    use taper::engine::{Trainer, TrainerOptions};
    common::fetched("data/smollm2/tokenizer.json")?;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(MODEL);
    let spec: LlamaGguf = serde_json::from_value(serde_json::json!({
        "path": path, "layers": 1, "train": "full", "context": 16
    }))?;
    assert!(spec
        .describe()
        .ends_with("(first 1 layers) full fine-tuning"));
    let w = spec.weights()?;
    let mut t = Trainer::new(
        Arc::new(spec.clone()),
        &OptimSpec::Sgd(Default::default()),
        TrainerOptions::default(),
    )?;
    // Embedding, final norm, 2 block norms and 7 projections.
    let vars = t.params().vars();
    assert_eq!(vars.len(), 11);
    for (name, v) in &vars {
        let stored = w.tensors[name].dequantize(&Device::Cpu)?;
        let diff = (v.as_tensor() - &stored)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert_eq!(diff, 0.0, "{name} does not start at the file's values");
    }
    let ids: Vec<u32> = (0..32).map(|i| (i * 97 % 5000) as u32).collect();
    let x = candle_core::Tensor::from_vec(ids[..30].to_vec(), (2, 15), &Device::Cpu)?;
    let y = candle_core::Tensor::from_vec(ids[2..].to_vec(), (2, 15), &Device::Cpu)?;
    let before = vars[0].1.as_tensor().copy()?;
    t.train_step(&Batch {
        x,
        y,
        indices: vec![0, 1],
    })?;
    let moved = (vars[0].1.as_tensor() - &before)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?;
    assert!(moved > 0.0, "{} did not train", vars[0].0);
    // An unknown mode is an error that names the choices.
    let bad: LlamaGguf =
        serde_json::from_value(serde_json::json!({ "path": path, "train": "half" }))?;
    let err = Trainer::new(
        Arc::new(bad),
        &OptimSpec::Sgd(Default::default()),
        TrainerOptions::default(),
    )
    .err()
    .expect("unknown train mode");
    assert!(
        err.to_string()
            .contains("unknown train `half` (lora, full)"),
        "{err}"
    );
    Ok(())
}

/// `base = "q8_0"` / `"q4_0"`: the frozen projections are requantized (8-bit
/// or 4-bit) and stay close to the file's weights; the rest is untouched.
#[test]
fn the_base_can_be_requantized_to_8_or_4_bits() -> Result<()> {
    use candle_core::quantized::GgmlDType;
    common::fetched("data/smollm2/tokenizer.json")?;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(MODEL);
    let file: LlamaGguf = serde_json::from_value(serde_json::json!({ "path": path }))?;
    let file = file.weights()?;
    for (base, dtype) in [("q8_0", GgmlDType::Q8_0), ("q4_0", GgmlDType::Q4_0)] {
        let spec: LlamaGguf =
            serde_json::from_value(serde_json::json!({ "path": path, "base": base }))?;
        assert!(spec.describe().contains(&format!("base {base}")));
        let w = spec.weights()?;
        let q = &w.tensors["blk.0.attn_q.weight"];
        assert_eq!(q.dtype(), dtype);
        let (a, b) = (
            q.dequantize(&Device::Cpu)?,
            file.tensors["blk.0.attn_q.weight"].dequantize(&Device::Cpu)?,
        );
        let err = (&a - &b)?.abs()?.max_all()?.to_scalar::<f32>()?;
        let scale = b.abs()?.max_all()?.to_scalar::<f32>()?;
        // Half a step of the type at the largest weight, at most.
        let bound = if dtype == GgmlDType::Q8_0 {
            scale / 127.0
        } else {
            scale / 8.0
        };
        assert!(err <= bound, "{base}: max error {err} (bound {bound})");
        assert_eq!(
            w.tensors["token_embd.weight"].dtype(),
            file.tensors["token_embd.weight"].dtype()
        );
    }
    let bad: LlamaGguf = serde_json::from_value(serde_json::json!({ "path": path, "base": "q2" }))?;
    let err = bad.weights().err().expect("unknown base");
    assert!(err.to_string().contains("unknown base `q2`"), "{err}");
    Ok(())
}

/// Recomputing the blocks in the backward gives the adapters the gradients
/// of the plain backward, with `lora_dropout` too (a recomputed block draws
/// the same masks).
#[test]
fn recomputed_llama_blocks_give_the_adapters_the_same_gradients() -> Result<()> {
    for rate in [0.0, 0.3] {
        recomputed_blocks_match(rate)?;
    }
    Ok(())
}

fn recomputed_blocks_match(rate: f64) -> Result<()> {
    use taper::engine::loss::CrossEntropy;
    let (store, model, x, y) = two_blocks(rate)?;
    let grads = |every: usize| -> Result<Vec<Vec<f32>>> {
        assert!(model.set_recompute(every));
        let logits = model.forward_train(&x, DRAW)?;
        let loss = CrossEntropy::default().loss(&logits, &y)?;
        let mut g = loss.backward()?;
        taper::engine::recompute::merge_parameter_grads(&mut g)?;
        store
            .vars()
            .iter()
            .map(|(name, v)| {
                let t = g
                    .get(v)
                    .ok_or_else(|| anyhow::anyhow!("{name}: no gradient"))?;
                Ok(t.flatten_all()?.to_vec1::<f32>()?)
            })
            .collect()
    };
    let plain = grads(0)?;
    let recomputed = grads(1)?;
    let scale = plain.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
    assert!(scale > 0.0);
    for (a, b) in plain.iter().flatten().zip(recomputed.iter().flatten()) {
        assert!((a - b).abs() <= 1e-5 * scale, "{a} vs {b}");
    }
    Ok(())
}

/// `cross_entropy{ chunk = n }` on QLoRA: the frozen head, tied to the
/// embedding, enters the chunked loss as the embedding's dequantized copy.
/// Loss and adapter gradients are those of the full logits through that
/// copy, and within the 8-bit rounding of the hidden states of the
/// quantized head's (the forward's) loss.
#[test]
fn the_chunked_loss_takes_the_tied_frozen_head_dequantized() -> Result<()> {
    use candle_core::Tensor;
    use taper::engine::loss::CrossEntropy;
    let (store, model, x, y) = two_blocks(0.0)?;
    let (hidden, head) = model
        .hidden_and_head(
            &x,
            taper::engine::Draw {
                seed: 0,
                step: 0,
                first: 0,
            },
        )?
        .expect("a tied frozen head is separable on the CPU");
    assert!(!head.track_op(), "the frozen head is not a parameter");
    let d = hidden.dim(2)?;
    let run = |loss: Tensor| -> Result<(f32, Vec<f32>)> {
        let g = loss.backward()?;
        let mut all = Vec::new();
        for (name, v) in store.vars() {
            let t = g
                .get(&v)
                .ok_or_else(|| anyhow::anyhow!("{name}: no gradient"))?;
            all.extend(t.flatten_all()?.to_vec1::<f32>()?);
        }
        Ok((loss.to_scalar::<f32>()?, all))
    };
    let h2 = hidden.reshape(((), d))?;
    let chunked = run(taper::kernels::chunked_cross_entropy(
        &h2, &head, &y, 3, 0.0,
    )?)?;
    let full = run(CrossEntropy::default().loss(&h2.matmul(&head.t()?)?, &y.flatten_all()?)?)?;
    let quantized = run(CrossEntropy::default().loss(&model.forward(&x)?, &y)?)?;
    let scale = full.1.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(scale > 0.0);
    let gap = |a: &(f32, Vec<f32>)| {
        let g =
            a.1.iter()
                .zip(&full.1)
                .fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        ((a.0 - full.0).abs(), g / scale)
    };
    let (dl, dg) = gap(&chunked);
    assert!(dl < 1e-5 && dg < 1e-4, "chunked: loss {dl}, gradients {dg}");
    let (dl, dg) = gap(&quantized);
    eprintln!(
        "the quantized head's loss {} against {}: gradients {dg}",
        quantized.0, full.0
    );
    // Two blocks with random B give a loss of 23.5; the rounding moves it
    // by 1e-3 of that (0.026), the gradients by 3e-3.
    assert!(
        dl < 2e-3 * full.0 && dg < 1e-2,
        "quantized head: loss {dl}, gradients {dg}"
    );
    Ok(())
}

/// A training step's draw: seed 7, step 3, the batch's first sample.
const DRAW: taper::engine::Draw = taper::engine::Draw {
    seed: 7,
    step: 3,
    first: 0,
};

/// `lora_dropout` drops out each adapter's input in training only; each
/// sample's masks follow from its place in the step's batch, so a
/// micro-batch of the batch's later samples (after an OOM) draws what the
/// whole batch would have drawn for them.
#[test]
fn lora_dropout_draws_by_the_samples_place_and_only_in_training() -> Result<()> {
    use candle_core::Tensor;
    let (_, plain, _, _) = two_blocks(0.0)?;
    let (_, dropped, _, _) = two_blocks(0.3)?;
    let x = Tensor::new(
        &[
            [1u32, 504, 2030, 28, 339, 9, 77, 1860],
            [504, 2030, 28, 339, 9, 77, 1860, 11],
            [9, 77, 1860, 11, 1, 504, 2030, 28],
        ],
        &Device::Cpu,
    )?;
    let values = |t: Tensor| -> Result<Vec<f32>> { Ok(t.flatten_all()?.to_vec1()?) };
    let gap = |a: &[f32], b: &[f32]| {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        a.iter().zip(b).fold(0f32, |m, (p, q)| m.max((p - q).abs())) / scale
    };
    // The same weights (B set alike in both), so evaluation is the same.
    let eval = values(plain.forward(&x)?)?;
    assert_eq!(values(dropped.forward(&x)?)?, eval);
    assert_eq!(values(plain.forward_train(&x, DRAW)?)?, eval);
    let train = values(dropped.forward_train(&x, DRAW)?)?;
    assert_eq!(values(dropped.forward_train(&x, DRAW)?)?, train);
    let moved = gap(&train, &eval);
    assert!(moved > 1e-3, "dropout moved the logits by {moved} only");
    let later = taper::engine::Draw { first: 1, ..DRAW };
    let part = values(dropped.forward_train(&x.narrow(0, 1, 2)?, later)?)?;
    let whole = &train[train.len() / 3..];
    assert!(gap(&part, whole) < 1e-5, "{}", gap(&part, whole));
    Ok(())
}

/// The first two blocks of SmolLM2 with adapters (dropping out their
/// inputs at `lora_dropout`) whose B is random (it starts at zero, which
/// would give A no gradient), and 8 tokens with their next ones.
fn two_blocks(
    lora_dropout: f64,
) -> Result<(
    taper::engine::ParamStore,
    Box<dyn taper::engine::model::TrainModule>,
    candle_core::Tensor,
    candle_core::Tensor,
)> {
    use candle_core::{DType, Tensor};
    common::fetched("data/smollm2/tokenizer.json")?;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(MODEL);
    let spec: LlamaGguf = serde_json::from_value(serde_json::json!({
        "path": path, "layers": 2, "context": 16, "lora_dropout": lora_dropout,
    }))?;
    let store = taper::engine::ParamStore::new(3);
    let model = spec.build_train(store.var_builder(DType::F32, &Device::Cpu))?;
    // B away from zero, so that the adapters act; spread-out values, the
    // same every run (the checks' bounds are for these).
    for (i, (name, v)) in store.vars().into_iter().enumerate() {
        if name.ends_with("lora_b") {
            let b: Vec<f32> = (0..v.elem_count())
                .map(|k| 0.07 * (k as f32 * 0.731 + i as f32).sin())
                .collect();
            v.set(&Tensor::from_vec(b, v.shape(), &Device::Cpu)?)?;
        }
    }
    let x = Tensor::new(&[[1u32, 504, 2030, 28, 339, 9, 77, 1860]], &Device::Cpu)?;
    let y = Tensor::new(&[[504u32, 2030, 28, 339, 9, 77, 1860, 11]], &Device::Cpu)?;
    Ok((store, model, x, y))
}
