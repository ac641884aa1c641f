//! `dpserve bench --engine`: the CPU engine alone, no server. For one model it measures prefill
//! tok/s at given prompt lengths (in chunks of `--chunked-prefill-size`, as a worker computes
//! them) and decode tok/s at given batch sizes (`--engine-decode-steps` steps from an empty
//! context, as llama-bench's `tg`), with the achieved GFLOP/s and GB/s beside the machine's
//! ceilings measured in the same run (peak fma throughput of the path, memory-copy bandwidth).
//! `--kernel-path all` runs each path this CPU supports in its own process (a path is fixed
//! once per process) and adds a comparison, each path as a ratio of the portable one.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use kernels::KernelPath;
use serde::{Deserialize, Serialize};
use worker::model::{BuiltinSize, KvBuffers, LlamaModel, LoadDtype, ModelConfig, SeqInput};
use worker::ModelSource;

/// Prefix of the one stdout line a child (`--kernel-path` given by the parent) reports on.
const CHILD_LINE: &str = "dpserve-engine-result ";

/// What the engine benchmark needs from the command line.
#[derive(Debug, Clone)]
pub struct EngineArgs {
    pub model_path: Option<PathBuf>,
    pub builtin_size: BuiltinSize,
    /// `--weight-dtype` of the checkpoint's matrices.
    pub weight_dtype: LoadDtype,
    /// `--compute-dtype`.
    pub compute_dtype: kernels::ComputeDtype,
    pub threads: Option<usize>,
    /// `auto`, a path name, or `all`.
    pub kernel_path: String,
    pub prompt_lens: Vec<usize>,
    pub batches: Vec<usize>,
    pub decode_steps: usize,
    pub chunk: usize,
    pub reps: usize,
    /// `--engine-json-schema`: decode rows again under this constraint.
    pub json_schema: Option<PathBuf>,
    pub output_file: Option<PathBuf>,
}

/// One measurement.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EngineRow {
    /// `pp512`, `tg128 b8`, …
    pub test: String,
    pub tokens_per_s: f64,
    pub gflops: f64,
    pub gbps: f64,
}

/// A whole run on one path.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EngineResult {
    pub kernel_path: String,
    pub model: String,
    pub params: usize,
    /// The type the weight matrices were held in (`f32`, `bf16`, `f16`).
    #[serde(default)]
    pub weight_dtype: String,
    /// What the linear layers computed in (`f32`; `bf16 (vdpbf16ps)`, `bf16 (emulated: …)`).
    #[serde(default)]
    pub compute_dtype: String,
    /// MiB of the loaded weights (packed matrices and vectors).
    #[serde(default)]
    pub weight_mib: f64,
    /// Resident MiB of the process right after loading (`VmRSS`), and its peak over the run
    /// (`VmHWM`); 0 where `/proc/self/status` is not there.
    #[serde(default)]
    pub rss_loaded_mib: f64,
    #[serde(default)]
    pub rss_peak_mib: f64,
    pub threads: usize,
    pub cpu: String,
    pub cpu_flags: String,
    pub fma_peak_gflops: f64,
    pub copy_gbps: f64,
    pub rows: Vec<EngineRow>,
}

