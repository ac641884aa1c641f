// A CUDA driver (libcuda.so.1) that runs on the CPU: the subset of the driver API that cudarc
// 0.19 calls for kernels::cuda (probe, context, memory, streams, events, modules, launches),
// with the kernel sources compiled in by g++ (see shim.h and mod.rs). Test support only.
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

#include "shim.h"

#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

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
const size_t MAX_DEVICES = 64;

struct Config {
    std::atomic<bool> initialized{false};
    int devices = 0;
    size_t total_bytes = 0;
    int cc_major = 9, cc_minor = 0;
    bool reverse = false;
};
Config config;

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

size_t page_size() {
    static size_t p = (size_t)sysconf(_SC_PAGESIZE);
    return p;
}

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

// Whether [p, p + bytes) lies inside one live allocation (one past its end for bytes = 0).
bool inside(uintptr_t p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mem_mu);
    auto it = allocs.upper_bound(p);
    if (it == allocs.begin()) return false;
    --it;
    return p >= it->first && bytes <= it->second.bytes && p - it->first <= it->second.bytes - bytes;
}

CUresult check_range(CUdeviceptr p, size_t bytes) {
    if (bytes == 0) return CUDA_SUCCESS;
    return inside((uintptr_t)p, bytes) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// Modules: the PTX text is kept for its entry points, the code is the registry's.
struct Module {
    std::vector<std::string> entries;
    // False for a binary image (cubin, fatbin), whose entry points are not read.
    bool ptx;
};

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

}  // namespace

// ---- The fiber scheduler: the threads of one block -------------------------------------------

namespace emu {

Thread* current = nullptr;
Grid grid;

void register_kernels(const Kernel* kernels, unsigned count) {
    for (unsigned i = 0; i < count; i++) registry().push_back(&kernels[i]);
}

namespace {

enum class Wait : unsigned char { Run, Warp, Block, Done };

const size_t STACK_BYTES = 256 << 10;

struct Fiber {
    Thread t;
    Wait wait;
    // Whether its context runs `fiber_main` (a fiber is reused by later blocks and launches).
    bool started;
    jmp_buf jb;
    ucontext_t uc;
    char* stack;
};

// A shuffle's value, with the shuffle count that wrote it (so a lane never takes a value left
// by an earlier shuffle, or by a lane that has exited).
struct Slot {
    uint64_t bits;
    unsigned round;
};

// The block being run. Launches are serialised, so one at a time.
struct Block {
    void (*invoke)(void**);
    void** params;
    const char* kernel;
    Fiber** fibers;
    unsigned n;
    unsigned alive, at_block;
    std::vector<unsigned> warp_alive, warp_at;
    // [warp][2][32]: shuffles alternate between two rows, so a lane that has read its value
    // may publish its next one while a slower lane still reads the previous row.
    std::vector<Slot> slots;
    jmp_buf* sched;
    // The earliest position (in the run order) a barrier released during the last resume.
    unsigned rescan;
};

Block block;
Fiber* running = nullptr;

// The fibers of an OS thread (each OS thread that launches gets its own, kept for reuse).
struct Pool {
    std::vector<Fiber*> fibers;
    jmp_buf sched;

