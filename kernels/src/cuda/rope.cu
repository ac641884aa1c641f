// Rotary position embedding in place, Hugging Face rotate-half layout, as kernels/src/rope.rs:
// for token t, head h and i < head_dim / 2, the pair (x[i], x[i + half]) becomes
// (a * cos - b * sin, b * cos + a * sin) with cos/sin from row t of the tables
// (`[n_tokens, half]`, f32, made on the host by `kernels::rope_tables`, so a table entry is the
// CPU's). f32 in, f32 math without contraction: bit-exact with the CPU for f32 storage.
//
// `x` is `[n_tokens, row_stride]` with the heads at the start of each row (`row_stride` =
// heads * head_dim for a separate q or k; the fused qkv width to rotate q or k inside it).
// Grid: one block per token; block: any size. Element-wise: batch-invariant.

template <typename S>
__device__ void rope(typename S::Raw* x, const float* cos_t, const float* sin_t, int n_tokens,
                     int heads, int head_dim, int row_stride) {
    int t = blockIdx.x;
    if (t >= n_tokens) return;
    int half = head_dim / 2;
    typename S::Raw* xt = x + (usize)t * row_stride;
    const float* c = cos_t + (usize)t * half;
    const float* s = sin_t + (usize)t * half;
    for (int j = threadIdx.x; j < heads * half; j += blockDim.x) {
        int h = j / half, i = j % half;
        typename S::Raw* head = xt + h * head_dim;
        float a = S::load(head[i]), b = S::load(head[i + half]);
        head[i] = S::store(a * c[i] - b * s[i]);
        head[i + half] = S::store(b * c[i] + a * s[i]);
    }
}

#define ROPE(NAME, S)                                                                          \
    extern "C" __global__ void NAME(S::Raw* x, const float* cos_t, const float* sin_t,          \
                                    int n_tokens, int heads, int head_dim, int row_stride) {    \
        rope<S>(x, cos_t, sin_t, n_tokens, heads, head_dim, row_stride);                        \
    }
ROPE(rope_f32, F32)
ROPE(rope_bf16, BF16)
ROPE(rope_f16, F16)
