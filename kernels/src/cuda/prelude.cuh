// What every dpserve CUDA kernel shares: storage types, the deterministic `exp_fixed` of the CPU
// path (kernels/src/math.rs), the 8-lane tree of its dot products. Prepended to each kernel
// source before NVRTC compiles it (kernels/src/cuda/source.rs); not a kernel itself.
//
// Numeric contract, as on the CPU: every output element is reduced in an order fixed by its own
// shape, never by the batch, the grid or the block that happens to compute it. The sources are
// compiled with --fmad=false, so `a * b + c` is a multiply then an add (as in Rust, which never
// contracts); `fmaf` is written out exactly where the CPU path calls `mul_add`. No headers: the
// 16-bit conversions are single PTX instructions (sm_80 and newer), so NVRTC needs nothing but
// itself.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long usize;

// -inf without math.h.
#define NEG_INF __int_as_float(0xff800000)

// Storage types: a value is loaded to f32, computed in f32 and rounded (to nearest even) when
// stored. `Raw` is the type in memory.
struct F32 {
    typedef float Raw;
    static __device__ __forceinline__ float load(float x) { return x; }
    static __device__ __forceinline__ float store(float x) { return x; }
};

struct BF16 {
    typedef u16 Raw;
    static __device__ __forceinline__ float load(u16 x) { return __uint_as_float(((u32)x) << 16); }
    static __device__ __forceinline__ u16 store(float x) {
        u16 r;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
        return r;
    }
};

struct F16 {
    typedef u16 Raw;
    static __device__ __forceinline__ float load(u16 x) {
        float r;
        asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(x));
        return r;
    }
    static __device__ __forceinline__ u16 store(float x) {
        u16 r;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
        return r;
    }
};

// `exp_fixed` of kernels/src/math.rs, operation for operation (Cody-Waite reduction, the Cephes
// polynomial, plain multiplies and adds), so it gives the CPU's bits.
__device__ __forceinline__ float exp_fixed(float x) {
    const float LOG2E = 1.44269504088896340736f;
    const float LN2_HI = 0.6933594f;
    const float LN2_LO = -2.1219444e-4f;
    const float ROUND = 12582912.0f;
    // Comparisons, not fminf/fmaxf, so a NaN input falls through and comes out NaN.
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float t = x * LOG2E + ROUND;
    float n = t - ROUND;
    float r = (x - n * LN2_HI) - n * LN2_LO;
    float z = r * r;
    float p = ((((((1.9875692e-4f * r + 1.3981999e-3f) * r + 8.333452e-3f) * r + 4.1665796e-2f)
                    * r
                + 1.6666665e-1f)
                   * r
               + 0.5f)
                  * z
              + r)
        + 1.0f;
    // Unsigned, as in Rust: the shift must not be signed overflow.
    u32 n_bits = (u32)__float_as_int(t) - (u32)__float_as_int(ROUND);
    float scale = __uint_as_float((n_bits + 127u) << 23);
    return p * scale;
}

// The CPU's 8-lane tree `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))` over 8 consecutive
// lanes of a warp (lane l holds a_l); every lane of the group gets the full result. Float
// addition is commutative bit for bit, so each xor step forms the CPU's pair sums exactly.
__device__ __forceinline__ float tree8_shfl(float a) {
    a = a + __shfl_xor_sync(0xffffffffu, a, 4);
    a = a + __shfl_xor_sync(0xffffffffu, a, 2);
    a = a + __shfl_xor_sync(0xffffffffu, a, 1);
    return a;
}
