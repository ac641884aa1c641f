// Embedding gather: `out[t, :] = table[ids[t], :]` as f32 (the residual stream is f32 whatever the
// weights' storage). The CPU path is `Weights::embed.copy_row` in model/src/forward.rs; a
// conversion from bf16/f16 to f32 is exact, so this is bit-exact for every dtype.
//
// Grid: one block per token; block: any size (columns strided by it). An id outside the
// vocabulary (the host validates ids first) gives a row of zeros, never a read out of bounds.

template <typename S>
__device__ void embedding_gather(float* out, const typename S::Raw* table, const u32* ids,
                                 int n_tokens, int hidden, u32 vocab) {
    int t = blockIdx.x;
    if (t >= n_tokens) return;
    u32 id = ids[t];
    float* o = out + (usize)t * hidden;
    if (id >= vocab) {
        for (int c = threadIdx.x; c < hidden; c += blockDim.x) o[c] = 0.0f;
        return;
    }
    const typename S::Raw* row = table + (usize)id * hidden;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) o[c] = S::load(row[c]);
}

#define EMBEDDING(NAME, S)                                                                     \
    extern "C" __global__ void NAME(float* out, const S::Raw* table, const u32* ids,           \
                                    int n_tokens, int hidden, u32 vocab) {                     \
        embedding_gather<S>(out, table, ids, n_tokens, hidden, vocab);                         \
    }
EMBEDDING(embedding_gather_f32, F32)
EMBEDDING(embedding_gather_bf16, BF16)
EMBEDDING(embedding_gather_f16, F16)
