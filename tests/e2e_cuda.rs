//! `--device cuda` end to end. Where it cannot serve, `dpserve worker --device cuda[:N]` is
//! refused with one clear line and EX_CONFIG (78), never a panic, whether the machine lacks a
//! driver, a GPU or that ordinal (the probe's reason) or has a driver whose libraries lack what
//! the upload needs (checked with stand-in driver libraries built here); a bad ordinal is a
//! usage error. `up --device cuda[:N]` probes the GPUs before it starts anything: one worker per
//! visible GPU with its own `--device cuda:<i>` (or rank r on `cuda:<r mod GPUs>` under
//! `--dp-size`), every rank on GPU N for `cuda:N`; a probe that fails is `up`'s own one-line
//! EX_CONFIG refusal. Where a GPU is (a real one, or the CPU emulator of kernels/tests/emu),
//! `up --device cuda:0 --dp-size 2` serves stories260k's golden continuation.
#![cfg(feature = "cuda")] // the stand-in drivers need the probe, which only the backend has

mod common;
#[path = "../kernels/tests/emu/mod.rs"]
mod emu;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kernels::cuda::{check_library, CudaLibrary};
use serde_json::{json, Value};

/// Runs `dpserve` with `args` and `env` (no other `DPSERVE_*` variable), killing it after 60 s;
/// its exit code and stderr.
fn dpserve(args: &[&str], env: &[(&str, &str)], dir: &Path) -> (Option<i32>, String) {
    let mut cmd = Command::new(common::dpserve_bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("DPSERVE_") {
            cmd.env_remove(key);
        }
    }
    // Somewhere harmless to connect to, should the worker get that far.
    cmd.env("XDG_RUNTIME_DIR", dir).envs(env.iter().copied());
    let mut child = cmd.spawn().expect("spawn dpserve");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("dpserve {args:?} still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    (status.code(), stderr)
}

/// Asserts the one-line EX_CONFIG refusal of `--device <shown>`; returns its reason.
fn assert_refused(code: Option<i32>, stderr: &str, shown: &str) -> String {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(code, Some(78), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(lines.len(), 1, "one line, not:\n{stderr}");
    let prefix = format!("dpserve: error: --device {shown}: ");
    let why = lines[0]
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("not `{prefix}…`: {}", lines[0]));
    why.to_string()
}

#[test]
fn worker_device_cuda_is_refused_with_one_clear_line_and_ex_config() {
    let dir = tempfile::tempdir().unwrap();
    if check_library(CudaLibrary::Driver).is_ok() {
        // There `--device cuda` serves; scripts/gpu-check.sh is the check of a GPU machine.
        eprintln!("skipping: a CUDA driver is loadable here");
        return;
    }
    // (--device's value, or DPSERVE_DEVICE's, and the device as the error shows it)
    for (flag, var, shown) in [
        (Some("cuda"), None, "cuda:0"),
        (Some("cuda:7"), None, "cuda:7"),
        (None, Some("cuda:1"), "cuda:1"),
    ] {
        let mut args = vec!["worker", "--rank", "0"];
        args.extend(flag.map(|f| ["--device", f]).into_iter().flatten());
        let env: Vec<(&str, &str)> = var.map(|v| ("DPSERVE_DEVICE", v)).into_iter().collect();
        let (code, stderr) = dpserve(&args, &env, dir.path());
        let why = assert_refused(code, &stderr, shown);
        assert!(
            why.starts_with("no CUDA driver (libcuda.so.1 not found; "),
            "{why}"
        );
    }
}

#[test]
fn a_gpu_ordinal_that_is_not_a_number_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["cuda:abc", "cuda:", "cuda:-1"] {
        let (code, stderr) = dpserve(&["worker", "--rank", "0", "--device", bad], &[], dir.path());
        assert_eq!(code, Some(2), "{bad}: {stderr}");
        assert!(
            stderr.contains(&format!("'{bad}'")) && stderr.contains("must be a number"),
            "{bad}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// A stand-in `libcuda` for the driver's answers a GPU machine may give: C source of its
/// functions (each returning a `CUresult`).
const STUB_NO_DEVICE: &str = r#"
int cuInit(unsigned flags) { return 100; /* CUDA_ERROR_NO_DEVICE */ }
int cuGetErrorString(int e, const char** s) { *s = "no CUDA-capable device is detected"; return 0; }
"#;
const STUB_TWO_DEVICES_OLD_DRIVER: &str = r#"
int cuInit(unsigned flags) { return 0; }
int cuDeviceGetCount(int* n) { *n = 2; return 0; }
"#;
/// A stand-in driver with `count` H200s that gets as far as a context on each.
fn stub_h200s(count: u32) -> String {
    format!(
        r#"
#include <stddef.h>
#include <string.h>
static int ctx;
int cuInit(unsigned flags) {{ return 0; }}
int cuDeviceGetCount(int* n) {{ *n = {count}; return 0; }}
int cuDeviceGet(int* d, int ordinal) {{ *d = ordinal; return 0; }}
int cuDevicePrimaryCtxRetain(void** c, int dev) {{ *c = &ctx; return 0; }}
int cuDevicePrimaryCtxRelease_v2(int dev) {{ return 0; }}
/* 75, 76: compute capability major, minor */
int cuDeviceGetAttribute(int* v, int attr, int dev) {{ *v = attr == 75 ? 9 : 0; return 0; }}
int cuCtxSetCurrent(void* c) {{ return 0; }}
int cuCtxGetCurrent(void** c) {{ *c = &ctx; return 0; }}
int cuCtxSynchronize(void) {{ return 0; }}
int cuDeviceGetName(char* name, int len, int dev) {{ strncpy(name, "NVIDIA H200", len); return 0; }}
int cuMemGetInfo_v2(size_t* f, size_t* t) {{ *f = 140ull << 30; *t = 141ull << 30; return 0; }}
"#
    )
}

/// Builds `libcuda.so` from `source` into `dir` (plus empty `libnvrtc.so` and `libcublas.so`
/// when `libs`), under the names cudarc tries first, so they win over any real library.
fn stub_driver(dir: &Path, source: &str, libs: bool) -> bool {
    let build = |name: &str, text: &str| {
        let c = dir.join(format!("{name}.c"));
        std::fs::write(&c, text).unwrap();
        Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(dir.join(format!("{name}.so")))
            .arg(&c)
            .status()
            .is_ok_and(|s| s.success())
    };
    for lib in ["libcuda", "libnvrtc", "libcublas"] {
        let _ = std::fs::remove_file(dir.join(format!("{lib}.so")));
    }
    build("libcuda", source) && (!libs || (build("libnvrtc", "") && build("libcublas", "")))
}

#[test]
fn each_answer_of_a_driver_becomes_its_own_line() {
    let stubs = tempfile::tempdir().unwrap();
    let runtime = tempfile::tempdir().unwrap();
    let lib_path = stubs.path().to_str().unwrap();
    for (source, libs, device, want) in [
        (
            STUB_NO_DEVICE,
            false,
            "cuda",
            "no CUDA device is visible (CUDA_VISIBLE_DEVICES",
        ),
        (
            STUB_TWO_DEVICES_OLD_DRIVER,
            false,
            "cuda:5",
            "there is no GPU 5: 2 visible (CUDA_VISIBLE_DEVICES",
        ),
        (
            STUB_TWO_DEVICES_OLD_DRIVER,
            false,
            "cuda:1",
            "the CUDA library failed in CudaContext::new: Missing symbol cuDeviceGet",
        ),
        (
            &stub_h200s(1),
            true,
            "cuda",
            "uploading the model: the CUDA library failed in nvrtcCompileProgram: Missing symbol \
             nvrtcCreateProgram",
        ),
    ] {
        if !stub_driver(stubs.path(), source, libs) {
            eprintln!("skipping: no C compiler (cc) to build a stand-in libcuda");
            return;
        }
        let env = [("LD_LIBRARY_PATH", lib_path)];
        let args = ["worker", "--rank", "0", "--device", device];
        let (code, stderr) = dpserve(&args, &env, runtime.path());
        let shown = if device == "cuda" { "cuda:0" } else { device };
        let why = assert_refused(code, &stderr, shown);
        assert!(why.starts_with(want), "{device}: {why}");
    }
}

/// stories260k's golden prompt, ids and text.
fn golden(dir: &Path) -> (Vec<u64>, String) {
    let g: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let ids = g["greedy_token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    (ids, g["greedy_text"].as_str().unwrap().to_string())
}

/// `dpserve up --device cuda:0 --dp-size 2` on stories260k: two ranks sharing GPU 0, each
/// reporting it, both giving the golden greedy continuation to 8 concurrent requests (4 per
/// rank, two of them streamed). Runs on whatever GPU `probe(0)` finds: a real one
/// (scripts/gpu-check.sh) or the CPU emulator ([`golden_on_two_ranks_sharing_the_emulated_gpu`]).
#[test]
fn golden_on_two_ranks_sharing_gpu_0() {
    let gpu = match kernels::cuda::probe(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!("skipping: {e}");
            return;
        }
    };
    let Some(dir) = common::stories_dir() else {
        return;
    };
    let (ids, text) = golden(&dir);
    let server = common::Server::up(&[
        "--model-path",
        dir.to_str().unwrap(),
        "--device",
        "cuda:0",
        "--dp-size",
        "2",
    ]);
    let (status, info) = server.get("/get_server_info");
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["device"], "cuda", "{info}");
    let ranks = info["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 2, "{info}");
    for r in ranks {
        assert_eq!(r["device"], "cuda:0", "{r}");
        assert_eq!(r["gpu"]["name"], gpu.name.as_str(), "{r}");
        assert_eq!(r["gpu"]["total_memory_bytes"], gpu.total_bytes, "{r}");
    }
    eprintln!(
        "{}: serving on cuda:0 ({} MiB)",
        gpu.name,
        gpu.total_bytes >> 20
    );
    let bodies: Vec<Value> = (0..8u64)
        .map(|i| {
            json!({
                "text": "Once upon a time",
                "sampling_params": {"temperature": 0, "max_new_tokens": 32},
                "routed_dp_rank": i % 2,
            })
        })
        .collect();
    let replies = server.post_concurrently("/generate", bodies);
    for (i, reply) in replies.into_iter().enumerate() {
        let reply = reply.join().unwrap();
        assert_eq!(reply.status, 200, "request {i}: {}", reply.body);
        let got: Vec<u64> = reply.body["output_ids"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        assert_eq!(got, ids, "request {i} ids");
        assert_eq!(reply.body["text"], text, "request {i} text");
        assert_eq!(reply.body["meta_info"]["dp_rank"], i as u64 % 2);
    }
    for rank in 0..2u64 {
        let chunks = server.stream(
            "/generate",
            &json!({
                "text": "Once upon a time",
                "stream": true,
                "sampling_params": {"temperature": 0, "max_new_tokens": 32},
                "routed_dp_rank": rank,
            }),
        );
        let streamed = common::generate::produced(&chunks, common::generate::Form::Cumulative);
        assert_eq!(streamed.text, text, "rank {rank} streamed");
    }
    eprintln!("golden: 8 concurrent requests and 2 streams on 2 ranks sharing GPU 0");
}

/// [`golden_on_two_ranks_sharing_gpu_0`] with the CPU emulator of the driver and cuBLAS as the
/// GPU: the whole serving path of `--device cuda` (probe, NVRTC compile, upload, pool sizing,
/// the first step, batched prefill and decode through the scheduler) on a machine without one.
#[test]
fn golden_on_two_ranks_sharing_the_emulated_gpu() {
    let Some(lib_dir) = emu::for_test() else {
        return;
    };
    if common::stories_dir().is_none() {
        return;
    }
    let env = [("DPSERVE_CUDA_EMU_MEM_MB", "1024")];
    match emu::run_inner(&lib_dir, "golden_on_two_ranks_sharing_gpu_0", &env) {
        Ok(out) => eprintln!("{out}"),
        Err(out) => panic!("{out}"),
    }
}

// ---------------------------------------------------------------------------------------------
// `dpserve up --device cuda[:N]`
// ---------------------------------------------------------------------------------------------

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

/// `dpserve up --builtin-size tiny <args>` on a free port with the stand-in driver in `stubs`,
/// until it has logged the start of `workers` workers (or exited); then SIGTERM (`up` stops its
/// children), SIGKILL past 60 s. The `(rank, device)` of each worker it started, in order.
fn up_started_workers(args: &[&str], stubs: &Path, workers: usize) -> Vec<(u32, String)> {
    let runtime = tempfile::Builder::new()
        .prefix("dpsc")
        .tempdir_in("/tmp")
        .unwrap();
    let port = free_port().to_string();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dpserve"));
    cmd.args(["up", "--builtin-size", "tiny", "--startup-timeout", "60"])
        .args(["--port", &port, "--runtime-dir"])
        .arg(runtime.path())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("DPSERVE_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("LD_LIBRARY_PATH", stubs).env("DPSERVE_LOG", "info");
    let mut child = cmd.spawn().expect("spawn dpserve up");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let started = Instant::now();
    let mut log = Vec::new();
    let mut workers_started = Vec::new();
    let mut terminated = false;
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => {
                // `up`'s own line for each child: `started actor="worker R on cuda:G" pid=…`.
                if let Some(at) = line.find("started actor=\"worker ") {
                    let name = &line[at + "started actor=\"worker ".len()..];
                    let name = name.split('"').next().unwrap_or_default();
                    if let Some((rank, device)) = name.split_once(" on ") {
                        workers_started.push((rank.parse().unwrap(), device.to_string()));
                    }
                }
                log.push(line);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        if !terminated && (workers_started.len() >= workers || started.elapsed().as_secs() > 30) {
            // Whatever the workers do next (today: refuse, status 78) is not this test's.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            terminated = true;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            break;
        }
    }
    let _ = child.wait();
    assert_eq!(
        workers_started.len(),
        workers,
        "up {args:?} started {workers_started:?}:\n{}",
        log.join("\n")
    );
    let placed = log.iter().find(|l| l.contains("ranks placed on GPUs"));
    assert!(placed.is_some(), "no placement line:\n{}", log.join("\n"));
    workers_started
}

#[test]
fn up_device_cuda_starts_one_worker_per_gpu_or_goes_round_them() {
    let stubs = tempfile::tempdir().unwrap();
    if !stub_driver(stubs.path(), &stub_h200s(2), true) {
        eprintln!("skipping: no C compiler (cc) to build a stand-in libcuda");
        return;
    }
    let cuda = |n: u32| format!("cuda:{n}");
    // (up's flags, each rank's GPU)
    let cases: &[(&[&str], &[u32])] = &[
        (&["--device", "cuda"], &[0, 1]),
        (&["--device", "cuda", "--dp-size", "3"], &[0, 1, 0]),
        (&["--device", "cuda:1", "--dp-size", "2"], &[1, 1]),
        (&["--device", "cuda:1"], &[1]),
    ];
    for (flags, gpus) in cases {
        let started = up_started_workers(flags, stubs.path(), gpus.len());
        let want: Vec<(u32, String)> = gpus
            .iter()
            .enumerate()
            .map(|(rank, &g)| (rank as u32, cuda(g)))
            .collect();
        assert_eq!(started, want, "{flags:?}");
    }
}

#[test]
fn up_device_cuda_without_a_usable_gpu_exits_78_with_one_line_before_starting_anything() {
    let stubs = tempfile::tempdir().unwrap();
    let runtime = tempfile::tempdir().unwrap();
    let lib_path = stubs.path().to_str().unwrap();
    if check_library(CudaLibrary::Driver).is_err() {
        let (code, stderr) = dpserve(&["up", "--device", "cuda"], &[], runtime.path());
        let why = assert_refused(code, &stderr, "cuda");
        assert!(
            why.starts_with("no CUDA driver (libcuda.so.1 not found; "),
            "{why}"
        );
    } else {
        eprintln!("a CUDA driver is loadable here: the no-driver case is not checked");
    }
    for (source, libs, device, want) in [
        (
            STUB_NO_DEVICE,
            false,
            "cuda",
            "no CUDA device is visible (CUDA_VISIBLE_DEVICES",
        ),
        (
            &stub_h200s(2),
            true,
            "cuda:5",
            "there is no GPU 5: 2 visible (CUDA_VISIBLE_DEVICES",
        ),
    ] {
        if !stub_driver(stubs.path(), source, libs) {
            eprintln!("skipping: no C compiler (cc) to build a stand-in libcuda");
            return;
        }
        let env = [("LD_LIBRARY_PATH", lib_path)];
        let (code, stderr) = dpserve(&["up", "--device", device], &env, runtime.path());
        // One line: nothing was started (each child's start is a log line of its own).
        let why = assert_refused(code, &stderr, device);
        assert!(why.starts_with(want), "{device}: {why}");
    }
}

#[test]
fn up_refuses_disaggregated_gpu_ranks_before_starting_anything() {
    let runtime = tempfile::tempdir().unwrap();
    let args = [
        "up",
        "--device",
        "cuda",
        "--prefill-dp-size",
        "1",
        "--decode-dp-size",
        "1",
    ];
    let (code, stderr) = dpserve(&args, &[], runtime.path());
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stderr.trim(),
        "dpserve: error: --device cuda does not serve disaggregated roles yet (the KV transfer \
         is CPU-only); use --device cpu for prefill/decode disaggregation"
    );
}
