//! The small non-cryptographic hashes every crate shares: SplitMix64 (Steele, Lea and Flood
//! 2014; Vigna's `splitmix64.c`) as a mixing function and as a seeded generator, and 64-bit
//! FNV-1a. Their outputs are fixed forever, unlike std's `DefaultHasher` or `rand`'s `StdRng`,
//! which may change between versions: a seeded workload, a state-file name, a routing draw or a
//! test fingerprint is the same on every machine and in every release. Not for anything secret.
//! (The KV events' block hash is xxh3, specified in WIRE.md: [`crate::kv_events`].)
//!
//! ```text
//! splitmix64_mix(z) = z ← (z ⊕ z ≫ 30) · 0xbf58476d1ce4e5b9
//!                     z ← (z ⊕ z ≫ 27) · 0x94d049bb133111eb
//!                     z ⊕ z ≫ 31                              (a bijection, full avalanche)
//! splitmix64(x)     = splitmix64_mix(x + γ),  γ = 0x9e3779b97f4a7c15
//! SplitMix64(seed)  : state += γ; draw = splitmix64_mix(state)
//! fnv1a64(bytes)    = fold h ← (h ⊕ byte) · 0x100000001b3 from 0xcbf29ce484222325
//! ```

/// SplitMix64's increment, the golden ratio's 64-bit fraction.
pub const SPLITMIX64_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's output function: its draw from state `z`.
pub fn splitmix64_mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// SplitMix64's draw after state `x`: a fixed, well-mixed 64-bit hash of `x`.
pub fn splitmix64(x: u64) -> u64 {
    splitmix64_mix(x.wrapping_add(SPLITMIX64_GAMMA))
}

/// The SplitMix64 generator: one add and three xor-shift-multiplies per draw, every seed a
/// full-period sequence.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(SPLITMIX64_GAMMA);
        splitmix64_mix(self.0)
    }

    /// Uniform in [0, 1): the top 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (n ≥ 1; the modulo bias is below 2^-40 for n < 2^24).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// FNV-1a's offset basis.
pub const FNV1A64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a's 64-bit prime.
pub const FNV1A64_PRIME: u64 = 0x0100_0000_01b3;

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_extend(FNV1A64_OFFSET, bytes)
}

/// FNV-1a continued from `h` over `bytes` (a hash of several parts, or of a stream).
pub fn fnv1a64_extend(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, &b| fnv1a64_word(h, u64::from(b)))
}

/// One FNV-1a step over a whole `word` (a token id, say) instead of one byte.
pub fn fnv1a64_word(h: u64, word: u64) -> u64 {
    (h ^ word).wrapping_mul(FNV1A64_PRIME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_is_the_published_generator() {
        // Vigna's splitmix64.c seeded with 0: the state advances by γ before each output.
        let mut g = SplitMix64::new(0);
        assert_eq!(g.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(g.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(splitmix64(SPLITMIX64_GAMMA), 0x6e78_9e6a_a1b9_65f4);
        let (mut a, mut b) = (SplitMix64::new(7), SplitMix64::new(7));
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
        assert_ne!(SplitMix64::new(1).next_u64(), SplitMix64::new(2).next_u64());
        let mut g = SplitMix64::new(3);
        assert!((0..1000).all(|_| (0.0..1.0).contains(&g.next_f64()) && g.below(5) < 5));
    }

    #[test]
    fn fnv1a64_matches_the_published_vectors() {
        // The FNV reference test vectors (draft-eastlake-fnv): "" and "a", "foobar".
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(fnv1a64_extend(fnv1a64(b"foo"), b"bar"), fnv1a64(b"foobar"));
    }
}
