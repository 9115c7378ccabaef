// Every op's name and CUDA slot: the signature cuda/ implements and the pointer cuda::register_ops fills.
#pragma once

// Core, not engine: cuda/ fills the slots without seeing the engine, and runtime/ reaches the
// CUDA kernels without including a cuda/ header. The ref and CPU bindings, which are always
// built, stay in runtime/ops/*.cpp (structs deriving from these). An empty slot dispatches as
// "op X has no cuda implementation". Arguments after the context are those of the op's
// cpu/ref/ops_ref.hpp twin, device memory except where the op's header says otherwise.

#include "runtime/kv_layout.hpp"
#include "runtime/ops/dispatch.hpp"
#include "runtime/weight.hpp"

#include <cstdint>
#include <string_view>

namespace tandem::ops {

using cuda_ctx = ::tandem::cuda::context;

// Element-wise (runtime/ops/elementwise.hpp).
struct rms_norm_op {
    static constexpr std::string_view name = "rms_norm";
    using cuda_fn = void(const cuda_ctx&, float* out, const float* x, const float* w, int64_t n_tok, int64_t n,
                         float eps);
    static inline cuda_fn* cuda_impl = nullptr;
};
struct rope_op {
    static constexpr std::string_view name = "rope";
    using cuda_fn = void(const cuda_ctx&, float* x, const int32_t* positions, int64_t n_tok, int n_head,
                         int head_dim, int n_rot, float freq_base, float freq_scale, bool neox);
    static inline cuda_fn* cuda_impl = nullptr;
};
struct swiglu_op {
    static constexpr std::string_view name = "swiglu";
    using cuda_fn = void(const cuda_ctx&, float* out, const float* gate, const float* up, int64_t n);
    static inline cuda_fn* cuda_impl = nullptr;
};
struct add_op {
    static constexpr std::string_view name = "add";
    using cuda_fn = void(const cuda_ctx&, float* x, const float* y, int64_t n);
    static inline cuda_fn* cuda_impl = nullptr;
};

// F32 matmul (runtime/ops/matmul.hpp): host backends only.
struct matmul_op {
    static constexpr std::string_view name = "matmul";
};

// Attention over KV pages (runtime/ops/attention.hpp). Block tables are host arrays here: the
// CUDA side copies over the entries it needs.
struct kv_store_op {
    static constexpr std::string_view name = "kv_store";
    using cuda_fn = void(const cuda_ctx&, uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* block_table,
                         int32_t pos0, const float* k, const float* v, int64_t n_tok);
    static inline cuda_fn* cuda_impl = nullptr;
};
struct attention_op {
    static constexpr std::string_view name = "attention";
    using cuda_fn = void(const cuda_ctx&, float* out, const float* q, int64_t n_tok, int32_t n_past, int n_head,
                         const uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* block_table,
                         float scale);
    static inline cuda_fn* cuda_impl = nullptr;
};
// One token for each of n_seq sequences: sequence i's query and output are row rows[i].
struct attention_decode_op {
    static constexpr std::string_view name = "attention";
    using cuda_fn = void(const cuda_ctx&, float* out, const float* q, int64_t n_seq, const int64_t* rows,
                         const int32_t* n_past, const int32_t* const* tables, int n_head, const uint8_t* kv_base,
                         const kv_layout& lay, int il, float scale);
    static inline cuda_fn* cuda_impl = nullptr;
};

// INT8 (runtime/ops/quant.hpp).
struct quantize_rows_op {
    static constexpr std::string_view name = "quantize_rows";
    using cuda_fn = void(const cuda_ctx&, int8_t* q, float* s, const float* x, int64_t n_tok, int64_t n);
    static inline cuda_fn* cuda_impl = nullptr;
};
struct quantize_rows_split_op {
    static constexpr std::string_view name = "quantize_rows_split";
    using cuda_fn = void(const cuda_ctx&, int8_t* q_hi, float* s_hi, int8_t* q_lo, float* s_lo, const float* x,
                         int64_t n_tok, int64_t n);
    static inline cuda_fn* cuda_impl = nullptr;
};
struct rms_norm_quant_op {
    static constexpr std::string_view name = "rms_norm_quant";
    using cuda_fn = void(const cuda_ctx&, int8_t* q, float* s, const float* x, const float* w, int64_t n_tok,
                         int64_t n, float eps);
    static inline cuda_fn* cuda_impl = nullptr;
};
struct swiglu_quant_op {
    static constexpr std::string_view name = "swiglu_quant";
    using cuda_fn = void(const cuda_ctx&, int8_t* q, float* s, const float* gate, const float* up, int64_t n_tok,
                         int64_t n);
    static inline cuda_fn* cuda_impl = nullptr;
};
// w is a device view (cuda::device_weight::view()); the bias [w.n_out] is a host array.
struct matmul_i8_op {
    static constexpr std::string_view name = "matmul_i8";
    using cuda_fn = void(const cuda_ctx&, float* out, const int8_t* qx, const float* sx, int64_t n_tok,
                         const weight& w, const float* bias);
    static inline cuda_fn* cuda_impl = nullptr;
};

} // namespace tandem::ops
