// The element-wise ops of the Llama block, as kernels/src/activation.rs and the bias of
// kernels/src/gemm.rs, operation for operation (bit-exact with the CPU for f32 storage):
//   silu_mul:    out[t, i] = gu[t, i] / (1 + exp_fixed(-gu[t, i])) * gu[t, inter + i]
//                (`gu` = `[n_tokens, 2 * inter]`, the fused gate and up projections);
//   add_inplace: x[i] += y[i], x the f32 residual stream, y in the storage type;
//   add_bias:    y[r, c] += b[c] (after the GEMM's dot, as on the CPU);
//   gelu_tanh_mul: Gemma's GeGLU, out[t, i] = 0.5 x (1 + tanhf(K (x + 0.044715 x^3))) u, as
//                kernels::gelu_tanh_mul (tanhf is CUDA's, within an ulp or two of the CPU's);
//   scale_f32:   x[i] *= s (Gemma's embedding scale, on the f32 residual stream; one entry
//                point per storage type like the others, though it reads none);
//   softcap:     y[i] = c * tanhf(y[i] / c) (Gemma's final logits);
//   widen:       y[i] = x[i] as f32 (a storage-type row into the f32 an RMSNorm reads).
// Grid-stride loops: any grid and block. Element-wise: batch-invariant.

template <typename S>
__device__ void silu_mul(const typename S::Raw* gu, typename S::Raw* out, int n_tokens,
                         int inter) {
    usize n = (usize)n_tokens * inter;
    for (usize j = (usize)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (usize)gridDim.x * blockDim.x) {
        usize t = j / inter, i = j % inter;
        float x = S::load(gu[t * 2 * inter + i]);
        float u = S::load(gu[t * 2 * inter + inter + i]);
        out[j] = S::store(x / (1.0f + exp_fixed(-x)) * u);
    }
}

template <typename S>
__device__ void add_inplace(float* x, const typename S::Raw* y, usize n) {
    for (usize j = (usize)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (usize)gridDim.x * blockDim.x)
        x[j] = x[j] + S::load(y[j]);
}

template <typename S>
__device__ void add_bias(typename S::Raw* y, const typename S::Raw* b, int rows, int cols) {
    usize n = (usize)rows * cols;
    for (usize j = (usize)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (usize)gridDim.x * blockDim.x)
        y[j] = S::store(S::load(y[j]) + S::load(b[j % cols]));
}

template <typename S>
__device__ void gelu_tanh_mul(const typename S::Raw* gu, typename S::Raw* out, int n_tokens,
                              int inter) {
    usize n = (usize)n_tokens * inter;
    for (usize j = (usize)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (usize)gridDim.x * blockDim.x) {
        usize t = j / inter, i = j % inter;
        float x = S::load(gu[t * 2 * inter + i]);
        float u = S::load(gu[t * 2 * inter + inter + i]);
        float inner = 0.7978846f * (x + 0.044715f * x * x * x);
        out[j] = S::store(0.5f * x * (1.0f + tanhf(inner)) * u);
    }
}

__device__ void scale_f32(float* x, float s, usize n) {
    for (usize j = (usize)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (usize)gridDim.x * blockDim.x)
        x[j] = x[j] * s;
}

template <typename S>
__device__ void softcap(typename S::Raw* y, float cap, usize n) {
    for (usize j = (usize)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (usize)gridDim.x * blockDim.x)
        y[j] = S::store(tanhf(S::load(y[j]) / cap) * cap);
}

template <typename S>
__device__ void widen(const typename S::Raw* x, float* y, usize n) {
    for (usize j = (usize)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (usize)gridDim.x * blockDim.x)
        y[j] = S::load(x[j]);
}

#define ELEMENTWISE(SUFFIX, S)                                                                  \
    extern "C" __global__ void silu_mul_##SUFFIX(const S::Raw* gu, S::Raw* out, int n_tokens,   \
                                                 int inter) {                                   \
        silu_mul<S>(gu, out, n_tokens, inter);                                                  \
    }                                                                                           \
    extern "C" __global__ void add_inplace_##SUFFIX(float* x, const S::Raw* y, usize n) {      \
        add_inplace<S>(x, y, n);                                                                \
    }                                                                                           \
    extern "C" __global__ void add_bias_##SUFFIX(S::Raw* y, const S::Raw* b, int rows,          \
                                                 int cols) {                                    \
        add_bias<S>(y, b, rows, cols);                                                          \
    }                                                                                           \
    extern "C" __global__ void gelu_tanh_mul_##SUFFIX(const S::Raw* gu, S::Raw* out,            \
                                                      int n_tokens, int inter) {                \
        gelu_tanh_mul<S>(gu, out, n_tokens, inter);                                             \
    }                                                                                           \
    extern "C" __global__ void scale_f32_##SUFFIX(float* x, float s, usize n) {                 \
        scale_f32(x, s, n);                                                                     \
    }                                                                                           \
    extern "C" __global__ void softcap_##SUFFIX(S::Raw* y, float cap, usize n) {                \
        softcap<S>(y, cap, n);                                                                  \
    }                                                                                           \
    extern "C" __global__ void widen_##SUFFIX(const S::Raw* x, float* y, usize n) {             \
        widen<S>(x, y, n);                                                                      \
    }
ELEMENTWISE(f32, F32)
ELEMENTWISE(bf16, BF16)
ELEMENTWISE(f16, F16)
