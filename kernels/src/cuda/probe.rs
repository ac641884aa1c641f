//! Finding a GPU without panicking: each library is looked for before cudarc's first call into
//! it (cudarc panics on a library it cannot load, and on a symbol the library lacks), and the
//! driver calls themselves run under a silenced `catch_unwind`, so an old driver missing a
//! symbol is an error too.

use std::panic::{self, AssertUnwindSafe};

use cudarc::driver::{result::DriverError, CudaContext};

use super::{visible_devices, CudaError, CudaLibrary, DeviceInfo, Result};

/// Whether `lib` can be loaded; [`CudaError::LibraryMissing`] if not.
pub fn check_library(lib: CudaLibrary) -> Result<()> {
    // SAFETY: `is_culib_present` only tries `dlopen` on cudarc's candidate names and closes
    // what it opened; loading the CUDA libraries runs no code of ours.
    let present = unsafe {
        match lib {
            CudaLibrary::Driver => cudarc::driver::sys::is_culib_present(),
            CudaLibrary::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
            CudaLibrary::Cublas => cudarc::cublas::sys::is_culib_present(),
        }
    };
    match present {
        true => Ok(()),
        false => Err(CudaError::LibraryMissing(lib)),
    }
}

/// GPU `ordinal` (after `CUDA_VISIBLE_DEVICES`) as the driver reports it, once the driver,
/// NVRTC and cuBLAS are all loadable; the first thing missing otherwise. Never panics.
pub fn probe(ordinal: u32) -> Result<DeviceInfo> {
    check_library(CudaLibrary::Driver)?;
    let count = quietly("cuInit", CudaContext::device_count)?;
    let count = match count {
        Ok(n) => n.max(0) as u32,
        Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE => 0,
        Err(e) => return Err(driver_error("cuDeviceGetCount", e)),
    };
    if count == 0 {
        return Err(CudaError::NoDevice {
            visible: visible_devices(),
        });
    }
    if ordinal >= count {
        return Err(CudaError::OrdinalOutOfRange {
            ordinal,
            count,
            visible: visible_devices(),
        });
    }
    let info = quietly("CudaContext::new", || {
        let ctx = CudaContext::new(ordinal as usize).map_err(|e| ("CudaContext::new", e))?;
        let name = ctx.name().map_err(|e| ("cuDeviceGetName", e))?;
        let cc = ctx
            .compute_capability()
            .map_err(|e| ("cuDeviceGetAttribute", e))?;
        let (free, total) = ctx.mem_get_info().map_err(|e| ("cuMemGetInfo", e))?;
        Ok::<_, (&'static str, DriverError)>(DeviceInfo {
            ordinal,
            device_count: count,
            name,
            compute_capability: cc,
            total_bytes: total as u64,
            free_bytes: free as u64,
        })
    })?
    .map_err(|(op, e)| driver_error(op, e))?;
    check_library(CudaLibrary::Nvrtc)?;
    check_library(CudaLibrary::Cublas)?;
    Ok(info)
}

/// A driver error as [`CudaError::Driver`]: its code and the driver's own words.
pub fn driver_error(op: &'static str, e: DriverError) -> CudaError {
    CudaError::Driver {
        op,
        code: format!("{:?}", e.0),
        text: e
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "no description".to_string()),
    }
}

/// `f`, with a panic inside cudarc turned into [`CudaError::Panicked`] and the panic hook
/// silenced meanwhile (the message goes into the error, not onto stderr). The hook is
/// process-wide: call this at start-up, not while other threads may panic.
pub fn quietly<T>(op: &'static str, f: impl FnOnce() -> T) -> Result<T> {
    let hook = panic::take_hook();
    panic::set_hook(Box::new(|_| {}));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    panic::set_hook(hook);
    result.map_err(|payload| CudaError::Panicked {
        op,
        message: payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "no message".to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_the_probe_says_so_and_does_not_panic() {
        if check_library(CudaLibrary::Driver).is_ok() {
            eprintln!("skipping: a CUDA driver is loadable here");
            return;
        }
        for ordinal in [0, 7] {
            assert_eq!(
                probe(ordinal),
                Err(CudaError::LibraryMissing(CudaLibrary::Driver))
            );
        }
    }

    #[test]
    fn a_panic_inside_becomes_an_error() {
        let e = quietly("test", || panic!("Missing symbol cuFoo")).unwrap_err();
        assert_eq!(
            e,
            CudaError::Panicked {
                op: "test",
                message: "Missing symbol cuFoo".into()
            }
        );
        assert_eq!(quietly("test", || 5), Ok(5));
    }
}
