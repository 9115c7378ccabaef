// A host emulation of the CUDA thread model, enough to run a kernel's own source on a machine
// without a GPU (tests/test_cuda_emu.cpp runs cuda/ops/attention_kernel.cuh with it).
//
// Each CUDA thread of a block is a fiber (ucontext), run one at a time until it reaches a
// barrier (__syncthreads, __syncwarp, a shuffle); blocks run one after another. That makes the
// run deterministic and turns the mistakes the hardware would hide or hang on into errors:
// a barrier some threads never reach (deadlock), a WMMA pointer or stride that breaks the
// alignment rules, shared memory read before it is written (it starts as NaN bytes), and,
// through three orders of running the threads, a barrier missing between warps. What it
// does not model: timing, memory ordering between blocks, the fragment layout inside a warp
// (each lane holds the whole 16x16 tile and stores a share of it; mma_sync is the
// warp-collective step), and the hardware's own rounding in tensor-core accumulation (here:
// f32 sums in k order).
//
// Include it after every other header and before the kernels' (*_kernels.cuh): it defines the
// CUDA keywords away, and renames namespace tandem::cuda to tandem::cuda_emulated for the rest
// of the file, so the emulated kernels and host launchers never clash with tandem_cuda's own
// (linked in through tandem_engine where nvcc is present). The kernels' host side gets a
// context whose device is the host: pointers are host memory, launches run here, in order.
#pragma once

#include "runtime/fp16.hpp"

#include <bit>

#include <ucontext.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
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

struct fiber {
    ucontext_t ctx{};
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
    std::vector<fiber> threads;
    int cur = -1;
    ucontext_t scheduler{};
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

// Blocks until every thread of the block (kind 1) or of the calling thread's warp (kind 2)
// has arrived here.
inline void barrier(int kind) {
    machine& m = state();
    fiber& f = self();
    const size_t warp = size_t(m.cur) / 32;
    uint64_t& gen = kind == 1 ? m.block_gen : m.warp_gen[warp];
    int& arrived = kind == 1 ? m.block_arrived : m.warp_arrived[warp];
    const int need = kind == 1 ? int(m.threads.size()) : 32;
    f.waiting = kind;
    f.wait_gen = gen;
    if (++arrived == need) {
        arrived = 0;
        ++gen;
    }
    swapcontext(&f.ctx, &m.scheduler); // resumed once gen has moved on
    f.waiting = 0;
}

inline void thread_entry() {
    machine& m = state();
    try {
        m.body();
    } catch (const std::exception& e) {
        if (m.error.empty()) m.error = e.what();
    }
    self().done = true; // uc_link returns to the scheduler
}

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
    machine& m = state();
    const size_t n = size_t(block.x) * block.y * block.z;
    if (block.y != 1 || block.z != 1 || block.x % 32 != 0 || n == 0 || n > 1024)
        fail("blocks here are 1-D and whole warps, not " + std::to_string(block.x) + "x" + std::to_string(block.y));
    m.grid = grid;
    m.block = block;
    m.body = std::move(body);
    m.error.clear();
    m.threads.resize(n);
    for (fiber& f : m.threads)
        if (f.stack.empty()) f.stack.resize(256 << 10);
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
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp = f.stack.data();
                    f.ctx.uc_stack.ss_size = f.stack.size();
                    f.ctx.uc_link = &m.scheduler;
                    makecontext(&f.ctx, thread_entry, 0);
                }
                // Which runnable thread goes next: in turn, or always the lowest (highest) numbered
                // one, which lets the first (last) warps run far ahead of the others, so a missing
                // barrier between warps shows. Blocks take the three orders in turn.
                const int order = int((m.launches + bx + by + bz) % 3);
                size_t next = 0;
                for (;;) {
                    size_t pick = n;
                    bool all_done = true;
                    for (size_t j = 0; j < n; ++j) {
                        const size_t i = order == 0 ? (next + j) % n : order == 1 ? j : n - 1 - j;
                        const fiber& f = m.threads[i];
                        if (f.done) continue;
                        all_done = false;
                        const uint64_t gen = f.waiting == 1 ? m.block_gen : m.warp_gen[i / 32];
                        if (f.waiting == 0 || gen != f.wait_gen) {
                            pick = i;
                            break;
                        }
                    }
                    if (all_done) break;
                    if (pick == n)
                        fail("deadlock: a barrier that not every thread of block (" + std::to_string(bx) + ", " +
                             std::to_string(by) + ") reaches");
                    m.cur = int(pick);
                    next = pick + 1;
                    swapcontext(&m.scheduler, &m.threads[pick].ctx);
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

#define cuda cuda_emulated
#include "cuda/device.hpp"

namespace tandem::cuda {
using std::max;
using std::min;
inline unsigned char* dynamic_smem() { return cuda_emu::state().smem(); }

// common.cuh's launch, run here: the launch waits for the kernel (so does nothing on a device).
template <class... P, class... A>
void launch_kernel(const context&, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, A&&... args) {
    cuda_emu::launch(grid, block, smem, [&] { kernel(args...); });
}

// The host as the device: the members the kernels' host side calls.
struct context::impl {};
inline context::context(int device) : device_(device) {}
inline context::~context() = default;
inline void context::make_current() const {}
} // namespace tandem::cuda

// WMMA at 16x16x16: every lane holds the whole tile, element (row, col) at x[row * 16 + col].
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulation has the 16x16x16 shape only");
    T x[256];
};

