// A CUDA driver (libcuda.so.1) that runs on the CPU: the subset of the driver API that cudarc
// 0.19 calls for kernels::cuda (probe, context, memory, streams, events, modules, launches),
// with the kernel sources compiled in by g++ (see shim.h and mod.rs). Test support only. This
// file: initialisation, devices, contexts, streams, events, modules, the launch call; device
// memory is memory.cpp's, running a grid scheduler.cpp's.
//
// What it is faithful to, so that a test passing here means something on a GPU:
//   - launches run the real kernel sources with real barriers and warp shuffles (shim.h), the
//     grid and block the caller asked for, each parameter unpacked by the kernel's signature;
//   - the threads of a block run in a greedy order (see run_block), in index order or its
//     reverse, so a barrier missing between a write to shared memory and another thread's read
//     of it changes the result in at least one of the two orders;
//   - a pointer parameter must point into a live device allocation, and each allocation ends
//     at an unmapped page, so reading or writing past its end stops the test with a message
//     naming the kernel, block and thread;
//   - memcpy and memset ranges must lie inside one allocation, `cuModuleGetFunction` finds only
//     the `.entry` points of the PTX it was given, PTX for a newer architecture or PTX ISA than
//     this device and driver (CUDA 13.0) is refused, memory is counted against the emulated size.
// What it is not: asynchronous (every call completes before it returns; streams and events are
// handles), fast, or a check of data races between blocks (they run one after another).
//
// Configured when cuInit runs, by environment variables:
//   DPSERVE_CUDA_EMU_DEVICES  devices (default 1; CUDA_VISIBLE_DEVICES then narrows them)
//   DPSERVE_CUDA_EMU_MEM_MB   memory of each device in MiB (default 8192)
//   DPSERVE_CUDA_EMU_CC       compute capability, as "9.0" (default)
//   DPSERVE_CUDA_EMU_REVERSE  1: the blocks of a grid and the threads of a block in reverse
//                             order (a test runs once in each order)

#include "driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mutex>
#include <string>
#include <vector>

emu::Config emu::config;

using emu::config;
using emu::MAX_DEVICES;
using emu::ctx_device;

namespace {

struct ErrorText {
    CUresult code;
    const char* name;
    const char* text;
};

const ErrorText ERRORS[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU",
     "no kernel image is available for execution on the device"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX",
     "a PTX JIT compilation failed"},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
     "the provided PTX was compiled with an unsupported toolchain."},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const char* const NAME = "dpserve CPU emulator (not a GPU)";
// CUDA 13.0, whose JIT takes PTX ISA up to 9.0.
const int DRIVER_VERSION = 13000;
const int PTX_ISA_MAX = 90;

size_t env_number(const char* name, size_t fallback) {
    const char* v = getenv(name);
    if (!v || !*v) return fallback;
    char* end = nullptr;
    unsigned long long n = strtoull(v, &end, 10);
    return *end ? fallback : (size_t)n;
}

// How many of `devices` CUDA_VISIBLE_DEVICES leaves: ordinals in order, stopping at the first
// entry that is not one (as the driver does; UUIDs are not emulated).
int visible(int devices) {
    const char* v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v) return devices;
    std::vector<bool> seen(devices, false);
    int count = 0;
    std::string s(v);
    size_t start = 0;
    while (start <= s.size()) {
        size_t comma = s.find(',', start);
        std::string item = s.substr(start, comma == std::string::npos ? std::string::npos
                                                                       : comma - start);
        char* end = nullptr;
        long n = strtol(item.c_str(), &end, 10);
        if (item.empty() || *end || n < 0 || n >= devices || seen[n]) break;
        seen[n] = true;
        count++;
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return count;
}

// Contexts: one primary per device; the current one per OS thread, as in the driver.
struct Context {
    int device;
    int refs;
};
Context primary[MAX_DEVICES];
thread_local Context* current_ctx = nullptr;
thread_local std::vector<Context*> ctx_stack;

// Modules: the PTX text is kept for its entry points, the code is the registry's.
struct Module {
    std::vector<std::string> entries;
    // False for a binary image (cubin, fatbin), whose entry points are not read.
    bool ptx;
};

// Every kernel compiled in, registered when the library loads.
std::vector<const emu::Kernel*>& registry() {
    static std::vector<const emu::Kernel*> r;
    return r;
}

