//! Quantization passes over a trained model. Today: post-training
//! quantization and export to GGUF (`run:export{}`), the format llama.cpp
//! and its tools read.

mod gguf;

pub use gguf::{export_gguf, ExportFormat, ExportSummary};
