//! Choosing a device from `--device auto|cpu|cuda[:N]`.

use candle_core::Device;

use crate::{Error, Result};

pub fn parse_device(spec: &str) -> Result<Device> {
    match spec {
        "cpu" => Ok(Device::Cpu),
        "auto" => Ok(auto()),
        s if s == "cuda" || s.starts_with("cuda:") => {
            let ordinal = match s.strip_prefix("cuda:") {
                None => 0,
                Some(n) => n.parse::<usize>().map_err(|_| {
                    Error::Device(format!(
                        "bad device `{s}`: expected cuda:N with N a GPU index"
                    ))
                })?,
            };
            cuda(ordinal)
        }
        other => Err(Error::Device(format!(
            "unknown device `{other}`: use auto, cpu, cuda or cuda:N"
        ))),
    }
}

#[cfg(feature = "cuda")]
fn cuda(ordinal: usize) -> Result<Device> {
    Device::new_cuda(ordinal).map_err(|e| {
        Error::Device(format!(
            "cannot open CUDA device {ordinal}: {}; is the NVIDIA driver installed and a GPU visible? Use --device cpu to train on the CPU",
            crate::error::candle_message(&e)
        ))
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda(_ordinal: usize) -> Result<Device> {
    Err(Error::Device(
        "this taper was built without CUDA: rebuild with `cargo build --release --features cuda`, or use --device cpu".into(),
    ))
}

fn auto() -> Device {
    #[cfg(feature = "cuda")]
    if let Ok(d) = Device::new_cuda(0) {
        return d;
    }
    Device::Cpu
}

pub fn describe(d: &Device) -> String {
    match d {
        Device::Cpu => "cpu".to_string(),
        Device::Cuda(_) => format!("{:?}", d.location()),
        Device::Metal(_) => "metal".to_string(),
    }
}
