// Stand-in for the CUDA toolkit's mma.h in the emulated build (see cuda_emu.hpp): nvcuda::wmma
// at the 16x16x16 shape with f16 operands and f32 accumulators, what Tandem's kernels use.
#pragma once

#include "cuda_emu.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

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
