// The device side of the CUDA emulation in tests/cuda_emu/: enough of the CUDA thread model to
// run Tandem's kernels, from their own source, on a machine without a GPU. The headers beside
// this one (cuda_runtime.h, cuda_fp16.h, mma.h, cublasLt.h) stand in for the CUDA toolkit's
// when the backend is built with TANDEM_CUDA_EMULATED (tests/CMakeLists.txt): device memory is
// host memory, every call completes before it returns, and kernels run here.
//
// Each CUDA thread of a block is a fiber (ucontext), run one at a time until it reaches a
// barrier (__syncthreads, __syncwarp, a shuffle, a WMMA product); blocks run one after
// another. That makes the run deterministic and turns the mistakes the hardware would hide or
// hang on into errors: a barrier some threads never reach (deadlock), a WMMA pointer or stride
// that breaks the alignment rules, shared memory read before it is written (it starts as NaN
// bytes), and, through three orders of running the threads, a barrier missing between warps.
// What it does not model: timing, memory ordering between blocks, the fragment layout inside a
// warp (each lane holds the whole 16x16 tile and stores a share of it; mma_sync is the
// warp-collective step), and the hardware's own rounding in tensor-core accumulation (here:
// f32 sums in k order) and in its math functions (here: the host's).
#pragma once

#include "runtime/fp16.hpp"

#include <ucontext.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <math.h> // expf, fmaxf, ... unqualified, as device code calls them

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
// A block's threads run one after another on one OS thread and blocks in turn: a static local
// is shared by a block's threads as __shared__ memory is (and, like it, starts undefined).
#define __shared__ static