    Fiber** get(unsigned n) {
        while (fibers.size() < n) {
            Fiber* f = new Fiber();
            size_t guard = page_size();
            void* m = mmap(nullptr, STACK_BYTES + guard, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
            if (m == MAP_FAILED) {
                delete f;
                return nullptr;
            }
            // Below the stack: an overflow faults instead of corrupting a neighbour.
            mprotect(m, guard, PROT_NONE);
            f->stack = (char*)m + guard;
            f->started = false;
            fibers.push_back(f);
        }
        return fibers.data();
    }

    ~Pool() {
        for (Fiber* f : fibers) {
            munmap(f->stack - page_size(), STACK_BYTES + page_size());
            delete f;
        }
    }
};
thread_local Pool pool;

// Back to the scheduler; returns when the fiber is resumed.
void park(Fiber* f) {
    if (_setjmp(f->jb) == 0) _longjmp(*block.sched, 1);
}

void fiber_main() {
    for (;;) {
        block.invoke(block.params);
        running->wait = Wait::Done;
        park(running);
    }
}

// Runs `f` until it parks at a barrier or returns. _setjmp/_longjmp, not swapcontext, for the
// switches: no signal-mask system call per switch (a fiber starts once with setcontext).
void resume(Fiber* f) {
    running = f;
    current = &f->t;
    if (_setjmp(*block.sched) != 0) return;
    if (f->started) _longjmp(f->jb, 1);
    f->started = true;
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = STACK_BYTES;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, fiber_main, 0);
    setcontext(&f->uc);
}

// Thread `i`'s place in the run order (the mapping is its own inverse: also the thread at
// place `i`).
unsigned position(unsigned i) { return config.reverse ? block.n - 1 - i : i; }

void release_block() {
    for (unsigned i = 0; i < block.n; i++) {
        if (block.fibers[i]->wait == Wait::Block) block.fibers[i]->wait = Wait::Run;
    }
    block.at_block = 0;
    block.rescan = 0;
}

void release_warp(unsigned w) {
    unsigned last = w * 32 + 31 < block.n ? w * 32 + 31 : block.n - 1;
    for (unsigned i = w * 32; i <= last; i++) {
        if (block.fibers[i]->wait == Wait::Warp) block.fibers[i]->wait = Wait::Run;
    }
    block.warp_at[w] = 0;
    unsigned first = config.reverse ? position(last) : position(w * 32);
    if (first < block.rescan) block.rescan = first;
}

// Runs the block's `n` threads to completion; false if they stopped at barriers none can pass
// (threads of one block, or lanes of one warp, waiting at different barriers).
//
// The order is greedy: always the first runnable thread in the run order (index order, or its
// reverse), going back to the first a barrier released. So the first warp runs ahead of the
// others as far as the barriers let it (up to the next `__syncthreads`), and within a warp the
// first lane ahead of the others up to the next shuffle: a read of shared memory that another
// thread writes without a barrier between sees the write in one order and not in the other.
bool run_block(unsigned n) {
    unsigned bx = grid.block_dim.x, by = grid.block_dim.y;
    for (unsigned i = 0; i < n; i++) {
        Thread& t = block.fibers[i]->t;
        t.idx = uint3{i % bx, (i / bx) % by, i / (bx * by)};
        t.lin = i;
        t.shuffles = 0;
        block.fibers[i]->wait = Wait::Run;
    }
    unsigned warps = (n + 31) / 32;
    block.n = n;
    block.alive = n;
    block.at_block = 0;
    block.warp_alive.assign(warps, 32);
    block.warp_alive[warps - 1] = n - (warps - 1) * 32;
    block.warp_at.assign(warps, 0);
    block.slots.assign(warps * 64, Slot{0, ~0u});
    unsigned done = 0, k = 0;
    while (done < n) {
        // The next runnable place from k, wrapping around once.
        unsigned tried = 0;
        while (tried < n && block.fibers[position(k)]->wait != Wait::Run) {
            k = k + 1 == n ? 0 : k + 1;
            tried++;
        }
        if (tried == n) {
            // Abandon the stuck fibers' stacks: they start afresh next time.
            for (unsigned i = 0; i < n; i++) {
                if (block.fibers[i]->wait != Wait::Done) block.fibers[i]->started = false;
            }
            return false;
        }
        unsigned i = position(k);
        Fiber* f = block.fibers[i];
        block.rescan = n;
        resume(f);
        if (f->wait == Wait::Done) {
            done++;
            unsigned w = i / 32;
            block.alive--;
            block.warp_alive[w]--;
            if (block.at_block && block.at_block == block.alive) release_block();
            if (block.warp_at[w] && block.warp_at[w] == block.warp_alive[w]) release_warp(w);
        }
        k = block.rescan < k + 1 ? block.rescan : k + 1;
        if (k == n) k = 0;
    }
    return true;
}

}  // namespace

void sync_block() {
    Fiber* f = running;
    f->wait = Wait::Block;
    // The last to arrive releases every thread (itself too); the order decides who goes first.
    if (++block.at_block == block.alive) release_block();
    park(f);
}

uint64_t exchange(uint64_t bits, unsigned src) {
    Fiber* f = running;
    unsigned w = f->t.lin / 32, lane = f->t.lin % 32, round = f->t.shuffles++;
    Slot* row = &block.slots[(w * 2 + (round & 1)) * 32];
    row[lane] = Slot{bits, round};
    f->wait = Wait::Warp;
    if (++block.warp_at[w] == block.warp_alive[w]) release_warp(w);
    park(f);
    if (src < 32 && row[src].round == round) return row[src].bits;
    return bits;
}

}  // namespace emu

