//! The CUDA backend's foundations: probing a GPU without ever panicking, compiling the kernel
//! sources with NVRTC, loading them and launching them. The model's forward pass on the GPU,
//! built from these, is the model crate's (model/src/cuda.rs).
//!
//! Everything is loaded at run time (cudarc's `dynamic-loading`, CUDA 13.0 bindings: driver 580
//! or newer): `libcuda.so.1` from the NVIDIA driver, `libnvrtc.so.13` and `libcublas.so.13` from
//! a CUDA 13 toolkit or pip's `nvidia-cuda-nvrtc` / `nvidia-cublas` wheels, found through
//! `LD_LIBRARY_PATH` or the loader's cache. cudarc panics when it calls into a library it
//! cannot load, so every entry point here checks for the library first and answers a
//! [`CudaError`] instead.
//!
//! Without the `cuda` feature the module keeps its sources and types, and every probe or
//! compile answers [`CudaError::NotBuilt`].
//!
//! What has run where: the sources compile with NVRTC 13.0 for compute_80 and compute_90 (a
//! test, on a machine with no GPU); the probe's no-driver path runs in the tests. The probe,
//! loading the modules, every launch and the GEMMs run in the tests on a CPU emulator of the
//! driver and cuBLAS (kernels/tests/emu: the same sources built as C++), checked against the
//! CPU kernels; none has yet run on a GPU.

mod attn_index;
#[cfg(feature = "cuda")]
mod compile;
#[cfg(feature = "cuda")]
mod launch;
#[cfg(feature = "cuda")]
mod probe;
mod source;

pub use attn_index::AttnIndex;
#[cfg(feature = "cuda")]
pub use compile::{arch_for, compile_all, compile_source, nvrtc_version, CompiledSource, ARCHS};
/// The cudarc this backend was built with, so callers name its types (`CudaSlice`,
/// `CudaContext`) at the same version.
#[cfg(feature = "cuda")]
pub use cudarc;
#[cfg(feature = "cuda")]
pub use launch::{AttnBatch, CudaKernels, DeviceIn, DeviceOut, Storage};
#[cfg(feature = "cuda")]
pub use probe::{check_library, driver_error, probe, quietly};
pub use source::{
    CudaDtype, KernelSource, ATTN_MAX_HEAD_DIM, ATTN_THREADS, PRELUDE, RMSNORM_THREADS, SOURCES,
};

/// A GPU as the probe found it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    pub ordinal: u32,
    /// Devices visible to this process (after `CUDA_VISIBLE_DEVICES`).
    pub device_count: u32,
    pub name: String,
    /// Compute capability `(major, minor)`.
    pub compute_capability: (i32, i32),
    pub total_bytes: u64,
    pub free_bytes: u64,
}

/// The CUDA libraries the backend loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaLibrary {
    Driver,
    Nvrtc,
    Cublas,
}

impl CudaLibrary {
    /// The file the loader is asked for first on Linux (cudarc also tries unversioned and
    /// older names).
    pub fn file(self) -> &'static str {
        match self {
            CudaLibrary::Driver => "libcuda.so.1",
            CudaLibrary::Nvrtc => "libnvrtc.so.13",
            CudaLibrary::Cublas => "libcublas.so.13",
        }
    }

    /// What the library is, and where it comes from.
    fn what(self) -> &'static str {
        match self {
            CudaLibrary::Driver => "no CUDA driver",
            CudaLibrary::Nvrtc => "no CUDA 13 NVRTC",
            CudaLibrary::Cublas => "no CUDA 13 cuBLAS",
        }
    }

    fn hint(self) -> &'static str {
        match self {
            CudaLibrary::Driver => {
                "install the NVIDIA driver (580 or newer), or put the directory holding it on \
                 LD_LIBRARY_PATH"
            }
            CudaLibrary::Nvrtc => {
                "put a CUDA 13.0 toolkit's lib64 or pip's nvidia-cuda-nvrtc==13.0.* \
                 (nvidia/cu13/lib) on LD_LIBRARY_PATH"
            }
            CudaLibrary::Cublas => {
                "put a CUDA 13.0 toolkit's lib64 or pip's nvidia-cublas==13.0.* \
                 (nvidia/cu13/lib) on LD_LIBRARY_PATH"
            }
        }
    }
}

