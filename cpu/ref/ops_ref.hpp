// Scalar reference kernels: the readable spec that every fast CPU/CUDA kernel is tested against.
#pragma once

#include "runtime/attn_params.hpp"
#include "runtime/rope_params.hpp"
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
void rope(float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim, const rope_params& rp);

// out [n] = silu(gate) * up
void swiglu(float* out, const float* gate, const float* up, int64_t n);
// out [n] = gelu(gate) * up, GELU's tanh approximation (Gemma's GeGLU)
void geglu(float* out, const float* gate, const float* up, int64_t n);
// x [n] *= s
void scale(float* x, float s, int64_t n);
// x [n] = cap * tanh(x / cap) (Gemma 2's logit soft-capping)
void softcap(float* x, float cap, int64_t n);

// x [n] += y
void add(float* x, const float* y, int64_t n);

// out [n_tok, n_embd] = rows tokens[t] of an embedding table: INT8 q [n_vocab, n_embd] with a
// scale per row (scale * q, as weight::row_f32) when q is set, else F32 f [n_vocab, n_embd].
void embed(float* out, const int32_t* tokens, int64_t n_tok, const int8_t* q, const float* scale, const float* f,
           int64_t n_embd);

// out [n_rows, n] = rows rows[r] of x [., n]
void gather_rows(float* out, const float* x, const int32_t* rows, int64_t n_rows, int64_t n);

// Encodes n positions' head vectors src [n, head_dim] of (layer il, K or V, kv head kvh) into
// `page` from slot `slot0` on, in lay.dtype (i8: one scale per position and head).
void kv_write(uint8_t* page, const kv_layout& lay, int il, bool is_v, int kvh, int slot0, int n, const float* src,
              int64_t src_stride);
// Decodes slots [slot0, slot0 + n) of (il, K or V, kvh) of `page` into dst [n, head_dim].
void kv_read(const uint8_t* page, const kv_layout& lay, int il, bool is_v, int kvh, int slot0, int n, float* dst);

// Writes each sequence's new k, v rows [., n_head_kv * head_dim] at its new positions, in layer il.
void kv_store(const attn_params& p, int il, const float* k, const float* v);

// Causal attention of each sequence's new query rows q [., n_head, head_dim] over the paged
// K/V of layer il (positions first_seen(pos)..pos; scores soft-capped when p.softcap > 0):
// out [., n_head, head_dim]. Query head h reads kv head h / (n_head / n_head_kv).
void attention(const attn_params& p, int il, float* out, const float* q, int n_head, float scale);

} // namespace tandem::cpu::ref

namespace tandem::cpu::ref {

// Per-token INT8 activations: q [n_tok, n], s [n_tok] with row t ~= s[t] * q[t] (quant/int8.hpp).
void quantize_rows(int8_t* q, float* s, const float* x, int64_t n_tok, int64_t n);
void rms_norm_quant(int8_t* q, float* s, const float* x, const float* w, int64_t n_tok, int64_t n, float eps);
void swiglu_quant(int8_t* q, float* s, const float* gate, const float* up, int64_t n_tok, int64_t n);
// Two-term per-token INT8: x[t] ~= s_hi[t] * q_hi[t] + s_lo[t] * q_lo[t], the second term quantizing
// the first one's rounding error (about 15 bits per activation from two int8 matmuls).
void quantize_rows_split(int8_t* q_hi, float* s_hi, int8_t* q_lo, float* s_lo, const float* x, int64_t n_tok,
                         int64_t n);

// out [n_tok, n_out] = float(dot(qx[t], qw[o])) * sx[t] * sw[o] + bias[o] (bias may be null)
void matmul_i8(float* out, const int8_t* qx, const float* sx, int64_t n_tok, const int8_t* qw, const float* sw,
               const int32_t* qw_sum, int64_t n_out, int64_t n_in, const float* bias);


} // namespace tandem::cpu::ref
