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
        driver_new_enough()?;
        libraries::others()?;
        match quietly(|| Device::new_cuda(ordinal)) {
            Ok(opened) => opened.map_err(|e| Unavailable::Broken(crate::error::candle_message(&e))),
            Err(panic) => Err(Unavailable::Broken(
                match panic.strip_prefix("Missing symbol ") {
                    Some(rest) => format!(
                        "the NVIDIA driver's library lacks {}, which this build calls: the \
                     driver is older than the CUDA this taper was built with{}; update the \
                     driver",
                        rest.split(':').next().unwrap_or(rest),
                        built_with().map_or(String::new(), |v| format!(" ({})", dotted(v)))
                    ),
                    None => format!("opening it failed: {panic}"),
                },
            )),
        }
    }

    /// The CUDA version this build was made with, as cudarc was told it
    /// (`CUDARC_CUDA_VERSION`, which `scripts/cuda-toolchain.sh` sets:
    /// 13000 for 13.0), if known.
    fn built_with() -> Option<i32> {
        option_env!("CUDARC_CUDA_VERSION")?.parse().ok()
    }

    /// `12020` as `12.2`.
    fn dotted(v: i32) -> String {
        format!("{}.{}", v / 1000, v % 1000 / 10)
    }

    /// A driver older than the CUDA the build was made with cannot run its
    /// kernels or its cuBLAS, and lacks functions cudarc calls (a panic):
    /// said before any is called, with both versions.
    fn driver_new_enough() -> Result<(), Unavailable> {
        let (Some(built), Some(driver)) = (built_with(), driver_version()) else {
            return Ok(());
        };
        if driver >= built {
            return Ok(());
        }
        Err(Unavailable::Broken(format!(
            "the NVIDIA driver supports CUDA up to {} and this taper was built with CUDA {}: \
             update the driver (`nvidia-smi` shows the CUDA version a driver supports), or \
             build taper with a CUDA toolkit the driver supports",
            dotted(driver),
            dotted(built)
        )))
    }

    /// The driver's CUDA version (`cuDriverGetVersion`: 12020 for 12.2),
    /// read from its library directly, since cudarc panics on a function
    /// the library lacks.
    #[cfg(not(feature = "nccl"))]
    fn driver_version() -> Option<i32> {
        use candle_core::cuda_backend::cudarc::get_lib_name_candidates;
        // SAFETY: the driver's library, which cudarc has loaded already.
        let lib = get_lib_name_candidates("cuda")
            .into_iter()
            .find_map(|f| unsafe { libloading::Library::new(f) }.ok())?;
        type GetVersion = unsafe extern "C" fn(*mut std::ffi::c_int) -> std::ffi::c_int;
        // SAFETY: cuDriverGetVersion's C signature, from the driver API.
        let get = unsafe { lib.get::<GetVersion>(b"cuDriverGetVersion") }.ok()?;
        let mut v: std::ffi::c_int = 0;
        // SAFETY: writes one int; 0 is CUDA_SUCCESS.
        (unsafe { get(&mut v) } == 0).then_some(v)
    }

    /// The NCCL build links the driver (no dynamic loading): its version,
    /// from the linked function.
    #[cfg(feature = "nccl")]
    fn driver_version() -> Option<i32> {
        let mut v: std::ffi::c_int = 0;
        // SAFETY: writes one int.
        let r =
            unsafe { candle_core::cuda_backend::cudarc::driver::sys::cuDriverGetVersion(&mut v) };
        (r == CUresult::CUDA_SUCCESS).then_some(v)
    }

    /// `f`'s value, or the message of its panic, with the panic not printed
    /// (cudarc panics on a function the driver's library lacks).
    fn quietly<T>(f: impl FnOnce() -> T) -> Result<T, String> {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        std::panic::set_hook(hook);
        result.map_err(|p| {
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into())
        })
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
