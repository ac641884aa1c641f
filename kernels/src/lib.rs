//! CPU kernels for the Llama forward pass (f32, weights stored in f32, bf16 or f16): GEMM, RMSNorm, RoPE, SwiGLU, attention over KV
//! slots, argmax, on the instruction set chosen once per process ([`KernelPath`]: AVX-512,
//! AVX2 + FMA, NEON or portable). Not the model itself (that is `worker::model`). The same
//! operations for NVIDIA GPUs, as CUDA sources compiled at run time by NVRTC, are in [`cuda`]
//! (the `cuda` feature; not yet run on a GPU).
//!
//! Numeric contract: every kernel reduces each output element in an order fixed by the problem
//! shape of that element alone (never by batch size, tiling, chunking or thread), so a token's
//! result is bit-identical however the scheduler batches it. Shape mismatches are caller bugs and
//! panic; callers validate external input before reaching here. Every kernel path performs the
//! same IEEE operations in the same order (fma where the contract says fma, nowhere else), so
//! the paths agree bit for bit; the tests check each path this CPU supports against the portable one.

pub mod activation;
pub mod attention;
pub mod cuda;
pub mod gemm;
pub mod linevec;
pub mod math;
pub mod norm;
pub mod path;
pub mod peak;
pub mod rope;
pub mod store;
pub mod team;
pub mod wdtype;

pub use activation::{add_inplace, argmax, gelu_tanh_mul, silu_mul, softmax_weights};
pub use attention::{attention, attention_scored, AttnShape, ScoreScale};
pub use gemm::{dot_fixed, linear, linear_packed, Bf16Dot, ComputeDtype, IntDot, PackedMatrix};
pub use linevec::{LineBuf, LineVec};
pub use norm::rmsnorm;
pub use path::{kernel_path, set_kernel_path, KernelPath, KernelPathError, KERNEL_PATH_ENV};
pub use rope::{
    apply_rope, rope_inv_freq, rope_tables, rope_tables_from_freqs_into, rope_tables_into,
};
pub use store::{SharedBytes, ViewError};
pub use wdtype::{Bf16, PackedElem, WeightDtype, F16};