pub fn run(args: &EngineArgs) -> anyhow::Result<()> {
    if args.kernel_path == "all" {
        return run_all(args);
    }
    let path: KernelPath = args
        .kernel_path
        .parse()
        .map_err(|e| anyhow::anyhow!("--kernel-path: {e}"))?;
    let fixed = kernels::set_kernel_path(path);
    anyhow::ensure!(
        fixed == path,
        "the kernel path was already fixed to {fixed} (is DPSERVE_KERNEL_PATH set?)"
    );
    let threads = args.threads.unwrap_or_else(default_threads);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("building the compute thread pool")?;
    let result = pool.install(|| measure(args, path, threads))?;
    print!("{}", table(&result));
    if let Some(file) = &args.output_file {
        super::report::append_jsonl(file, &serde_json::to_value(&result)?)?;
    }
    if std::env::var_os("DPSERVE_ENGINE_CHILD").is_some() {
        println!("{CHILD_LINE}{}", serde_json::to_string(&result)?);
    }
    Ok(())
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Each supported path in a child process, then one comparison table.
fn run_all(args: &EngineArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("locating this binary")?;
    let mut results = Vec::new();
    for path in KernelPath::all_supported() {
        let mut cmd = Command::new(&exe);
        cmd.args(["bench", "--engine", "--kernel-path", path.name()])
            .args(["--engine-prompt-lens", &join(&args.prompt_lens)])
            .args(["--engine-batches", &join(&args.batches)])
            .args(["--engine-decode-steps", &args.decode_steps.to_string()])
            .args(["--engine-reps", &args.reps.to_string()])
            .args(["--chunked-prefill-size", &args.chunk.to_string()])
            .args(["--builtin-size", &args.builtin_size.to_string()])
            .args(["--weight-dtype", args.weight_dtype.name()])
            .args(["--compute-dtype", args.compute_dtype.name()])
            .env("DPSERVE_ENGINE_CHILD", "1")
            .env_remove(kernels::KERNEL_PATH_ENV)
            .stdout(Stdio::piped());
        if let Some(p) = &args.model_path {
            cmd.arg("--model-path").arg(p);
        }
        if let Some(t) = args.threads {
            cmd.args(["--num-threads", &t.to_string()]);
        }
        if let Some(f) = &args.output_file {
            cmd.arg("--output-file").arg(f);
        }
        if let Some(f) = &args.json_schema {
            cmd.arg("--engine-json-schema").arg(f);
        }
        let mut child = cmd.spawn().context("starting the benchmark child")?;
        let stdout = child.stdout.take().context("child stdout")?;
        let mut result = None;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            match line.strip_prefix(CHILD_LINE) {
                Some(json) => result = Some(serde_json::from_str::<EngineResult>(json)?),
                None => println!("{line}"),
            }
        }
        let status = child.wait()?;
        anyhow::ensure!(status.success(), "the {path} run failed ({status})");
        results.push(result.with_context(|| format!("the {path} run reported nothing"))?);
    }
    print!("{}", comparison(&results));
    Ok(())
}

