//! Building and running the CUDA-kernel emulation drivers of
//! `tests/emulate/` (kernels compiled with g++ against `cuda_emu.hpp`), for
//! the tests that check taper's CUDA kernels on machines without a GPU.
#![allow(dead_code)] // each test binary uses some of them

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{DType, Result, Tensor};

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Builds `tests/emulate/{name}.cpp` (which includes a kernel file).
pub fn build(name: &str) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let emulate = root().join("tests/emulate");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let o = Command::new(&compiler)
        // Kernels read tiles of half values as uint4, as CUDA code does;
        // no contraction into FMAs, as the kernels are built (--fmad=false).
        .args(["-std=c++20", "-O2", "-pthread", "-Wall", "-Werror"])
        .args(["-fno-strict-aliasing", "-ffp-contract=off"])
        // A misaligned 16-byte load works on a CPU but faults on a GPU.
        .args([
            "-fsanitize=alignment",
            "-fno-sanitize-recover=alignment",
            "-include",
        ])
        .arg(emulate.join("cuda_emu.hpp"))
        .arg("-I")
        .arg(emulate.join("include"))
        .arg("-I")
        .arg(root().join("kernels"))
        .arg(emulate.join(format!("{name}.cpp")))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(
        o.status.success(),
        "{compiler} failed on {name}.cpp:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Runs an emulation driver on `input` (written to a file, as the drivers
/// read it) and returns its output, a file of f32 values.
pub fn run_f32(exe: &Path, name: &str, input: &[u8]) -> Vec<f32> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (inp, out) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::write(&inp, input).expect("writing the input");
    let o = Command::new(exe)
        .arg(&inp)
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("running {name}: {e}"));
    assert!(
        o.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::read(&out)
        .expect("reading the output")
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

/// max |a - r| / max |r|.
pub fn rel(a: &[f32], r: &[f32]) -> f64 {
    assert_eq!(a.len(), r.len());
    let scale = r.iter().fold(1e-30f64, |m, x| m.max(x.abs() as f64));
    let diff = a
        .iter()
        .zip(r)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs() as f64));
    diff / scale
}

/// A tensor's values as f32, flat.
pub fn f32s(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()
}

/// `x` as the kernels store it: rounded to bf16 (and back) when `bf16`.
pub fn stored(x: f32, bf16: bool) -> f32 {
    if bf16 {
        half::bf16::from_f32(x).to_f32()
    } else {
        x
    }
}
