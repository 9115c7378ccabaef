// The low-bit weight family: GGUF block formats below 8 bits (Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K,
// IQ4_NL, IQ4_XS) repacked, never re-quantized, into runtime/weight.hpp's lowbit_matrix, and
// the scalar references the kernels (cpu/ops/matmul_lowbit.cpp) are held to.
#pragma once

#include "runtime/dtype.hpp"
#include "runtime/weight.hpp"

#include <cstdint>

namespace tandem {

// Whether t is one of the formats above.
bool is_lowbit_format(dtype t);

// Rows [r0, r0 + n_out) of a matrix of type t with n_in inputs a row (a multiple of t's block),
// the file's blocks at `rows` (row r at rows + r * block_bytes_of(t, n_in)), repacked. Tiles of
// 16 outputs run on `for_tiles(n_tiles, fn(t0, t1))` (the loader's pool; may be sequential).
template <class F> lowbit_matrix pack_lowbit(dtype t, const uint8_t* rows, int64_t r0, int64_t n_out, int64_t n_in, F&& for_tiles);
lowbit_matrix lowbit_layout_of(dtype t, int64_t n_out, int64_t n_in); // the parameters, no data
// Packs tiles [t0, t1) of m (sized by lowbit_layout_of) from the file's rows.
void pack_lowbit_tiles(lowbit_matrix& m, const uint8_t* rows, int64_t r0, int64_t t0, int64_t t1);

template <class F>
lowbit_matrix pack_lowbit(dtype t, const uint8_t* rows, int64_t r0, int64_t n_out, int64_t n_in, F&& for_tiles) {
    lowbit_matrix m = lowbit_layout_of(t, n_out, n_in);
    m.data.resize(size_t(m.n_tiles() * m.n_super() * m.super_bytes));
    for_tiles(m.n_tiles(), [&](int64_t t0, int64_t t1) { pack_lowbit_tiles(m, rows, r0, t0, t1); });
    return m;
}

// Row o of m as floats [n_in]: d * sc * v (+ dm * mg) in the order the file's dequantizer
// (dequantize_blocks_ref) multiplies, so the same floats bit for bit (tested).
void lowbit_row_f32(const lowbit_matrix& m, int64_t o, float* out);

// The integer parts of one output's super-block s against INT8 activations x (the row's
// inputs [s * super, (s + 1) * super)) and their group sums xs (one per group):
// a = sum_g sc_g * (sum_i v_i x_i), b = sum_g mg_g * xs_g (b = 0 without minimums).
void lowbit_super_ref(const lowbit_matrix& m, int64_t o, int64_t s, const int8_t* x, const int32_t* xs, int32_t& a,
                      int32_t& b);

// The reference matmul every kernel gives bit for bit: per output o and token t,
//   r = 0; for each super-block s in order: r = r + (d_s * float(a_s) + dm_s * float(b_s))
//   out[t][o] = r * sx[t] (+ bias[o])
// with a, b from lowbit_super_ref on x row t (plain multiplies and adds, no FMA).
void matmul_lowbit_ref(float* out, const int8_t* qx, const float* sx, int64_t n_tok, const lowbit_matrix& m,
                       const float* bias);
// The same for outputs [o0, o1) only (out is still [n_tok, m.n_out]).
void matmul_lowbit_ref_rows(float* out, const int8_t* qx, const float* sx, int64_t n_tok, const lowbit_matrix& m,
                            const float* bias, int64_t o0, int64_t o1);

// Group sums of one activation row: xs[g] = sum of x over inputs [g * group, (g + 1) * group).
void lowbit_group_sums_ref(const int8_t* x, int64_t n_in, int32_t group, int32_t* xs);

} // namespace tandem
