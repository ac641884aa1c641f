// The emulated driver's device memory: host pages, each allocation ending at an unmapped guard
// page (so a kernel reading or writing past the end of a buffer faults, and scheduler.cpp says
// which kernel), counted against the device's emulated size. The memcpy and memset calls check
// that their range lies inside one allocation, as the driver refuses a range it does not own.

#include "driver.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <mutex>

using emu::config;
using emu::MAX_DEVICES;
using emu::inside;
using emu::page_size;

namespace {

// Device memory: host pages, each allocation ending at an unmapped guard page.
struct Alloc {
    size_t bytes;
    int device;
    char* map;
    size_t map_len;
};
std::mutex mem_mu;
std::map<uintptr_t, Alloc> allocs;
size_t used[MAX_DEVICES];

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

CUresult device_alloc(CUdeviceptr* out, size_t bytes, int device) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    // Starts 16-byte aligned (every type the kernels load), ends within 15 bytes of the guard.
    size_t data = round_up(bytes, page_size()), span = round_up(bytes, 16);
    std::lock_guard<std::mutex> lock(mem_mu);
    if (bytes > config.total_bytes - used[device]) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t map_len = data + page_size();
    void* map = mmap(nullptr, map_len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    char* m = (char*)map;
    mprotect(m + data, page_size(), PROT_NONE);
    char* ptr = m + data - span;
    allocs[(uintptr_t)ptr] = Alloc{bytes, device, m, map_len};
    used[device] += bytes;
    *out = (CUdeviceptr)(uintptr_t)ptr;
    return CUDA_SUCCESS;
}

CUresult device_free(CUdeviceptr p) {
    std::lock_guard<std::mutex> lock(mem_mu);
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end()) return CUDA_ERROR_INVALID_VALUE;
    used[it->second.device] -= it->second.bytes;
    munmap(it->second.map, it->second.map_len);
    allocs.erase(it);
    return CUDA_SUCCESS;
}

CUresult check_range(CUdeviceptr p, size_t bytes) {
    if (bytes == 0) return CUDA_SUCCESS;
    return inside((uintptr_t)p, bytes) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

namespace emu {

size_t page_size() {
    static size_t p = (size_t)sysconf(_SC_PAGESIZE);
    return p;
}

bool inside(uintptr_t p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mem_mu);
    auto it = allocs.upper_bound(p);
    if (it == allocs.begin()) return false;
    --it;
    return p >= it->first && bytes <= it->second.bytes && p - it->first <= it->second.bytes - bytes;
}

}  // namespace emu

// For the emulated cuBLAS (cublas.cpp), which checks each matrix's extent before a GEMM:
// whether [p, p + bytes) lies inside one device allocation.
API int dpserve_emu_is_device_range(const void* p, size_t bytes) {
    return inside((uintptr_t)p, bytes);
}

// ---- Memory ----------------------------------------------------------------------------------

API CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
    int dev;
    if (CUresult r = emu::ctx_device(&dev)) return r;
    std::lock_guard<std::mutex> lock(mem_mu);
    *free_bytes = config.total_bytes - used[dev];
    *total_bytes = config.total_bytes;
    return CUDA_SUCCESS;
}

API CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
    int dev;
    if (CUresult r = emu::ctx_device(&dev)) return r;
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    return device_alloc(p, bytes, dev);
}

API CUresult cuMemAllocAsync(CUdeviceptr* p, size_t bytes, void*) {
    int dev;
    if (CUresult r = emu::ctx_device(&dev)) return r;
    // cudarc's empty slices: a null pointer, never dereferenced.
    if (bytes == 0) {
        *p = 0;
        return CUDA_SUCCESS;
    }
    return device_alloc(p, bytes, dev);
}

API CUresult cuMemFree_v2(CUdeviceptr p) {
    INIT_OR_RETURN;
    return p == 0 ? CUDA_SUCCESS : device_free(p);
}

API CUresult cuMemFreeAsync(CUdeviceptr p, void*) { return cuMemFree_v2(p); }

API CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned) {
    INIT_OR_RETURN;
    *p = malloc(bytes ? bytes : 1);
    return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

API CUresult cuMemAllocHost_v2(void** p, size_t bytes) { return cuMemHostAlloc(p, bytes, 0); }

API CUresult cuMemFreeHost(void* p) {
    INIT_OR_RETURN;
    free(p);
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
    INIT_OR_RETURN;
    if (CUresult r = check_range(dst, bytes)) return r;
    if (bytes) memcpy((void*)(uintptr_t)dst, src, bytes);
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
    INIT_OR_RETURN;
    if (CUresult r = check_range(src, bytes)) return r;
    if (bytes) memcpy(dst, (const void*)(uintptr_t)src, bytes);
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    INIT_OR_RETURN;
    if (CUresult r = check_range(dst, bytes)) return r;
    if (CUresult r = check_range(src, bytes)) return r;
    if (bytes) memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, bytes);
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, void*) {
    return cuMemcpyHtoD_v2(dst, src, bytes);
}

API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, void*) {
    return cuMemcpyDtoH_v2(dst, src, bytes);
}

API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, void*) {
    return cuMemcpyDtoD_v2(dst, src, bytes);
}

API CUresult cuMemcpyPeerAsync(CUdeviceptr dst, void*, CUdeviceptr src, void*,
                               size_t bytes, void*) {
    return cuMemcpyDtoD_v2(dst, src, bytes);
}

API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
    INIT_OR_RETURN;
    if (CUresult r = check_range(dst, n)) return r;
    if (n) memset((void*)(uintptr_t)dst, v, n);
    return CUDA_SUCCESS;
}

API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void*) {
    return cuMemsetD8_v2(dst, v, n);
}

API CUresult cuMemsetD16_v2(CUdeviceptr dst, unsigned short v, size_t n) {
    INIT_OR_RETURN;
    if (CUresult r = check_range(dst, n * 2)) return r;
    unsigned short* p = (unsigned short*)(uintptr_t)dst;
    for (size_t i = 0; i < n; i++) p[i] = v;
    return CUDA_SUCCESS;
}

API CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short v, size_t n, void*) {
    return cuMemsetD16_v2(dst, v, n);
}

API CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned v, size_t n) {
    INIT_OR_RETURN;
    if (CUresult r = check_range(dst, n * 4)) return r;
    unsigned* p = (unsigned*)(uintptr_t)dst;
    for (size_t i = 0; i < n; i++) p[i] = v;
    return CUDA_SUCCESS;
}

API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned v, size_t n, void*) {
    return cuMemsetD32_v2(dst, v, n);
}
