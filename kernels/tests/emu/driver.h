// What the parts of the emulated driver share: driver.cpp (the API), memory.cpp (device memory)
// and scheduler.cpp (running a grid). The kernel sources see shim.h only.

#ifndef DPSERVE_CUDA_EMU_DRIVER_H
#define DPSERVE_CUDA_EMU_DRIVER_H

#include "shim.h"

#include <stddef.h>
#include <stdint.h>

#include <atomic>

#define API extern "C" __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum : CUresult {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    CUDA_ERROR_FILE_NOT_FOUND = 301,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999,
};

namespace emu {

const size_t MAX_DEVICES = 64;

// The emulated devices, from the environment (read once, by cuInit; see driver.cpp).
struct Config {
    std::atomic<bool> initialized{false};
    int devices = 0;
    size_t total_bytes = 0;
    int cc_major = 9, cc_minor = 0;
    bool reverse = false;
};
extern Config config;

size_t page_size();
// Whether [p, p + bytes) lies inside one live device allocation (one past its end for bytes 0).
bool inside(uintptr_t p, size_t bytes);
// The device of the calling thread's context.
CUresult ctx_device(int* device);
// Runs `kernel` over the grid, every block to completion, before it returns.
CUresult run_grid(const Kernel* kernel, uint3 grid_dim, uint3 block_dim, void** params);

}  // namespace emu

#define INIT_OR_RETURN \
    if (!::emu::config.initialized) return CUDA_ERROR_NOT_INITIALIZED

#endif
