//! Which instruction set the kernels run on: chosen once per process (the best the CPU has, or
//! the one `DPSERVE_KERNEL_PATH` names), so every call of every batch size uses the same one.
//! Not the kernels themselves; each kernel module instantiates its generic body per path.
//!
//! Every path computes the numeric contract of the crate (see `lib.rs`) with the same IEEE
//! operations in the same order, so all paths agree bit for bit; only the vector width differs.
//! One binary runs everywhere: the wide paths are compiled with `#[target_feature]` and only
//! called after the CPU reported the features at run time, never with a global `-C target-cpu`.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// The environment variable that forces a path (`auto` or unset: the best supported).
pub const KERNEL_PATH_ENV: &str = "DPSERVE_KERNEL_PATH";

/// A set of kernel instantiations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelPath {
    /// The generic 16-lane code compiled for the baseline target. On x86-64 CPUs with FMA it is
    /// compiled with `fma` enabled, so `mul_add` is one instruction, never a software `fmaf`.
    Portable,
    /// The generic code compiled for aarch64 NEON (baseline there, as is FMA): each 16-lane
    /// accumulator is four 128-bit registers.
    Neon,
    /// x86-64 AVX2 + FMA (+ F16C): explicit GEMM micro-kernel (each 16-lane accumulator is two 256-bit
    /// registers), generic code elsewhere.
    Avx2,
    /// x86-64 AVX-512F: explicit GEMM micro-kernel (one 512-bit register per accumulator).
    Avx512,
}

impl KernelPath {
    /// Every path, narrowest first.
    pub const ALL: [KernelPath; 4] = [
        KernelPath::Portable,
        KernelPath::Neon,
        KernelPath::Avx2,
        KernelPath::Avx512,
    ];

    /// The name used by `DPSERVE_KERNEL_PATH`, logs and `/get_server_info`.
    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Portable => "portable",
            KernelPath::Neon => "neon",
            KernelPath::Avx2 => "avx2",
            KernelPath::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the path.
    pub fn supported(self) -> bool {
        match self {
            KernelPath::Portable => true,
            #[cfg(target_arch = "aarch64")]
            KernelPath::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "x86_64")]
            // f16c (16-bit → f32 loads of f16 weights) came with or before FMA on every x86
            // CPU, so requiring it excludes none that has the rest.
            KernelPath::Avx2 => {
                std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("fma")
                    && std::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512 => {
                std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("fma")
                    && std::is_x86_feature_detected!("f16c")
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The paths this CPU supports, narrowest first.
    pub fn all_supported() -> Vec<KernelPath> {
        Self::ALL.into_iter().filter(|p| p.supported()).collect()
    }

    /// The widest path this CPU supports.
    pub fn best() -> KernelPath {
        Self::ALL
            .into_iter()
            .rev()
            .find(|p| p.supported())
            .unwrap_or(KernelPath::Portable)
    }
}

impl fmt::Display for KernelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A path name that is unknown, or known but not runnable on this CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPathError {
    pub requested: String,
    /// The paths this CPU supports.
    pub supported: Vec<KernelPath>,
}

impl fmt::Display for KernelPathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.supported.iter().map(|p| p.name()).collect();
        let known = KernelPath::ALL.iter().any(|p| p.name() == self.requested);
        let why = if known {
            "is not supported by this CPU"
        } else {
            "is not a kernel path"
        };
        write!(
            f,
            "kernel path {:?} {why} (this CPU supports: auto, {})",
            self.requested,
            names.join(", ")
        )
    }
}

impl std::error::Error for KernelPathError {}

impl FromStr for KernelPath {
    type Err = KernelPathError;

    /// A path this CPU supports; `auto` (or nothing) is the best one.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s == "auto" || s.is_empty() {
            return Ok(KernelPath::best());
        }
        KernelPath::ALL
            .into_iter()
            .find(|p| p.name() == s && p.supported())
            .ok_or_else(|| KernelPathError {
                requested: s.to_string(),
                supported: KernelPath::all_supported(),
            })
    }
}

static CHOSEN: OnceLock<KernelPath> = OnceLock::new();

