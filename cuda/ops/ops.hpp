// CUDA kernels; the same contracts as cpu/ref/ops_ref.hpp, with every pointer in device memory
// and every call queued on the context's stream (nothing here synchronizes).
#pragma once

#include "runtime/attn_params.hpp"
#include "runtime/rope_params.hpp"

#include <cstdint>

namespace tandem::cuda {

class context;

void rms_norm(const context& c, float* out, const float* x, const float* w, int64_t n_tok, int64_t n, float eps);
void rope(const context& c, float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim,
          const rope_params& rp);
void swiglu(const context& c, float* out, const float* gate, const float* up, int64_t n);
void geglu(const context& c, float* out, const float* gate, const float* up, int64_t n);
void scale(const context& c, float* x, float s, int64_t n);
void softcap(const context& c, float* x, float cap, int64_t n);
void add(const context& c, float* x, const float* y, int64_t n);

// out [n_tok, n_embd] = rows tokens[t] of the embedding table: INT8 (q [n_vocab, n_embd] with one
// scale per row: scale * q, as weight::row_f32) when q is set, else F32 `f` [n_vocab, n_embd].
// Token ids must be in [0, n_vocab) (the caller checks them on the host).
void embed(const context& c, float* out, const int32_t* tokens, int64_t n_tok, const int8_t* q, const float* scale,
           const float* f, int64_t n_embd);

// out [n_rows, n] = x rows rows[r] (a gather of the rows whose logits are wanted)
void gather_rows(const context& c, float* out, const float* x, const int32_t* rows, int64_t n_rows, int64_t n);

// kv_store and attention of every sequence of p (cpu/ref/ops_ref.hpp), p's pages and tables
// in device memory: one launch per 64 sequences, a decode step's or a whole mixed batch's;
// with p's window (no page before it is read) and soft-cap.
void kv_store(const context& c, const attn_params& p, int il, const float* k, const float* v);
void attention(const context& c, const attn_params& p, int il, float* out, const float* q, int n_head, float scale);

// INT8 (W8A8), see runtime/ops/quant.hpp
void quantize_rows(const context& c, int8_t* q, float* s, const float* x, int64_t n_tok, int64_t n);
void rms_norm_quant(const context& c, int8_t* q, float* s, const float* x, const float* w, int64_t n_tok, int64_t n,
                    float eps);
void swiglu_quant(const context& c, int8_t* q, float* s, const float* gate, const float* up, int64_t n_tok,
                  int64_t n);
void quantize_rows_split(const context& c, int8_t* q_hi, float* s_hi, int8_t* q_lo, float* s_lo, const float* x,
                         int64_t n_tok, int64_t n);

// Which int8 GEMM runs: cuBLASLt's IMMA kernels (int32 out, then a scale kernel) where the
// shapes allow (n_out and n_in multiples of 4, 16-byte aligned operands, enough tokens), else
// the hand-written tiled dp4a kernel. Both give the same exact int32 dots.
enum class gemm_impl { automatic, tiled, cublaslt };

// out [n_tok, n_out] = float(dot(qx[t], qw[o])) * sx[t] * sw[o] + bias[o] (bias may be null).
// gemm_impl::cublaslt on shapes cuBLASLt refuses falls back to tiled; the return value says
// which one ran.
gemm_impl matmul_i8(const context& c, float* out, const int8_t* qx, const float* sx, int64_t n_tok,
                    const int8_t* qw, const float* sw, int64_t n_out, int64_t n_in, const float* bias,
                    gemm_impl impl = gemm_impl::automatic);

// out_i32 [n_tok, n_out] = dot(qx[t], qw[o]) through cuBLASLt alone (the benchmark's baseline);
// false when cuBLASLt cannot run the shape.
bool gemm_i8_i32_cublaslt(const context& c, int32_t* out_i32, const int8_t* qx, int64_t n_tok, const int8_t* qw,
                          int64_t n_out, int64_t n_in);


} // namespace tandem::cuda
