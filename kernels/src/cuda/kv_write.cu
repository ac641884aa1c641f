// KV write by slot index: `cache[slots[t], :] = src[t * src_stride + :kv_dim]` for each new
// token, into one layer's K or V pool (`[num_slots, kv_heads * head_dim]`, the layout of
// model/src/kv.rs). `src` may be the K or V columns inside the fused qkv rows
// (`src_stride` = the qkv width). Same storage type on both sides: a copy. A slot outside the
// pool (the host validates slots first) is skipped, never written out of bounds.
//
// Grid: one block per token; block: any size.

template <typename S>
__device__ void kv_write(typename S::Raw* cache, const typename S::Raw* src, const u32* slots,
                         int n_tokens, int kv_dim, int src_stride, u32 num_slots) {
    int t = blockIdx.x;
    if (t >= n_tokens) return;
    u32 slot = slots[t];
    if (slot >= num_slots) return;
    typename S::Raw* dst = cache + (usize)slot * kv_dim;
    const typename S::Raw* row = src + (usize)t * src_stride;
    for (int c = threadIdx.x; c < kv_dim; c += blockDim.x) dst[c] = row[c];
}

#define KV_WRITE(NAME, S)                                                                      \
    extern "C" __global__ void NAME(S::Raw* cache, const S::Raw* src, const u32* slots,         \
                                    int n_tokens, int kv_dim, int src_stride, u32 num_slots) {  \
        kv_write<S>(cache, src, slots, n_tokens, kv_dim, src_stride, num_slots);                \
    }
KV_WRITE(kv_write_f32, F32)
KV_WRITE(kv_write_bf16, BF16)
KV_WRITE(kv_write_f16, F16)
