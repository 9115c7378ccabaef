// Row-wise and element-wise ops: RMSNorm, RoPE, SwiGLU, residual add.
#pragma once

#include "runtime/ops/dispatch.hpp"

#include <cstdint>

namespace tandem::ops {

// On backend::cuda every pointer (weights and positions included) is device memory.

// out [n_tok, n] = x / rms(x) * w [n]
void rms_norm(const exec_ctx& ctx, float* out, const float* x, const float* w, int64_t n_tok, int64_t n, float eps);

// In place on x [n_tok, n_head, head_dim]; token t at positions[t].
void rope(const exec_ctx& ctx, float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim,
          int n_rot, float freq_base, float freq_scale, bool neox);

// out [n] = silu(gate) * up
void swiglu(const exec_ctx& ctx, float* out, const float* gate, const float* up, int64_t n);

// x [n] += y
void add(const exec_ctx& ctx, float* x, const float* y, int64_t n);

} // namespace tandem::ops
