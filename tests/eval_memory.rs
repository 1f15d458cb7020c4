//! Evaluation builds no gradient graph and keeps nothing across batches:
//! peak host memory does not grow with the size of the evaluated set.
//! (Its own test binary, because it installs the counting allocator.)

use std::sync::Arc;

use anyhow::Result;
use taper::data::{digits, Pipeline};
use taper::engine::optim::OptimSpec;
use taper::engine::{Activation, Mlp, Trainer, TrainerOptions};
use taper::memory::{CountingAlloc, HostMemory};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

#[test]
fn evaluation_memory_does_not_grow_with_data() -> Result<()> {
    let spec = Mlp {
        inputs: 64,
        hidden: vec![512, 512],
        outputs: 10,
        activation: Activation::Relu,
        dropout: 0.0,
    };
    let trainer = Trainer::new(
        Arc::new(spec),
        &OptimSpec::AdamW(Default::default()),
        TrainerOptions::default(),
    )?;
    let data = Pipeline::new(Arc::new(digits("all")?));
    let peak_for = |n: usize| -> Result<usize> {
        let d = data.clone().take(n);
        trainer.evaluate(d.epoch(1, 64, 0))?; // warm up (lazy tables, pools)
        let before = HostMemory::current();
        HostMemory::reset_peak();
        trainer.evaluate(d.epoch(1, 64, 0))?;
        Ok(HostMemory::peak() - before)
    };
    let small = peak_for(64)?;
    let large = peak_for(1792)?; // 28 batches
    assert!(HostMemory::is_counting());
    // One batch of activations is ~64 x 512 x 4 B = 128 KiB per layer; 28
    // batches kept alive would be several MiB. Allow the order vector (14 KiB)
    // and allocator noise.
    assert!(
        large <= small + 64 * 1024,
        "peak over 64 samples {small} B, over 1792 samples {large} B"
    );
    Ok(())
}