namespace tandem::cuda_emu {

struct dim3 {
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
    unsigned x, y, z;
};

// TANDEM_EMU_ASAN: 1 under AddressSanitizer (suites may run less there: it is several times
// slower). Switching between fibers: the fast switch of fiber.cpp (callee-saved registers and
// the stack pointer, no system call), or ucontext under ASan, which knows that one.
#if defined(__SANITIZE_ADDRESS__)
#define TANDEM_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TANDEM_EMU_ASAN 1
#endif
#endif
#ifndef TANDEM_EMU_ASAN
#define TANDEM_EMU_ASAN 0
#endif
#define TANDEM_EMU_UCONTEXT TANDEM_EMU_ASAN
#if !TANDEM_EMU_UCONTEXT
// Saves the callee-saved registers on the current stack, stores its pointer in *save, and
// continues on the stack `load` (saved the same way, or made by fiber_stack_init).
extern "C" void tandem_emu_switch(void** save, void* load);
#endif

struct fiber {
#if TANDEM_EMU_UCONTEXT
    ucontext_t ctx{};
#else
    void* sp = nullptr;
#endif
    std::vector<char> stack;
    dim3 idx;
    bool done = false;
    int waiting = 0; // 0: runnable; 1: at the block barrier; 2: at its warp's barrier
    uint64_t wait_gen = 0;
    double shfl = 0.0; // this lane's value in a shuffle
};

// The machine state: one block at a time.
struct machine {
    dim3 grid, block, block_idx;
    std::vector<fiber> threads; // the first n_threads are the block's (kept: stacks are reused)
    size_t n_threads = 0;
    int cur = -1;
#if TANDEM_EMU_UCONTEXT
    ucontext_t scheduler{};
#else
    void* scheduler_sp = nullptr;
#endif
    bool released = false; // a barrier let its threads go since the scheduler last looked
    uint64_t block_gen = 0;
    int block_arrived = 0;
    std::vector<uint64_t> warp_gen;
    std::vector<int> warp_arrived;
    std::vector<unsigned char> smem_store; // the block's dynamic shared memory, from smem()
    unsigned char* smem() { return smem_store.data() + (128 - reinterpret_cast<uintptr_t>(smem_store.data()) % 128); }
    std::function<void()> body;
    std::string error; // the first error a thread raised
    uint64_t launches = 0;
};

inline machine& state() {
    static machine m;
    return m;
}

inline fiber& self() { return state().threads[size_t(state().cur)]; }

// The running block's dynamic shared memory.
inline unsigned char* dynamic_smem() { return state().smem(); }

// Blocks until every thread of the block (kind 1) or of the calling thread's warp (kind 2)
// has arrived here.
inline void barrier(int kind) {
    machine& m = state();
    fiber& f = self();
    const size_t warp = size_t(m.cur) / 32;
    uint64_t& gen = kind == 1 ? m.block_gen : m.warp_gen[warp];
    int& arrived = kind == 1 ? m.block_arrived : m.warp_arrived[warp];
    const int need = kind == 1 ? int(m.n_threads) : 32;
    f.waiting = kind;
    f.wait_gen = gen;
    if (++arrived == need) {
        arrived = 0;
        ++gen;
        m.released = true;
    }
#if TANDEM_EMU_UCONTEXT
    swapcontext(&f.ctx, &m.scheduler); // resumed once gen has moved on
#else
    tandem_emu_switch(&f.sp, m.scheduler_sp);
#endif
    f.waiting = 0;
}

inline void thread_entry() {
    machine& m = state();
    try {
        m.body();
    } catch (const std::exception& e) {
        if (m.error.empty()) m.error = e.what();
    }
    self().done = true;
}

#if !TANDEM_EMU_UCONTEXT
// Where a new fiber starts: its thread, then back to the scheduler for good.
[[noreturn]] inline void fiber_main() {
    thread_entry();
    void* dead = nullptr;
    tandem_emu_switch(&dead, state().scheduler_sp);
    __builtin_unreachable();
}

// A stack that tandem_emu_switch "returns" into fiber_main from: six zero registers, then
// fiber_main as the return address, 16-byte aligned as after a call.
inline void* fiber_stack_init(std::vector<char>& stack) {
    auto top = (reinterpret_cast<uintptr_t>(stack.data()) + stack.size()) & ~uintptr_t(15);
    auto* slot = reinterpret_cast<uintptr_t*>(top - 16);
    slot[0] = reinterpret_cast<uintptr_t>(&fiber_main);
    for (int i = 1; i <= 6; ++i) slot[-i] = 0;
    return slot - 6;
}
#endif

[[noreturn]] inline void fail(const std::string& what) { throw std::runtime_error("cuda_emu: " + what); }

// swapcontext returns twice as far as the compiler knows; the scheduler's locals live across
// it unchanged (the fibers run on their own stacks).
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wclobbered"
#endif
// Runs body as the kernel of a grid x block launch with smem_bytes of dynamic shared memory.
// Throws what a thread threw, or a deadlock (a barrier not every thread reaches).
inline void launch(dim3 grid, dim3 block, size_t smem_bytes, std::function<void()> body) {
    static std::mutex one_at_a_time; // launches from several host threads take turns
    std::lock_guard lock(one_at_a_time);
    machine& m = state();
    const size_t n = size_t(block.x) * block.y * block.z;
    if (block.y != 1 || block.z != 1 || block.x % 32 != 0 || n == 0 || n > 1024)
        fail("blocks here are 1-D and whole warps, not " + std::to_string(block.x) + "x" + std::to_string(block.y));
    m.grid = grid;
    m.block = block;
    m.body = std::move(body);
    m.error.clear();
    if (m.threads.size() < n) m.threads.resize(n);
    m.n_threads = n;
    for (size_t i = 0; i < n; ++i)
        if (m.threads[i].stack.empty()) m.threads[i].stack.resize(256 << 10);
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                m.block_idx = {bx, by, bz};
                m.smem_store.assign(smem_bytes + 128, 0xff); // all NaN: reading what nothing wrote shows
                m.block_gen = 0;
                m.block_arrived = 0;
                m.warp_gen.assign(n / 32, 0);
                m.warp_arrived.assign(n / 32, 0);
                for (size_t i = 0; i < n; ++i) {
                    fiber& f = m.threads[i];
                    f.idx = {unsigned(i), 0, 0};
                    f.done = false;
                    f.waiting = 0;
#if TANDEM_EMU_UCONTEXT
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp = f.stack.data();
                    f.ctx.uc_stack.ss_size = f.stack.size();
                    f.ctx.uc_link = &m.scheduler;
                    makecontext(&f.ctx, thread_entry, 0);
#else
                    f.sp = fiber_stack_init(f.stack);
#endif
                }
                // Which runnable thread goes next: in turn, or always the lowest (highest) numbered
                // one, which lets the first (last) warps run far ahead of the others, so a missing
                // barrier between warps shows. Blocks take the three orders in turn.
                const int order = int((m.launches + bx + by + bz) % 3);
                size_t next = 0;    // order 0: where the turn goes on
                size_t from = 0;    // orders 1, 2: before this (in the order's sense) nothing can run
                m.released = false;
                for (;;) {
                    size_t pick = n;
                    bool all_done = true;
                    if (m.released) from = 0; // a barrier released threads: look from the start
                    m.released = false;
                    for (size_t j = order == 0 ? 0 : from; j < n; ++j) {
                        const size_t i = order == 0 ? (next + j) % n : order == 1 ? j : n - 1 - j;
                        const fiber& f = m.threads[i];
                        if (f.done) continue;
                        all_done = false;
                        const uint64_t gen = f.waiting == 1 ? m.block_gen : m.warp_gen[i / 32];
                        if (f.waiting == 0 || gen != f.wait_gen) {
                            pick = i;
                            from = j; // those before it stay blocked until a barrier releases them
                            break;
                        }
                    }
                    if (pick == n && order != 0 && from != 0) { // judge done or stuck on a full scan
                        from = 0;
                        continue;
                    }
                    if (all_done) break;
                    if (pick == n)
                        fail("deadlock: a barrier that not every thread of block (" + std::to_string(bx) + ", " +
                             std::to_string(by) + ") reaches");
                    m.cur = int(pick);
                    next = pick + 1;
#if TANDEM_EMU_UCONTEXT
                    swapcontext(&m.scheduler, &m.threads[pick].ctx);
#else
                    tandem_emu_switch(&m.scheduler_sp, m.threads[pick].sp);
#endif
                    if (!m.error.empty()) throw std::runtime_error(m.error);
                }
            }
    m.cur = -1;
    ++m.launches;
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

} // namespace tandem::cuda_emu

