// INT8 (W8A8) ops: per-token activation quantization (plain and fused) and the int8 matmul.
#pragma once

#include "runtime/ops/dispatch.hpp"
#include "runtime/weight.hpp"

#include <cstdint>

namespace tandem::ops {

// On backend::cuda every pointer is device memory and weights are device views
// (cuda::device_weight::view(): q(), scale() and f32() on the device).

// Quantized activations of a flat batch: row t ~= s[t] * q[t].
struct act_i8 {
    int8_t* q;   // [n_tok, n]
    float* s;    // [n_tok]
};

// q, s = quantize_per_token(x [n_tok, n])
void quantize_rows(const exec_ctx& ctx, act_i8 out, const float* x, int64_t n_tok, int64_t n);

// q, s = quantize_per_token(rms_norm(x, w)): RMSNorm and quantization in one pass per row
void rms_norm_quant(const exec_ctx& ctx, act_i8 out, const float* x, const float* w, int64_t n_tok, int64_t n,
                    float eps);

// hi, lo = two-term per-token quantization of x [n_tok, n]: x[t] ~= s_hi[t] q_hi[t] + s_lo[t] q_lo[t]
void quantize_rows_split(const exec_ctx& ctx, act_i8 hi, act_i8 lo, const float* x, int64_t n_tok, int64_t n);
// q, s = quantize_per_token(silu(gate) * up), gate and up [n_tok, n]
void swiglu_quant(const exec_ctx& ctx, act_i8 out, const float* gate, const float* up, int64_t n_tok, int64_t n);

// out [n_tok, w.n_out] = (s_x[t] * s_w[o]) * dot(q_x[t], q_w[o]) + bias [w.n_out]; w must be INT8,
// or low-bit (then quant/lowbit.hpp's matmul_lowbit_ref: per super-block scales; CPU and ref only).
void matmul_i8(const exec_ctx& ctx, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w,
               const weight* bias = nullptr);
// Builds ahead what matmul_i8 on this backend builds on first use for any n_tok up to max_tok
// with w (the CPU's oneDNN primitives; nothing elsewhere).
void prepare_matmul_i8(const exec_ctx& ctx, const weight& w, int64_t max_tok);

} // namespace tandem::ops