fn join(v: &[usize]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Floats multiplied per token by the weight matrices of the decoder (and of `lm_head` when
/// `with_head`): every weight is used once per token.
fn matmul_params(c: &ModelConfig, with_head: bool) -> usize {
    let (h, q, kv, i) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let layer = h * (q + 2 * kv) + q * h + 3 * h * i;
    c.num_hidden_layers * layer + if with_head { h * c.vocab_size } else { 0 }
}

/// Attention flops of one token at position `p` (scores and weighted values, every layer).
fn attn_flops(c: &ModelConfig, p: usize) -> f64 {
    (c.num_hidden_layers * 4 * c.num_attention_heads * c.head_dim * (p + 1)) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn measure(args: &EngineArgs, path: KernelPath, threads: usize) -> anyhow::Result<EngineResult> {
    let (source, name) = model_source(args)?;
    let model = worker::load_model(&source)?;
    let rss_loaded = status_mib("VmRSS");
    let c = model.config().clone();
    let mut rows = Vec::new();
    for &len in &args.prompt_lens {
        rows.push(prefill_row(&model, args, len)?);
    }
    let guided = constraint(args, &c)?;
    for &batch in &args.batches {
        rows.push(decode_row(&model, args, batch, None)?);
        if let Some(g) = &guided {
            rows.push(decode_row(&model, args, batch, Some(g))?);
        }
    }
    let (cpu, cpu_flags) = cpu_info();
    Ok(EngineResult {
        kernel_path: path.name().to_string(),
        model: name,
        params: c.num_params(),
        weight_dtype: model.matrix_dtype().name().to_string(),
        compute_dtype: model.compute_dtype_name(path),
        weight_mib: model.weight_bytes() as f64 / (1 << 20) as f64,
        rss_loaded_mib: rss_loaded,
        rss_peak_mib: status_mib("VmHWM"),
        threads,
        cpu,
        cpu_flags,
        fma_peak_gflops: kernels::peak::fma_gflops(path, Duration::from_millis(300)),
        copy_gbps: kernels::peak::copy_gbps(256 << 20, 5),
        rows,
    })
}

/// The model to load and the name the result gives it.
fn model_source(args: &EngineArgs) -> anyhow::Result<(ModelSource, String)> {
    Ok(match &args.model_path {
        Some(dir) => (
            ModelSource::HfDir {
                dir: dir.clone(),
                dtype: args.weight_dtype,
                compute: args.compute_dtype,
                weight_cache: None,
            },
            dir.display().to_string(),
        ),
        None if args.compute_dtype != kernels::ComputeDtype::F32 => anyhow::bail!(
            "--compute-dtype {} applies to a --model-path checkpoint; the built-in model \
             computes in f32",
            args.compute_dtype
        ),
        None if args.weight_dtype != LoadDtype::Auto => anyhow::bail!(
            "--weight-dtype {} applies to a --model-path checkpoint; the built-in model is f32",
            args.weight_dtype
        ),
        None => (
            ModelSource::Builtin {
                size: args.builtin_size,
                seed: 0,
            },
            format!("built-in {}", args.builtin_size),
        ),
    })
}

/// The benchmark's synthetic token at position `i`: spread over the vocabulary, never random.
fn bench_token(vocab: usize, i: usize) -> u32 {
    (i as u32 * 7919 + 13) % vocab as u32
}

/// `pp{len}`: one prompt of `len` tokens, prefilled in `--chunked-prefill-size` chunks; the
/// median of `--reps` runs after a warm-up.
fn prefill_row(model: &LlamaModel, args: &EngineArgs, len: usize) -> anyhow::Result<EngineRow> {
    let c = model.config();
    let max_ctx = c.max_position_embeddings;
    anyhow::ensure!(
        len > 0 && len <= max_ctx,
        "prompt length {len} outside 1..={max_ctx}"
    );
    // Bytes of one weight element as the matrices hold it (what a token streams per parameter).
    let elem = model.matrix_dtype().bytes() as f64;
    let ids: Vec<u32> = (0..len).map(|i| bench_token(c.vocab_size, i)).collect();
    let slots: Vec<u32> = (0..len as u32).collect();
    let mut kv = KvBuffers::new(c, len);
    let mut once = || -> anyhow::Result<f64> {
        let t = Instant::now();
        for start in (0..len).step_by(args.chunk.max(1)) {
            let end = (start + args.chunk).min(len);
            model.forward(
                &mut kv,
                &[SeqInput {
                    new_tokens: &ids[start..end],
                    start_pos: start,
                    slots: &slots[..end],
                }],
            )?;
        }
        Ok(t.elapsed().as_secs_f64())
    };
    once()?; // warm-up: page faults, thread start
    let times = (0..args.reps.max(1))
        .map(|_| once())
        .collect::<anyhow::Result<Vec<_>>>()?;
    let dt = median(times);
    let chunks = len.div_ceil(args.chunk.max(1));
    let flops = 2.0
        * (matmul_params(c, false) * len + c.hidden_size * c.vocab_size * chunks) as f64
        + (0..len).map(|p| attn_flops(c, p)).sum::<f64>();
    Ok(EngineRow {
        test: format!("pp{len}"),
        tokens_per_s: len as f64 / dt,
        gflops: flops / dt / 1e9,
        gbps: elem * matmul_params(c, true) as f64 * chunks as f64 / dt / 1e9,
    })
}

/// `--engine-json-schema`'s constraint compiled against the model directory's vocabulary.
fn constraint(
    args: &EngineArgs,
    c: &ModelConfig,
) -> anyhow::Result<Option<(grammar::Grammars, grammar::Constraint)>> {
    let Some(file) = &args.json_schema else {
        return Ok(None);
    };
    let Some(dir) = &args.model_path else {
        anyhow::bail!(
            "--engine-json-schema needs --model-path (the built-in model has no byte vocabulary)"
        );
    };
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("--engine-json-schema {}", file.display()))?;
    let g = grammar::Grammars::from_tokenizer_json(
        &dir.join("tokenizer.json"),
        c.vocab_size,
        &c.eos_token_ids,
    )?;
    let constraint = grammar::Constraint::JsonSchema(text);
    g.compile(&constraint)?;
    Ok(Some((g, constraint)))
}

/// `tg{steps} b{batch}`: `batch` one-token prompts decoded greedily for `--engine-decode-steps`
/// steps, timed after the prompts' own step. With `guided`, every sequence's logits are masked
/// by its constraint each step (in the timed loop, the masks computed during the forward pass
/// as a worker does), and a sequence whose constraint ends starts it again: the row is
/// `tg{steps} b{batch} json_schema`.
fn decode_row(
    model: &LlamaModel,
    args: &EngineArgs,
    batch: usize,
    guided: Option<&(grammar::Grammars, grammar::Constraint)>,
) -> anyhow::Result<EngineRow> {
    let c = model.config();
    let steps = args.decode_steps.max(1);
    anyhow::ensure!(batch > 0, "batch sizes must be positive");
    anyhow::ensure!(
        steps < c.max_position_embeddings,
        "--engine-decode-steps must be below the context"
    );
    let elem = model.matrix_dtype().bytes() as f64;
    let ctx = steps + 1;
    let mut kv = KvBuffers::new(c, batch * ctx);
    let slots: Vec<Vec<u32>> = (0..batch)
        .map(|b| ((b * ctx) as u32..((b + 1) * ctx) as u32).collect())
        .collect();
    let mut toks: Vec<Vec<u32>> = (0..batch)
        .map(|b| vec![bench_token(c.vocab_size, b)])
        .collect();
    let mut guides: Vec<Option<grammar::Guide>> = (0..batch)
        .map(|_| fresh_guide(guided))
        .collect::<anyhow::Result<_>>()?;
    let mut step = |pos: usize, toks: &mut Vec<Vec<u32>>| {
        decode_step(model, &mut kv, &slots, toks, &mut guides, guided, pos)
    };
    step(0, &mut toks)?; // the one-token prompts
    let t = Instant::now();
    for pos in 1..=steps {
        step(pos, &mut toks)?;
    }
    let dt = t.elapsed().as_secs_f64();
    let flops = (1..=steps)
        .map(|p| 2.0 * matmul_params(c, true) as f64 + attn_flops(c, p))
        .sum::<f64>()
        * batch as f64;
    let kv_bytes: f64 = (1..=steps)
        .map(|p| (c.num_hidden_layers * 2 * c.kv_dim() * 4 * (p + 1)) as f64)
        .sum::<f64>()
        * batch as f64;
    let weight_bytes = elem * matmul_params(c, true) as f64 * steps as f64;
    Ok(EngineRow {
        test: match guided {
            Some(_) => format!("tg{steps} b{batch} json_schema"),
            None => format!("tg{steps} b{batch}"),
        },
        tokens_per_s: (batch * steps) as f64 / dt,
        gflops: flops / dt / 1e9,
        gbps: (weight_bytes + kv_bytes) / dt / 1e9,
    })
}

/// A new guide for `guided`'s constraint (`None` without one).
fn fresh_guide(
    guided: Option<&(grammar::Grammars, grammar::Constraint)>,
) -> anyhow::Result<Option<grammar::Guide>> {
    Ok(match guided {
        Some((g, constraint)) => Some(g.compile(constraint)?),
        None => None,
    })
}

/// One decode step of every sequence at `pos`: the forward pass, each guide's mask applied to
/// its logits, and the greedy token appended to `toks` (a guide that ends starts again).
fn decode_step(
    model: &LlamaModel,
    kv: &mut KvBuffers,
    slots: &[Vec<u32>],
    toks: &mut [Vec<u32>],
    guides: &mut [Option<grammar::Guide>],
    guided: Option<&(grammar::Grammars, grammar::Constraint)>,
    pos: usize,
) -> anyhow::Result<()> {
    let c = model.config();
    let seqs: Vec<SeqInput> = (0..toks.len())
        .map(|b| SeqInput {
            new_tokens: &toks[b][pos..=pos],
            start_pos: pos,
            slots: &slots[b][..=pos],
        })
        .collect();
    // As a worker does: the masks are computed on a thread while the forward pass runs.
    let guides_now = &mut *guides;
    let (logits, masks) = std::thread::scope(|s| {
        let masks = s.spawn(|| {
            guides_now
                .iter_mut()
                .map(|g| g.as_mut().map(grammar::Guide::next_mask).transpose())
                .collect::<Result<Vec<_>, _>>()
        });
        let logits = model.forward(kv, &seqs);
        (
            logits,
            masks
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p)),
        )
    });
    let (mut logits, masks) = (logits?, masks?);
    for (b, row) in logits.chunks_exact_mut(c.vocab_size).enumerate() {
        if let Some(mask) = &masks[b] {
            mask.apply(row);
        }
        let token = kernels::argmax(row) as u32;
        if let Some(guide) = &mut guides[b] {
            if guide.advance(token)? {
                guides[b] = fresh_guide(guided)?;
            }
        }
        toks[b].push(token);
    }
    Ok(())
}

