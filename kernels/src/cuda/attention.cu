// Causal GQA attention of query tokens over K/V held in a slot pool, for prefill (with or
// without a cached prefix) and decode alike: the semantics of kernels/src/attention.rs.
//
// Query token t attends to the `kv_len[t]` slots `slots[slot_start[t] ..]` (its sequence's
// positions 0..=p in position order: the CPU's `token_slots[t]` as a CSR row, so a prefill
// chunk's tokens share one req_to_token row at growing lengths and a decode token has one row
// of its own). Query head h reads KV head h / (num_heads / num_kv_heads). K and V of one layer
// are `[num_slots, num_kv_heads * head_dim]`; q and out are `[n_tokens, *_stride]` with the
// heads at the start of each row (so q can be read inside the fused qkv rows).
//
// The reduction of one (token, head) is the CPU's, step for step (with --fmad=false):
//   score_i = tree8(8 lane fmaf chains of q . k_i, element j in lane j % 8) * scale,
//             then, with a soft cap c > 0 (Gemma 2), c * tanhf(score_i / c);
//   m = max_i score_i (NaN passed over); e_i = exp_fixed(score_i - m);
//   sum = tree8(8 lanes, e_i added in position order to lane i % 8);
//   acc = fmaf(e_i, v_i, acc) in position order; out = acc * (1 / sum).
// So for f32 storage it gives the CPU's bits, and nothing depends on the other tokens of the
// call: batch-invariant, and a prefill token, a chunked-prefill token and a decode token at the
// same position agree. Simple, not fast: one block per (token, head) that walks the keys twice
// (the max, then the sums and values), the value accumulation serial in position order.
//
// Grid: (n_tokens, num_heads); block: exactly ATTN_THREADS threads; head_dim <= ATTN_MAX_HEAD_DIM
// (the host checks both). Slots are below `num_slots` (the host validates them first; a slot
// outside is skipped, never read).

#define ATTN_THREADS 128
#define ATTN_MAX_HEAD_DIM 256
// Keys whose numerators are staged in shared memory at a time: a multiple of 8, so each key's
// lane (i % 8) is its index in the tile mod 8.
#define ATTN_TILE 64
// Keys scored at once: one group of 8 threads per key.
#define ATTN_GROUPS (ATTN_THREADS / 8)

// The score of key `slot` for the query in `q_s` by the 8 threads of a group (lane `l` = the
// group's lane 0..7): lane l accumulates elements l, l + 8, ... by fmaf, then the tree. Every
// thread of the warp must call it (the shuffles); `valid` false gives garbage, unused.
template <typename S>
__device__ __forceinline__ float attn_score(const float* q_s, const typename S::Raw* k_cache,
                                            u32 slot, bool valid, int kv_width, int col,
                                            int head_dim, int l, float scale, float softcap) {
    float a = 0.0f;
    if (valid) {
        const typename S::Raw* k = k_cache + (usize)slot * kv_width + col;
        for (int j = l; j < head_dim; j += 8) a = fmaf(q_s[j], S::load(k[j]), a);
    }
    float s = tree8_shfl(a) * scale;
    return softcap > 0.0f ? tanhf(s / softcap) * softcap : s;
}

