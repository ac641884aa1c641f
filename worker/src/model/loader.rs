//! Loading Hugging Face safetensors (single file or sharded) into `Weights`: weight matrices in
//! the type `--weight-dtype` resolves (F32/F16/BF16 kept or converted), norms and biases in f32. Every failure names the file and the tensor; a tensor the configured
//! model does not use is refused (a checkpoint with more parts than its config describes).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use kernels::cuda::CudaDtype;
use kernels::{PackedMatrix, WeightDtype};
use memmap2::Mmap;
use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};

use super::config::ModelConfig;
use super::elems::{narrow, Elems, LoadDtype};
use super::error::{ModelError, Result};
use super::moe::{MoeOptions, MoeWeights, SharedExpert};
use super::packed_file::{self, PackedFile, PackedWriter};
use super::support::ModelFamily;
use super::weights::{LayerWeights, Weights};

/// The `.safetensors` files of a model directory: those named by `model.safetensors.index.json`
/// when it exists, else every `*.safetensors` in the directory (sorted, for stable errors).
fn shard_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| ModelError::BadJson {
                path: index.clone(),
                reason: e.to_string(),
            })?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| ModelError::MissingField {
                file: index.clone(),
                field: "weight_map".into(),
            })?;
        let mut files: Vec<PathBuf> = Vec::new();
        for f in map.values() {
            let name = f.as_str().ok_or_else(|| ModelError::MissingField {
                file: index.clone(),
                field: "weight_map".into(),
            })?;
            let p = dir.join(name);
            if !files.contains(&p) {
                files.push(p);
            }
        }
        files.sort();
        for p in &files {
            if !p.exists() {
                return Err(ModelError::MissingFile { path: p.clone() });
            }
        }
        return Ok(files);
    }
    let rd = std::fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ModelError::MissingFile {
            path: dir.join("model.safetensors"),
        });
    }
    Ok(files)
}

/// Memory maps of the shard files, kept alive while tensors are converted.
struct Shards {
    files: Vec<(PathBuf, Mmap)>,
}

impl Shards {
    fn open(paths: Vec<PathBuf>) -> Result<Self> {
        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            let f = File::open(&path).map_err(|e| ModelError::io(&path, e))?;
            // SAFETY: the map is read-only and lives only while loading; model files are not
            // expected to be modified underneath a starting worker (the same assumption every
            // safetensors loader makes). A truncation would surface as SIGBUS, not as UB here.
            let map = unsafe { Mmap::map(&f) }.map_err(|e| ModelError::io(&path, e))?;
            files.push((path, map));
        }
        Ok(Shards { files })
    }

    fn parse<'s>(&'s self, want: LoadDtype, sink: &'s Sink<'s>) -> Result<TensorIndex<'s>> {
        let mut st = Vec::with_capacity(self.files.len());
        let mut by_name = HashMap::new();
        for (i, (path, map)) in self.files.iter().enumerate() {
            let t = SafeTensors::deserialize(map).map_err(|e| ModelError::BadSafetensors {
                file: path.clone(),
                reason: e.to_string(),
            })?;
            for name in t.names() {
                by_name.insert(name.to_string(), i);
            }
            st.push((path.as_path(), t));
        }
        Ok(TensorIndex {
            st,
            by_name,
            used: RefCell::default(),
            want,
            sink,
        })
    }
}

/// Name → tensor lookup across shards.
struct TensorIndex<'a> {
    st: Vec<(&'a Path, SafeTensors<'a>)>,
    by_name: HashMap<String, usize>,
    /// The names `get` has read (or `mark_used` accounted for).
    used: RefCell<HashSet<String>>,
    /// The type weight matrices are kept in.
    want: LoadDtype,
    /// Where packed matrices go.
    sink: &'a Sink<'a>,
}

/// What the loader does with each weight matrix.
enum Sink<'f> {
    /// Packs it in this process's memory.
    Own,
    /// Packs it into a packed weight file being written; the weights loaded are then dropped
    /// (each matrix is an empty stand-in), so one checkpoint tensor's matrices at most are in
    /// memory at a time.
    Write(RefCell<PackedWriter>),
    /// Views it in a mapped packed weight file; the checkpoint's matrices are not read (their
    /// names, shapes and types are still checked).
    Map(&'f PackedFile),
}

