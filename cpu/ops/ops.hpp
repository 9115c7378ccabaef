// Fast CPU kernels (threaded, ISA-dispatched); same contracts as cpu/ref/ops_ref.hpp.
#pragma once

#include "runtime/attn_params.hpp"
#include "runtime/rope_params.hpp"
#include "runtime/weight.hpp"

#include <cstdint>

namespace tandem::cpu {

class thread_pool;

void rms_norm(thread_pool& pool, float* out, const float* x, const float* w, int64_t n_tok, int64_t n, float eps);
void matmul(thread_pool& pool, float* out, const float* x, int64_t n_tok, const float* w, int64_t n_out,
            int64_t n_in, const float* bias);
void rope(thread_pool& pool, float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim,
          const rope_params& rp);
void swiglu(thread_pool& pool, float* out, const float* gate, const float* up, int64_t n);
void add(thread_pool& pool, float* x, const float* y, int64_t n);
// kv_store and attention of every sequence of p (cpu/ref/ops_ref.hpp): the decode tokens of a
// step (sequences with one new token) share one op, their threads handed (sequence, kv head)
// jobs across all of them; a sequence with more new tokens gets its own, the same values a
// token gets whichever way its sequence's tokens were split into steps. Every kernel takes the
// window (reading no page before it) and the soft-cap.
void kv_store(thread_pool& pool, const attn_params& p, int il, const float* k, const float* v);
void attention(thread_pool& pool, const attn_params& p, int il, float* out, const float* q, int n_head, float scale);

// INT8 (W8A8), see runtime/ops/quant.hpp
void quantize_rows(thread_pool& pool, int8_t* q, float* s, const float* x, int64_t n_tok, int64_t n);
void rms_norm_quant(thread_pool& pool, int8_t* q, float* s, const float* x, const float* w, int64_t n_tok, int64_t n,
                    float eps);
void swiglu_quant(thread_pool& pool, int8_t* q, float* s, const float* gate, const float* up, int64_t n_tok,
                  int64_t n);
void quantize_rows_split(thread_pool& pool, int8_t* q_hi, float* s_hi, int8_t* q_lo, float* s_lo, const float* x,
                         int64_t n_tok, int64_t n);
void matmul_i8(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w,
               const float* bias);
// Builds what matmul_i8 would build on first use for any n_tok up to max_tok with w (oneDNN's
// primitive for each multiple of 64 rows), so that a server's memory reaches its steady
// state at start rather than in steps as batches of new sizes arrive.
void prepare_matmul_i8(const weight& w, int64_t max_tok);
// The layout of INT8 matrices matmul_i8 reads fastest at the active ISA level: blocked from the
// VNNI level up (every kernel there reads it; rows go to the AVX2 GEMV), rows below (blocked
// weights work there too, unpacked a block at a time).
q_layout matmul_i8_layout();
// matmul_i8 with its AMX kernel's tile instructions run on a scalar model of the tiles (any
// CPU): for tests of the AMX tiling where the CPU has none. Slow.
void matmul_i8_amx_emulated(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok,
                            const weight& w, const float* bias);

// The low-bit family (runtime/weight.hpp's lowbit_matrix): out [n_tok, m.n_out] as
// matmul_lowbit_ref (quant/lowbit.hpp) bit for bit at every ISA level: the scalar twin is the
// reference, AVX2 and VNNI unpack each super-block's codes once per tile into INT8 lines.
void matmul_lowbit(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok,
                   const lowbit_matrix& m, const float* bias);

// row [n] = silu(g) * u with AVX-512 and a polynomial exp (swiglu and swiglu_quant share it).
void swiglu_row_avx512(const float* g, const float* u, float* row, int64_t n);

} // namespace tandem::cpu
