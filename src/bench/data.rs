//! `taper bench data`: how fast each source delivers batches, and how much of
//! a training step waits for data with and without prefetch.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Tensor;

use crate::data::{self, Pipeline, Source};
use crate::Result;

fn throughput(name: &str, source: Arc<dyn Source>) -> Result<()> {
    let p = Pipeline::new(source).shuffle(1).batch(64, false);
    let t = Instant::now();
    let (mut samples, mut bytes) = (0usize, 0usize);
    for b in p.epoch(1, 64, 0) {
        let b = b?;
        samples += b.len();
        bytes += b.x.elem_count() * b.x.dtype().size_in_bytes();
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "  {name:<14} {samples:>9} samples in {s:>6.2} s: {:>10.0} samples/s, {:>7.1} MB/s of inputs",
        samples as f64 / s,
        bytes as f64 / s / 1e6
    );
    Ok(())
}

/// A source that takes `delay` to build each batch (a stand-in for a slow
/// decoder or disk), to show what prefetch hides.
struct Slow {
    inner: Arc<dyn Source>,
    delay: Duration,
}

impl Source for Slow {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn split(&self) -> &str {
        self.inner.split()
    }
    fn describe(&self) -> String {
        format!("slow {}", self.inner.describe())
    }
    fn gather(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        std::thread::sleep(self.delay);
        self.inner.gather(indices)
    }
}

/// Trains `steps` steps of the Shakespeare GPT (the recipe's shape) and
/// returns (seconds, seconds waiting for data).
fn wait_share(source: Arc<dyn Source>, prefetch: usize, steps: usize) -> Result<(f64, f64)> {
    let mut trainer = super::shakespeare_gpt(3e-3)?;
    let p = Pipeline::new(source)
        .shuffle(1)
        .batch(32, false)
        .prefetch(prefetch);
    let mut epoch = p.epoch(1, 32, 0);
    let t = Instant::now();
    for _ in 0..steps {
        match epoch.next() {
            Some(b) => trainer.train_step(&b?)?,
            None => break,
        };
    }
    Ok((t.elapsed().as_secs_f64(), epoch.wait().as_secs_f64()))
}

pub fn run(steps: usize) -> Result<()> {
    println!("data: throughput of a shuffled epoch, batch 64");
    throughput("digits", Arc::new(data::digits("train")?))?;
    let shakespeare = Arc::new(data::shakespeare("train", 64, None)?);
    throughput("shakespeare", shakespeare.clone())?;
    let fm = Path::new("data/fashion-mnist");
    if fm.join("train-images-idx3-ubyte.gz").exists() {
        let src = data::idx(
            &fm.join("train-images-idx3-ubyte.gz"),
            &fm.join("train-labels-idx1-ubyte.gz"),
            "train",
            255.0,
        )?;
        throughput("fashion idx", Arc::new(src))?;
    }
    let mnist = Path::new("data/mnist/mnist_5k.csv.gz");
    if mnist.exists() {
        throughput(
            "mnist csv",
            Arc::new(data::csv(
                mnist,
                &data::CsvOptions {
                    scale: 255.0,
                    ..Default::default()
                },
            )?),
        )?;
    }
    let dir = std::env::temp_dir().join(format!("taper-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| crate::Error::io(&dir, e))?;
    let path = dir.join("tokens.bin");
    {
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(&path).map_err(|e| crate::Error::io(&path, e))?,
        );
        let block: Vec<u8> = (0..(1u32 << 16))
            .flat_map(|t| (t as u16).to_le_bytes())
            .collect();
        for _ in 0..2048 {
            f.write_all(&block)
                .map_err(|e| crate::Error::io(&path, e))?;
        }
    }
    let tokens = data::tokens(&path, data::TokenType::U16, 256, None, "all")?;
    throughput("tokens 256 MiB", Arc::new(tokens))?;
    let _ = std::fs::remove_dir_all(&dir);

    println!("data wait on the Shakespeare GPT ({steps} steps, batch 32):");
    for (label, delay) in [
        ("built-in source", Duration::ZERO),
        ("source slowed 40 ms/batch", Duration::from_millis(40)),
    ] {
        for prefetch in [0, 4] {
            let src: Arc<dyn Source> = Arc::new(Slow {
                inner: shakespeare.clone(),
                delay,
            });
            let (total, wait) = wait_share(src, prefetch, steps)?;
            println!(
                "  {label:<27} prefetch {prefetch}: {:>6.1} ms/step, data wait {:>6.3}% of the time",
                total / steps as f64 * 1e3,
                wait / total * 100.0
            );
        }
    }
    Ok(())
}
