//! Every shipped recipe, stopped by a signal and resumed with the same
//! command plus `--resume auto`, ends with the weights of a run never
//! stopped, bitwise (on the CPU). The digits recipe has the drills
//! (`drills.rs`), the pruning and distillation recipes tests of their own
//! phases and runs (`main.rs`, `checkpoints.rs`); the others are here.

use std::process::Child;

use taper::engine::checkpoint;

use super::{
    common, records, stop_and_resume, stop_and_resume_when, straight_run, wait_until, weights,
};

/// `recipe` stopped by `signal` after its first epoch, in the second, and
/// resumed: the same weights as a straight run.
fn stopped_in_its_second_epoch(recipe: &[&str], signal: i32) {
    stopped_after(recipe, signal, 1);
}

/// `recipe` stopped by `signal` once it has written `epochs` epoch
/// records, and resumed: the same weights as a straight run, and, for a
/// recipe that keeps its best model, the same best model and best state.
fn stopped_after(recipe: &[&str], signal: i32, epochs: usize) {
    let dir = tempfile::tempdir().unwrap();
    let straight = straight_run(recipe, dir.path());
    let reference = weights(&straight);
    let out = dir.path().join("stopped");
    let end = stop_and_resume(recipe, &out, signal, epochs, &[]);
    assert!(weights(&end) == reference, "{recipe:?}: weights differ");
    let best = straight.with_file_name("best.safetensors");
    if best.exists() {
        let resumed = out.join("best.safetensors");
        assert!(
            weights(&resumed) == weights(&best),
            "{recipe:?}: best models differ"
        );
        let state = |p: &std::path::Path| {
            let mut b = checkpoint::read_meta(p).unwrap().best.unwrap();
            b.path = None;
            b
        };
        assert_eq!(state(&resumed), state(&best), "{recipe:?}");
    }
}

/// The image folder recipe (images decoded and augmented on the prefetch
/// thread, a seeded subset, a cosine schedule), stopped by SIGTERM after
/// its first epoch and resumed: the same weights as a run never stopped.
#[test]
fn the_image_folder_recipe_stops_and_resumes_to_the_same_weights() {
    common::fetched("data/fashion-mnist-png/val/bag").unwrap();
    let recipe = &[
        "scripts/image_folder.lua",
        "--set",
        "epochs=3",
        "--set",
        "train_samples=640",
        "--set",
        "augment=true",
    ];
    stopped_after(recipe, libc::SIGTERM, 1);
}

/// The penguins recipe (a CSV split by a seeded permutation, standardized
/// with its training part's statistics), stopped by SIGINT and resumed: the
/// statistics are computed again to the same bits, and so are the weights.
#[test]
fn the_penguins_recipe_stops_and_resumes_to_the_same_weights() {
    common::fetched("data/penguins/penguins.csv").unwrap();
    stopped_after(
        &["scripts/penguins.lua", "--set", "epochs=2000"],
        libc::SIGINT,
        50,
    );
}

/// The penguin mass regression (its target standardized too), stopped by
/// SIGTERM and resumed.
#[test]
fn the_penguins_mass_recipe_stops_and_resumes_to_the_same_weights() {
    common::fetched("data/penguins/penguins.csv").unwrap();
    stopped_after(
        &["scripts/penguins_mass.lua", "--set", "epochs=2000"],
        libc::SIGTERM,
        40,
    );
}

/// The two-target regression (each target standardized with its own
/// statistics), stopped by SIGINT and resumed.
#[test]
fn the_penguins_size_recipe_stops_and_resumes_to_the_same_weights() {
    common::fetched("data/penguins/penguins.csv").unwrap();
    stopped_after(
        &["scripts/penguins_size.lua", "--set", "epochs=2000"],
        libc::SIGINT,
        40,
    );
}

#[test]
fn the_shakespeare_recipe_stops_and_resumes_to_the_same_weights() {
    stopped_in_its_second_epoch(
        &[
            "scripts/shakespeare.lua",
            "--set",
            "epochs=2",
            "--set",
            "steps=60",
        ],
        libc::SIGTERM,
    );
}

#[test]
fn the_digits_cnn_recipe_stops_and_resumes_to_the_same_weights() {
    stopped_in_its_second_epoch(
        &["scripts/digits_cnn.lua", "--set", "epochs=3"],
        libc::SIGINT,
    );
}

