//! Every CUDA kernel source compiles with NVRTC for Ampere and Hopper, and defines the entry
//! points the launcher loads. Needs no GPU, only `libnvrtc.so.13` on the loader's path
//! (`.ci/run` unpacks pip's `nvidia-cuda-nvrtc==13.0.88` and sets `LD_LIBRARY_PATH`); without
//! it the test says so and passes, unless `DPSERVE_TEST_REQUIRE_NVRTC` is set (as `.ci/run`
//! does, so CI cannot skip it unnoticed).
#![cfg(feature = "cuda")]

use kernels::cuda::{self, CudaLibrary, ARCHS, SOURCES};

/// Whether NVRTC can be loaded; if not, says why the test skips (or fails, where required).
fn nvrtc_or_skip() -> bool {
    let Err(e) = cuda::check_library(CudaLibrary::Nvrtc) else {
        return true;
    };
    let why = format!(
        "{e}. .ci/run downloads nvidia-cuda-nvrtc==13.0.88 and puts its nvidia/cu13/lib on \
         LD_LIBRARY_PATH"
    );
    assert!(
        std::env::var_os("DPSERVE_TEST_REQUIRE_NVRTC").is_none(),
        "DPSERVE_TEST_REQUIRE_NVRTC is set, but {why}"
    );
    eprintln!("skipping: {why}");
    false
}

#[test]
fn every_kernel_source_compiles_for_compute_80_and_compute_90() {
    if !nvrtc_or_skip() {
        return;
    }
    let (major, minor) = cuda::nvrtc_version().expect("nvrtcVersion");
    eprintln!("NVRTC {major}.{minor}");
    let mut failures = Vec::new();
    for arch in ARCHS {
        let sm = arch.replace("compute_", "sm_");
        for source in SOURCES {
            let compiled = match cuda::compile_source(source, arch) {
                Ok(c) => c,
                Err(e) => {
                    failures.push(e.to_string());
                    continue;
                }
            };
            let ptx = compiled.ptx.to_src();
            let target = ptx
                .lines()
                .find(|l| l.starts_with(".target"))
                .unwrap_or("no .target line");
            let version = ptx
                .lines()
                .find(|l| l.starts_with(".version"))
                .unwrap_or("no .version line");
            assert_eq!(
                target,
                format!(".target {sm}"),
                "{}.cu for {arch}",
                source.name
            );
            let entries: Vec<String> = source.functions().collect();
            for f in &entries {
                assert!(
                    ptx.contains(&format!(".entry {f}(")),
                    "{}.cu for {arch}: no entry point {f}",
                    source.name
                );
            }
            eprintln!(
                "{arch}: {}.cu -> {version}, {target}, {} entry points, {} bytes of PTX",
                source.name,
                entries.len(),
                ptx.len()
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_compile_error_comes_back_with_nvrtc_s_log() {
    if !nvrtc_or_skip() {
        return;
    }
    static BROKEN: cuda::KernelSource = cuda::KernelSource {
        name: "broken",
        body: "extern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }",
        ops: &[],
    };
    let err = cuda::compile_source(&BROKEN, "compute_90").unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("NVRTC could not compile broken.cu for compute_90: ")
            && text.contains("undefined_name"),
        "{text}"
    );
}
