//! Runs the examples: `examples/embed.rs`, a Rust program that registers its
//! own model, and `examples/run_core.rs`, the run core driven without Lua.

#[path = "../examples/embed.rs"]
mod embed;

#[test]
fn embedded_custom_model_trains() -> anyhow::Result<()> {
    let accuracy = embed::run(true)?;
    assert!(accuracy >= 0.93, "test accuracy {accuracy}");
    Ok(())
}

#[path = "../examples/run_core.rs"]
mod run_core;

/// The run core with no Lua: OOMs injected in backward and in evaluation
/// are recovered by the built-in policy, and the run reaches the same bar.
#[test]
fn the_run_core_trains_through_injected_ooms_without_lua() -> anyhow::Result<()> {
    let (plain, none, steps) = run_core::train(10, Vec::new(), true)?;
    let (recovered, events, steps_after) = run_core::train(10, run_core::faults(10), true)?;
    assert_eq!(none, 0);
    assert_eq!(events, 3, "two in backward, one in evaluation");
    assert_eq!(steps, 450);
    assert_eq!(steps_after, steps, "no batch was lost");
    assert!(plain >= 0.93, "{plain}");
    assert!((recovered - plain).abs() <= 0.01, "{recovered} vs {plain}");
    Ok(())
}
