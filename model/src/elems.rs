//! What type the loaded weight matrices are held in ([`LoadDtype`], `--weight-dtype`) and a
//! matrix's elements on their way from the checkpoint to [`PackedMatrix`] ([`Elems`]). Not the
//! kernels' storage itself (`kernels::wdtype`), nor the small vectors (norms, biases), which are
//! always f32.

use std::fmt;
use std::ops::Range;

use kernels::{PackedMatrix, WeightDtype};

/// `--weight-dtype`: the type the weight matrices are kept in on the CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LoadDtype {
    /// The checkpoint's own: bf16 and f16 stay 16-bit, f32 stays f32 (a matrix fused from parts
    /// of different types is f32). Lossless, and results equal `f32`'s bit for bit: the kernels
    /// widen every weight exactly.
    #[default]
    Auto,
    /// Every matrix widened to f32 at load (twice the memory of a 16-bit checkpoint).
    F32,
    /// Every matrix in bf16; a matrix stored in another type is rounded (to nearest even).
    Bf16,
    /// Every matrix in f16; a matrix stored in another type is rounded (to nearest even).
    F16,
    /// Every matrix quantized to llama.cpp's Q8_0 (blocks of 32 int8 weights, one f16 scale
    /// each; lossy) as it is packed, from its values widened to f32.
    Q8_0,
}

impl LoadDtype {
    /// Every choice, as `--weight-dtype` lists them.
    pub const ALL: [LoadDtype; 5] = [
        LoadDtype::Auto,
        LoadDtype::F32,
        LoadDtype::Bf16,
        LoadDtype::F16,
        LoadDtype::Q8_0,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LoadDtype::Auto => "auto",
            LoadDtype::F32 => "f32",
            LoadDtype::Bf16 => "bf16",
            LoadDtype::F16 => "f16",
            LoadDtype::Q8_0 => "q8_0",
        }
    }

    /// The type of a matrix whose parts are stored in `stored` (one entry per part).
    pub fn resolve(self, stored: &[WeightDtype]) -> WeightDtype {
        match self {
            LoadDtype::Q8_0 => WeightDtype::Q8_0,
            LoadDtype::Auto => match stored.split_first() {
                Some((&first, rest)) if rest.iter().all(|&d| d == first) => first,
                _ => WeightDtype::F32,
            },
            LoadDtype::F32 => WeightDtype::F32,
            LoadDtype::Bf16 => WeightDtype::Bf16,
            LoadDtype::F16 => WeightDtype::F16,
        }
    }
}

impl fmt::Display for LoadDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A row-major matrix's elements in the type it will be packed in: f32 values, the bits of
/// a 16-bit type, or f32 values to quantize to Q8_0 as they are packed.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Elems {
    F32(Vec<f32>),
    Bits(Vec<u16>, WeightDtype),
    Q8(Vec<f32>),
}

impl Elems {
    /// No elements, in `dtype`.
    pub fn empty(dtype: WeightDtype) -> Self {
        match dtype {
            WeightDtype::F32 => Elems::F32(Vec::new()),
            WeightDtype::Q8_0 => Elems::Q8(Vec::new()),
            d => Elems::Bits(Vec::new(), d),
        }
    }

    pub fn dtype(&self) -> WeightDtype {
        match self {
            Elems::F32(_) => WeightDtype::F32,
            Elems::Bits(_, d) => *d,
            Elems::Q8(_) => WeightDtype::Q8_0,
        }
    }

    /// Appends `more` (rows of the same width, in the same type: the loader reads every part
    /// of a fused matrix in the type it resolved for the whole).
    ///
    /// # Panics
    /// If the types differ (a loader bug).
    pub fn extend(&mut self, more: Elems) {
        match (self, more) {
            (Elems::F32(a), Elems::F32(b)) | (Elems::Q8(a), Elems::Q8(b)) => a.extend(b),
            (Elems::Bits(a, da), Elems::Bits(b, db)) if *da == db => a.extend(b),
            (a, b) => panic!("fusing a {} part into a {} matrix", b.dtype(), a.dtype()),
        }
    }

    /// The `[n, k]` matrix packed for the GEMM kernels, in its type.
    pub fn pack(&self, n: usize, k: usize) -> PackedMatrix {
        self.pack_range(0..self.len(), n, k)
    }

    /// Elements `range` (a whole `[n, k]` matrix of a stack of them) packed.
    pub fn pack_range(&self, range: Range<usize>, n: usize, k: usize) -> PackedMatrix {
        match self {
            Elems::F32(v) => PackedMatrix::pack(&v[range], n, k),
            Elems::Bits(v, d) => PackedMatrix::pack_16bit(&v[range], n, k, *d),
            Elems::Q8(v) => PackedMatrix::pack_q8_0(&v[range], n, k),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Elems::F32(v) | Elems::Q8(v) => v.len(),
            Elems::Bits(v, _) => v.len(),
        }
    }
}

/// `v` as bits of 16-bit `dtype`, rounded to nearest even (NaN stays NaN).
pub(crate) fn narrow(v: &[f32], dtype: WeightDtype) -> Vec<u16> {
    match dtype {
        WeightDtype::Bf16 => v
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect(),
        WeightDtype::F16 => v
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect(),
        WeightDtype::F32 | WeightDtype::Q8_0 => panic!("narrow to {dtype}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_keeps_a_uniform_type_and_widens_a_mixed_one() {
        use WeightDtype::*;
        assert_eq!(LoadDtype::Auto.resolve(&[Bf16, Bf16, Bf16]), Bf16);
        assert_eq!(LoadDtype::Auto.resolve(&[F16]), F16);
        assert_eq!(LoadDtype::Auto.resolve(&[F32, F32]), F32);
        assert_eq!(LoadDtype::Auto.resolve(&[Bf16, F16]), F32);
        assert_eq!(LoadDtype::Auto.resolve(&[Bf16, F32]), F32);
        assert_eq!(LoadDtype::F32.resolve(&[Bf16]), F32);
        assert_eq!(LoadDtype::Bf16.resolve(&[F32, F16]), Bf16);
        assert_eq!(LoadDtype::F16.resolve(&[Bf16]), F16);
        assert_eq!(LoadDtype::Q8_0.resolve(&[Bf16, F16]), Q8_0);
    }

    #[test]
    fn fused_parts_pack_as_one_matrix() {
        let mut e = Elems::empty(WeightDtype::Bf16);
        e.extend(Elems::Bits(vec![0x3f80; 4], WeightDtype::Bf16));
        e.extend(Elems::Bits(vec![0x4000; 4], WeightDtype::Bf16));
        let m = e.pack(4, 2);
        assert_eq!(m.dtype(), WeightDtype::Bf16);
        assert_eq!(m.unpack(), [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]);
        assert_eq!(narrow(&[1.0, -2.0], WeightDtype::Bf16), [0x3f80, 0xc000]);
    }
}
