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

#ifndef __CUDACC_RTC__
// Not NVRTC: host C++, the CPU emulator of kernels/tests/emu, which has no PTX. The same three
// conversions in C++: round to nearest even (subnormals and overflow to infinity included), and
// a NaN stored as the canonical NaN 0x7fff, as the PTX instructions give.
__device__ __forceinline__ u16 bf16_from_f32_rn(float x) {
    u32 b = (u32)__float_as_int(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    return (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ u16 f16_from_f32_rn(float x) {
    u32 b = (u32)__float_as_int(x);
    u32 sign = (b >> 16) & 0x8000u, a = b & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fff;
    // 65520 and above: past the largest half (65504) by half an ulp or more.
    if (a >= 0x477ff000u) return (u16)(sign | 0x7c00u);
    // 2^-25 and below: zero (exactly 2^-25 is a tie, to the even zero).
    if (a <= 0x33000000u) return (u16)sign;
    u32 r, rem, half;
    if (a < 0x38800000u) {
        // Below 2^-14: a subnormal half, in units of 2^-24.
        u32 m = (a & 0x7fffffu) | 0x800000u, shift = 126u - (a >> 23);
        r = m >> shift;
        rem = m & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
    } else {
        // Rebias the exponent (127 to 15); a carry out of the mantissa moves into the exponent.
        r = (a - 0x38000000u) >> 13;
        rem = a & 0x1fffu;
        half = 0x1000u;
    }
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (u16)(sign | r);
}

__device__ __forceinline__ float f16_to_f32(u16 h) {
    u32 sign = ((u32)h & 0x8000u) << 16, e = ((u32)h >> 10) & 0x1fu, m = (u32)h & 0x3ffu;
    if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e != 0) return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
    // Zero or subnormal: m * 2^-24, exact in f32.
    float v = (float)m * 5.9604644775390625e-8f;
    return sign ? -v : v;
}
#endif

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
#ifdef __CUDACC_RTC__
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
#else
        r = bf16_from_f32_rn(x);
#endif
        return r;
    }
};

struct F16 {
    typedef u16 Raw;
    static __device__ __forceinline__ float load(u16 x) {
        float r;
#ifdef __CUDACC_RTC__
        asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(x));
#else
        r = f16_to_f32(x);
#endif
        return r;
    }
    static __device__ __forceinline__ u16 store(float x) {
        u16 r;
#ifdef __CUDACC_RTC__
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
#else
        r = f16_from_f32_rn(x);
#endif
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