bool is_ident(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '$';
}

// The number after `directive` in `ptx` (`.version 9.0` gives 90, `.target sm_90a` 90), or -1.
int ptx_number(const std::string& ptx, const char* directive) {
    size_t at = ptx.find(directive);
    if (at == std::string::npos) return -1;
    at += strlen(directive);
    while (at < ptx.size() && (ptx[at] == ' ' || ptx[at] == '\t')) at++;
    if (ptx.compare(at, 3, "sm_") == 0) at += 3;
    int major = 0, digits = 0;
    while (at < ptx.size() && ptx[at] >= '0' && ptx[at] <= '9') {
        major = major * 10 + (ptx[at++] - '0');
        digits++;
    }
    if (!digits) return -1;
    if (at < ptx.size() && ptx[at] == '.') {
        at++;
        int minor = at < ptx.size() && ptx[at] >= '0' && ptx[at] <= '9' ? ptx[at] - '0' : 0;
        return major * 10 + minor;
    }
    return major;
}

// A cubin (ELF) or fatbin image, by its magic: accepted, its entry points not read.
bool is_binary(const void* image) {
    const unsigned char* p = static_cast<const unsigned char*>(image);
    return (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F') ||
           (p[0] == 0x50 && p[1] == 0xed && p[2] == 0x55 && p[3] == 0xba);
}

CUresult load_module(Module** out, const void* image, size_t len) {
    Module m;
    m.ptx = !is_binary(image);
    if (m.ptx) {
        std::string text(static_cast<const char*>(image), len);
        int version = ptx_number(text, ".version");
        int target = ptx_number(text, ".target");
        if (version < 0) return CUDA_ERROR_INVALID_IMAGE;
        if (version > PTX_ISA_MAX) return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
        if (target < 0 || target > config.cc_major * 10 + config.cc_minor) {
            return CUDA_ERROR_INVALID_PTX;
        }
        size_t at = 0;
        while ((at = text.find(".entry", at)) != std::string::npos) {
            at += 6;
            while (at < text.size() && (text[at] == ' ' || text[at] == '\t')) at++;
            size_t end = at;
            while (end < text.size() && is_ident(text[end])) end++;
            if (end > at) m.entries.push_back(text.substr(at, end - at));
            at = end;
        }
    }
    *out = new Module(m);
    return CUDA_SUCCESS;
}

#define DEVICE_OR_RETURN(dev) \
    INIT_OR_RETURN;           \
    if ((dev) < 0 || (dev) >= config.devices) return CUDA_ERROR_INVALID_DEVICE

struct Stream {
    int device;
};

struct Event {
    unsigned flags;
    bool recorded;
    timespec at;
};

const unsigned CU_EVENT_DISABLE_TIMING = 0x2;

}  // namespace

namespace emu {

void register_kernels(const Kernel* kernels, unsigned count) {
    for (unsigned i = 0; i < count; i++) registry().push_back(&kernels[i]);
}

CUresult ctx_device(int* device) {
    if (!config.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!current_ctx) return CUDA_ERROR_INVALID_CONTEXT;
    *device = current_ctx->device;
    return CUDA_SUCCESS;
}

}  // namespace emu

// ---- Errors, initialisation, devices ---------------------------------------------------------

