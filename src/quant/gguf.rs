//! Export to GGUF with post-training quantization. Weight matrices (rank 2
//! or more, rows a multiple of the 32-value block) are stored in the chosen
//! type; biases and other small tensors stay f32, as llama.cpp keeps its
//! norms. The file is written next to its destination and renamed into
//! place, so a reader never sees half of it.

use std::io::BufWriter;
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Tensor};

use crate::{Error, Result};

/// The type weight matrices are stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    F32,
    F16,
    Q8_0,
    Q4_0,
    Q4_1,
}

impl ExportFormat {
    pub const NAMES: &'static str = "f32, f16, q8_0, q4_0, q4_1";

    pub fn name(self) -> &'static str {
        match self {
            ExportFormat::F32 => "f32",
            ExportFormat::F16 => "f16",
            ExportFormat::Q8_0 => "q8_0",
            ExportFormat::Q4_0 => "q4_0",
            ExportFormat::Q4_1 => "q4_1",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "f32" => ExportFormat::F32,
            "f16" => ExportFormat::F16,
            "q8_0" => ExportFormat::Q8_0,
            "q4_0" => ExportFormat::Q4_0,
            "q4_1" => ExportFormat::Q4_1,
            _ => return None,
        })
    }

    pub(crate) fn ggml(self) -> GgmlDType {
        match self {
            ExportFormat::F32 => GgmlDType::F32,
            ExportFormat::F16 => GgmlDType::F16,
            ExportFormat::Q8_0 => GgmlDType::Q8_0,
            ExportFormat::Q4_0 => GgmlDType::Q4_0,
            ExportFormat::Q4_1 => GgmlDType::Q4_1,
        }
    }
}

/// What an export wrote.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExportSummary {
    /// Tensors stored in the chosen type, and those kept in f32.
    pub quantized: usize,
    pub kept_f32: usize,
    pub bytes: u64,
    /// The weights' size in f32, for the compression ratio.
    pub f32_bytes: u64,
}

/// Writes `tensors` (name, f32 weights) to a GGUF file at `path`, with
/// `metadata` as key-value pairs (`general.architecture` first).
pub fn export_gguf(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: &[(String, gguf_file::Value)],
    format: ExportFormat,
) -> Result<ExportSummary> {
    let dtype = format.ggml();
    let mut qs = Vec::with_capacity(tensors.len());
    let (mut quantized, mut kept_f32, mut f32_bytes) = (0, 0, 0u64);
    for (name, t) in tensors {
        let t = t
            .to_dtype(DType::F32)?
            .to_device(&candle_core::Device::Cpu)?;
        f32_bytes += 4 * t.elem_count() as u64;
        let rows_fit = t.dims().last().is_some_and(|d| d % dtype.block_size() == 0);
        let q = if t.rank() >= 2 && rows_fit {
            quantized += 1;
            QTensor::quantize(&t, dtype)?
        } else {
            kept_f32 += 1;
            QTensor::quantize(&t, GgmlDType::F32)?
        };
        qs.push((name.as_str(), q));
    }
    let meta: Vec<(&str, &gguf_file::Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let refs: Vec<(&str, &QTensor)> = qs.iter().map(|(k, q)| (*k, q)).collect();

    let tmp = path.with_extension("gguf.tmp");
    let io = |e: std::io::Error| Error::Config(format!("export {}: {e}", path.display()));
    {
        let file = std::fs::File::create(&tmp).map_err(io)?;
        let mut w = BufWriter::new(file);
        gguf_file::write(&mut w, &meta, &refs)?;
        let file = w.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)?;
    let bytes = std::fs::metadata(path).map_err(io)?.len();
    Ok(ExportSummary {
        quantized,
        kept_f32,
        bytes,
        f32_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Reads the file back with candle's GGUF reader and checks every
    /// value against the documented error of its type.
    #[test]
    fn round_trips_within_each_types_error() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Config(e.to_string()))?;
        let dev = Device::Cpu;
        let w: Vec<f32> = (0..64 * 96)
            .map(|i| ((i as f32) * 0.37).sin() * (1.0 + (i % 13) as f32))
            .collect();
        let w = Tensor::from_vec(w, (64, 96), &dev)?;
        let b = Tensor::new(&[0.5f32, -1.25, 3.0], &dev)?;
        let tensors = vec![
            ("fc.weight".to_string(), w.clone()),
            ("fc.bias".to_string(), b.clone()),
        ];
        let meta = vec![(
            "general.architecture".to_string(),
            gguf_file::Value::String("taper-test".into()),
        )];
        // Per block of 32 values with maximum |x| = a: Q8_0 stores x / d
        // rounded with d = a / 127, so the error is at most d / 2; Q4_0 uses
        // d = a / 8 (16 levels), error at most d / 2 except at the clipped
        // end, where it is at most d. The scale d itself is stored in f16.
        // f16 weights: relative 2^-11.
        for (fmt, bound) in [
            (ExportFormat::Q8_0, 1.0 / 127.0 / 2.0),
            (ExportFormat::Q4_0, 1.0 / 8.0),
            (ExportFormat::F16, 0.0),
        ] {
            let path = dir.path().join("m.gguf");
            let s = export_gguf(&path, &tensors, &meta, fmt)?;
            assert_eq!((s.quantized, s.kept_f32), (1, 1));
            let mut f = std::fs::File::open(&path).map_err(|e| Error::Config(e.to_string()))?;
            let content = gguf_file::Content::read(&mut f)?;
            assert_eq!(
                content.metadata["general.architecture"].to_string()?,
                "taper-test"
            );
            let back = content.tensor(&mut f, "fc.weight", &dev)?;
            assert_eq!(back.dtype(), fmt.ggml());
            assert_eq!(back.shape().dims(), &[64, 96]);
            let got: Vec<f32> = back.dequantize(&dev)?.flatten_all()?.to_vec1()?;
            let want: Vec<f32> = w.flatten_all()?.to_vec1()?;
            for (blk, (g, x)) in got.chunks(32).zip(want.chunks(32)).enumerate() {
                let a = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (gi, xi) in g.iter().zip(x) {
                    let tol = if fmt == ExportFormat::F16 {
                        xi.abs() * 4.9e-4
                    } else {
                        // Plus the f16 rounding of the block's scale.
                        a * bound * 1.01 + xi.abs() * 1e-3
                    };
                    assert!(
                        (gi - xi).abs() <= tol + 1e-6,
                        "{fmt:?} block {blk}: {gi} vs {xi}"
                    );
                }
            }
            let bias: Vec<f32> = content
                .tensor(&mut f, "fc.bias", &dev)?
                .dequantize(&dev)?
                .to_vec1()?;
            assert_eq!(bias, [0.5, -1.25, 3.0]);
            assert!(!path.with_extension("gguf.tmp").exists());
        }
        Ok(())
    }
}