template <typename S>
__device__ void attention(const typename S::Raw* q, int q_stride, const typename S::Raw* k_cache,
                          const typename S::Raw* v_cache, const u32* slots,
                          const u32* slot_start, const u32* kv_len, typename S::Raw* out,
                          int out_stride, int n_tokens, int num_heads, int num_kv_heads,
                          int head_dim, float scale, float softcap, u32 num_slots) {
    __shared__ float q_s[ATTN_MAX_HEAD_DIM];
    __shared__ float e_s[ATTN_TILE];
    __shared__ u32 slot_s[ATTN_TILE];
    __shared__ float max_s[ATTN_THREADS / 32];
    __shared__ float lane_s[8];
    int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    if (t >= n_tokens || h >= num_heads) return;
    int kvh = h / (num_heads / num_kv_heads);
    int kv_width = num_kv_heads * head_dim, col = kvh * head_dim;
    const u32* row = slots + slot_start[t];
    int n = (int)kv_len[t];
    typename S::Raw* o = out + (usize)t * out_stride + h * head_dim;
    for (int c = tid; c < head_dim; c += ATTN_THREADS)
        q_s[c] = S::load(q[(usize)t * q_stride + h * head_dim + c]);
    __syncthreads();
    int group = tid / 8, l = tid % 8;

    // Pass 1: the maximum score (exact in any order).
    float m = NEG_INF;
    for (int base = 0; base < n; base += ATTN_GROUPS) {
        int i = base + group;
        bool valid = i < n && row[i] < num_slots;
        float s = attn_score<S>(q_s, k_cache, valid ? row[i] : 0u, valid, kv_width, col,
                                head_dim, l, scale, softcap);
        if (valid && s > m) m = s;
    }
    for (int off = 16; off > 0; off >>= 1) {
        float other = __shfl_xor_sync(0xffffffffu, m, off);
        m = other > m ? other : m;
    }
    if ((tid & 31) == 0) max_s[tid >> 5] = m;
    __syncthreads();
    m = NEG_INF;
    for (int w = 0; w < ATTN_THREADS / 32; w++) m = max_s[w] > m ? max_s[w] : m;

    // Pass 2, a tile of keys at a time in position order: numerators into shared memory, then
    // lane sums (threads 0..7) and weighted values (one thread per column), both in order.
    float lane_sum = 0.0f;
    float acc0 = 0.0f, acc1 = 0.0f;  // columns tid and tid + ATTN_THREADS
    for (int tile = 0; tile < n; tile += ATTN_TILE) {
        int count = min(ATTN_TILE, n - tile);
        for (int base = 0; base < ATTN_TILE; base += ATTN_GROUPS) {
            int j = base + group, i = tile + j;
            bool valid = j < count && row[i] < num_slots;
            float s = attn_score<S>(q_s, k_cache, valid ? row[i] : 0u, valid, kv_width, col,
                                    head_dim, l, scale, softcap);
            if (l == 0 && j < count) {
                // A slot outside the pool contributes nothing (and is never read).
                e_s[j] = valid ? exp_fixed(s - m) : 0.0f;
                slot_s[j] = valid ? row[i] : num_slots;
            }
        }
        __syncthreads();
        if (tid < 8)
            for (int j = tid; j < count; j += 8) lane_sum = lane_sum + e_s[j];
        for (int j = 0; j < count; j++) {
            if (slot_s[j] >= num_slots) continue;
            const typename S::Raw* v = v_cache + (usize)slot_s[j] * kv_width + col;
            if (tid < head_dim) acc0 = fmaf(e_s[j], S::load(v[tid]), acc0);
            if (tid + ATTN_THREADS < head_dim)
                acc1 = fmaf(e_s[j], S::load(v[tid + ATTN_THREADS]), acc1);
        }
        __syncthreads();
    }
    if (tid < 8) lane_s[tid] = lane_sum;
    __syncthreads();
    float sum = ((lane_s[0] + lane_s[4]) + (lane_s[2] + lane_s[6]))
        + ((lane_s[1] + lane_s[5]) + (lane_s[3] + lane_s[7]));
    float inv = 1.0f / sum;
    if (n == 0) inv = 0.0f;  // no keys (never sent by the worker): zeros, not NaN
    if (tid < head_dim) o[tid] = S::store(acc0 * inv);
    if (tid + ATTN_THREADS < head_dim) o[tid + ATTN_THREADS] = S::store(acc1 * inv);
}

#define ATTENTION(NAME, S)                                                                     \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS)                                 \
        NAME(const S::Raw* q, int q_stride, const S::Raw* k_cache, const S::Raw* v_cache,       \
             const u32* slots, const u32* slot_start, const u32* kv_len, S::Raw* out,           \
             int out_stride, int n_tokens, int num_heads, int num_kv_heads, int head_dim,       \
             float scale, float softcap, u32 num_slots) {                                       \
        attention<S>(q, q_stride, k_cache, v_cache, slots, slot_start, kv_len, out, out_stride, \
                     n_tokens, num_heads, num_kv_heads, head_dim, scale, softcap, num_slots);   \
    }
ATTENTION(attention_f32, F32)
ATTENTION(attention_bf16, BF16)
ATTENTION(attention_f16, F16)
