//! The checkpoint's tensors: the shard files mapped, one name → tensor index across them, and
//! each tensor read, checked and converted (or packed, or viewed in a packed weight file).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use kernels::cuda::CudaDtype;
use kernels::{PackedMatrix, WeightDtype};
use memmap2::Mmap;
use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};

use crate::elems::{narrow, Elems, LoadDtype};
use crate::error::{ModelError, Result};
use crate::packed_file::{PackedFile, PackedWriter};

/// Memory maps of the shard files, kept alive while tensors are converted.
pub(super) struct Shards {
    pub(super) files: Vec<(PathBuf, Mmap)>,
}

impl Shards {
    pub(super) fn open(paths: Vec<PathBuf>) -> Result<Self> {
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

    pub(super) fn parse<'s>(
        &'s self,
        want: LoadDtype,
        sink: &'s Sink<'s>,
    ) -> Result<TensorIndex<'s>> {
        let mut st = Vec::with_capacity(self.files.len());
        let mut by_name = HashMap::new();
        for (i, (path, map)) in self.files.iter().enumerate() {
            let t = SafeTensors::deserialize(map).map_err(|e| ModelError::BadSafetensors {
                file: path.clone(),
                reason: e.to_string(),
            })?;
            for name in t.names() {
                // Two shards with one name: which one the model would get is arbitrary.
                if let Some(j) = by_name.insert(name.to_string(), i) {
                    return Err(ModelError::BadSafetensors {
                        file: path.clone(),
                        reason: format!(
                            "tensor `{name}` is also in {} (a tensor belongs to one shard)",
                            self.files[j].0.display()
                        ),
                    });
                }
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
pub(super) struct TensorIndex<'a> {
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
pub(super) enum Sink<'f> {
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
    pub(super) fn mark_used(&self, name: &str) {
        self.used.borrow_mut().insert(name.to_string());
    }

    /// The first tensor (by name) nothing read, other than the RoPE buffers old conversions
    /// saved (`rotary_emb.inv_freq`: recomputed from the config, as transformers does).
    pub(super) fn first_unused(&self) -> Option<String> {
        let used = self.used.borrow();
        let mut left: Vec<&String> = self
            .by_name
            .keys()
            .filter(|n| !used.contains(*n) && !n.ends_with("rotary_emb.inv_freq"))
            .collect();
        left.sort();
        left.first().map(|n| n.to_string())
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The storage type of tensor `name`, as the GPU keeps it (`None`: absent, or a type the
    /// loader refuses anyway).
    pub(super) fn dtype(&self, name: &str) -> Option<CudaDtype> {
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
    pub(super) fn stored(&self, name: &str) -> Option<WeightDtype> {
        self.dtype(name).map(|d| match d {
            CudaDtype::F32 => WeightDtype::F32,
            CudaDtype::Bf16 => WeightDtype::Bf16,
            CudaDtype::F16 => WeightDtype::F16,
        })
    }

    /// Tensor `name`, checked against `shape` and marked used.
    pub(super) fn view(
        &self,
        name: &str,
        shape: &[usize],
    ) -> Result<safetensors::tensor::TensorView<'_>> {
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
    pub(super) fn matrix_dtype(&self, parts: &[(String, Vec<usize>)]) -> WeightDtype {
        let stored: Vec<WeightDtype> = parts
            .iter()
            .map(|(n, _)| self.stored(n).unwrap_or(WeightDtype::F32))
            .collect();
        self.want.resolve(&stored)
    }

    /// A weight matrix fused from `parts` (row blocks `(name, shape)`, in order), in the type
    /// `--weight-dtype` resolves for their stored types, not packed.
    pub(super) fn elems_of(&self, parts: &[(String, Vec<usize>)]) -> Result<Elems> {
        let dtype = self.matrix_dtype(parts);
        let mut m = Elems::empty(dtype);
        for (name, shape) in parts {
            m.extend(self.elems(name, shape, dtype)?);
        }
        Ok(m)
    }

    /// The `[n, k]` weight matrix fused from `parts`, packed (or viewed) as the sink says; its
    /// name is that of its first part.
    pub(super) fn matrix(
        &self,
        parts: &[(String, Vec<usize>)],
        n: usize,
        k: usize,
    ) -> Result<PackedMatrix> {
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
    pub(super) fn packed(&self, name: &str, n: usize, k: usize) -> Result<PackedMatrix> {
        self.matrix(&[(name.to_string(), vec![n, k])], n, k)
    }

    /// The `[e, n, k]` tensor `name` as `e` matrices `[n, k]` (experts fused in one tensor);
    /// matrix `x` is named `name[x]`.
    pub(super) fn stacked(
        &self,
        name: &str,
        e: usize,
        n: usize,
        k: usize,
    ) -> Result<Vec<PackedMatrix>> {
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
    pub(super) fn untied_head(&self, v: usize, h: usize) -> Result<Option<PackedMatrix>> {
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
    pub(super) fn sink_packed(&self, name: &str, m: PackedMatrix) -> Result<PackedMatrix> {
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
    pub(super) fn elems(&self, name: &str, shape: &[usize], dtype: WeightDtype) -> Result<Elems> {
        match dtype {
            WeightDtype::F32 => return Ok(Elems::F32(self.get(name, shape)?)),
            WeightDtype::Q8_0 => return Ok(Elems::Q8(self.get(name, shape)?)),
            _ => {}
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
    pub(super) fn norm(&self, name: &str, len: usize, gemma: bool) -> Result<Vec<f32>> {
        let mut w = self.get(name, &[len])?;
        if gemma {
            w.iter_mut().for_each(|x| *x += 1.0);
        }
        Ok(w)
    }

    /// The tensor as f32, checked against `shape`.
    pub(super) fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    /// A safetensors file of f32 tensors `(name, shape)`, each filled with its index.
    fn write(path: &Path, tensors: &[(&str, Vec<usize>)]) {
        let data: Vec<Vec<u8>> = tensors
            .iter()
            .enumerate()
            .map(|(i, (_, shape))| {
                let n: usize = shape.iter().product();
                (0..n).flat_map(|_| (i as f32).to_le_bytes()).collect()
            })
            .collect();
        let views: Vec<(&str, TensorView<'_>)> = tensors
            .iter()
            .zip(&data)
            .map(|((name, shape), d)| {
                (
                    *name,
                    TensorView::new(Dtype::F32, shape.clone(), d).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, &None, path).unwrap();
    }

    #[test]
    fn a_tensor_is_read_once_checked_against_its_shape_and_counted_used() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        write(
            &path,
            &[
                ("a", vec![2, 3]),
                ("b", vec![4]),
                ("model.rotary_emb.inv_freq", vec![2]),
            ],
        );
        let shards = Shards::open(vec![path.clone()]).unwrap();
        let sink = Sink::Own;
        let ix = shards.parse(LoadDtype::F32, &sink).unwrap();
        assert_eq!(ix.dtype("a"), Some(CudaDtype::F32));
        assert_eq!(ix.dtype("nope"), None);
        assert_eq!(ix.first_unused().as_deref(), Some("a"));
        let e = ix.view("a", &[3, 2]).unwrap_err();
        assert!(
            matches!(&e, ModelError::BadShape { name, expected, got }
                if name == "a" && expected == &[3, 2] && got == &[2, 3]),
            "{e}"
        );
        assert_eq!(ix.view("a", &[2, 3]).unwrap().shape(), [2, 3]);
        // The RoPE buffer old conversions saved is never asked for, nor reported unused.
        assert_eq!(ix.first_unused().as_deref(), Some("b"));
        ix.view("b", &[4]).unwrap();
        assert_eq!(ix.first_unused(), None);
        let e = ix.view("c", &[1]).unwrap_err();
        assert!(
            matches!(&e, ModelError::MissingTensor { name, file: Some(f) } if name == "c" && f == &path),
            "{e}"
        );
    }

    #[test]
    fn a_tensor_in_two_shards_is_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let (one, two) = (
            dir.path().join("1.safetensors"),
            dir.path().join("2.safetensors"),
        );
        write(&one, &[("a", vec![2]), ("b", vec![2])]);
        write(&two, &[("b", vec![2]), ("c", vec![2])]);
        let shards = Shards::open(vec![one.clone(), two.clone()]).unwrap();
        let sink = Sink::Own;
        let Err(e) = shards.parse(LoadDtype::F32, &sink) else {
            panic!("a tensor in two shards was accepted")
        };
        let text = e.to_string();
        assert!(
            text.contains("`b`")
                && text.contains("1.safetensors")
                && text.contains("2.safetensors"),
            "{text}"
        );
    }

    #[test]
    fn a_file_that_is_not_safetensors_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        for bytes in [
            &b""[..],
            &b"\x10\0\0\0\0\0\0\0{\"a\":"[..],
            &[0xffu8; 16][..],
        ] {
            std::fs::write(&path, bytes).unwrap();
            let shards = Shards::open(vec![path.clone()]).unwrap();
            let sink = Sink::Own;
            let Err(e) = shards.parse(LoadDtype::F32, &sink) else {
                panic!("{bytes:?} parsed")
            };
            assert!(
                matches!(&e, ModelError::BadSafetensors { file, .. } if file == &path),
                "{e}"
            );
        }
        let gone = dir.path().join("gone.safetensors");
        let Err(e) = Shards::open(vec![gone.clone()]) else {
            panic!("a missing shard opened")
        };
        assert!(e.to_string().contains("gone.safetensors"), "{e}");
    }
}
