// RMSNorm of each row of the f32 residual stream `x` (`[rows, dim]`):
// `y = (w_offset + w) * (x * (1 / sqrt(sum(x^2) / dim + eps)))` (w_offset 0, or Gemma's 1: its
// weight is `1 + w`, the sum taken in f32 as transformers does, so a 16-bit `w` keeps its
// bits), stored as the weight's type (the input of
// the next GEMM). Same formula and operation order per element as kernels/src/norm.rs; the sum
// of squares is reduced in another (fixed) order, so results agree with the CPU to rounding,
// not bit for bit.
//
// Grid: one block per row; block: exactly RMSNORM_THREADS threads (the host launches that, a
// constant, never a size chosen from the batch). Thread i sums elements i, i + 256, ... in
// order; the 32 lanes of a warp are combined by a fixed xor-shuffle tree; thread 0 adds the
// 8 warps' sums in warp order. The reduction order depends on `dim` only: batch-invariant.

#define RMSNORM_THREADS 256

template <typename S>
__device__ void rmsnorm(const float* x, const typename S::Raw* w, float w_offset, float eps,
                        typename S::Raw* y, int rows, int dim) {
    __shared__ float warp_sums[RMSNORM_THREADS / 32];
    __shared__ float inv_s;
    int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (usize)r * dim;
    float s = 0.0f;
    for (int i = threadIdx.x; i < dim; i += RMSNORM_THREADS) s = s + xr[i] * xr[i];
    for (int o = 16; o > 0; o >>= 1) s = s + __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int i = 0; i < RMSNORM_THREADS / 32; i++) total = total + warp_sums[i];
        float ms = total / (float)dim;
        inv_s = 1.0f / sqrtf(ms + eps);
    }
    __syncthreads();
    float inv = inv_s;
    typename S::Raw* yr = y + (usize)r * dim;
    for (int i = threadIdx.x; i < dim; i += RMSNORM_THREADS) yr[i] = S::store((w_offset + S::load(w[i])) * (xr[i] * inv));
}

#define RMSNORM(NAME, S)                                                                       \
    extern "C" __global__ void __launch_bounds__(RMSNORM_THREADS)                              \
        NAME(const float* x, const S::Raw* w, float w_offset, float eps, S::Raw* y, int rows,  \
             int dim) {                                                                        \
        rmsnorm<S>(x, w, w_offset, eps, y, rows, dim);                                         \
    }
RMSNORM(rmsnorm_f32, F32)
RMSNORM(rmsnorm_bf16, BF16)
RMSNORM(rmsnorm_f16, F16)

// RMSNorm of each head of q or k in place (Qwen3's and Gemma 3's q_norm / k_norm, before RoPE,
// the weight `w_offset + w` as above): `x` is
// `[n_tokens, row_stride]` with `heads` heads of `head_dim` at the start of each row (q or k
// inside the fused qkv rows), `w` the `[head_dim]` weight. Same formula and per-element order
// as kernels/src/norm.rs over a row of `head_dim`; the sum of squares in f32, reduced in a
// fixed order (lane i sums elements i, i + 32, ... in order, then the xor-shuffle tree).
//
// Grid: one block per (token, head), `n_tokens * heads`; block: exactly one warp, 32 threads.
// Each lane reads and then writes only its own elements, so in place is safe. Batch-invariant.
template <typename S>
__device__ void head_rmsnorm(typename S::Raw* x, const typename S::Raw* w, float w_offset, float eps,
                             int n_tokens, int heads, int head_dim, int row_stride) {
    int b = blockIdx.x;
    if (b >= n_tokens * heads) return;
    typename S::Raw* xh = x + (usize)(b / heads) * row_stride + (usize)(b % heads) * head_dim;
    float s = 0.0f;
    for (int i = threadIdx.x; i < head_dim; i += 32) {
        float v = S::load(xh[i]);
        s = s + v * v;
    }
    for (int o = 16; o > 0; o >>= 1) s = s + __shfl_xor_sync(0xffffffffu, s, o);
    float inv = 1.0f / sqrtf(s / (float)head_dim + eps);
    for (int i = threadIdx.x; i < head_dim; i += 32) xh[i] = S::store((w_offset + S::load(w[i])) * (S::load(xh[i]) * inv));
}

#define HEAD_RMSNORM(NAME, S)                                                                  \
    extern "C" __global__ void __launch_bounds__(32)                                           \
        NAME(S::Raw* x, const S::Raw* w, float w_offset, float eps, int n_tokens, int heads,   \
             int head_dim, int row_stride) {                                                   \
        head_rmsnorm<S>(x, w, w_offset, eps, n_tokens, heads, head_dim, row_stride);           \
    }
HEAD_RMSNORM(head_rmsnorm_f32, F32)
HEAD_RMSNORM(head_rmsnorm_bf16, BF16)
HEAD_RMSNORM(head_rmsnorm_f16, F16)
