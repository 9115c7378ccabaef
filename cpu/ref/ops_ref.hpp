// Scalar reference kernels: the readable spec that every fast CPU/CUDA kernel is tested against.
#pragma once

#include "runtime/kv_layout.hpp"

#include <cstdint>

namespace tandem::cpu::ref {

// out [n_tok, n] = x / rms(x) * w, per row
void rms_norm(float* out, const float* x, const float* w, int64_t n_tok, int64_t n, float eps);

// out [n_tok, n_out] = x [n_tok, n_in] . w[n_out, n_in]^T + bias [n_out] (bias may be null)
void matmul(float* out, const float* x, int64_t n_tok, const float* w, int64_t n_out, int64_t n_in,
            const float* bias);

// Rotates the first n_rot dims of every head of x [n_tok, n_head, head_dim] in place;
// token t sits at positions[t]. neox: pairs (i, i + n_rot/2); otherwise (2i, 2i+1).
void rope(float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim, int n_rot,
          float freq_base, float freq_scale, bool neox);

// out [n] = silu(gate) * up
void swiglu(float* out, const float* gate, const float* up, int64_t n);

// x [n] += y
void add(float* x, const float* y, int64_t n);

// Writes k, v [n_tok, n_head_kv * head_dim] at positions pos0.. of the sequence whose
// pages are block_table, in layer il.
void kv_store(float* kv_base, const kv_layout& lay, int il, const int32_t* block_table, int32_t pos0,
              const float* k, const float* v, int64_t n_tok);

// Causal attention of q [n_tok, n_head, head_dim] (token t at position n_past + t) over the
// paged K/V of layer il: out [n_tok, n_head, head_dim]. Query head h reads kv head
// h / (n_head / n_head_kv).
void attention(float* out, const float* q, int64_t n_tok, int32_t n_past, int n_head, const float* kv_base,
               const kv_layout& lay, int il, const int32_t* block_table, float scale);

} // namespace tandem::cpu::ref
