// Fast CPU kernels (threaded, ISA-dispatched); same contracts as cpu/ref/ops_ref.hpp.
#pragma once

#include "runtime/kv_layout.hpp"
#include "runtime/weight.hpp"

#include <cstdint>

namespace tandem::cpu {

class thread_pool;

void rms_norm(thread_pool& pool, float* out, const float* x, const float* w, int64_t n_tok, int64_t n, float eps);
void matmul(thread_pool& pool, float* out, const float* x, int64_t n_tok, const float* w, int64_t n_out,
            int64_t n_in, const float* bias);
void rope(thread_pool& pool, float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim,
          int n_rot, float freq_base, float freq_scale, bool neox);
void swiglu(thread_pool& pool, float* out, const float* gate, const float* up, int64_t n);
void add(thread_pool& pool, float* x, const float* y, int64_t n);
void kv_store(thread_pool& pool, uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* block_table,
              int32_t pos0, const float* k, const float* v, int64_t n_tok);
void attention(thread_pool& pool, float* out, const float* q, int64_t n_tok, int32_t n_past, int n_head,
               const uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* block_table, float scale);
// One token for each of n_seq sequences: sequence i's query and output are row rows[i] of q and out.
void attention_decode(thread_pool& pool, float* out, const float* q, int64_t n_seq, const int64_t* rows,
                      const int32_t* n_past, const int32_t* const* tables, int n_head, const uint8_t* kv_base,
                      const kv_layout& lay, int il, float scale);


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
// matmul_i8 with its AMX kernel's tile instructions run on a scalar model of the tiles (any
// CPU): for tests of the AMX tiling where the CPU has none. Slow.
void matmul_i8_amx_emulated(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok,
                            const weight& w, const float* bias);

// row [n] = silu(g) * u with AVX-512 and a polynomial exp (swiglu and swiglu_quant share it).
void swiglu_row_avx512(const float* g, const float* u, float* row, int64_t n);

} // namespace tandem::cpu