/// A `kB` field of `/proc/self/status` in MiB (0 where there is none).
fn status_mib(field: &str) -> f64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The CPU model name and its SIMD flags that matter here, from `/proc/cpuinfo` (Linux).
fn cpu_info() -> (String, String) {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let model = field("model name")
        .or_else(|| field("CPU part"))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let all = field("flags")
        .or_else(|| field("Features"))
        .unwrap_or_default();
    let wanted = [
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512_bf16",
        "asimd",
        "neon",
    ];
    let flags: Vec<&str> = all
        .split_whitespace()
        .filter(|f| wanted.contains(f))
        .collect();
    (model, flags.join(" "))
}

/// The result as a Markdown table, with its context above it.
pub fn table(r: &EngineResult) -> String {
    let mut s = format!(
        "\nengine: {} ({:.1}M params, weights {}, computed in {}), kernel path {}, {} threads\n\
         memory: weights {:.1} MiB, resident {:.1} MiB after loading, peak {:.1} MiB\n\
         CPU: {} [{}]\n\
         ceilings (this run): fma peak {:.1} GFLOP/s ({}), memory copy {:.1} GB/s (read + write)\n\n\
         | test | tok/s | GFLOP/s | of fma peak | GB/s | of copy |\n\
         |---|---:|---:|---:|---:|---:|\n",
        r.model,
        r.params as f64 / 1e6,
        r.weight_dtype,
        if r.compute_dtype.is_empty() {
            "f32"
        } else {
            &r.compute_dtype
        },
        r.kernel_path,
        r.threads,
        r.weight_mib,
        r.rss_loaded_mib,
        r.rss_peak_mib,
        r.cpu,
        r.cpu_flags,
        r.fma_peak_gflops,
        r.kernel_path,
        r.copy_gbps
    );
    for row in &r.rows {
        s += &format!(
            "| {} | {:.1} | {:.1} | {:.0}% | {:.1} | {:.0}% |\n",
            row.test,
            row.tokens_per_s,
            row.gflops,
            100.0 * row.gflops / r.fma_peak_gflops,
            row.gbps,
            100.0 * row.gbps / r.copy_gbps
        );
    }
    s
}

/// tok/s of every path side by side, each as a ratio of the first (portable) path's.
pub fn comparison(results: &[EngineResult]) -> String {
    let Some(base) = results.first() else {
        return String::new();
    };
    let mut s = String::from("\n| test |");
    for r in results {
        s += &format!(" {} tok/s |", r.kernel_path);
    }
    s += "\n|---|";
    s += &"---:|".repeat(results.len());
    s += "\n";
    for (i, row) in base.rows.iter().enumerate() {
        s += &format!("| {} |", row.test);
        for r in results {
            let v = r.rows.get(i).map_or(0.0, |x| x.tokens_per_s);
            s += &format!(" {:.1} ({:.2}×) |", v, v / row.tokens_per_s);
        }
        s += "\n";
    }
    s
}