/// The path this process uses: fixed by [`set_kernel_path`] or on first use from
/// `DPSERVE_KERNEL_PATH` (empty or `auto`: the best supported).
///
/// # Panics
/// On first use, if `DPSERVE_KERNEL_PATH` names a path this CPU cannot run: running another
/// one silently would make a forced test or benchmark measure the wrong thing. Binaries call
/// [`set_kernel_path`] first and report the error cleanly.
pub fn kernel_path() -> KernelPath {
    *CHOSEN.get_or_init(|| match from_env() {
        Ok(p) => p,
        Err(e) => panic!("{KERNEL_PATH_ENV}: {e}"),
    })
}

/// The path `DPSERVE_KERNEL_PATH` asks for (the best one when unset, empty or `auto`).
pub fn from_env() -> Result<KernelPath, KernelPathError> {
    std::env::var(KERNEL_PATH_ENV).map_or(Ok(KernelPath::best()), |v| v.parse())
}

/// Fixes the process's path before any kernel runs. Returns the path in force: `path` itself,
/// or the one already fixed by an earlier call or kernel use (a path never changes once set).
pub fn set_kernel_path(path: KernelPath) -> KernelPath {
    *CHOSEN.get_or_init(|| path)
}

/// Whether the portable path may use hardware `fma` (x86-64 only; aarch64 always has it).
#[cfg(target_arch = "x86_64")]
pub(crate) fn portable_has_fma() -> bool {
    static FMA: OnceLock<bool> = OnceLock::new();
    *FMA.get_or_init(|| std::is_x86_feature_detected!("fma"))
}

/// Defines `fn $name(path: KernelPath, args…)` that runs the `#[inline(always)]` function
/// `$body` compiled for `path`'s target features. The body is the same source for every path
/// (no fast-math, so the same IEEE operations in the same order): only the vector width the
/// compiler picks differs, never a result.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? => $body:path;) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name(path: $crate::path::KernelPath, $($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            fn avx512($($arg: $ty),*) $(-> $ret)? { $body($($arg),*) }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            fn avx2($($arg: $ty),*) $(-> $ret)? { $body($($arg),*) }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "fma")]
            #[allow(clippy::too_many_arguments)]
            fn fma($($arg: $ty),*) $(-> $ret)? { $body($($arg),*) }
            #[cfg(target_arch = "aarch64")]
            #[target_feature(enable = "neon")]
            #[allow(clippy::too_many_arguments)]
            fn neon($($arg: $ty),*) $(-> $ret)? { $body($($arg),*) }
            match path {
                // SAFETY (each arm): a path is only chosen (`KernelPath::from_str`, `best`)
                // when the CPU reported its features, and tests call only supported paths.
                #[cfg(target_arch = "x86_64")]
                $crate::path::KernelPath::Avx512 => unsafe { avx512($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                $crate::path::KernelPath::Avx2 => unsafe { avx2($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                $crate::path::KernelPath::Portable if $crate::path::portable_has_fma() => unsafe {
                    fma($($arg),*)
                },
                #[cfg(target_arch = "aarch64")]
                $crate::path::KernelPath::Neon => unsafe { neon($($arg),*) },
                _ => $body($($arg),*),
            }
        }
    };
}
pub(crate) use multiversion;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unsupported_paths_are_refused() {
        for p in KernelPath::all_supported() {
            assert_eq!(p.name().parse::<KernelPath>(), Ok(p));
        }
        assert_eq!("auto".parse::<KernelPath>(), Ok(KernelPath::best()));
        assert!(KernelPath::Portable.supported());
        let e = "sse9".parse::<KernelPath>().unwrap_err();
        assert!(e.to_string().contains("is not a kernel path"), "{e}");
        for p in KernelPath::ALL.into_iter().filter(|p| !p.supported()) {
            let e = p.name().parse::<KernelPath>().unwrap_err();
            assert!(e.to_string().contains("not supported by this CPU"), "{e}");
        }
        #[cfg(target_arch = "x86_64")]
        assert!(!KernelPath::Neon.supported());
    }
}
