//! Choosing the device, and making CUDA available when it is asked for.
//!
//! PyPI's libtorch splits CUDA support into `libtorch_cuda.so`. Our binaries link with `--as-needed`, and no
//! symbol of that library is referenced directly, so the linker drops it and libtorch then reports no CUDA
//! device even on a GPU machine. Loading the library at run time (globally, so its static initialisers register
//! the CUDA hooks with libtorch) restores it. It is loaded only when CUDA is asked for: on a CPU-only machine
//! its dependencies (cuBLAS, cuDNN, ...) are usually absent, and a CPU run must not depend on them.

use std::ffi::CString;
use std::sync::OnceLock;

use tch::Device;

use crate::error::{ModelError, Result};

/// Which device a config or flag asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceRequest {
    /// CUDA device 0 when CUDA can be loaded and sees a device, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// A CUDA device; an error when none is usable.
    Cuda(usize),
}

impl DeviceRequest {
    /// Parses `auto`, `cpu`, `cuda` or `cuda:N`.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "auto" => Ok(DeviceRequest::Auto),
            "cpu" => Ok(DeviceRequest::Cpu),
            "cuda" => Ok(DeviceRequest::Cuda(0)),
            other => {
                other.strip_prefix("cuda:").and_then(|n| n.parse().ok()).map(DeviceRequest::Cuda).ok_or_else(|| {
                    ModelError::InvalidInput(format!("unknown device `{other}` (auto, cpu, cuda, cuda:N)"))
                })
            }
        }
    }
}

/// Resolves a request to a device, loading libtorch's CUDA library first when CUDA may be used.
pub fn select_device(request: DeviceRequest) -> Result<Device> {
    match request {
        DeviceRequest::Cpu => Ok(Device::Cpu),
        DeviceRequest::Auto => Ok(match cuda_devices() {
            Ok(count) if count > 0 => Device::Cuda(0),
            _ => Device::Cpu,
        }),
        DeviceRequest::Cuda(index) => {
            let count = cuda_devices()?;
            if index < count {
                Ok(Device::Cuda(index))
            } else {
                Err(ModelError::InvalidInput(format!(
                    "cuda:{index} requested but libtorch sees {count} CUDA device(s)"
                )))
            }
        }
    }
}

/// Whether bf16 compute is fast on `device`, so mixed precision should be the default there: CUDA devices, and
/// x86 CPUs with AVX512-BF16 or AMX-BF16 (where libtorch's oneDNN bf16 matmul runs several times faster than
/// fp32). Elsewhere bf16 on the CPU is emulated and slower than fp32.
pub fn fast_bf16(device: Device) -> bool {
    match device {
        Device::Cpu => cpu_has_bf16(),
        _ => true,
    }
}

#[cfg(target_arch = "x86_64")]
fn cpu_has_bf16() -> bool {
    // Every CPU with AMX-BF16 (Sapphire Rapids and later) also has AVX512-BF16, so one check covers both.
    std::arch::is_x86_feature_detected!("avx512bf16")
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_has_bf16() -> bool {
    false
}

/// Loads `libtorch_cuda.so` once and returns the number of CUDA devices libtorch sees.
pub fn cuda_devices() -> Result<usize> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED.get_or_init(load_libtorch_cuda).clone().map_err(ModelError::InvalidInput)?;
    Ok(usize::try_from(tch::Cuda::device_count()).unwrap_or(0))
}

fn load_libtorch_cuda() -> std::result::Result<(), String> {
    let name = CString::new("libtorch_cuda.so").map_err(|e| e.to_string())?;
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call; dlopen has no other preconditions.
    // The handle is deliberately never closed: libtorch keeps pointers into the library for the process's life.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if !handle.is_null() {
        return Ok(());
    }
    // SAFETY: dlerror returns either null or a NUL-terminated string owned by the loader, read before any other
    // dl* call on this thread.
    let reason = unsafe {
        let message = libc::dlerror();
        if message.is_null() {
            "unknown dlopen error".to_owned()
        } else {
            std::ffi::CStr::from_ptr(message).to_string_lossy().into_owned()
        }
    };
    Err(format!("CUDA is not usable: cannot load libtorch_cuda.so ({reason})"))
}

/// Makes the calling thread run libtorch ops single-threaded, and returns the intra-op thread count it had, for
/// a caller that hands the heavy work to another thread (the generation engine's) with that many threads.
///
/// Why: libgomp counts the threads of every OpenMP pool in the process, and once they outnumber the CPUs it
/// stops spinning between parallel regions, so every region wakes its workers through the kernel. A decode step
/// runs ~150 regions; measured on SmolLM2 with 2 cores, a second pool on the loading thread cost a quarter of
/// decode throughput. Call it before this thread's first parallel libtorch op, or its pool already exists.
pub fn hand_over_threads() -> usize {
    let threads = usize::try_from(tch::get_num_threads()).unwrap_or(1).max(1);
    tch::set_num_threads(1);
    threads
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_names() {
        assert_eq!(DeviceRequest::parse("auto").unwrap(), DeviceRequest::Auto);
        assert_eq!(DeviceRequest::parse("cpu").unwrap(), DeviceRequest::Cpu);
        assert_eq!(DeviceRequest::parse("cuda").unwrap(), DeviceRequest::Cuda(0));
        assert_eq!(DeviceRequest::parse("cuda:3").unwrap(), DeviceRequest::Cuda(3));
        let error = DeviceRequest::parse("gpu").unwrap_err().to_string();
        assert!(error.contains("unknown device `gpu`"), "{error}");
    }

    #[test]
    fn auto_agrees_with_what_cuda_reports() {
        let device = select_device(DeviceRequest::Auto).unwrap();
        match cuda_devices() {
            Ok(count) if count > 0 => assert_eq!(device, Device::Cuda(0)),
            _ => {
                assert_eq!(device, Device::Cpu);
                let error = select_device(DeviceRequest::Cuda(0)).unwrap_err().to_string();
                assert!(error.contains("CUDA") || error.contains("cuda:0"), "{error}");
            }
        }
        assert_eq!(select_device(DeviceRequest::Cpu).unwrap(), Device::Cpu);
    }
}
