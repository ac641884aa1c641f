//! Compiling the kernel sources to PTX with NVRTC, once per process at start. The options are
//! part of the numeric contract: no fused multiply-add contraction (`--fmad=false`), IEEE
//! division and square root, no flush-to-zero, so each kernel performs the operations its
//! source writes, as the CPU path does.

use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};

use super::probe::quietly;
use super::{check_library, CudaError, CudaLibrary, KernelSource, Result, SOURCES};

/// The virtual architectures the sources are checked for: Ampere (A100) and Hopper
/// (H100/H200). PTX for one runs, JIT-compiled by the driver, on every newer GPU.
pub const ARCHS: [&str; 2] = ["compute_80", "compute_90"];

/// One compiled program.
#[derive(Debug)]
pub struct CompiledSource {
    pub source: &'static KernelSource,
    pub arch: &'static str,
    pub ptx: Ptx,
}

/// The architecture to compile for on a GPU of compute capability `cc`: its own where NVRTC
/// 13.0 names it for these kernels, else the newest listed below it (PTX runs forward).
pub fn arch_for(cc: (i32, i32)) -> Result<&'static str> {
    Ok(match cc {
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (8, _) => "compute_80",
        (9, 0) => "compute_90",
        (major, _) if major >= 9 => "compute_90",
        _ => return Err(CudaError::UnsupportedArch(cc)),
    })
}

/// NVRTC's `(major, minor)` version.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    check_library(CudaLibrary::Nvrtc)?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is loadable (checked above); nvrtcVersion writes two ints through
    // the pointers, which point at live locals.
    let status = quietly("nvrtcVersion", || unsafe {
        cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor)
    })?;
    match status {
        cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS => Ok((major, minor)),
        other => Err(CudaError::Compile {
            source_name: "nvrtcVersion",
            arch: "",
            log: format!("{other:?}"),
        }),
    }
}

/// The options every program is compiled with (see the module comment).
fn options(source: &KernelSource, arch: &'static str) -> CompileOptions {
    CompileOptions {
        fmad: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        ftz: Some(false),
        use_fast_math: Some(false),
        arch: Some(arch),
        name: Some(format!("{}.cu", source.name)),
        ..Default::default()
    }
}

/// `source` compiled for `arch` (`compute_80`, `compute_90`, …); NVRTC's log on failure.
pub fn compile_source(source: &'static KernelSource, arch: &'static str) -> Result<CompiledSource> {
    check_library(CudaLibrary::Nvrtc)?;
    let program = source.program();
    let compiled = quietly("nvrtcCompileProgram", || {
        compile_ptx_with_opts(program, options(source, arch))
    })?;
    let ptx = compiled.map_err(|e| CudaError::Compile {
        source_name: source.name,
        arch,
        log: match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().trim().to_string(),
            other => other.to_string(),
        },
    })?;
    Ok(CompiledSource { source, arch, ptx })
}

/// Every program of [`SOURCES`] compiled for `arch`; the first failure's log otherwise.
pub fn compile_all(arch: &'static str) -> Result<Vec<CompiledSource>> {
    SOURCES.iter().map(|s| compile_source(s, arch)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_capability_gets_an_architecture_nvrtc_knows() {
        assert_eq!(arch_for((8, 0)), Ok("compute_80"));
        assert_eq!(arch_for((8, 9)), Ok("compute_89"));
        assert_eq!(arch_for((9, 0)), Ok("compute_90"));
        assert_eq!(arch_for((12, 0)), Ok("compute_90"));
        assert_eq!(arch_for((7, 5)), Err(CudaError::UnsupportedArch((7, 5))));
    }

    #[test]
    fn without_nvrtc_compiling_says_which_library_is_missing() {
        if check_library(CudaLibrary::Nvrtc).is_ok() {
            return;
        }
        let e = compile_source(&SOURCES[0], "compute_90").unwrap_err();
        assert_eq!(e, CudaError::LibraryMissing(CudaLibrary::Nvrtc));
    }
}
