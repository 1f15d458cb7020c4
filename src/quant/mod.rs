//! Quantization passes: post-training quantization and export to GGUF
//! (`run:export{}`), the format llama.cpp and its tools read, and frozen
//! quantized layers with low-rank adapters (QLoRA).

mod dequant;
mod device_copies;
mod gguf;
pub mod llama;
mod llama_attention;
mod llama_net;
pub mod lora;
mod tiled;

pub use gguf::{export_gguf, ExportFormat, ExportSummary};
pub use llama::LlamaGguf;
