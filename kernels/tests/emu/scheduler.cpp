// Running a grid on the CPU: the blocks one after another on the calling OS thread, the threads
// of a block as fibers of it, switched only at a barrier (`__syncthreads`, a warp shuffle) or
// when a thread returns. Deterministic, and faithful to the barriers: no thread runs past one
// before every live thread of its block (or lanes of its warp) has reached it.

#include "driver.h"

#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <mutex>
#include <vector>

using emu::config;
using emu::page_size;

namespace emu {

Thread* current = nullptr;
Grid grid;

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

}  // namespace

CUresult emu::run_grid(const Kernel* k, uint3 grid_dim, uint3 block_dim, void** params) {
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
    Fiber** fibers = pool.get(n);
    if (!fibers) return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    block.invoke = k->invoke;
    block.params = params;
    block.kernel = k->name;
    block.fibers = fibers;
    block.sched = &pool.sched;
    grid.grid_dim = grid_dim;
    grid.block_dim = block_dim;

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
                grid.block_idx = uint3{x, y, z};
                if (!run_block(n)) {
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
    current = nullptr;
    block.kernel = nullptr;
    return result;
}
