//! Loading Hugging Face safetensors (single file or sharded) into `Weights`: weight matrices in
//! the type `--weight-dtype` resolves (F32/F16/BF16 kept or converted), norms and biases in f32. Every failure names the file and the tensor; a tensor the configured
//! model does not use is refused (a checkpoint with more parts than its config describes).

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use kernels::cuda::CudaDtype;
use kernels::PackedMatrix;

use crate::config::ModelConfig;
use crate::elems::LoadDtype;
use crate::error::{ModelError, Result};
use crate::moe::{MoeOptions, MoeWeights, SharedExpert};
use crate::packed_file::{self, PackedFile, PackedWriter};
use crate::support::ModelFamily;
use crate::weights::{LayerWeights, Weights};

mod tensors;

use tensors::{Shards, Sink, TensorIndex};

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

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(dir: &Path, name: &str) {
        std::fs::write(dir.join(name), b"").unwrap();
    }

    #[test]
    fn without_an_index_every_safetensors_file_is_a_shard_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.safetensors", "a.safetensors", "config.json", "c.bin"] {
            touch(dir.path(), name);
        }
        let files = shard_files(dir.path()).unwrap();
        assert_eq!(
            files,
            [
                dir.path().join("a.safetensors"),
                dir.path().join("b.safetensors")
            ]
        );
    }

    #[test]
    fn an_index_names_its_shards_once_each_and_only_those() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["m-2.safetensors", "m-1.safetensors", "stray.safetensors"] {
            touch(dir.path(), name);
        }
        let index = serde_json::json!({"weight_map": {
            "x": "m-2.safetensors", "y": "m-1.safetensors", "z": "m-2.safetensors"}});
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            index.to_string(),
        )
        .unwrap();
        let files = shard_files(dir.path()).unwrap();
        assert_eq!(
            files,
            [
                dir.path().join("m-1.safetensors"),
                dir.path().join("m-2.safetensors")
            ]
        );
    }

    #[test]
    fn a_missing_shard_or_a_bad_index_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join("model.safetensors.index.json");
        std::fs::write(&index, r#"{"weight_map": {"x": "gone.safetensors"}}"#).unwrap();
        let e = shard_files(dir.path()).unwrap_err();
        assert!(
            matches!(&e, ModelError::MissingFile { path } if path.ends_with("gone.safetensors")),
            "{e}"
        );
        std::fs::write(&index, r#"{"weight_map": {"x": 7}}"#).unwrap();
        let e = shard_files(dir.path()).unwrap_err();
        assert!(
            matches!(&e, ModelError::MissingField { file, field } if file == &index && field == "weight_map"),
            "{e}"
        );
        std::fs::write(&index, r#"{"metadata": {}}"#).unwrap();
        let e = shard_files(dir.path()).unwrap_err();
        assert!(matches!(&e, ModelError::MissingField { .. }), "{e}");
        std::fs::write(&index, "{not json").unwrap();
        let e = shard_files(dir.path()).unwrap_err();
        assert!(
            matches!(&e, ModelError::BadJson { path, .. } if path == &index),
            "{e}"
        );
        assert!(
            e.to_string().contains("model.safetensors.index.json"),
            "{e}"
        );
    }

    #[test]
    fn a_directory_without_safetensors_names_the_file_it_looked_for() {
        let dir = tempfile::tempdir().unwrap();
        touch(dir.path(), "config.json");
        let e = shard_files(dir.path()).unwrap_err();
        assert!(
            matches!(&e, ModelError::MissingFile { path } if path.ends_with("model.safetensors")),
            "{e}"
        );
        assert!(e.to_string().contains("model.safetensors"), "{e}");
    }
}