namespace detail {
inline float to_f32(float v) { return v; }
inline float to_f32(__half v) { return __half2float(v); }

// WMMA's rules: a 256-bit aligned pointer and a stride of a multiple of 16 bytes.
template <class T> void check_operands(const T* p, unsigned ldm) {
    if (reinterpret_cast<uintptr_t>(p) % 32 != 0) tandem::cuda_emu::fail("a WMMA pointer not 32-byte aligned");
    if (ldm * sizeof(T) % 16 != 0 || ldm < 16) tandem::cuda_emu::fail("a WMMA ldm not a multiple of 16 bytes");
}
template <class T> void load(T* x, const T* p, unsigned ldm, bool row_major) {
    check_operands(p, ldm);
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) x[r * 16 + c] = row_major ? p[r * ldm + unsigned(c)] : p[unsigned(c) * ldm + r];
}
} // namespace detail

template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
    static_assert(!std::is_void_v<Layout>);
    detail::load(f.x, p, ldm, std::is_same_v<Layout, row_major>);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t l) {
    detail::load(f.x, p, ldm, l == mem_row_major);
}
// Each lane stores its share of the tile only (here: elements lane, lane + 32, ...), as on the
// device, so reading the tile back needs a __syncwarp first.
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t l) {
    detail::check_operands(p, ldm);
    for (int e = tandem::cuda_emu::state().cur % 32; e < 256; e += 32) {
        const unsigned r = unsigned(e / 16), c = unsigned(e % 16);
        (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[e];
    }
}
template <class T> void fill_fragment(fragment<accumulator, 16, 16, 16, T>& f, T v) { std::fill(f.x, f.x + 256, v); }

// Warp-collective, as on the device: no lane gets its result before every lane has handed in
// its operands (so a lane's store after it cannot overwrite what another lane still loads).
// Lane 0 computes; the others take its result (every lane holds the same tiles).
template <class TA, class LA, class TB, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, TA, LA>& a,
              const fragment<matrix_b, 16, 16, 16, TB, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
    static std::vector<std::array<float, 256>> result; // per warp
    namespace emu = tandem::cuda_emu;
    const size_t warp = size_t(emu::state().cur) / 32;
    __syncwarp();
    if (emu::state().cur % 32 == 0) {
        result.resize(std::max(result.size(), warp + 1));
        for (int r = 0; r < 16; ++r)
            for (int n = 0; n < 16; ++n) {
                float acc = c.x[r * 16 + n];
                for (int k = 0; k < 16; ++k) acc += detail::to_f32(a.x[r * 16 + k]) * detail::to_f32(b.x[k * 16 + n]);
                result[warp][size_t(r * 16 + n)] = acc;
            }
    }
    __syncwarp();
    std::copy(result[warp].begin(), result[warp].end(), d.x);
    __syncwarp(); // lane 0 may compute the next product only when every lane has its copy
}
} // namespace nvcuda::wmma