using tandem::cuda_emu::dim3;
#define threadIdx (::tandem::cuda_emu::self().idx)
#define blockIdx (::tandem::cuda_emu::state().block_idx)
#define blockDim (::tandem::cuda_emu::state().block)
#define gridDim (::tandem::cuda_emu::state().grid)

inline void __syncthreads() { tandem::cuda_emu::barrier(1); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    if (mask != 0xffffffffu) tandem::cuda_emu::fail("__syncwarp with a partial mask");
    tandem::cuda_emu::barrier(2);
}

template <class T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    static_assert(std::is_arithmetic_v<T>);
    namespace emu = tandem::cuda_emu;
    if (mask != 0xffffffffu || lane_mask < 0 || lane_mask > 31) emu::fail("shuffle with a partial mask or lane");
    emu::machine& m = emu::state();
    const int me = m.cur;
    m.threads[size_t(me)].shfl = double(v);
    __syncwarp();
    const int src = (me & ~31) | ((me & 31) ^ lane_mask);
    const T r = T(m.threads[size_t(src)].shfl);
    __syncwarp();
    return r;
}

inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline uint32_t __float_as_uint(float f) { return std::bit_cast<uint32_t>(f); }

struct int2 {
    int x, y;
};
inline int2 make_int2(int x, int y) { return {x, y}; }

// The four signed byte products of a and b, plus c.
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += int(int8_t(uint32_t(a) >> (8 * i))) * int(int8_t(uint32_t(b) >> (8 * i)));
    return c;
}

struct __half {
    uint16_t bits;
};
inline __half __float2half_rn(float f) { return {tandem::f32_to_fp16(f)}; }
inline float __half2float(__half h) { return tandem::fp16_to_f32(h.bits); }
inline __half __ushort_as_half(uint16_t b) { return {b}; }

namespace tandem::cuda {
using std::max;
using std::min;
} // namespace tandem::cuda

