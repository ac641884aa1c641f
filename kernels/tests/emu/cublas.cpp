// A cuBLAS (libcublas.so.13) that runs on the CPU: the handle calls and the GEMMs cudarc 0.19's
// `CudaBlas` and `Gemm` make (cublasSgemm_v2 for f32; cublasGemmEx with CUBLAS_COMPUTE_32F for
// f16 and bf16), plus their strided-batched forms. Test support only.
//
// The point is the exact cuBLAS contract, so that a caller's mapping of row-major matrices onto
// cuBLAS's column-major ones is checked: C = alpha · op(A) · op(B) + beta · C with every matrix
// column-major, op(A) m × k (A stored m × k with lda >= m when transa is N, k × m with lda >= k
// when T or C), op(B) k × n (ldb >= k for N, ldb >= n for T), C m × n (ldc >= m); the argument
// checks return CUBLAS_STATUS_INVALID_VALUE as cuBLAS does, and C is not read when beta is 0.
// Each element is one f32 accumulation over k in index order by fused multiply-add (16-bit
// values widened exactly, the result rounded to nearest even), so results agree with any other
// fixed-order f32 dot product to rounding, not bit for bit (cuBLAS itself promises no order).
// Pointers are host memory (the emulated driver's device memory is host memory); each matrix's
// extent is checked against the driver's allocations first, so a wrong leading dimension or
// transpose is a message naming the matrix, not a read of a neighbouring buffer.

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

// The kernels' storage types (written beside this file by mod.rs), in host C++.
#include "shim.h"
#include "prelude.cuh"

#define API extern "C" __attribute__((visibility("default")))

typedef int cublasStatus_t;

enum : cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16,
};

enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_PEDANTIC = 69 };