#[test]
fn the_fashion_mnist_recipe_stops_and_resumes_to_the_same_weights() {
    common::fetched("data/fashion-mnist/t10k-labels-idx1-ubyte.gz").unwrap();
    stopped_in_its_second_epoch(
        &[
            "scripts/fashion_mnist.lua",
            "--set",
            "epochs=2",
            "--set",
            "train_samples=640",
        ],
        libc::SIGTERM,
    );
}

/// With `net = "pytorch"` (PyTorch's MNIST example net: a convolution
/// without a pool, dropout drawn each step), stopped by SIGINT.
#[test]
fn the_fashion_mnist_recipe_with_pytorchs_net_stops_and_resumes_to_the_same_weights() {
    common::fetched("data/fashion-mnist/t10k-labels-idx1-ubyte.gz").unwrap();
    stopped_in_its_second_epoch(
        &[
            "scripts/fashion_mnist.lua",
            "--set",
            "epochs=2",
            "--set",
            "train_samples=640",
            "--set",
            "net=pytorch",
        ],
        libc::SIGINT,
    );
}

/// Stopped by SIGHUP (a closed terminal) this time.
#[test]
fn the_mnist_csv_recipe_stops_and_resumes_to_the_same_weights() {
    common::fetched("data/mnist/mnist_5k.csv.gz").unwrap();
    stopped_in_its_second_epoch(
        &["scripts/mnist_csv.lua", "--set", "epochs=3"],
        libc::SIGHUP,
    );
}

/// One epoch of 40 steps over the first block of SmolLM2 (a GGUF file's
/// frozen Q4_1 weights, LoRA adapters trained, their inputs dropped out):
/// stopped after its step-10 record, resumed, the same adapters and
/// moments as a straight run.
#[test]
fn the_smollm2_qlora_recipe_stops_and_resumes_to_the_same_weights() {
    common::fetched("data/smollm2/tokenizer.json").unwrap();
    stopped_after_step_10_of_40(&[
        "scripts/smollm2_qlora.lua",
        "--set",
        "lora_dropout=0.1",
        "--set",
        "layers=1",
        "--set",
        "context=16",
        "--set",
        "steps=40",
        "--set",
        "val_windows=2",
    ]);
}

/// scripts/smollm2_chat.lua (conversations, the replies alone trained, on
/// one block of SmolLM2, batched by length), 5 epochs of 8 steps: the same.
#[test]
fn the_smollm2_chat_recipe_stops_and_resumes_to_the_same_weights() {
    common::fetched("data/smollm2/tokenizer.json").unwrap();
    stopped_after_step_10_of_40(&[
        "scripts/smollm2_chat.lua",
        "--set",
        "group=true",
        "--set",
        "layers=1",
        "--set",
        "chats=64",
        "--set",
        "epochs=5",
        "--set",
        "answers=0",
    ]);
}

/// scripts/minilm_classify.lua (MiniLM, every weight trained, on texts of a
/// CSV file batched by length, a warmup and cosine schedule), 4 epochs of
/// 10 steps: the same.
#[test]
fn the_minilm_classify_recipe_stops_and_resumes_to_the_same_weights() {
    common::fetched("data/minilm/tokenizer.json").unwrap();
    common::fetched("data/austen/test.csv").unwrap();
    stopped_after_step_10_of_40(&[
        "scripts/minilm_classify.lua",
        "--set",
        "rows=160",
        "--set",
        "test_rows=16",
        "--set",
        "context=16",
        "--set",
        "epochs=4",
    ]);
}

/// A run of 40 steps stopped by SIGTERM after its first step record (step
/// 10), resumed: the same weights as a straight run.
fn stopped_after_step_10_of_40(recipe: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let reference = weights(&straight_run(recipe, dir.path()));
    let out = dir.path().join("stopped");
    let end = stop_and_resume_when(recipe, &out, libc::SIGTERM, &[], |child: &mut Child| {
        wait_until(child, "a step record", || !records(&out, "step").is_empty())
    });
    let stopped_at = records(&out, "run")[1]["step"].as_u64().unwrap();
    assert!(
        (10..40).contains(&stopped_at),
        "{}: resumed at step {stopped_at}",
        recipe[0]
    );
    assert!(weights(&end) == reference, "{}: weights differ", recipe[0]);
}

/// Every recipe in scripts/ is stopped and resumed by a test in this
/// folder.
#[test]
fn every_shipped_recipe_has_a_resume_test() {
    let tests: String = std::fs::read_dir("tests/durable")
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    for e in std::fs::read_dir("scripts").unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".lua") {
            assert!(
                tests.contains(&format!("\"scripts/{name}\"")),
                "scripts/{name} has no stop-and-resume test in tests/durable"
            );
        }
    }
}
