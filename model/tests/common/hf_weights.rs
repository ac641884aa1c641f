//! The weights of the Hugging Face parity fixtures, generated at test time: no checkpoint is
//! stored in the repository. `reference.json` lists each tensor (name, shape, mean, std and an
//! FNV-1a 64 hash of its bf16 bits); this module regenerates the bits, checks the hashes and
//! writes the bf16 `model.safetensors` the loader reads. Not a general safetensors writer.
//!
//! The generator is fixed forever and is the same, bit for bit, as `bf16_bits` in
//! `tests/python/make_model_fixtures.py` (which computed the reference logits from it):
//! tensor `name` of a fixture with seed `seed` is a SplitMix64 stream whose state starts at
//! (the first draw of a SplitMix64 seeded with `seed`) XOR (FNV-1a 64 of the name's UTF-8); its
//! k-th draw `r` gives the k-th value in row-major order:
//!   s = the sum of r's four 16-bit lanes (Irwin–Hall: mean 131070, variance (2^32 − 1) / 3),
//!   x = mean + std · ((s − 131070) / sqrt(1431655765))   in f64,
//! then `x` rounded to f32 and the f32 to bf16, both to nearest with ties to even. Integer
//! arithmetic and IEEE-754 `+ · / sqrt` only (each correctly rounded, so Python gets the same
//! bits); `mean` and `std` are short decimals (`std` to 4 significant digits) that serde_json
//! reads exactly.

use std::collections::HashMap;
use std::path::Path;

use protocol::hash::{fnv1a64, splitmix64_mix as mix64, SPLITMIX64_GAMMA as GAMMA};
use safetensors::{Dtype, View};

/// The generator `reference.json` must name (`"weights"`).
pub const WEIGHTS: &str = "splitmix64-irwin-hall-4/bf16";

const IRWIN_HALL_MEAN: i64 = 131_070;
/// (2^32 − 1) / 3, the variance of the sum of four uniform 16-bit lanes.
const IRWIN_HALL_VARIANCE: f64 = 1_431_655_765.0;

/// An f32 rounded to bf16 (to nearest, ties to even; no NaN occurs here).
fn bf16_of(f: f32) -> u16 {
    let bits = u64::from(f.to_bits());
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// One tensor as `reference.json` lists it.
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub mean: f64,
    pub std: f64,
    /// FNV-1a 64 over the bf16 values' little-endian bytes (the safetensors data).
    pub fnv1a64: u64,
}

impl TensorSpec {
    /// From one entry of `reference.json`'s `"tensors"`.
    pub fn from_json(t: &serde_json::Value) -> Result<Self, String> {
        let name = t["name"].as_str().ok_or("a tensor without a name")?;
        let field = |k: &str| t[k].as_f64().ok_or(format!("{name}: no number `{k}`"));
        let shape = t["shape"]
            .as_array()
            .and_then(|s| s.iter().map(|d| d.as_u64().map(|d| d as usize)).collect())
            .ok_or(format!("{name}: no `shape`"))?;
        let hash = t["fnv1a64"]
            .as_str()
            .ok_or(format!("{name}: no `fnv1a64`"))?;
        Ok(TensorSpec {
            name: name.to_string(),
            shape,
            mean: field("mean")?,
            std: field("std")?,
            fnv1a64: u64::from_str_radix(hash, 16)
                .map_err(|e| format!("{name}: `fnv1a64` {hash:?}: {e}"))?,
        })
    }

    /// The tensor's values from fixture seed `seed`, as bf16 bit patterns in row-major order.
    pub fn generate(&self, seed: u64) -> Vec<u16> {
        let sigma = IRWIN_HALL_VARIANCE.sqrt();
        let mut state = mix64(seed.wrapping_add(GAMMA)) ^ fnv1a64(self.name.as_bytes());
        let n: usize = self.shape.iter().product();
        (0..n)
            .map(|_| {
                state = state.wrapping_add(GAMMA);
                let r = mix64(state);
                let s: i64 = (0..4).map(|i| ((r >> (16 * i)) & 0xffff) as i64).sum();
                let x = self.mean + self.std * ((s - IRWIN_HALL_MEAN) as f64 / sigma);
                bf16_of(x as f32)
            })
            .collect()
    }
}

/// A bf16 tensor ready for safetensors.
pub struct Bf16Tensor {
    pub shape: Vec<usize>,
    /// Little-endian bf16 values.
    pub data: Vec<u8>,
}

impl View for &Bf16Tensor {
    fn dtype(&self) -> Dtype {
        Dtype::BF16
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        (&self.data[..]).into()
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Every listed tensor generated from `seed`, each first checked against its recorded hash (a
/// mismatch names the tensor: the generator here and the script's have diverged, or
/// `reference.json` was edited).
pub fn generate_checked(
    seed: u64,
    specs: &[TensorSpec],
) -> Result<HashMap<String, Bf16Tensor>, String> {
    specs
        .iter()
        .map(|spec| {
            let data: Vec<u8> = spec
                .generate(seed)
                .into_iter()
                .flat_map(u16::to_le_bytes)
                .collect();
            let got = fnv1a64(&data);
            if got != spec.fnv1a64 {
                return Err(format!(
                    "tensor {}: the generated bf16 values hash to {got:016x}, reference.json \
                     records {:016x}",
                    spec.name, spec.fnv1a64
                ));
            }
            let t = Bf16Tensor {
                shape: spec.shape.clone(),
                data,
            };
            Ok((spec.name.clone(), t))
        })
        .collect()
}

/// `tensors` as a safetensors file at `path`.
pub fn write_safetensors(path: &Path, tensors: &HashMap<String, Bf16Tensor>) {
    safetensors::serialize_to_file(tensors.iter(), &None, path)
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}