// ---- A fault inside a kernel: say where before the process dies ------------------------------

namespace {

struct sigaction old_segv, old_bus;

void write_str(const char* s) {
    ssize_t r = write(2, s, strlen(s));
    (void)r;
}

void write_num(unsigned long long v, int base) {
    char buf[32];
    int i = 31;
    buf[i] = 0;
    do {
        buf[--i] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v && i > 0);
    write_str(buf + i);
}

void on_fault(int sig, siginfo_t* info, void*) {
    write_str("\ndpserve CUDA emulator: kernel ");
    write_str(emu::block.kernel ? emu::block.kernel : "?");
    write_str(" touched memory outside every device allocation at 0x");
    write_num((uintptr_t)info->si_addr, 16);
    write_str(" (block ");
    write_num(emu::grid.block_idx.x, 10);
    write_str(",");
    write_num(emu::grid.block_idx.y, 10);
    write_str(",");
    write_num(emu::grid.block_idx.z, 10);
    write_str(", thread ");
    if (emu::current) {
        write_num(emu::current->idx.x, 10);
        write_str(",");
        write_num(emu::current->idx.y, 10);
        write_str(",");
        write_num(emu::current->idx.z, 10);
    }
    write_str("); on a GPU: CUDA_ERROR_ILLEGAL_ADDRESS\n");
    // Die of the same signal once this handler returns.
    signal(sig, SIG_DFL);
}

std::mutex launch_mu;

CUresult launch(const emu::Kernel* k, uint3 grid_dim, uint3 block_dim, void** params) {
    // Every pointer parameter must point into device memory (a host pointer, or an integer
    // pushed where the kernel takes a pointer, would fault on the GPU).
    for (unsigned i = 0; i < k->arity; i++) {
        if (!((k->pointers >> i) & 1)) continue;
        uintptr_t p = (uintptr_t) * static_cast<void**>(params[i]);
        if (p && !inside(p, 0)) {
            fprintf(stderr,
                    "dpserve CUDA emulator: %s: parameter %u (0x%llx) is not in any device "
                    "allocation\n",
                    k->name, i, (unsigned long long)p);
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        }
    }
    unsigned n = block_dim.x * block_dim.y * block_dim.z;
    std::lock_guard<std::mutex> lock(launch_mu);
    emu::Fiber** fibers = emu::pool.get(n);
    if (!fibers) return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    emu::block.invoke = k->invoke;
    emu::block.params = params;
    emu::block.kernel = k->name;
    emu::block.fibers = fibers;
    emu::block.sched = &emu::pool.sched;
    emu::grid.grid_dim = grid_dim;
    emu::grid.block_dim = block_dim;

    struct sigaction fault = {};
    fault.sa_sigaction = on_fault;
    fault.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&fault.sa_mask);
    sigaction(SIGSEGV, &fault, &old_segv);
    sigaction(SIGBUS, &fault, &old_bus);
    CUresult result = CUDA_SUCCESS;
    auto nth = [](unsigned i, unsigned n) { return config.reverse ? n - 1 - i : i; };
    for (unsigned zi = 0; zi < grid_dim.z && result == CUDA_SUCCESS; zi++) {
        for (unsigned yi = 0; yi < grid_dim.y && result == CUDA_SUCCESS; yi++) {
            for (unsigned xi = 0; xi < grid_dim.x; xi++) {
                unsigned x = nth(xi, grid_dim.x), y = nth(yi, grid_dim.y), z = nth(zi, grid_dim.z);
                emu::grid.block_idx = uint3{x, y, z};
                if (!emu::run_block(n)) {
                    fprintf(stderr,
                            "dpserve CUDA emulator: %s: block (%u,%u,%u) deadlocked: its threads "
                            "wait at different barriers\n",
                            k->name, x, y, z);
                    result = CUDA_ERROR_LAUNCH_FAILED;
                    break;
                }
            }
        }
    }
    sigaction(SIGSEGV, &old_segv, nullptr);
    sigaction(SIGBUS, &old_bus, nullptr);
    emu::current = nullptr;
    emu::block.kernel = nullptr;
    return result;
}