API CUresult cuGetErrorString(CUresult error, const char** out) {
    for (const ErrorText& e : ERRORS) {
        if (e.code == error) {
            *out = e.text;
            return CUDA_SUCCESS;
        }
    }
    *out = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGetErrorName(CUresult error, const char** out) {
    for (const ErrorText& e : ERRORS) {
        if (e.code == error) {
            *out = e.name;
            return CUDA_SUCCESS;
        }
    }
    *out = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuInit(unsigned flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    static std::mutex init_mu;
    std::lock_guard<std::mutex> lock(init_mu);
    if (!config.initialized) {
        size_t devices = env_number("DPSERVE_CUDA_EMU_DEVICES", 1);
        config.devices = visible((int)(devices < MAX_DEVICES ? devices : MAX_DEVICES));
        config.total_bytes = env_number("DPSERVE_CUDA_EMU_MEM_MB", 8192) << 20;
        const char* cc = getenv("DPSERVE_CUDA_EMU_CC");
        int major = 0, minor = 0;
        if (cc && sscanf(cc, "%d.%d", &major, &minor) == 2 && major > 0 && minor >= 0) {
            config.cc_major = major;
            config.cc_minor = minor;
        }
        config.reverse = env_number("DPSERVE_CUDA_EMU_REVERSE", 0) != 0;
        for (size_t d = 0; d < MAX_DEVICES; d++) primary[d] = Context{(int)d, 0};
        config.initialized = true;
    }
    return config.devices == 0 ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

// The driver's private tables: NVRTC 13 loads libcuda.so.1 when it can and asks for one
// (without this function it crashed inside nvrtcCompileProgram). None here; NVRTC compiles
// without it.
API CUresult cuGetExportTable(const void** table, const void* /*uuid*/) {
    if (table) *table = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuDriverGetVersion(int* version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = DRIVER_VERSION;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int* count) {
    INIT_OR_RETURN;
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = config.devices;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    DEVICE_OR_RETURN(ordinal);
    *device = ordinal;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
    DEVICE_OR_RETURN(dev);
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", NAME);
    return CUDA_SUCCESS;
}

API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
    DEVICE_OR_RETURN(dev);
    *bytes = config.total_bytes;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid(unsigned char* uuid, CUdevice dev) {
    DEVICE_OR_RETURN(dev);
    memcpy(uuid, "dpserve-emu-gpu", 15);
    uuid[15] = (unsigned char)dev;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid_v2(unsigned char* uuid, CUdevice dev) {
    return cuDeviceGetUuid(uuid, dev);
}

API CUresult cuDeviceGetPCIBusId(char* id, int len, CUdevice dev) {
    DEVICE_OR_RETURN(dev);
    snprintf(id, (size_t)len, "0000:%02x:00.0", dev + 1);
    return CUDA_SUCCESS;
}

API CUresult cuDeviceComputeCapability(int* major, int* minor, CUdevice dev) {
    DEVICE_OR_RETURN(dev);
    *major = config.cc_major;
    *minor = config.cc_minor;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice dev) {
    DEVICE_OR_RETURN(dev);
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    int v = 0;
    switch (attribute) {
        case 1: v = 1024; break;                 // MAX_THREADS_PER_BLOCK
        case 2: case 3: v = 1024; break;         // MAX_BLOCK_DIM_X, _Y
        case 4: v = 64; break;                   // MAX_BLOCK_DIM_Z
        case 5: v = 2147483647; break;           // MAX_GRID_DIM_X
        case 6: case 7: v = 65535; break;        // MAX_GRID_DIM_Y, _Z
        case 8: v = 48 << 10; break;             // MAX_SHARED_MEMORY_PER_BLOCK
        case 9: v = 64 << 10; break;             // TOTAL_CONSTANT_MEMORY
        case 10: v = 32; break;                  // WARP_SIZE
        case 12: case 82: v = 65536; break;      // MAX_REGISTERS_PER_BLOCK, _PER_MULTIPROCESSOR
        case 13: v = 1000000; break;             // CLOCK_RATE (kHz)
        case 16: v = 1; break;                   // MULTIPROCESSOR_COUNT
        case 39: v = 2048; break;                // MAX_THREADS_PER_MULTIPROCESSOR
        case 41: v = 1; break;                   // UNIFIED_ADDRESSING
        case 75: v = config.cc_major; break;     // COMPUTE_CAPABILITY_MAJOR
        case 76: v = config.cc_minor; break;     // COMPUTE_CAPABILITY_MINOR
        case 81: v = 228 << 10; break;           // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        case 97: v = 227 << 10; break;           // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        case 106: v = 32; break;                 // MAX_BLOCKS_PER_MULTIPROCESSOR
        case 115: v = 1; break;                  // MEMORY_POOLS_SUPPORTED
        default:
            if (attribute <= 0 || attribute > 160) return CUDA_ERROR_INVALID_VALUE;
            v = 0;
    }
    *value = v;
    return CUDA_SUCCESS;
}

// ---- Contexts --------------------------------------------------------------------------------

API CUresult cuDevicePrimaryCtxRetain(Context** ctx, CUdevice dev) {
    DEVICE_OR_RETURN(dev);
    primary[dev].refs++;
    *ctx = &primary[dev];
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    DEVICE_OR_RETURN(dev);
    if (primary[dev].refs > 0) primary[dev].refs--;
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    DEVICE_OR_RETURN(dev);
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned* flags, int* active) {
    DEVICE_OR_RETURN(dev);
    *flags = 0;
    *active = primary[dev].refs > 0;
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(Context** ctx) {
    INIT_OR_RETURN;
    *ctx = current_ctx;
    return CUDA_SUCCESS;
}

API CUresult cuCtxSetCurrent(Context* ctx) {
    INIT_OR_RETURN;
    current_ctx = ctx;
    return CUDA_SUCCESS;
}

API CUresult cuCtxPushCurrent_v2(Context* ctx) {
    INIT_OR_RETURN;
    ctx_stack.push_back(current_ctx);
    current_ctx = ctx;
    return CUDA_SUCCESS;
}

API CUresult cuCtxPopCurrent_v2(Context** ctx) {
    INIT_OR_RETURN;
    if (ctx) *ctx = current_ctx;
    if (ctx_stack.empty()) {
        current_ctx = nullptr;
    } else {
        current_ctx = ctx_stack.back();
        ctx_stack.pop_back();
    }
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetDevice(CUdevice* dev) { return ctx_device(dev); }

API CUresult cuCtxSynchronize() {
    int dev;
    return ctx_device(&dev);
}

API CUresult cuCtxSetFlags(unsigned) {
    int dev;
    return ctx_device(&dev);
}

API CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
    INIT_OR_RETURN;
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetLimit(size_t* value, int) {
    INIT_OR_RETURN;
    *value = 0;
    return CUDA_SUCCESS;
}

API CUresult cuCtxSetLimit(int, size_t) {
    INIT_OR_RETURN;
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetCacheConfig(int* config_out) {
    INIT_OR_RETURN;
    *config_out = 0;
    return CUDA_SUCCESS;
}

API CUresult cuCtxSetCacheConfig(int) {
    INIT_OR_RETURN;
    return CUDA_SUCCESS;
}

// ---- Streams and events: handles (every call has completed when it returns) -----------------

API CUresult cuStreamCreate(Stream** stream, unsigned) {
    int dev;
    if (CUresult r = ctx_device(&dev)) return r;
    *stream = new Stream{dev};
    return CUDA_SUCCESS;
}

API CUresult cuStreamCreateWithPriority(Stream** stream, unsigned flags, int) {
    return cuStreamCreate(stream, flags);
}

API CUresult cuStreamDestroy_v2(Stream* stream) {
    INIT_OR_RETURN;
    delete stream;
    return CUDA_SUCCESS;
}

API CUresult cuStreamSynchronize(Stream*) {
    INIT_OR_RETURN;
    return CUDA_SUCCESS;
}

API CUresult cuStreamQuery(Stream*) {
    INIT_OR_RETURN;
    return CUDA_SUCCESS;
}

API CUresult cuStreamWaitEvent(Stream*, Event* event, unsigned) {
    INIT_OR_RETURN;
    return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

API CUresult cuLaunchHostFunc(Stream*, void (*fn)(void*), void* data) {
    INIT_OR_RETURN;
    fn(data);
    return CUDA_SUCCESS;
}

API CUresult cuEventCreate(Event** event, unsigned flags) {
    int dev;
    if (CUresult r = ctx_device(&dev)) return r;
    *event = new Event{flags, false, {}};
    return CUDA_SUCCESS;
}

API CUresult cuEventDestroy_v2(Event* event) {
    INIT_OR_RETURN;
    delete event;
    return CUDA_SUCCESS;
}

API CUresult cuEventRecord(Event* event, Stream*) {
    INIT_OR_RETURN;
    if (!event) return CUDA_ERROR_INVALID_HANDLE;
    event->recorded = true;
    clock_gettime(CLOCK_MONOTONIC, &event->at);
    return CUDA_SUCCESS;
}

API CUresult cuEventSynchronize(Event* event) {
    INIT_OR_RETURN;
    return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

API CUresult cuEventQuery(Event* event) {
    INIT_OR_RETURN;
    return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

API CUresult cuEventElapsedTime(float* ms, Event* start, Event* end) {
    INIT_OR_RETURN;
    if (!start || !end) return CUDA_ERROR_INVALID_HANDLE;
    if ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
    if (!start->recorded || !end->recorded) return CUDA_ERROR_NOT_READY;
    *ms = (float)((end->at.tv_sec - start->at.tv_sec) * 1e3 +
                  (end->at.tv_nsec - start->at.tv_nsec) / 1e6);
    return CUDA_SUCCESS;
}

API CUresult cuEventElapsedTime_v2(float* ms, Event* start, Event* end) {
    return cuEventElapsedTime(ms, start, end);
}

// ---- Modules and launches --------------------------------------------------------------------

API CUresult cuModuleLoadData(Module** module, const void* image) {
    int dev;
    if (CUresult r = ctx_device(&dev)) return r;
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    // PTX is text ending at its NUL.
    return load_module(module, image, is_binary(image) ? 0 : strlen((const char*)image));
}

API CUresult cuModuleLoadDataEx(Module** module, const void* image, unsigned, int*, void**) {
    return cuModuleLoadData(module, image);
}

API CUresult cuModuleLoad(Module** module, const char* path) {
    int dev;
    if (CUresult r = ctx_device(&dev)) return r;
    FILE* f = fopen(path, "rb");
    if (!f) return CUDA_ERROR_FILE_NOT_FOUND;
    std::string text;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    fclose(f);
    if (text.size() < 4) return CUDA_ERROR_INVALID_IMAGE;
    return load_module(module, text.data(), text.size());
}

API CUresult cuModuleUnload(Module* module) {
    INIT_OR_RETURN;
    delete module;
    return CUDA_SUCCESS;
}

API CUresult cuModuleGetFunction(const emu::Kernel** f, Module* module, const char* name) {
    INIT_OR_RETURN;
    if (!f || !module || !name) return CUDA_ERROR_INVALID_VALUE;
    if (module->ptx) {
        bool listed = false;
        for (const std::string& e : module->entries) listed = listed || e == name;
        if (!listed) return CUDA_ERROR_NOT_FOUND;
    }
    for (const emu::Kernel* k : registry()) {
        if (strcmp(k->name, name) == 0) {
            *f = k;
            return CUDA_SUCCESS;
        }
    }
    fprintf(stderr,
            "dpserve CUDA emulator: the PTX defines %s, but the emulator was built without it "
            "(rebuild it from the current kernel sources)\n",
            name);
    return CUDA_ERROR_NOT_FOUND;
}

API CUresult cuFuncGetAttribute(int* value, int attribute, const emu::Kernel* f) {
    INIT_OR_RETURN;
    if (!value || !f) return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
        case 0: *value = 1024; break;  // MAX_THREADS_PER_BLOCK
        case 4: *value = 32; break;    // NUM_REGS
        default: *value = 0;
    }
    return CUDA_SUCCESS;
}

API CUresult cuFuncSetAttribute(const emu::Kernel*, int, int) {
    INIT_OR_RETURN;
    return CUDA_SUCCESS;
}

API CUresult cuFuncSetCacheConfig(const emu::Kernel*, int) {
    INIT_OR_RETURN;
    return CUDA_SUCCESS;
}

API CUresult cuLaunchKernel(const emu::Kernel* f, unsigned gx, unsigned gy, unsigned gz,
                            unsigned bx, unsigned by, unsigned bz, unsigned shared_bytes,
                            Stream*, void** params, void** extra) {
    int dev;
    if (CUresult r = ctx_device(&dev)) return r;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (extra) return CUDA_ERROR_NOT_SUPPORTED;
    if (!params && f->arity) return CUDA_ERROR_INVALID_VALUE;
    // The limits of the device (cuDeviceGetAttribute above).
    if (!gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
    if (gx > 2147483647u || gy > 65535 || gz > 65535) return CUDA_ERROR_INVALID_VALUE;
    if (bx > 1024 || by > 1024 || bz > 64 || (unsigned long long)bx * by * bz > 1024) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (shared_bytes > (48u << 10)) return CUDA_ERROR_INVALID_VALUE;
    return emu::run_grid(f, uint3{gx, gy, gz}, uint3{bx, by, bz}, params);
}

API CUresult cuProfilerStart() { return CUDA_SUCCESS; }
API CUresult cuProfilerStop() { return CUDA_SUCCESS; }
