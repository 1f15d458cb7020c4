//! Native plugins, end to end: the example plugins (Rust and C) inside real
//! runs, every loader error with a library built to trigger it, and the C
//! header checked against the Rust ABI.
//!
//! The Rust plugins are built by `cargo build --release` into
//! `target/plugins` (their own target folder, so that the build does not
//! wait on the one running these tests); the C libraries are compiled with
//! the system C compiler.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use candle_core::Device;
use serde_json::Value;
use taper::engine::checkpoint;

mod common;
use common::records;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command) -> Output {
    let o = cmd.output().expect("start command");
    assert!(
        o.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// The built plugins: Rust cdylibs and C libraries (built once per test binary).
fn built() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let target = root().join("target/plugins");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--release", "--target-dir"])
            .arg(&target)
            .args([
                "-p",
                "taper-adaptive-batch",
                "-p",
                "taper-augment",
                "-p",
                "taper-test-panicky",
            ])
            .current_dir(root());
        run(&mut cmd);
        let out = target.join("release");
        let c = |name: &str, src: &str| {
            let file = target.join(format!("{name}.c"));
            std::fs::write(&file, src).unwrap();
            cc(&file, &out.join(format!("lib{name}.so")));
        };
        cc(
            &root().join("plugins/c-policy/policy.c"),
            &out.join("libtaper_c_policy.so"),
        );
        c("no_symbol", "int not_a_plugin(void) { return 1; }\n");
        c("future_abi", BAD_VERSION);
        c(
            "abi_v2_only",
            "const void *taper_plugin_v2(void) { return 0; }\n",
        );
        std::fs::write(out.join("libtext.so"), "not a library\n").unwrap();
        out
    })
}

fn cc(src: &Path, out: &Path) {
    cc_with(src, out, &root().join("plugins/include"));
}

/// Compiles a C plugin against the header in `include`.
fn cc_with(src: &Path, out: &Path, include: &Path) {
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    run(Command::new(compiler)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I"])
        .arg(include)
        .arg(src)
        .arg("-o")
        .arg(out));
}

/// A descriptor that claims ABI version 7.
const BAD_VERSION: &str = r#"#include "taper_plugin.h"
static const TaperDescriptor D = { .abi_version = 7, .size = sizeof(TaperDescriptor), .name = "future", .version = "9.0.0" };
const TaperDescriptor *taper_plugin_v1(void) { return &D; }
"#;

fn lib(name: &str) -> String {
    built().join(format!("lib{name}.so")).display().to_string()
}

fn taper(dir: &Path, recipe: &str, extra: &[&str]) -> (Output, PathBuf) {
    let path = dir.join("recipe.lua");
    std::fs::write(&path, recipe).unwrap();
    let out = dir.join("out");
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args([
            "train",
            path.to_str().unwrap(),
            "--quiet",
            "--out",
            out.to_str().unwrap(),
        ])
        .args(extra)
        .current_dir(root())
        .output()
        .unwrap();
    (o, out)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The `action` of each `oom` record.
fn actions(out: &Path) -> Vec<Value> {
    records(out, "oom")
        .iter()
        .map(|r| r["action"].clone())
        .collect()
}

/// The digits MLP with `{data}`, `{run}` (extra taper.run options) and a
/// closing evaluation.
fn digits(prelude: &str, map: &str, run_opts: &str, epochs: u32) -> String {
    format!(
        r#"{prelude}
local train = taper.data.digits{{ split = "train" }}:shuffle{{ seed = 1 }}:batch(32){map}
local test = taper.data.digits{{ split = "test" }}:batch(256)
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 64, hidden = {{ 128, 64 }}, outputs = 10 }},
  optim = taper.optim.adamw{{ lr = 3e-3, weight_decay = 1e-4 }},
  data = train, seed = 1, {run_opts}
}}
for epoch in run:epochs({epochs}) do
  for batch in run:batches() do run:step(batch) end