impl TensorIndex<'_> {
    fn mark_used(&self, name: &str) {
        self.used.borrow_mut().insert(name.to_string());
    }

    /// The first tensor (by name) nothing read, other than the RoPE buffers old conversions
    /// saved (`rotary_emb.inv_freq`: recomputed from the config, as transformers does).
    fn first_unused(&self) -> Option<String> {
        let used = self.used.borrow();
        let mut left: Vec<&String> = self
            .by_name
            .keys()
            .filter(|n| !used.contains(*n) && !n.ends_with("rotary_emb.inv_freq"))
            .collect();
        left.sort();
        left.first().map(|n| n.to_string())
    }

    fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The storage type of tensor `name`, as the GPU keeps it (`None`: absent, or a type the
    /// loader refuses anyway).
    fn dtype(&self, name: &str) -> Option<CudaDtype> {
        let &i = self.by_name.get(name)?;
        match self.st[i].1.tensor(name).ok()?.dtype() {
            Dtype::F32 => Some(CudaDtype::F32),
            Dtype::F16 => Some(CudaDtype::F16),
            Dtype::BF16 => Some(CudaDtype::Bf16),
            _ => None,
        }
    }

    /// The storage type of tensor `name` as a packed matrix can hold it (`None`: absent, or a
    /// type the loader refuses anyway).
    fn stored(&self, name: &str) -> Option<WeightDtype> {
        self.dtype(name).map(|d| match d {
            CudaDtype::F32 => WeightDtype::F32,
            CudaDtype::Bf16 => WeightDtype::Bf16,
            CudaDtype::F16 => WeightDtype::F16,
        })
    }

    /// Tensor `name`, checked against `shape` and marked used.
    fn view(&self, name: &str, shape: &[usize]) -> Result<safetensors::tensor::TensorView<'_>> {
        let missing = || ModelError::MissingTensor {
            name: name.into(),
            file: (self.st.len() == 1).then(|| self.st[0].0.to_path_buf()),
        };
        let &i = self.by_name.get(name).ok_or_else(missing)?;
        let (_, st) = &self.st[i];
        let t = st.tensor(name).map_err(|_| missing())?;
        self.mark_used(name);
        if t.shape() != shape {
            return Err(ModelError::BadShape {
                name: name.into(),
                expected: shape.to_vec(),
                got: t.shape().to_vec(),
            });
        }
        Ok(t)
    }

    /// The type `--weight-dtype` resolves for the stored types of `parts`.
    fn matrix_dtype(&self, parts: &[(String, Vec<usize>)]) -> WeightDtype {
        let stored: Vec<WeightDtype> = parts
            .iter()
            .map(|(n, _)| self.stored(n).unwrap_or(WeightDtype::F32))
            .collect();
        self.want.resolve(&stored)
    }

    /// A weight matrix fused from `parts` (row blocks `(name, shape)`, in order), in the type
    /// `--weight-dtype` resolves for their stored types, not packed.
    fn elems_of(&self, parts: &[(String, Vec<usize>)]) -> Result<Elems> {
        let dtype = self.matrix_dtype(parts);
        let mut m = Elems::empty(dtype);
        for (name, shape) in parts {
            m.extend(self.elems(name, shape, dtype)?);
        }
        Ok(m)
    }

    /// The `[n, k]` weight matrix fused from `parts`, packed (or viewed) as the sink says; its
    /// name is that of its first part.
    fn matrix(&self, parts: &[(String, Vec<usize>)], n: usize, k: usize) -> Result<PackedMatrix> {
        let name = &parts[0].0;
        match self.sink {
            Sink::Map(file) => {
                for (part, shape) in parts {
                    self.view(part, shape)?;
                }
                file.view(name, n, k, self.matrix_dtype(parts))
            }
            _ => self.sink_packed(name, self.elems_of(parts)?.pack(n, k)),
        }
    }

    /// One matrix tensor (`matrix` of one part), packed as `[n, k]`.
    fn packed(&self, name: &str, n: usize, k: usize) -> Result<PackedMatrix> {
        self.matrix(&[(name.to_string(), vec![n, k])], n, k)
    }

    /// The `[e, n, k]` tensor `name` as `e` matrices `[n, k]` (experts fused in one tensor);
    /// matrix `x` is named `name[x]`.
    fn stacked(&self, name: &str, e: usize, n: usize, k: usize) -> Result<Vec<PackedMatrix>> {
        let parts = [(name.to_string(), vec![e, n, k])];
        let one = |x: usize| format!("{name}[{x}]");
        match self.sink {
            Sink::Map(file) => {
                self.view(name, &parts[0].1)?;
                let dtype = self.matrix_dtype(&parts);
                (0..e).map(|x| file.view(&one(x), n, k, dtype)).collect()
            }
            _ => {
                let all = self.elems_of(&parts)?;
                (0..e)
                    .map(|x| {
                        self.sink_packed(&one(x), all.pack_range(x * n * k..(x + 1) * n * k, n, k))
                    })
                    .collect()
            }
        }
    }

    /// The untied output projection `lm_head.weight` (`[v, h]`), or `None` when it equals the
    /// embedding table (an explicit copy costs memory for nothing: the two share).
    fn untied_head(&self, v: usize, h: usize) -> Result<Option<PackedMatrix>> {
        let head = [("lm_head.weight".to_string(), vec![v, h])];
        if let Sink::Map(file) = self.sink {
            // The file holds the head only when it was not a copy.
            self.view(&head[0].0, &head[0].1)?;
            return match file.contains(&head[0].0) {
                true => Ok(Some(self.matrix(&head, v, h)?)),
                false => Ok(None),
            };
        }
        let embed = [("model.embed_tokens.weight".to_string(), vec![v, h])];
        // Stored alike, the bytes tell (the embedding table was read and packed already; its
        // values are not converted a second time). Stored in two types, the values do.
        let (hv, ev) = (
            self.view(&head[0].0, &head[0].1)?,
            self.view(&embed[0].0, &embed[0].1)?,
        );
        let copy = match hv.dtype() == ev.dtype() {
            true => hv.data() == ev.data(),
            false => self.elems_of(&head)? == self.elems_of(&embed)?,
        };
        match copy {
            true => Ok(None),
            false => Ok(Some(
                self.sink_packed(&head[0].0, self.elems_of(&head)?.pack(v, h))?,
            )),
        }
    }

    /// `m` (matrix `name`) kept as the sink says: returned ([`Sink::Own`]), or written to the
    /// packed weight file and replaced by an empty stand-in ([`Sink::Write`]).
    fn sink_packed(&self, name: &str, m: PackedMatrix) -> Result<PackedMatrix> {
        match self.sink {
            Sink::Write(w) => {
                w.borrow_mut().append(name, &m)?;
                Ok(PackedMatrix::pack(&[], 0, 0))
            }
            _ => Ok(m),
        }
    }

    /// Tensor `name` in `dtype`: its bits as stored when it is stored so, else converted
    /// (widened exactly, or rounded to nearest even).
    fn elems(&self, name: &str, shape: &[usize], dtype: WeightDtype) -> Result<Elems> {
        if dtype == WeightDtype::F32 {
            return Ok(Elems::F32(self.get(name, shape)?));
        }
        if self.stored(name) == Some(dtype) {
            let bits = self
                .view(name, shape)?
                .data()
                .par_chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect();
            return Ok(Elems::Bits(bits, dtype));
        }
        Ok(Elems::Bits(narrow(&self.get(name, shape)?, dtype), dtype))
    }

    /// Norm weights `name` (`[len]`) as the forward pass multiplies by them: Gemma's norms
    /// multiply by `1 + w`, folded in here (in f32, as transformers adds), so the forward pass
    /// has one RMSNorm.
    fn norm(&self, name: &str, len: usize, gemma: bool) -> Result<Vec<f32>> {
        let mut w = self.get(name, &[len])?;
        if gemma {
            w.iter_mut().for_each(|x| *x += 1.0);
        }
        Ok(w)
    }

    /// The tensor as f32, checked against `shape`.
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self.view(name, shape)?;
        let data = t.data();
        let out: Vec<f32> = match t.dtype() {
            Dtype::F32 => data
                .par_chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => data
                .par_chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .par_chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(ModelError::UnsupportedDtype {
                    name: name.into(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        Ok(out)
    }
}

/// The router and experts of layer `prefix` (`model.layers.N`), as the Hub stores them
/// (Mixtral: `block_sparse_moe.gate`, `block_sparse_moe.experts.E.w1` / `w3` / `w2` for gate /
/// up / down; Qwen3-MoE: `mlp.gate`, `mlp.experts.E.gate_proj` / `up_proj` / `down_proj`), or
/// as transformers 5 holds them (`mlp.experts.gate_up_proj` `[E, 2·inter, hidden]` and
/// `mlp.experts.down_proj` `[E, hidden, inter]`).
fn load_experts(
    ix: &TensorIndex<'_>,
    cfg: &ModelConfig,
    o: &MoeOptions,
    prefix: &str,
) -> Result<MoeWeights> {
    let (h, i, e) = (cfg.hidden_size, o.expert_intermediate_size, o.num_experts);
    let fused = format!("{prefix}.mlp.experts.gate_up_proj");
    let block = match cfg.family == ModelFamily::Mixtral && !ix.contains(&fused) {
        true => format!("{prefix}.block_sparse_moe"),
        false => format!("{prefix}.mlp"),
    };
    let router = ix.packed(&format!("{block}.gate.weight"), e, h)?;
    let experts = if ix.contains(&fused) {
        let gu = ix.stacked(&fused, e, 2 * i, h)?;
        let down = ix.stacked(&format!("{block}.experts.down_proj"), e, h, i)?;
        gu.into_iter().zip(down).collect()
    } else {
        let [gate, up, down] = match cfg.family {
            ModelFamily::Mixtral => ["w1", "w3", "w2"],
            _ => ["gate_proj", "up_proj", "down_proj"],
        };
        let mut experts = Vec::with_capacity(e);
        for x in 0..e {
            let t = |name: &str| format!("{block}.experts.{x}.{name}.weight");
            let gu = ix.matrix(&[(t(gate), vec![i, h]), (t(up), vec![i, h])], 2 * i, h)?;
            experts.push((gu, ix.packed(&t(down), h, i)?));
        }
        experts
    };
    let shared = match o.shared_expert_intermediate_size {
        Some(si) => {
            let t = |name: &str| format!("{block}.{name}");
            let gu = ix.matrix(
                &[
                    (t("shared_expert.gate_proj.weight"), vec![si, h]),
                    (t("shared_expert.up_proj.weight"), vec![si, h]),
                ],
                2 * si,
                h,
            )?;
            Some(SharedExpert {
                wgu: gu,
                wdown: ix.packed(&t("shared_expert.down_proj.weight"), h, si)?,
                gate: ix.packed(&t("shared_expert_gate.weight"), 1, h)?,
            })
        }
        None => None,
    };
    Ok(MoeWeights {
        router,
        experts,
        shared,
    })
}

/// Loads every weight of `cfg` from the safetensors files of `dir`, the matrices in the type
/// `want` resolves: packed in this process's memory, or, with `cache` (`--weight-cache`),
/// viewed in this host's packed weight file of the checkpoint, written first when there is none
/// that reads back (see [`packed_file`]).
pub(crate) fn load_weights(
    dir: &Path,
    cfg: &ModelConfig,
    want: LoadDtype,
    cache: Option<&Path>,
) -> Result<Weights> {
    let shards = Shards::open(shard_files(dir)?)?;
    let Some(cache) = cache else {
        return load_into(&shards, cfg, want, &Sink::Own);
    };
    let key = packed_file::Key::new(dir, &shards.files, want)?;
    // Held until this rank has mapped the file: the ranks that wait map the one it wrote.
    let _lock = packed_file::lock(cache, &key)?;
    let existing = match PackedFile::open(cache, &key) {
        Ok(file) => file,
        Err(e) if e.is_packed_file() => {
            tracing::warn!(error = %e, "writing the packed weight file again");
            None
        }
        Err(e) => return Err(e),
    };
    if let Some(file) = existing {
        match load_into(&shards, cfg, want, &Sink::Map(&file)) {
            Err(e) if e.is_packed_file() => {
                tracing::warn!(error = %e, "writing the packed weight file again")
            }
            loaded => {
                tracing::info!(
                    file = %file.path().display(),
                    bytes = file.len(),
                    "weight matrices mapped from this host's packed weight file"
                );
                return loaded;
            }
        }
    }
    let started = std::time::Instant::now();
    let sink = Sink::Write(RefCell::new(PackedWriter::create(cache, &key)?));
    load_into(&shards, cfg, want, &sink)?;
    let Sink::Write(writer) = sink else {
        unreachable!("the sink written to")
    };
    let path = writer.into_inner().finish()?;
    tracing::info!(
        file = %path.display(),
        seconds = started.elapsed().as_secs_f64(),
        "packed the weight matrices into this host's packed weight file (--weight-cache)"
    );
    let file = PackedFile::open(cache, &key)?.ok_or_else(|| ModelError::PackedFile {
        path,
        reason: "it was gone right after it was written".into(),
    })?;
    let weights = load_into(&shards, cfg, want, &Sink::Map(&file))?;
    tracing::info!(
        file = %file.path().display(),
        bytes = file.len(),
        "weight matrices mapped from this host's packed weight file"
    );
    Ok(weights)
}

/// The vectors of an attention block that the config asks for.
struct AttentionVectors {
    /// The fused q/k/v bias.
    bqkv: Option<Vec<f32>>,
    /// Qwen3's per-head q and k norms.
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// The output projection's bias.
    bo: Option<Vec<f32>>,
}

/// Attention block `a`'s [`AttentionVectors`].
fn attention_vectors(ix: &TensorIndex<'_>, cfg: &ModelConfig, a: &str) -> Result<AttentionVectors> {
    let (h, q, kv, d) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
    let bqkv = if cfg.qkv_bias {
        let mut b = ix.get(&format!("{a}.q_proj.bias"), &[q])?;
        b.extend(ix.get(&format!("{a}.k_proj.bias"), &[kv])?);
        b.extend(ix.get(&format!("{a}.v_proj.bias"), &[kv])?);
        Some(b)
    } else {
        None
    };
    let gemma = cfg.gemma.is_some();
    let qk_norm = match cfg.qk_norm {
        true => Some((
            ix.norm(&format!("{a}.q_norm.weight"), d, gemma)?,
            ix.norm(&format!("{a}.k_norm.weight"), d, gemma)?,
        )),
        false => None,
    };
    let bo = match cfg.o_bias {
        true => Some(ix.get(&format!("{a}.o_proj.bias"), &[h])?),
        false => None,
    };
    Ok(AttentionVectors { bqkv, qk_norm, bo })
}

/// MLP block `m`'s fused gate/up bias and its down bias.
fn mlp_biases(
    ix: &TensorIndex<'_>,
    m: &str,
    inter: usize,
    h: usize,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let mut b = ix.get(&format!("{m}.gate_proj.bias"), &[inter])?;
    b.extend(ix.get(&format!("{m}.up_proj.bias"), &[inter])?);
    Ok((b, ix.get(&format!("{m}.down_proj.bias"), &[h])?))
}

/// Decoder layer `l`'s weights.
fn load_layer(ix: &TensorIndex<'_>, cfg: &ModelConfig, l: usize) -> Result<LayerWeights> {
    let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let (q, kv) = (cfg.q_dim(), cfg.kv_dim());
    let gemma = cfg.gemma.is_some();
    let norm = |name: &str, len: usize| ix.norm(name, len, gemma);
    let p = format!("model.layers.{l}");
    let a = format!("{p}.self_attn");
    let wqkv = ix.matrix(
        &[
            (format!("{a}.q_proj.weight"), vec![q, h]),
            (format!("{a}.k_proj.weight"), vec![kv, h]),
            (format!("{a}.v_proj.weight"), vec![kv, h]),
        ],
        q + 2 * kv,
        h,
    )?;
    let AttentionVectors { bqkv, qk_norm, bo } = attention_vectors(ix, cfg, &a)?;
    let m = format!("{p}.mlp");
    let moe = match cfg.moe.as_ref().filter(|o| o.moe_layers[l]) {
        Some(o) => Some(load_experts(ix, cfg, o, &p)?),
        None => None,
    };
    // A layer with experts has no dense MLP.
    let inter = if moe.is_some() { 0 } else { inter };
    let wgu = match inter {
        0 => PackedMatrix::pack(&[], 0, h),
        _ => ix.matrix(
            &[
                (format!("{m}.gate_proj.weight"), vec![inter, h]),
                (format!("{m}.up_proj.weight"), vec![inter, h]),
            ],
            2 * inter,
            h,
        )?,
    };
    let (bgu, bdown) = match cfg.mlp_bias {
        true => {
            let (b, down) = mlp_biases(ix, &m, inter, h)?;
            (Some(b), Some(down))
        }
        false => (None, None),
    };
    // Llama's `post_attention_layernorm` is its MLP's input norm; Gemma's norms the
    // attention output, and `pre_feedforward_layernorm` is the MLP's.
    let (mlp_norm, post_norms) = match gemma {
        true => (
            norm(&format!("{p}.pre_feedforward_layernorm.weight"), h)?,
            Some((
                norm(&format!("{p}.post_attention_layernorm.weight"), h)?,
                norm(&format!("{p}.post_feedforward_layernorm.weight"), h)?,
            )),
        ),
        false => (
            norm(&format!("{p}.post_attention_layernorm.weight"), h)?,
            None,
        ),
    };
    Ok(LayerWeights {
        attn_norm: norm(&format!("{p}.input_layernorm.weight"), h)?,
        wqkv,
        bqkv,
        qk_norm,
        wo: ix.packed(&format!("{a}.o_proj.weight"), h, q)?,
        bo,
        mlp_norm,
        wgu,
        bgu,
        wdown: match inter {
            0 => PackedMatrix::pack(&[], h, 0),
            _ => ix.packed(&format!("{m}.down_proj.weight"), h, inter)?,
        },
        bdown,
        post_norms,
        moe,
    })
}

/// [`load_weights`] with each matrix going to `sink`.
fn load_into(
    shards: &Shards,
    cfg: &ModelConfig,
    want: LoadDtype,
    sink: &Sink<'_>,
) -> Result<Weights> {
    let ix = shards.parse(want, sink)?;
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    let embed = ix.packed("model.embed_tokens.weight", v, h)?;
    let layers = (0..cfg.num_hidden_layers)
        .map(|l| load_layer(&ix, cfg, l))
        .collect::<Result<Vec<_>>>()?;
    let norm = ix.norm("model.norm.weight", h, cfg.gemma.is_some())?;
    let lm_head = if ix.contains("lm_head.weight") {
        ix.untied_head(v, h)?
    } else if cfg.tie_word_embeddings {
        None
    } else {
        return Err(ModelError::MissingTensor {
            name: "lm_head.weight".into(),
            file: None,
        });
    };
    if let Some(name) = ix.first_unused() {
        return Err(ModelError::UnusedTensor {
            name,
            family: cfg.family.architecture().into(),
        });
    }
    Ok(Weights {
        embed,
        layers,
        norm,
        lm_head,
        rope: cfg.rope(),
        local_rope: cfg.local_rope(),
        dtype: ix
            .dtype("model.embed_tokens.weight")
            .unwrap_or(CudaDtype::F32),
    })
}
