//! A CUDA build on a machine without a usable GPU: it starts (the CUDA
//! libraries are loaded when a device is opened, not when the binary starts),
//! `--device auto` trains on the CPU, and `--device cuda` is a one-line
//! error, never a panic. A driver that sees no GPU, or one that does not
//! match its kernel module, is a stand-in compiled here with gcc (a
//! `libcuda.so` with `cuInit`, `cuDeviceGetCount` and `cuGetErrorString`,
//! the calls before a device is touched).
//!
//! Needs the `cuda` feature and no GPU; `.ci/run` runs it:
//!
//!     cargo test --release --features cuda --target-dir target/cuda -p taper --test cuda_without_gpu
#![cfg(all(feature = "cuda", not(feature = "nccl")))]

use std::path::Path;
use std::process::{Command, Output};

mod common;

/// Two epochs of the digits recipe into a fresh folder, with `env` set.
fn digits(device: &str, env: &[(&str, &Path)]) -> (Output, tempfile::TempDir) {
    let out = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_taper"));
    cmd.args([
        "train",
        "scripts/digits.lua",
        "--set",
        "epochs=2",
        "--device",
        device,
    ])
    .arg("--out")
    .arg(out.path())
    .current_dir(env!("CARGO_MANIFEST_DIR"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    (cmd.output().expect("run taper"), out)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The device the run record names.
fn device_used(out: &Path) -> String {
    let runs = common::records(out, "run");
    runs[0]["device"].as_str().unwrap().to_string()
}

/// A driver's CUDA version newer than any build's.
const NEW_DRIVER: u32 = 99000;

/// A `libcuda.so` whose `cuInit` returns `code`, which counts one GPU and
/// supports CUDA `version` (12020 for 12.2), in a folder of its own.
fn stand_in_driver(code: u32, version: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("cuda.c");
    std::fs::write(
        &src,
        format!(
            "int cuInit(unsigned int flags) {{ return {code}; }}\n\
             int cuDeviceGetCount(int *n) {{ *n = 1; return 0; }}\n\
             int cuDriverGetVersion(int *v) {{ *v = {version}; return 0; }}\n\
             int cuGetErrorString(int e, const char **s) {{\n\
               *s = e == 100 ? \"no CUDA-capable device is detected\"\n\
                  : \"system has unsupported display driver / cuda driver combination\";\n\
               return 0;\n\
             }}\n"
        ),
    )
    .unwrap();
    let lib = dir.path().join("libcuda.so");
    let made = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(made.success(), "cc could not build the stand-in libcuda.so");
    dir
}

/// Whether none of `names` loads (from LD_LIBRARY_PATH or the system's folders).
fn none_loads(names: &[&str]) -> bool {
    // SAFETY: loading a CUDA library, as cudarc would.
    names
        .iter()
        .all(|name| unsafe { libloading::Library::new(name) }.is_err())
}

/// `--device auto` trains on the CPU; its stderr.
fn trains_on_the_cpu(env: &[(&str, &Path)]) -> String {
    let (o, out) = digits("auto", env);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(device_used(out.path()), "cpu");
    err
}

/// `device` is refused: exit 2, each of `says` in the message, no panic.
fn refused(device: &str, env: &[(&str, &Path)], says: &[&str]) {
    let (o, _out) = digits(device, env);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for s in says {
        assert!(err.contains(s), "{s:?} not in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn without_a_driver_auto_trains_on_the_cpu_and_cuda_is_an_error() {
    if !none_loads(&["libcuda.so", "libcuda.so.1"]) {
        eprintln!(
            "skipped: this machine has a CUDA driver (tests/cuda_kernels.rs is the GPU's test)"
        );
        return;
    }
    let err = trains_on_the_cpu(&[]);
    assert!(!err.contains("warning"), "{err}");
    refused(
        "cuda",
        &[],
        &[
            "cannot open CUDA device 0: the NVIDIA driver's library (libcuda.so.1) is not on this machine",
            "--device cpu",
        ],
    );
}

#[test]
fn a_driver_that_sees_no_gpu_means_the_cpu_quietly_under_auto() {
    // CUDA_ERROR_NO_DEVICE: a GPU node with CUDA_VISIBLE_DEVICES empty.
    let driver = stand_in_driver(100, NEW_DRIVER);
    let env = [("LD_LIBRARY_PATH", driver.path())];
    let err = trains_on_the_cpu(&env);
    assert!(!err.contains("warning"), "{err}");
    refused(
        "cuda:0",
        &env,
        &[
            "cannot open CUDA device 0: the driver sees no GPU",
            "CUDA_ERROR_NO_DEVICE",
            "CUDA_VISIBLE_DEVICES",
        ],
    );
}

#[test]
fn a_broken_driver_is_named_and_auto_still_trains_on_the_cpu() {
    // CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: the driver's library does not match
    // its kernel module (the driver was upgraded and the machine not rebooted).
    let driver = stand_in_driver(803, NEW_DRIVER);
    let env = [("LD_LIBRARY_PATH", driver.path())];
    let err = trains_on_the_cpu(&env);
    assert!(
        err.contains("warning: the CUDA driver is here but device 0 cannot be opened")
            && err.contains("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH")
            && err.contains("training on the CPU"),
        "{err}"
    );
    // Once, at the start, not per run or epoch.
    assert_eq!(
        err.matches("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH").count(),
        1,
        "{err}"
    );
    refused(
        "cuda",
        &env,
        &[
            "cannot open CUDA device 0",
            "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        ],
    );
}

#[test]
fn a_driver_without_cublas_is_named_and_auto_still_trains_on_the_cpu() {
    // The GPU machine's usual slip: the driver is there, the toolkit's
    // libraries (PyTorch's nvidia/cu13/lib) are not on LD_LIBRARY_PATH.
    if !none_loads(&["libcublas.so", "libcublas.so.13", "libcublas.so.12"]) {
        eprintln!("skipped: cuBLAS is in this machine's library folders");
        return;
    }
    let driver = stand_in_driver(0, NEW_DRIVER);
    let env = [("LD_LIBRARY_PATH", driver.path())];
    let err = trains_on_the_cpu(&env);
    assert!(
        err.contains("warning: the CUDA driver is here but device 0 cannot be opened: cuBLAS (libcublas.so.*), cuBLASLt (libcublasLt.so.*), cuRAND (libcurand.so.*) not found")
            && err.contains("LD_LIBRARY_PATH"),
        "{err}"
    );
    refused("cuda", &env, &["cannot open CUDA device 0: cuBLAS"]);
    // A GPU the driver does not have.
    refused(
        "cuda:3",
        &env,
        &["there is no GPU 3: the driver sees 1 (numbered from 0)"],
    );
}

#[test]
fn a_driver_older_than_the_build_is_named_with_both_versions() {
    // A cluster's driver 535 supports CUDA 12.2; the build's toolkit is newer.
    let Some(built) = option_env!("CUDARC_CUDA_VERSION").and_then(|v| v.parse::<u32>().ok()) else {
        eprintln!("skipped: built without CUDARC_CUDA_VERSION (scripts/cuda-toolchain.sh sets it)");
        return;
    };
    let driver = stand_in_driver(0, 12020);
    let env = [("LD_LIBRARY_PATH", driver.path())];
    let built = format!("built with CUDA {}.{}", built / 1000, built % 1000 / 10);
    let err = trains_on_the_cpu(&env);
    assert!(
        err.contains("warning: the CUDA driver is here but device 0 cannot be opened: the NVIDIA driver supports CUDA up to 12.2")
            && err.contains(&built)
            && err.contains("training on the CPU"),
        "{err}"
    );
    refused(
        "cuda",
        &env,
        &["supports CUDA up to 12.2", &built, "update the driver"],
    );
}

#[test]
fn a_driver_lacking_a_function_is_an_error_not_a_panic() {
    // The stand-in reports a new driver but has four functions: opening the
    // device calls one it lacks, where cudarc panics. cuBLAS and cuRAND come
    // from the build's toolkit (`CUDA_HOME`, as scripts/cuda-toolchain.sh
    // sets it), so that opening gets that far.
    let Some(home) = std::env::var_os("CUDA_HOME") else {
        eprintln!("skipped: no CUDA_HOME with the toolkit's libraries");
        return;
    };
    let driver = stand_in_driver(0, NEW_DRIVER);
    let path = std::path::PathBuf::from(format!(
        "{}:{}",
        driver.path().display(),
        Path::new(&home).join("lib").display()
    ));
    let env = [("LD_LIBRARY_PATH", path.as_path())];
    let err = trains_on_the_cpu(&env);
    assert!(
        err.contains("device 0 cannot be opened: the NVIDIA driver's library lacks cu")
            && err.contains("update the driver")
            && !err.contains("panicked"),
        "{err}"
    );
    refused("cuda", &env, &["the NVIDIA driver's library lacks cu"]);
}
