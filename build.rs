//! With the `cuda` feature, compiles `kernels/*.cu` to PTX (one module per
//! file) for `src/kernels/cuda.rs` to embed. nvcc at build time rather than
//! NVRTC at run time: a kernel that does not compile fails the build (CI
//! builds the feature), not a training run on a GPU machine, and the binary
//! needs no NVRTC on the machine it runs on. Without the feature this does
//! nothing, so CPU builds need no CUDA toolchain.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = match std::env::var_os("CUDA_HOME") {
        Some(home) => Path::new(&home).join("bin/nvcc"),
        None => PathBuf::from("nvcc"),
    };
    // PTX for the oldest architecture we target; the driver compiles it for
    // the GPU it finds. compute_90 is the H100/H200 (see ../shared/CUDA.md).
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let cap = cap.replace('.', "");
    for name in [
        "gelu",
        "add",
        "rows",
        "rope",
        "adamw",
        "ce",
        "attention",
        "dense",
        "embedding",
        "conv",
        "flash",
        "norm",
    ] {
        let src = format!("kernels/{name}.cu");
        let ptx = out.join(format!("{name}.ptx"));
        let status = Command::new(&nvcc)
            .args(["--ptx", "-O3", "-std=c++17", "-Ikernels"])
            // No fused multiply-add contraction: the kernels then round as
            // their CPU references do (the 8-bit AdamW matches bit for bit).
            .arg("--fmad=false")
            .arg(format!("-arch=compute_{cap}"))
            .arg(&src)
            .arg("-o")
            .arg(&ptx)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "running {} for {src}: {e}. The cuda feature needs the CUDA toolchain: \
                     eval \"$(bash scripts/cuda-toolchain.sh)\"",
                    nvcc.display()
                )
            });
        assert!(status.success(), "nvcc failed on {src}");
        assemble(&nvcc, &ptx, &cap);
    }
}

/// Assembles the PTX for the target GPU with ptxas (next to nvcc), output
/// discarded, so that what only the driver's compiler would find on the GPU
/// machine fails the build here: a kernel that declares more than 48 KiB of
/// shared memory, or too many registers. Skipped when the toolchain has no
/// ptxas.
fn assemble(nvcc: &Path, ptx: &Path, cap: &str) {
    let ptxas = nvcc.with_file_name("ptxas");
    if nvcc.parent().is_some_and(|p| !p.as_os_str().is_empty()) && !ptxas.exists() {
        return;
    }
    let o = Command::new(&ptxas)
        .arg(format!("-arch=sm_{cap}"))
        .arg(ptx)
        .args(["-o", "/dev/null"])
        .output();
    if let Ok(o) = o {
        assert!(
            o.status.success(),
            "ptxas failed on {}:\n{}",
            ptx.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}