/// Why the CUDA backend cannot be used; each says what to do, on one line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CudaError {
    #[error("this dpserve was built without CUDA support (the kernels crate's `cuda` feature)")]
    NotBuilt,
    #[error("{} ({} not found; {})", .0.what(), .0.file(), .0.hint())]
    LibraryMissing(CudaLibrary),
    #[error("no CUDA device is visible ({visible})")]
    NoDevice { visible: String },
    #[error("there is no GPU {ordinal}: {count} visible ({visible})")]
    OrdinalOutOfRange {
        ordinal: u32,
        count: u32,
        visible: String,
    },
    #[error(
        "compute capability {}.{} is too old: the kernels need 8.0 (Ampere) or newer",
        .0 .0,
        .0 .1
    )]
    UnsupportedArch((i32, i32)),
    #[error("CUDA driver call {op} failed: {code} ({text})")]
    Driver {
        op: &'static str,
        code: String,
        text: String,
    },
    /// cudarc panicked inside (caught): typically a symbol the library lacks.
    #[error("the CUDA library failed in {op}: {message} (a library older than CUDA 13.0?)")]
    Panicked { op: &'static str, message: String },
    /// The log is NVRTC's, possibly several lines.
    #[error("NVRTC could not compile {source_name}.cu for {arch}: {log}")]
    Compile {
        source_name: &'static str,
        arch: &'static str,
        log: String,
    },
    #[error("cuBLAS call {op} failed: {text}")]
    Blas { op: &'static str, text: String },
    /// A launch whose arguments do not fit the kernel (a caller bug, reported, not a panic).
    #[error("{kernel}: {why}")]
    Shape { kernel: &'static str, why: String },
}

/// `Result` with [`CudaError`].
pub type Result<T> = std::result::Result<T, CudaError>;

/// `CUDA_VISIBLE_DEVICES` as the messages quote it.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn visible_devices() -> String {
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) => format!("CUDA_VISIBLE_DEVICES={v}"),
        Err(_) => "CUDA_VISIBLE_DEVICES unset".to_string(),
    }
}

/// [`probe`] without the `cuda` feature: always [`CudaError::NotBuilt`].
#[cfg(not(feature = "cuda"))]
pub fn probe(_ordinal: u32) -> Result<DeviceInfo> {
    Err(CudaError::NotBuilt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_as_one_line_that_says_what_to_do() {
        let errors = [
            CudaError::NotBuilt,
            CudaError::LibraryMissing(CudaLibrary::Driver),
            CudaError::LibraryMissing(CudaLibrary::Nvrtc),
            CudaError::LibraryMissing(CudaLibrary::Cublas),
            CudaError::NoDevice {
                visible: "CUDA_VISIBLE_DEVICES=".into(),
            },
            CudaError::OrdinalOutOfRange {
                ordinal: 3,
                count: 1,
                visible: "CUDA_VISIBLE_DEVICES unset".into(),
            },
            CudaError::UnsupportedArch((7, 5)),
        ];
        for e in errors {
            let text = e.to_string();
            assert!(!text.contains('\n'), "{text}");
            assert!(text.len() > 20, "{text}");
        }
        assert_eq!(
            CudaError::LibraryMissing(CudaLibrary::Driver).to_string(),
            "no CUDA driver (libcuda.so.1 not found; install the NVIDIA driver (580 or newer), \
             or put the directory holding it on LD_LIBRARY_PATH)"
        );
        assert_eq!(
            CudaError::UnsupportedArch((7, 5)).to_string(),
            "compute capability 7.5 is too old: the kernels need 8.0 (Ampere) or newer"
        );
    }
}
