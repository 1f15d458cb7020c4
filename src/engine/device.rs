//! Choosing a device from `--device auto|cpu|cuda[:N]`.
//!
//! A CUDA build loads the CUDA libraries when a device is first opened (cudarc's
//! dynamic loading; `vendor/README.md`), so the same binary starts and trains
//! on a machine without the driver. `auto` then takes the CPU quietly where
//! there is no driver or no GPU, and says why where there is a driver and the
//! GPU still cannot be opened.

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
    open::cuda(ordinal).map_err(|why| {
        Error::Device(format!(
            "cannot open CUDA device {ordinal}: {}. Use --device cpu to train on the CPU",
            why.message()
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
    match open::cuda(0) {
        Ok(d) => return d,
        Err(open::Unavailable::Broken(why)) => crate::tell!(
            "taper: warning: the CUDA driver is here but device 0 cannot be opened: {why}; \
             training on the CPU (--device cuda makes this an error)"
        ),
        Err(_) => {}
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

#[cfg(feature = "cuda")]
mod open {
    use candle_core::cuda_backend::cudarc::driver::{result as driver, sys::CUresult};
    use candle_core::Device;

    /// Why a CUDA device did not open.
    pub enum Unavailable {
        /// No driver library on this machine: nothing to say under `auto`.
        /// (The NCCL build does not start without one.)
        #[cfg_attr(feature = "nccl", allow(dead_code))]
        NoDriver,
        /// The driver found no GPU (none installed, or none visible through
        /// `CUDA_VISIBLE_DEVICES`), or not the one asked for.
        NoDevice(String),
        /// A driver, but the device still cannot be used: a library missing,
        /// a driver that does not match its kernel module, a failure opening it.
        Broken(String),
    }

    impl Unavailable {
        pub fn message(&self) -> String {
            match self {
                Unavailable::NoDriver => {
                    "the NVIDIA driver's library (libcuda.so.1) is not on this machine".into()
                }
                Unavailable::NoDevice(s) | Unavailable::Broken(s) => s.clone(),
            }
        }
    }

    /// The driver first (is there one, does it see a GPU, this one), then
    /// the libraries a device needs, then the device.
    pub fn cuda(ordinal: usize) -> Result<Device, Unavailable> {
        libraries::driver()?;
        let count = driver::init()
            .and_then(|()| driver::device::get_count())
            .map_err(|e| match e.0 {
                CUresult::CUDA_ERROR_NO_DEVICE => Unavailable::NoDevice(format!(
                    "the driver sees no GPU ({e}; is CUDA_VISIBLE_DEVICES empty?)"
                )),
                _ => Unavailable::Broken(format!("the driver says {e}")),
            })?;
        if ordinal >= count as usize {
            return Err(Unavailable::NoDevice(format!(
                "there is no GPU {ordinal}: the driver sees {count} (numbered from 0)"
            )));
        }
        libraries::others()?;
        Device::new_cuda(ordinal).map_err(|e| Unavailable::Broken(crate::error::candle_message(&e)))
    }

    /// The libraries that opening a device loads, checked first: cudarc
    /// panics on a library it cannot load.
    #[cfg(not(feature = "nccl"))]
    mod libraries {
        use super::Unavailable;
        use candle_core::cuda_backend::cudarc::get_lib_name_candidates;

        /// cudarc's names, and the ones for messages.
        const NEEDED: [(&str, &str); 3] = [
            ("cublas", "cuBLAS"),
            ("cublasLt", "cuBLASLt"),
            ("curand", "cuRAND"),
        ];

        pub fn driver() -> Result<(), Unavailable> {
            match present("cuda") {
                true => Ok(()),
                false => Err(Unavailable::NoDriver),
            }
        }

        pub fn others() -> Result<(), Unavailable> {
            let missing: Vec<String> = NEEDED
                .iter()
                .filter(|(name, _)| !present(name))
                .map(|(name, shown_as)| format!("{shown_as} (lib{name}.so.*)"))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            Err(Unavailable::Broken(format!(
                "{} not found in LD_LIBRARY_PATH or the system's library folders; \
                 they come with the CUDA toolkit, or with PyTorch's nvidia-* wheels \
                 (point LD_LIBRARY_PATH at their lib folder)",
                missing.join(", ")
            )))
        }

        fn present(name: &str) -> bool {
            get_lib_name_candidates(name)
                .iter()
                // SAFETY: loading runs the library's initializers; these are
                // the CUDA libraries cudarc itself would load next.
                .any(|file| unsafe { libloading::Library::new(file) }.is_ok())
        }
    }

    /// The NCCL build links the CUDA libraries (libnccl.so.2 is not a name
    /// cudarc loads), so it does not start without them: nothing to check.
    #[cfg(feature = "nccl")]
    mod libraries {
        pub fn driver() -> Result<(), super::Unavailable> {
            Ok(())
        }
        pub fn others() -> Result<(), super::Unavailable> {
            Ok(())
        }
    }
}
