//! The CUDA kernel sources, compiled at run time by NVRTC (never by nvcc at build time, so
//! building dpserve needs no CUDA toolkit), and the names of their entry points. Plain text:
//! present with or without the `cuda` feature, so their constants can be checked anywhere.

/// Storage type of a kernel's tensors (computation is f32 throughout; 16-bit values are
/// widened on load and rounded to nearest even on store). The residual stream, RoPE tables and
/// softmax state are f32 in every variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CudaDtype {
    F32,
    Bf16,
    F16,
}

impl CudaDtype {
    pub const ALL: [CudaDtype; 3] = [CudaDtype::F32, CudaDtype::Bf16, CudaDtype::F16];

    /// The suffix of the entry points for this type (`rmsnorm_bf16`).
    pub fn suffix(self) -> &'static str {
        match self {
            CudaDtype::F32 => "f32",
            CudaDtype::Bf16 => "bf16",
            CudaDtype::F16 => "f16",
        }
    }
}

/// One NVRTC program: [`PRELUDE`] then `body`, defining one entry point per [`CudaDtype`] for
/// each of `ops` (`<op>_<suffix>`).
#[derive(Debug)]
pub struct KernelSource {
    /// The program's name (NVRTC's file name in its log: `<name>.cu`).
    pub name: &'static str,
    pub body: &'static str,
    pub ops: &'static [&'static str],
}

impl KernelSource {
    /// The full text NVRTC compiles.
    pub fn program(&self) -> String {
        format!("{PRELUDE}\n{}", self.body)
    }

    /// Every entry point the program defines.
    pub fn functions(&self) -> impl Iterator<Item = String> + '_ {
        self.ops.iter().flat_map(|op| {
            CudaDtype::ALL
                .iter()
                .map(move |d| format!("{op}_{}", d.suffix()))
        })
    }
}

/// Storage types, `exp_fixed`, the 8-lane tree: prepended to every program.
pub const PRELUDE: &str = include_str!("prelude.cuh");

/// Every kernel program.
pub const SOURCES: &[KernelSource] = &[
    KernelSource {
        name: "embedding",
        body: include_str!("embedding.cu"),
        ops: &["embedding_gather"],
    },
    KernelSource {
        name: "rmsnorm",
        body: include_str!("rmsnorm.cu"),
        ops: &["rmsnorm", "head_rmsnorm"],
    },
    KernelSource {
        name: "rope",
        body: include_str!("rope.cu"),
        ops: &["rope"],
    },
    KernelSource {
        name: "elementwise",
        body: include_str!("elementwise.cu"),
        ops: &[
            "silu_mul",
            "add_inplace",
            "add_bias",
            "gelu_tanh_mul",
            "scale_f32",
            "softcap",
            "widen",
        ],
    },
    KernelSource {
        name: "kv_write",
        body: include_str!("kv_write.cu"),
        ops: &["kv_write"],
    },
    KernelSource {
        name: "attention",
        body: include_str!("attention.cu"),
        ops: &["attention"],
    },
];

/// Threads of an RMSNorm block (`RMSNORM_THREADS` in rmsnorm.cu): part of its reduction order.
pub const RMSNORM_THREADS: u32 = 256;
/// Threads of an attention block (`ATTN_THREADS` in attention.cu).
pub const ATTN_THREADS: u32 = 128;
/// The largest head dimension the attention kernel takes (`ATTN_MAX_HEAD_DIM`).
pub const ATTN_MAX_HEAD_DIM: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `#define NAME value` in `text`.
    fn define(text: &str, name: &str) -> Option<u64> {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix("#define ")?.strip_prefix(name)?;
            rest.trim().parse().ok()
        })
    }

    fn source(name: &str) -> &'static KernelSource {
        SOURCES.iter().find(|s| s.name == name).expect("a source")
    }

    #[test]
    fn the_launch_constants_are_the_sources() {
        let attn = source("attention").body;
        assert_eq!(
            define(source("rmsnorm").body, "RMSNORM_THREADS"),
            Some(RMSNORM_THREADS.into())
        );
        assert_eq!(define(attn, "ATTN_THREADS"), Some(ATTN_THREADS.into()));
        assert_eq!(
            define(attn, "ATTN_MAX_HEAD_DIM"),
            Some(ATTN_MAX_HEAD_DIM as u64)
        );
        // Two value columns per thread.
        assert!(ATTN_MAX_HEAD_DIM <= 2 * ATTN_THREADS as usize);
    }

    #[test]
    fn every_entry_point_is_instantiated_once_per_type() {
        let mut all = Vec::new();
        for s in SOURCES {
            assert!(!s.program().contains('\0'), "{}", s.name);
            for op in s.ops {
                // The sources instantiate with `MACRO(<op>_<suffix>, Type)` or, for the
                // element-wise file, `<op>_##SUFFIX` under `ELEMENTWISE(<suffix>, Type)`.
                for d in CudaDtype::ALL {
                    let direct = format!("({op}_{}, ", d.suffix());
                    assert!(
                        s.body.contains(&direct)
                            || (s.body.contains(&format!("{op}_##SUFFIX"))
                                && s.body.contains(&format!("({}, ", d.suffix()))),
                        "{}: no {op}_{}",
                        s.name,
                        d.suffix()
                    );
                }
            }
            all.extend(s.functions());
        }
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "an entry point defined twice");
        assert_eq!(n, 13 * CudaDtype::ALL.len());
    }
}
