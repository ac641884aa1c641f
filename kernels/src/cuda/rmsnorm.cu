// RMSNorm of each row of the f32 residual stream `x` (`[rows, dim]`):
// `y = w * (x * (1 / sqrt(sum(x^2) / dim + eps)))`, stored as the weight's type (the input of
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
__device__ void rmsnorm(const float* x, const typename S::Raw* w, float eps,
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
    for (int i = threadIdx.x; i < dim; i += RMSNORM_THREADS) yr[i] = S::store(S::load(w[i]) * (xr[i] * inv));
}

#define RMSNORM(NAME, S)                                                                       \
    extern "C" __global__ void __launch_bounds__(RMSNORM_THREADS)                              \
        NAME(const float* x, const S::Raw* w, float eps, S::Raw* y, int rows, int dim) {       \
        rmsnorm<S>(x, w, eps, y, rows, dim);                                                   \
    }
RMSNORM(rmsnorm_f32, F32)
RMSNORM(rmsnorm_bf16, BF16)
RMSNORM(rmsnorm_f16, F16)