namespace {

struct Handle {
    void* stream;
    int pointer_mode;
    int math_mode;
};

// The storage types convert as the kernels do: the prelude's F16 and BF16 (round to nearest
// even, NaN to 0x7fff), included below, so a GEMM's output is stored bit for bit as a kernel
// would store it.
float load(int type, const void* p, size_t i) {
    switch (type) {
        case CUDA_R_16F: return F16::load(static_cast<const uint16_t*>(p)[i]);
        case CUDA_R_16BF: return BF16::load(static_cast<const uint16_t*>(p)[i]);
        default: return static_cast<const float*>(p)[i];
    }
}

void store(int type, void* p, size_t i, float v) {
    switch (type) {
        case CUDA_R_16F: static_cast<uint16_t*>(p)[i] = F16::store(v); break;
        case CUDA_R_16BF: static_cast<uint16_t*>(p)[i] = BF16::store(v); break;
        default: static_cast<float*>(p)[i] = v;
    }
}

size_t type_bytes(int type) { return type == CUDA_R_32F ? 4 : 2; }

// The emulated driver's check of device memory, if that driver is the one loaded.
typedef int (*RangeCheck)(const void*, size_t);
RangeCheck range_check() {
    static RangeCheck check = [] {
        void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        return lib ? (RangeCheck)dlsym(lib, "dpserve_emu_is_device_range") : nullptr;
    }();
    return check;
}

// Whether the `rows` × `cols` column-major matrix at `p` (`count` of them, `stride` elements
// apart) lies in device memory; says which one does not.
bool in_device_memory(const char* gemm, const char* name, int type, const void* p, int rows,
                      int cols, int ld, long long stride, int count) {
    RangeCheck check = range_check();
    if (!check || rows == 0 || cols == 0 || count == 0) return true;
    size_t elems = (size_t)(cols - 1) * ld + rows + (size_t)(count - 1) * (size_t)stride;
    if (check(p, elems * type_bytes(type))) return true;
    fprintf(stderr,
            "dpserve cuBLAS emulator: %s: %s (%d x %d, leading dimension %d, %d of them) is not "
            "inside one device allocation; on a GPU: an illegal address\n",
            gemm, name, rows, cols, ld, count);
    return false;
}

bool is_op(int op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

int max1(int v) { return v > 1 ? v : 1; }

struct Matrix {
    int type;
    const void* p;
    int ld;
    long long stride;
};

// One batch of `count` GEMMs, all operands of the given types, alpha and beta f32.
cublasStatus_t gemm(const char* name, Handle* h, int transa, int transb, int m, int n, int k,
                    const float* alpha, Matrix a, Matrix b, const float* beta, int c_type, void* c,
                    int ldc, long long stride_c, int count) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!is_op(transa) || !is_op(transb) || m < 0 || n < 0 || k < 0 || count < 0) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (a.ld < max1(transa == CUBLAS_OP_N ? m : k) || b.ld < max1(transb == CUBLAS_OP_N ? k : n) ||
        ldc < max1(m)) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    float al = *alpha, be = *beta;
    // Nothing to do (the documented quick return): C is left as it is.
    if (m == 0 || n == 0 || count == 0 || ((al == 0.0f || k == 0) && be == 1.0f)) {
        return CUBLAS_STATUS_SUCCESS;
    }
    bool reads = al != 0.0f && k > 0;
    bool na = transa == CUBLAS_OP_N, nb = transb == CUBLAS_OP_N;
    if ((reads && !in_device_memory(name, "A", a.type, a.p, na ? m : k, na ? k : m, a.ld,
                                    a.stride, count)) ||
        (reads && !in_device_memory(name, "B", b.type, b.p, nb ? k : n, nb ? n : k, b.ld,
                                    b.stride, count)) ||
        !in_device_memory(name, "C", c_type, c, m, n, ldc, stride_c, count)) {
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    for (int batch = 0; batch < count; batch++) {
        for (int j = 0; j < n; j++) {
            for (int i = 0; i < m; i++) {
                float acc = 0.0f;
                if (al != 0.0f) {
                    for (int l = 0; l < k; l++) {
                        // op(A)(i, l) and op(B)(l, j), column-major.
                        size_t ia = transa == CUBLAS_OP_N ? (size_t)i + (size_t)l * a.ld
                                                          : (size_t)l + (size_t)i * a.ld;
                        size_t ib = transb == CUBLAS_OP_N ? (size_t)l + (size_t)j * b.ld
                                                          : (size_t)j + (size_t)l * b.ld;
                        ia += (size_t)(batch * a.stride);
                        ib += (size_t)(batch * b.stride);
                        acc = fmaf(load(a.type, a.p, ia), load(b.type, b.p, ib), acc);
                    }
                }
                size_t ic = (size_t)i + (size_t)j * ldc + (size_t)(batch * stride_c);
                float v = al * acc;
                // beta = 0: C is output only (it may hold NaN), as documented.
                if (be != 0.0f) v = v + be * load(c_type, c, ic);
                store(c_type, c, ic, v);
            }
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

bool supported_types(int a, int b, int c, int compute) {
    bool same = a == b && b == c && (a == CUDA_R_32F || a == CUDA_R_16F || a == CUDA_R_16BF);
    return same && (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC);
}

struct StatusText {
    cublasStatus_t code;
    const char* name;
    const char* text;
};

const StatusText STATUSES[] = {
    {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "success"},
    {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED",
     "the library was not initialized"},
    {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "the resource allocation failed"},
    {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE",
     "an invalid numeric value was used as an argument"},
    {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH",
     "an absent device architectural feature is required"},
    {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR",
     "an access to GPU memory space failed"},
    {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED",
     "the GPU program failed to execute"},
    {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR", "an internal operation failed"},
    {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED",
     "the functionality requested is not supported"},
    {CUBLAS_STATUS_LICENSE_ERROR, "CUBLAS_STATUS_LICENSE_ERROR",
     "an error was detected when checking the current licensing"},
};

}  // namespace

API cublasStatus_t cublasCreate_v2(Handle** handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new Handle{nullptr, 0, 0};
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasDestroy_v2(Handle* handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasGetVersion_v2(Handle* handle, int* version) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    *version = 130000;
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasSetStream_v2(Handle* handle, void* stream) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasGetStream_v2(Handle* handle, void** stream) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasSetPointerMode_v2(Handle* handle, int mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != 0 && mode != 1) return CUBLAS_STATUS_INVALID_VALUE;
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasGetPointerMode_v2(Handle* handle, int* mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    *mode = handle->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasSetMathMode(Handle* handle, int mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasGetMathMode(Handle* handle, int* mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    *mode = handle->math_mode;
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasSetWorkspace_v2(Handle* handle, void*, size_t) {
    return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

API const char* cublasGetStatusName(cublasStatus_t status) {
    for (const StatusText& s : STATUSES) {
        if (s.code == status) return s.name;
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

API const char* cublasGetStatusString(cublasStatus_t status) {
    for (const StatusText& s : STATUSES) {
        if (s.code == status) return s.text;
    }
    return "unknown error";
}

API cublasStatus_t cublasSgemm_v2(Handle* h, int transa, int transb, int m, int n, int k,
                                  const float* alpha, const float* a, int lda, const float* b,
                                  int ldb, const float* beta, float* c, int ldc) {
    return gemm("cublasSgemm_v2", h, transa, transb, m, n, k, alpha,
                Matrix{CUDA_R_32F, a, lda, 0}, Matrix{CUDA_R_32F, b, ldb, 0}, beta, CUDA_R_32F, c,
                ldc, 0, 1);
}

API cublasStatus_t cublasSgemmStridedBatched(Handle* h, int transa, int transb, int m, int n,
                                             int k, const float* alpha, const float* a, int lda,
                                             long long stride_a, const float* b, int ldb,
                                             long long stride_b, const float* beta, float* c,
                                             int ldc, long long stride_c, int count) {
    return gemm("cublasSgemmStridedBatched", h, transa, transb, m, n, k, alpha,
                Matrix{CUDA_R_32F, a, lda, stride_a}, Matrix{CUDA_R_32F, b, ldb, stride_b}, beta,
                CUDA_R_32F, c, ldc, stride_c, count);
}

API cublasStatus_t cublasGemmEx(Handle* h, int transa, int transb, int m, int n, int k,
                                const void* alpha, const void* a, int a_type, int lda,
                                const void* b, int b_type, int ldb, const void* beta, void* c,
                                int c_type, int ldc, int compute, int /*algo*/) {
    if (!supported_types(a_type, b_type, c_type, compute)) return CUBLAS_STATUS_NOT_SUPPORTED;
    return gemm("cublasGemmEx", h, transa, transb, m, n, k, static_cast<const float*>(alpha),
                Matrix{a_type, a, lda, 0}, Matrix{b_type, b, ldb, 0},
                static_cast<const float*>(beta), c_type, c, ldc, 0, 1);
}

API cublasStatus_t cublasGemmStridedBatchedEx(Handle* h, int transa, int transb, int m, int n,
                                              int k, const void* alpha, const void* a,
                                              int a_type, int lda, long long stride_a,
                                              const void* b, int b_type, int ldb,
                                              long long stride_b, const void* beta, void* c,
                                              int c_type, int ldc, long long stride_c,
                                              int count, int compute, int /*algo*/) {
    if (!supported_types(a_type, b_type, c_type, compute)) return CUBLAS_STATUS_NOT_SUPPORTED;
    return gemm("cublasGemmStridedBatchedEx", h, transa, transb, m, n, k,
                static_cast<const float*>(alpha), Matrix{a_type, a, lda, stride_a},
                Matrix{b_type, b, ldb, stride_b}, static_cast<const float*>(beta), c_type, c, ldc,
                stride_c, count);
}
