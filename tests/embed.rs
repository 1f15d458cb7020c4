//! Runs `examples/embed.rs`: a Rust program that registers its own model.

#[path = "../examples/embed.rs"]
mod embed;

#[test]
fn embedded_custom_model_trains() -> anyhow::Result<()> {
    let accuracy = embed::run(true)?;
    assert!(accuracy >= 0.93, "test accuracy {accuracy}");
    Ok(())
}
