// Every op's name and CUDA slot: the signature cuda/ implements and the pointer cuda::register_ops fills.
#pragma once

// Core, not engine: cuda/ fills the slots without seeing the engine, and runtime/ reaches the
// CUDA kernels without including a cuda/ header. The ref and CPU bindings, which are always
// built, stay in runtime/ops/*.cpp (structs deriving from these). An empty slot dispatches as
// "op X has no cuda implementation". Arguments after the context are those of the op's
// cpu/ref/ops_ref.hpp twin, device memory except where the op's header says otherwise.

#include "runtime/attn_params.hpp"
#include "runtime/rope_params.hpp"
#include "runtime/ops/dispatch.hpp"
#include "runtime/weight.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tandem::ops {

using cuda_ctx = ::tandem::cuda::context;

// An op's CUDA slot: its signature and the pointer cuda::register_ops fills (one per op: Op
// keeps ops of the same signature apart).
template <class Op, class Fn>
struct cuda_slot {
    using cuda_fn = Fn;
    static inline cuda_fn* cuda_impl = nullptr;
};

// Element-wise (runtime/ops/elementwise.hpp).
struct rms_norm_op : cuda_slot<rms_norm_op, void(const cuda_ctx&, float* out, const float* x, const float* w,
                                                 int64_t n_tok, int64_t n, float eps)> {
    static constexpr std::string_view name = "rms_norm";
};
struct rope_op : cuda_slot<rope_op, void(const cuda_ctx&, float* x, const int32_t* positions, int64_t n_tok, int n_head,
                                         int head_dim, const rope_params& rp)> {
    static constexpr std::string_view name = "rope";
};
struct swiglu_op
    : cuda_slot<swiglu_op, void(const cuda_ctx&, float* out, const float* gate, const float* up, int64_t n)> {
    static constexpr std::string_view name = "swiglu";
};
struct geglu_op
    : cuda_slot<geglu_op, void(const cuda_ctx&, float* out, const float* gate, const float* up, int64_t n)> {
    static constexpr std::string_view name = "geglu";
};
struct scale_op : cuda_slot<scale_op, void(const cuda_ctx&, float* x, float s, int64_t n)> {
    static constexpr std::string_view name = "scale";
};
struct softcap_op : cuda_slot<softcap_op, void(const cuda_ctx&, float* x, float cap, int64_t n)> {
    static constexpr std::string_view name = "softcap";
};
struct add_op : cuda_slot<add_op, void(const cuda_ctx&, float* x, const float* y, int64_t n)> {
    static constexpr std::string_view name = "add";
};

// The embedding lookup and the gather of the rows whose logits are wanted (runtime/ops/elementwise.hpp).
struct embed_op : cuda_slot<embed_op, void(const cuda_ctx&, float* out, const int32_t* tokens, int64_t n_tok,
                                           const int8_t* q, const float* scale, const float* f, int64_t n_embd)> {
    static constexpr std::string_view name = "embed";
};
struct gather_rows_op : cuda_slot<gather_rows_op, void(const cuda_ctx&, float* out, const float* x, const int32_t* rows,
                                                       int64_t n_rows, int64_t n)> {
    static constexpr std::string_view name = "gather_rows";
};
// Host memory to backend memory, and backend memory to backend memory (runtime/ops/scratch.hpp).
struct upload_op : cuda_slot<upload_op, void(const cuda_ctx&, void* dst, const void* src, size_t bytes)> {
    static constexpr std::string_view name = "upload";
};
struct copy_op : cuda_slot<copy_op, void(const cuda_ctx&, void* dst, const void* src, size_t bytes)> {
    static constexpr std::string_view name = "copy";
};

// F32 matmul (runtime/ops/matmul.hpp): host backends only.
struct matmul_op {
    static constexpr std::string_view name = "matmul";
};

// Attention over KV pages (runtime/ops/attention.hpp): p's pages and tables device memory,
// its sequences host memory.
struct kv_store_op
    : cuda_slot<kv_store_op, void(const cuda_ctx&, const attn_params& p, int il, const float* k, const float* v)> {
    static constexpr std::string_view name = "kv_store";
};
struct attention_op : cuda_slot<attention_op, void(const cuda_ctx&, const attn_params& p, int il, float* out,
                                                   const float* q, int n_head, float scale)> {
    static constexpr std::string_view name = "attention";
};

// INT8 (runtime/ops/quant.hpp).
struct quantize_rows_op : cuda_slot<quantize_rows_op, void(const cuda_ctx&, int8_t* q, float* s, const float* x,
                                                           int64_t n_tok, int64_t n)> {
    static constexpr std::string_view name = "quantize_rows";
};
struct quantize_rows_split_op
    : cuda_slot<quantize_rows_split_op, void(const cuda_ctx&, int8_t* q_hi, float* s_hi, int8_t* q_lo, float* s_lo,
                                             const float* x, int64_t n_tok, int64_t n)> {
    static constexpr std::string_view name = "quantize_rows_split";
};
struct rms_norm_quant_op : cuda_slot<rms_norm_quant_op, void(const cuda_ctx&, int8_t* q, float* s, const float* x,
                                                             const float* w, int64_t n_tok, int64_t n, float eps)> {
    static constexpr std::string_view name = "rms_norm_quant";
};
struct swiglu_quant_op : cuda_slot<swiglu_quant_op, void(const cuda_ctx&, int8_t* q, float* s, const float* gate,
                                                         const float* up, int64_t n_tok, int64_t n)> {
    static constexpr std::string_view name = "swiglu_quant";
};
// w is a device view (cuda::device_weight::view()); the bias [w.n_out] device memory or null.
struct matmul_i8_op : cuda_slot<matmul_i8_op, void(const cuda_ctx&, float* out, const int8_t* qx, const float* sx,
                                                   int64_t n_tok, const weight& w, const float* bias)> {
    static constexpr std::string_view name = "matmul_i8";
};

} // namespace tandem::ops
