//! The storage types of packed weight matrices ([`WeightDtype`]): f32, and the 16-bit bf16 and
//! f16 that checkpoints are saved in. Only storage: every kernel widens a 16-bit weight to f32
//! (exactly: both types are subsets of f32) and then computes the f32 contract of `gemm.rs`, so
//! a bf16 matrix gives bit for bit the results of the same values widened at load.

use std::fmt;
use std::str::FromStr;

/// How a packed matrix stores its elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightDtype {
    F32,
    Bf16,
    F16,
    /// llama.cpp's Q8_0: blocks of 32 int8 weights with one f16 scale (`gemm::q8`). Made at
    /// load from another type (lossy), never read from a packed weight file.
    Q8_0,
}

impl WeightDtype {
    /// Every storage type.
    pub const ALL: [WeightDtype; 4] = [
        WeightDtype::F32,
        WeightDtype::Bf16,
        WeightDtype::F16,
        WeightDtype::Q8_0,
    ];

    /// `f32`, `bf16`, `f16` (flags, logs, `/get_server_info`).
    pub fn name(self) -> &'static str {
        match self {
            WeightDtype::F32 => "f32",
            WeightDtype::Bf16 => "bf16",
            WeightDtype::F16 => "f16",
            WeightDtype::Q8_0 => "q8_0",
        }
    }

    /// Bytes per element (Q8_0: its quant; the block scales add 1/16 of a byte).
    pub fn bytes(self) -> usize {
        match self {
            WeightDtype::F32 => 4,
            WeightDtype::Bf16 | WeightDtype::F16 => 2,
            WeightDtype::Q8_0 => 1,
        }
    }
}

impl fmt::Display for WeightDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WeightDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("{s:?} is not a weight dtype (f32, bf16, f16, q8_0)"))
    }
}

/// A bf16 value, as its bits (the high half of an f32).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bf16(pub u16);

/// An IEEE binary16 value, as its bits.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct F16(pub u16);

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::Bf16 {}
    impl Sealed for super::F16 {}
    impl Sealed for u8 {}
}

/// Plain data a matrix's panels are stored as (owned, or viewed in shared bytes): every bit
/// pattern valid, no padding. The element types, and the bytes of Q8_0 panels.
pub trait Plain: sealed::Sealed + Copy + Default + Send + Sync + 'static {}
impl Plain for f32 {}
impl Plain for Bf16 {}
impl Plain for F16 {}
impl Plain for u8 {}

/// An element type a [`crate::PackedMatrix`] can hold.
pub trait PackedElem: Plain {
    const DTYPE: WeightDtype;

    /// The value as f32 (exact).
    fn widen(self) -> f32;
}

impl PackedElem for f32 {
    const DTYPE: WeightDtype = WeightDtype::F32;

    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl PackedElem for Bf16 {
    const DTYPE: WeightDtype = WeightDtype::Bf16;

    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

impl PackedElem for F16 {
    const DTYPE: WeightDtype = WeightDtype::F16;

    #[inline(always)]
    fn widen(self) -> f32 {
        f16_to_f32(self.0)
    }
}

/// binary16 → f32, exactly (subnormals, infinities and NaN payloads included), without
/// branches the vectoriser cannot follow: the exponent is rebiased, and a subnormal is
/// renormalised by an exact f32 subtraction.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    const EXP: u32 = 0x7c00 << 13; // the f16 exponent field, moved to f32's
    let sign = ((h as u32) & 0x8000) << 16;
    let mut o = ((h as u32) & 0x7fff) << 13;
    let exp = o & EXP;
    o += (127 - 15) << 23;
    let v = if exp == EXP {
        // Inf / NaN: all-ones exponent.
        f32::from_bits(o + ((128 - 16) << 23))
    } else if exp == 0 {
        // Zero / subnormal: (1.m · 2^-14) − 2^-14 = 0.m · 2^-14.
        f32::from_bits(o + (1 << 23)) - f32::from_bits(113 << 23)
    } else {
        f32::from_bits(o)
    };
    f32::from_bits(v.to_bits() | sign)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_widening_is_exact_for_every_value() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = f16_to_f32(h);
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
            }
        }
    }

    #[test]
    fn bf16_widening_is_the_high_half() {
        for b in [0u16, 0x3f80, 0xbf80, 0x7f80, 0x0001, 0x8000, 0x7fc0] {
            let want = half::bf16::from_bits(b).to_f32();
            assert_eq!(Bf16(b).widen().to_bits(), want.to_bits(), "{b:#06x}");
        }
    }

    #[test]
    fn names_round_trip() {
        for d in WeightDtype::ALL {
            assert_eq!(d.name().parse::<WeightDtype>(), Ok(d));
        }
        assert!("fp8".parse::<WeightDtype>().is_err());
    }
}