end
run:evaluate(test)
"#
    )
}

#[test]
fn augment_plugin_shifts_images_and_digits_still_reach_the_bar() {
    let dir = tempfile::tempdir().unwrap();
    let prelude = format!(
        "local shift = taper.plugin.load('{}', {{ width = 8, max_shift = 1, seed = 7, probability = 0.5 }})",
        lib("taper_augment")
    );
    let (o, out) = taper(dir.path(), &digits(&prelude, ":map(shift)", "", 30), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let acc = records(&out, "eval")[0]["accuracy"].as_f64().unwrap();
    assert!(acc >= 0.95, "accuracy {acc}");
    // The shifted batches differ from the plain ones: a run without the
    // transform ends with different weights.
    let plain = tempfile::tempdir().unwrap();
    let (o, plain_out) = taper(plain.path(), &digits("", "", "", 1), &[]);
    assert!(o.status.success());
    // A folder of its own: a fresh run does not write over another's.
    let shifted = tempfile::tempdir().unwrap();
    let (o, shifted_out) = taper(shifted.path(), &digits(&prelude, ":map(shift)", "", 1), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let w = |p: &Path| {
        let (t, _) = checkpoint::load(&p.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
        t["model.fc0.weight"]
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    assert_ne!(w(&plain_out), w(&shifted_out));
}

#[test]
fn adaptive_batch_plugin_recovers_injected_ooms_with_the_same_weights() {
    let prelude = format!(
        "local smart = taper.plugin.load('{}', {{ ceiling = 32, after = 10 }})",
        lib("taper_adaptive_batch")
    );
    let recipe = digits(&prelude, "", "on_oom = smart, schedule = smart,", 3);
    let (clean, drill) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (o, clean_out) = taper(clean.path(), &recipe, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let inject = [
        "--inject-oom",
        "step=3,phase=forward",
        "--inject-oom",
        "step=7,phase=backward,times=2",
        "--inject-oom",
        "step=50,phase=optimizer",
    ];
    let (o, drill_out) = taper(drill.path(), &recipe, &inject);
    assert!(o.status.success(), "{}", stderr(&o));
    let ooms = records(&drill_out, "oom");
    let micro: Vec<_> = ooms
        .iter()
        .map(|r| r["new_micro_batch"].as_u64().unwrap())
        .collect();
    // Halving to 4; 8 was the smallest size that failed, so after 10 clean
    // steps it grows back to 0.75 x 8 = 6, and the OOM at step 50 halves that.
    assert_eq!(micro, [16, 8, 4, 3], "{ooms:?}");
    let (a, _) = checkpoint::load(&clean_out.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    let (b, _) = checkpoint::load(&drill_out.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    for (k, t) in a.iter().filter(|(k, _)| k.starts_with("model.")) {
        let d = (t - &b[k])
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap();
        let d = d.to_scalar::<f32>().unwrap();
        assert!(d < 1e-5, "{k} differs by {d}");
    }
}

/// Runs the digits recipe with the policy plugin `so` (options `{ floor = 8 }`)
/// and `inject` (three OOMs at one step): 32 -> 16 -> 8, then 4 would be
/// under the floor, so the run stops (exit 3). Returns the output folder.
fn floor_8_policy_splits_then_stops(dir: &Path, so: &Path, inject: &str) -> (Output, PathBuf) {
    let prelude = format!(
        "local p = taper.plugin.load('{}', {{ floor = 8 }})",
        so.display()
    );
    let (o, out) = taper(
        dir,
        &digits(&prelude, "", "on_oom = p,", 1),
        &["--inject-oom", inject],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert_eq!(actions(&out), ["split", "split", "stop"]);
    (o, out)
}

#[test]
fn c_policy_built_from_the_header_alone_splits_then_stops() {
    let dir = tempfile::tempdir().unwrap();
    let so = PathBuf::from(lib("taper_c_policy"));
    let (o, out) =
        floor_8_policy_splits_then_stops(dir.path(), &so, "step=4,phase=backward,times=3");
    assert!(stderr(&o).contains("c-policy"), "{}", stderr(&o));
    assert!(out.join("checkpoint.safetensors").exists());
}

/// The ABI is append-only: a plugin compiled against the header as it was
/// before the 1.1 fields (plugins/testing/abi-1.0) loads and decides.
#[test]
fn a_plugin_built_against_the_1_0_header_still_loads_and_decides() {
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("libold_policy.so");
    cc_with(
        &root().join("plugins/c-policy/policy.c"),
        &so,
        &root().join("plugins/testing/abi-1.0"),
    );
    let (_, out) =
        floor_8_policy_splits_then_stops(dir.path(), &so, "step=4,phase=backward,times=3");
    let micro: Vec<_> = records(&out, "oom")
        .iter()
        .map(|r| r["new_micro_batch"].clone())
        .collect();
    assert_eq!(micro, [16, 8, 8]);
}

/// The same policy as a Lua function and as a C plugin (plugins/testing/
/// mirror/policy.c), over the same injected faults in every phase: the
/// same actions, in the same order, and the same final weights.
#[test]
fn a_lua_policy_and_its_c_mirror_decide_the_same() {
    const LUA: &str = r#"local function policy(ev)
  if ev.step == 13 and not ev.offload then
    return "offload"
  elseif ev.phase == "eval" then
    return { action = "split", micro_batch = math.max(ev.micro_batch // 4, 1) }
  elseif ev.phase == "upload" then
    return "retry"
  elseif ev.phase == "optimizer" and ev.precision == "f32" then
    return { action = "precision", precision = "bf16" }
  elseif ev.phase == "accumulate" then
    return "skip"
  elseif ev.micro_batch > 16 then
    return { action = "split", micro_batch = ev.micro_batch - 8 }
  elseif ev.attempt > 3 then
    return "stop"
  end
end"#;
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("libmirror.so");
    cc(&root().join("plugins/testing/mirror/policy.c"), &so);
    let faults = [
        "step=3,phase=forward,times=2",
        "step=5,phase=upload",
        "step=7,phase=backward,times=2",
        "step=9,phase=accumulate",
        "step=11,phase=optimizer",
        "step=13,phase=forward",
    ];
    let mut args = Vec::new();
    for f in &faults {
        args.extend(["--inject-oom", f]);
    }
    let both = [
        (LUA.to_string(), "on_oom = policy,"),
        (
            format!("local p = taper.plugin.load('{}')", so.display()),
            "on_oom = p,",
        ),
    ];
    let mut seen = Vec::new();
    for (i, (prelude, opt)) in both.iter().enumerate() {
        // An evaluation that meets an OOM too.
        let recipe = digits(prelude, "", opt, 1).replace(
            "run:evaluate(test)",
            "run:inject_oom{ step = run.steps + 1, phase = \"eval\", times = 2 }\nrun:evaluate(test)",
        );
        let sub = dir.path().join(format!("run{i}"));
        std::fs::create_dir_all(&sub).unwrap();
        let (o, out) = taper(&sub, &recipe, &args);
        assert!(o.status.success(), "{}", stderr(&o));
        let decided: Vec<_> = records(&out, "oom")
            .iter()
            .map(|r| {
                format!(
                    "{} {} {} {} {}",
                    r["step"], r["phase"], r["action"], r["new_micro_batch"], r["new_precision"]
                )
            })
            .collect();
        seen.push((decided, out));
    }
    assert_eq!(seen[0].0, seen[1].0);
    let expected = [
        "3 \"forward\" \"split\" 24 null",
        "3 \"forward\" \"split\" 16 null",
        "5 \"upload\" \"retry\" 16 null",
        "7 \"backward\" \"split\" 8 null",
        "7 \"backward\" \"split\" 4 null",
        "9 \"accumulate\" \"skip\" 4 null",
        "11 \"optimizer\" \"precision\" 4 \"bf16\"",
        "13 \"forward\" \"offload\" 4 null",
    ];
    assert_eq!(seen[0].0[..expected.len()], expected, "{:?}", seen[0].0);
    let evals: Vec<_> = seen[0].0[expected.len()..].to_vec();
    assert_eq!(evals.len(), 2, "{evals:?}");
    assert!(
        evals.iter().all(|e| e.contains("\"eval\" \"split\"")),
        "{evals:?}"
    );
    let (a, _) = checkpoint::load(&seen[0].1.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    let (b, _) = checkpoint::load(&seen[1].1.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    for (k, t) in &a {
        let f64 = |t: &candle_core::Tensor| {
            t.flatten_all()
                .and_then(|t| t.to_dtype(candle_core::DType::F64))
                .unwrap()
        };
        let (x, y) = (f64(t), f64(&b[k]));
        assert_eq!(
            x.to_vec1::<f64>().unwrap(),
            y.to_vec1::<f64>().unwrap(),
            "{k}"
        );
    }
}

#[test]
fn a_plugin_and_a_lua_policy_share_a_chain() {
    let prelude = format!("local p = taper.plugin.load('{}')", lib("taper_c_policy"));
    // Lua retries forward OOMs and passes the rest to the plugin.
    let chain = "on_oom = taper.policy.chain{ function(ev) if ev.phase == 'forward' then return 'retry' end end, p },";
    let dir = tempfile::tempdir().unwrap();
    let inject = [
        "--inject-oom",
        "step=3,phase=forward",
        "--inject-oom",
        "step=6,phase=backward",
    ];
    let (o, out) = taper(dir.path(), &digits(&prelude, "", chain, 1), &inject);
    assert!(o.status.success(), "{}", stderr(&o));
    let got: Vec<_> = records(&out, "oom")
        .iter()
        .map(|r| {
            (
                r["phase"].clone(),
                r["action"].clone(),
                r["new_micro_batch"].clone(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("forward".into(), "retry".into(), 32.into()),
            ("backward".into(), "split".into(), 16.into())
        ]
    );
}

/// Each loader check fails with its own message, exit code 2, no crash.
#[test]
fn every_load_error_says_which_check_failed() {
    let cases = [
        (lib("missing"), "no such file"),
        (lib("text"), "not a loadable shared library"),
        (lib("no_symbol"), "is this a taper plugin?"),
        (lib("future_abi"), "declares ABI version 7, expected 1"),
        (lib("abi_v2_only"), "built for taper plugin ABI v2"),
    ];
    for (path, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (o, _) = taper(
            dir.path(),
            &format!("\n\ntaper.plugin.load('{path}')\n"),
            &[],
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{path}: {err}");
        assert!(
            err.contains(want) && err.contains("recipe.lua:3:"),
            "{path}: {err}"
        );
    }
    // create() fails with the plugin's own message.
    let dir = tempfile::tempdir().unwrap();
    let src = format!(
        "taper.plugin.load('{}', {{ floor = 0 }})",
        lib("taper_c_policy")
    );
    let (o, _) = taper(dir.path(), &src, &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("c-policy") && err.contains("create failed: option `floor` must be"),
        "{err}"
    );
    // A plugin in a slot it does not implement.
    let prelude = format!(
        "local shift = taper.plugin.load('{}', {{ width = 8 }})",
        lib("taper_augment")
    );
    let (o, _) = taper(dir.path(), &digits(&prelude, "", "on_oom = shift,", 1), &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("augment") && err.contains("does not implement `on_oom`"),
        "{err}"
    );
}

#[test]
fn a_panic_inside_a_plugin_fails_the_run_with_a_checkpoint() {
    let prelude = format!(
        "local p = taper.plugin.load('{}')",
        lib("taper_test_panicky")
    );
    let dir = tempfile::tempdir().unwrap();
    let (o, out) = taper(
        dir.path(),
        &digits(&prelude, "", "on_oom = p,", 1),
        &["--inject-oom", "step=5,phase=forward"],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("plugin panicky") && err.contains("panicked: no policy for step 5"),
        "{err}"
    );
    let (_, meta) = checkpoint::load(&out.join("checkpoint.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(meta.step, 4);
}

#[test]
fn plugin_info_prints_name_version_abi_and_kinds() {
    let o = run(Command::new(env!("CARGO_BIN_EXE_taper")).args([
        "plugin",
        "info",
        &lib("taper_adaptive_batch"),
    ]));
    let text = String::from_utf8_lossy(&o.stdout);
    for want in [
        "name     adaptive-batch",
        "version  0.1.0",
        "ABI      1",
        "kinds    on_oom, schedule",
    ] {
        assert!(text.contains(want), "{text}");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(["plugin", "info", &lib("no_symbol")])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("is this a taper plugin?"),
        "{}",
        stderr(&o)
    );
}

/// `plugins/include/taper_plugin.h` and the Rust ABI agree on every size and
/// field offset: a C program prints them, Rust computes them.
#[test]
fn the_c_header_matches_the_rust_abi() {
    use std::mem::{offset_of, size_of};
    use taper_plugin::*;
    macro_rules! layout {
        ($($c:literal $t:ty { $($f:ident),* })*) => {{
            let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n#include \"taper_plugin.h\"\nint main(void) {\n");
            let mut rust = Vec::new();
            $(
                c += &format!("printf(\"{} %zu\\n\", sizeof({}));\n", $c, $c);
                rust.push(format!("{} {}", $c, size_of::<$t>()));
                $(
                    c += &format!("printf(\"{}.{} %zu\\n\", offsetof({}, {}));\n", $c, stringify!($f), $c, stringify!($f));
                    rust.push(format!("{}.{} {}", $c, stringify!($f), offset_of!($t, $f)));
                )*
            )*
            c += "return 0;\n}\n";
            (c, rust)
        }};
    }
    let (c, rust) = layout! {
        "TaperStr" Str { ptr, len }
        "TaperErrorBuf" ErrorBuf { ptr, cap, len }
        "TaperOomEvent" OomEvent { phase, cause, step, epoch, batch_size, micro_batch, attempt, memory_used, memory_peak, memory_limit, requested, device_used, device_free, device_total, precision, recompute, offload }
        "TaperOomAction" OomAction { action, micro_batch, precision, every }
        "TaperStepInfo" StepInfo { step, micro_batch, batch_size, clean_steps, peak, limit }
        "TaperPlan" Plan { lr, micro_batch, batch_size }
        "TaperTensorView" TensorView { data, dtype, ndim, shape }
        "TaperBatchView" BatchView { x, y, indices, size, epoch }
        "TaperDescriptor" Descriptor { abi_version, size, name, version, kinds, create, destroy, on_oom, on_step, schedule, transform }
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("layout.c"), c).unwrap();
    let exe = dir.path().join("layout");
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    run(Command::new(compiler)
        .arg("-I")
        .arg(root().join("plugins/include"))
        .arg(dir.path().join("layout.c"))
        .arg("-o")
        .arg(&exe));
    let o = run(&mut Command::new(&exe));
    let from_c: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(from_c, rust);
    // The constants the header defines, too.
    let header = std::fs::read_to_string(root().join("plugins/include/taper_plugin.h")).unwrap();
    for (name, value) in [
        ("TAPER_ABI_VERSION", format!("{ABI_VERSION}u")),
        ("TAPER_KIND_TRANSFORM", format!("{KIND_TRANSFORM}u")),
        ("TAPER_ACTION_STOP", format!("{ACTION_STOP}u")),
        ("TAPER_ACTION_PRECISION", format!("{ACTION_PRECISION}u")),
        ("TAPER_ACTION_RECOMPUTE", format!("{ACTION_RECOMPUTE}u")),
        ("TAPER_ACTION_OFFLOAD", format!("{ACTION_OFFLOAD}u")),
        ("TAPER_PRECISION_BF16", format!("{PRECISION_BF16}u")),
        ("TAPER_PHASE_EVAL", format!("{PHASE_EVAL}u")),
        ("TAPER_STATUS_PANIC", format!("{STATUS_PANIC}")),
        ("TAPER_MAX_DIMS", format!("{MAX_DIMS}")),
    ] {
        assert!(
            header.contains(&format!("#define {name} {value}")),
            "{name}"
        );
    }
}

/// `taper plugin new` writes a crate that builds into a working plugin.
#[test]
fn plugin_new_scaffolds_a_crate_that_builds_and_loads() {
    let dir = tempfile::tempdir().unwrap();
    let taper_bin = env!("CARGO_BIN_EXE_taper");
    run(Command::new(taper_bin)
        .args(["plugin", "new", "my-policy", "--dir"])
        .arg(dir.path()));
    let again = Command::new(taper_bin)
        .args(["plugin", "new", "my-policy", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2), "refuses to overwrite");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = root().join("target/plugins");
    run(Command::new(cargo)
        .args(["build", "--release", "--manifest-path"])
        .arg(dir.path().join("my-policy/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target));
    let so = target.join("release/libmy_policy.so");
    let o = run(Command::new(taper_bin).args(["plugin", "info"]).arg(&so));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("name     my-policy") && text.contains("kinds    on_oom"),
        "{text}"
    );
    // And it works as a policy.
    floor_8_policy_splits_then_stops(dir.path(), &so, "step=2,phase=forward,times=3");
}

/// Under `--watch`, a rebuilt plugin is loaded as a copy under a new file
/// name and swapped in at the next safe point; the run keeps going.
#[test]
fn a_rebuilt_plugin_is_swapped_in_by_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(root().join("plugins/c-policy/policy.c")).unwrap();
    let so = dir.path().join("libpolicy.so");
    let build = |version: &str| {
        let c = dir.path().join("policy.c");
        std::fs::write(&c, src.replace("\"0.1.0\"", &format!("\"{version}\""))).unwrap();
        let tmp = dir.path().join("libpolicy.so.new");
        cc(&c, &tmp);
        std::fs::rename(&tmp, &so).unwrap();
    };
    build("1.0.0");
    let recipe = format!(
        r#"local p = taper.plugin.load('{}')
local run = taper.run{{
  model = taper.model.mlp{{ inputs = 64, hidden = {{ 16 }}, outputs = 10 }},
  data = taper.data.digits{{ split = "train" }}:batch(64), on_oom = p,
}}
for epoch in run:epochs(3) do
  for batch in run:batches() do run:step(batch) end
  run:log{{ plugin = p.version, generation = taper.generation }}
  if epoch == 1 and taper.generation == 0 then run:reload_point{{ wait = 30 }} end
end
"#,
        so.display()
    );
    let path = dir.path().join("recipe.lua");
    std::fs::write(&path, recipe).unwrap();
    let out = dir.path().join("out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args([
            "train",
            path.to_str().unwrap(),
            "--watch",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
        ])
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while records(&out, "log").is_empty() {
        assert!(start.elapsed().as_secs() < 60, "no epoch 1");
        assert!(child.try_wait().unwrap().is_none(), "taper ended early");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    build("2.0.0");
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed().as_secs() < 60, "taper did not finish");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success());
    let versions: Vec<_> = records(&out, "log")
        .iter()
        .map(|r| r["plugin"].clone())
        .collect();
    assert_eq!(versions, ["1.0.0", "2.0.0", "2.0.0"]);
    let reload = &records(&out, "reload")[0];
    assert_eq!(reload["ok"], true, "{reload}");
    assert!(
        reload["files"][0]
            .as_str()
            .unwrap()
            .ends_with("libpolicy.so"),
        "{reload}"
    );
}
