// CUDA C++ as host C++: what the unmodified kernel sources (kernels/src/cuda/*.cu after the
// prelude) need from the CUDA compiler, so g++ can build them into the CPU emulator's libcuda.
// Test support only; nothing here is shipped.
//
// Execution model (driver.cpp): the blocks of a grid run one after another on the calling OS
// thread; the threads of a block are fibers of that thread, switched only at a barrier
// (`__syncthreads`, a warp shuffle) or when a thread returns. So barriers really order the
// threads (a thread never runs ahead of a barrier it has not passed), `__shared__` can be a plain
// `static` (one block at a time; launches are serialised), and a run is deterministic.

#ifndef DPSERVE_CUDA_EMU_SHIM_H
#define DPSERVE_CUDA_EMU_SHIM_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>
#include <utility>

struct uint3 {
    unsigned x, y, z;
};
typedef uint3 dim3;

namespace emu {

// One CUDA thread of the running block.
struct Thread {
    uint3 idx;
    // Linear index in the block (x fastest): warp = lin / 32, lane = lin % 32.
    unsigned lin;
    // Shuffles done so far: picks which of the warp's two exchange rows this one uses.
    unsigned shuffles;
};

// The running launch (one at a time).
struct Grid {
    uint3 block_idx, block_dim, grid_dim;
};

extern Thread* current;
extern Grid grid;

// Waits until every live thread of the block has arrived.
void sync_block();
// Publishes `bits` as this lane's value, waits for the warp's live lanes, and returns lane
// `src`'s value (this lane's own if `src` is outside the warp or has exited).
uint64_t exchange(uint64_t bits, unsigned src);

// A memory clobber around each barrier: values in `__shared__` (statics) must be reloaded after
// it, never kept in registers across it.
inline void fence() { asm volatile("" ::: "memory"); }

template <class T>
inline T shuffle(T v, unsigned src) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    fence();
    bits = exchange(bits, src);
    fence();
    memcpy(&v, &bits, sizeof v);
    return v;
}

inline unsigned lane() { return current->lin % 32; }

}  // namespace emu

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict

#define threadIdx (::emu::current->idx)
#define blockIdx (::emu::grid.block_idx)
#define blockDim (::emu::grid.block_dim)
#define gridDim (::emu::grid.grid_dim)
#define warpSize 32

inline void __syncthreads() {
    ::emu::fence();
    ::emu::sync_block();
    ::emu::fence();
}

// The `mask` is not checked: the kernels shuffle with whole warps.
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
    unsigned lane = ::emu::lane();
    unsigned src = lane ^ (unsigned)lane_mask;
    // Outside this lane's segment of `width`: its own value, as on the GPU.
    if (src / width != lane / width) src = lane;
    return ::emu::shuffle(v, src);
}

template <class T>
inline T __shfl_sync(unsigned, T v, int src_lane, int width = 32) {
    unsigned lane = ::emu::lane();
    unsigned base = lane - lane % width;
    return ::emu::shuffle(v, base + (unsigned)src_lane % width);
}

template <class T>
inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
    unsigned lane = ::emu::lane();
    unsigned src = lane % width + delta < (unsigned)width ? lane + delta : lane;
    return ::emu::shuffle(v, src);
}

template <class T>
inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
    unsigned lane = ::emu::lane();
    unsigned src = lane % width >= delta ? lane - delta : lane;
    return ::emu::shuffle(v, src);
}

inline void __syncwarp(unsigned = 0xffffffffu) { (void)::emu::shuffle(0, ::emu::lane()); }

inline float __int_as_float(int x) {
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

inline float __uint_as_float(unsigned x) {
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

inline int __float_as_int(float x) {
    int i;
    memcpy(&i, &x, sizeof i);
    return i;
}

inline unsigned __float_as_uint(float x) {
    unsigned i;
    memcpy(&i, &x, sizeof i);
    return i;
}

// CUDA's integer `min`/`max` overloads (fmaf, sqrtf, expf, … come from math.h, IEEE as on the
// GPU with --fmad=false, --prec-div, --prec-sqrt).
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

namespace emu {

// A kernel entry point as the driver calls it: `invoke(params)` unpacks cuLaunchKernel's
// `kernelParams` by the kernel's C++ signature and runs it for the current thread. `pointers`
// marks the parameters that are pointers (bit i: parameter i), which the driver checks point
// into device memory before the launch, as a GPU would fault on any other address.
struct Kernel {
    const char* name;
    void (*invoke)(void** params);
    unsigned arity;
    uint64_t pointers;
};

template <class F>
struct Entry;

template <class... A>
struct Entry<void (*)(A...)> {
    static_assert(sizeof...(A) <= 64, "at most 64 kernel parameters");

    template <void (*F)(A...), class Seq>
    struct Unpack;

    template <void (*F)(A...), unsigned long... I>
    struct Unpack<F, std::integer_sequence<unsigned long, I...>> {
        static void invoke(void** p) { F(*static_cast<A*>(p[I])...); }
    };

    static constexpr uint64_t pointers() {
        uint64_t bits = 0;
        unsigned i = 0;
        ((bits |= (std::is_pointer<A>::value ? uint64_t(1) << i : 0), i++), ...);
        return bits;
    }

    template <void (*F)(A...)>
    static Kernel make(const char* name) {
        return Kernel{name,
                      &Unpack<F, std::make_integer_sequence<unsigned long, sizeof...(A)>>::invoke,
                      (unsigned)sizeof...(A), pointers()};
    }
};

// Adds a program's entry points to the driver's registry (at library load).
void register_kernels(const Kernel* kernels, unsigned count);

}  // namespace emu

#define EMU_KERNEL(NAME) ::emu::Entry<decltype(&NAME)>::make<&NAME>(#NAME)

#endif
