// Matmul op: activations times a weight matrix (+ bias).
#pragma once

#include "runtime/ops/dispatch.hpp"
#include "runtime/weight.hpp"

#include <cstdint>

namespace tandem::ops {

// out [n_tok, w.n_out] = x [n_tok, w.n_in] . w^T + bias [w.n_out] (bias may be null or empty)
void matmul(const exec_ctx& ctx, float* out, const float* x, int64_t n_tok, const weight& w,
            const weight* bias = nullptr);

} // namespace tandem::ops
