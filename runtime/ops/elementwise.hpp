// Row-wise and element-wise ops: embedding rows, row gather, RMSNorm, RoPE, SwiGLU and GeGLU,
// scaling and soft-capping, residual add.
#pragma once

#include "runtime/ops/dispatch.hpp"
#include "runtime/rope_params.hpp"
#include "runtime/weight.hpp"

#include <cstdint>

namespace tandem::ops {

// On backend::cuda every pointer (weights and positions included) is device memory.

// out [n_tok, table.n_in] = rows tokens[t] of the embedding table (INT8 rows dequantized). The
// ids must be in [0, table.n_out): the caller checks them on the host.
void embed(const exec_ctx& ctx, float* out, const int32_t* tokens, int64_t n_tok, const weight& table);

// out [n_rows, n] = rows rows[r] of x [., n]
void gather_rows(const exec_ctx& ctx, float* out, const float* x, const int32_t* rows, int64_t n_rows, int64_t n);

// out [n_tok, n] = x / rms(x) * w [n]
void rms_norm(const exec_ctx& ctx, float* out, const float* x, const float* w, int64_t n_tok, int64_t n, float eps);

// In place on x [n_tok, n_head, head_dim]; token t at positions[t] (rp.inv_freq backend memory).
void rope(const exec_ctx& ctx, float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim,
          const rope_params& rp);

// out [n] = silu(gate) * up
void swiglu(const exec_ctx& ctx, float* out, const float* gate, const float* up, int64_t n);

// out [n] = gelu(gate) * up (GELU's tanh approximation: Gemma's GeGLU)
void geglu(const exec_ctx& ctx, float* out, const float* gate, const float* up, int64_t n);

// x [n] *= s
void scale(const exec_ctx& ctx, float* x, float s, int64_t n);

// x [n] = cap * tanh(x / cap), cap > 0 (Gemma 2's logit soft-capping)
void softcap(const exec_ctx& ctx, float* x, float cap, int64_t n);

// x [n] += y
void add(const exec_ctx& ctx, float* x, const float* y, int64_t n);

} // namespace tandem::ops