// The device of the calling thread's context.
CUresult ctx_device(int* device) {
    if (!config.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!current_ctx) return CUDA_ERROR_INVALID_CONTEXT;
    *device = current_ctx->device;
    return CUDA_SUCCESS;
}

#define INIT_OR_RETURN \
    if (!config.initialized) return CUDA_ERROR_NOT_INITIALIZED
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

// For the emulated cuBLAS (cublas.cpp), which checks each matrix's extent before a GEMM:
// whether [p, p + bytes) lies inside one device allocation.
API int dpserve_emu_is_device_range(const void* p, size_t bytes) {
    return inside((uintptr_t)p, bytes);
}

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

// ---- Memory ----------------------------------------------------------------------------------

API CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
    int dev;
    if (CUresult r = ctx_device(&dev)) return r;
    std::lock_guard<std::mutex> lock(mem_mu);
    *free_bytes = config.total_bytes - used[dev];
    *total_bytes = config.total_bytes;
    return CUDA_SUCCESS;
}

API CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
    int dev;
    if (CUresult r = ctx_device(&dev)) return r;
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    return device_alloc(p, bytes, dev);
}

API CUresult cuMemAllocAsync(CUdeviceptr* p, size_t bytes, Stream*) {
    int dev;
    if (CUresult r = ctx_device(&dev)) return r;
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

API CUresult cuMemFreeAsync(CUdeviceptr p, Stream*) { return cuMemFree_v2(p); }

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

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, Stream*) {
    return cuMemcpyHtoD_v2(dst, src, bytes);
}

API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, Stream*) {
    return cuMemcpyDtoH_v2(dst, src, bytes);
}

API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, Stream*) {
    return cuMemcpyDtoD_v2(dst, src, bytes);
}

API CUresult cuMemcpyPeerAsync(CUdeviceptr dst, Context*, CUdeviceptr src, Context*,
                               size_t bytes, Stream*) {
    return cuMemcpyDtoD_v2(dst, src, bytes);
}

API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
    INIT_OR_RETURN;
    if (CUresult r = check_range(dst, n)) return r;
    if (n) memset((void*)(uintptr_t)dst, v, n);
    return CUDA_SUCCESS;
}

API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, Stream*) {
    return cuMemsetD8_v2(dst, v, n);
}

API CUresult cuMemsetD16_v2(CUdeviceptr dst, unsigned short v, size_t n) {
    INIT_OR_RETURN;
    if (CUresult r = check_range(dst, n * 2)) return r;
    unsigned short* p = (unsigned short*)(uintptr_t)dst;
    for (size_t i = 0; i < n; i++) p[i] = v;
    return CUDA_SUCCESS;
}

API CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short v, size_t n, Stream*) {
    return cuMemsetD16_v2(dst, v, n);
}

API CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned v, size_t n) {
    INIT_OR_RETURN;
    if (CUresult r = check_range(dst, n * 4)) return r;
    unsigned* p = (unsigned*)(uintptr_t)dst;
    for (size_t i = 0; i < n; i++) p[i] = v;
    return CUDA_SUCCESS;
}

API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned v, size_t n, Stream*) {
    return cuMemsetD32_v2(dst, v, n);
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
    return launch(f, uint3{gx, gy, gz}, uint3{bx, by, bz}, params);
}

API CUresult cuProfilerStart() { return CUDA_SUCCESS; }
API CUresult cuProfilerStop() { return CUDA_SUCCESS; }
