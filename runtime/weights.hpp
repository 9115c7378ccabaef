// Model weights in the engine's layout: F32, or INT8 per output channel, from any supported GGUF type.
#pragma once

#include "runtime/model_config.hpp"

#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace tandem {

namespace gguf { class file; struct tensor_info; }
namespace cpu { class thread_pool; }

// Storage on 64-byte boundaries: the kernels load 64 bytes at a time, and a load that straddles
// two cache lines costs two (the decode GEMV ran ~40% faster on L2-resident rows once its
// activation rows were aligned).
template <class T>
struct cacheline_allocator {
    using value_type = T;
    static constexpr std::align_val_t align{64};
    cacheline_allocator() = default;
    template <class U> cacheline_allocator(const cacheline_allocator<U>&) {}
    T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), align)); }
    void deallocate(T* p, size_t) { ::operator delete(p, align); }
    template <class U> bool operator==(const cacheline_allocator<U>&) const { return true; }
};

// How matrices are held in memory. Vectors (norms, biases) are always F32.
enum class weight_format { f32, int8 };

// A weight: a matrix [n_out, n_in] stored row-major (each output's inputs are contiguous,
// as GGUF stores them), or a vector [n_out] with n_in == 1. Either F32 (`data`) or INT8:
// q [n_out, n_in] with one f32 scale per row, w[o][i] ~= scale[o] * q[o][i]. INT8 rows
// live in `q_store` or, for pre-quantized files, in the file's mapping (`q_ext`).
struct weight {
    std::vector<float> data;          // F32 form
    int64_t n_out = 0;
    int64_t n_in = 0;
    std::vector<int8_t, cacheline_allocator<int8_t>> q_store; // [n_out, n_in] when quantized at load
    std::vector<float> scale_store;   // [n_out]
    const int8_t* q_ext = nullptr;    // [n_out, n_in] in a mapped file (outlives the weight)
    const float* scale_ext = nullptr; // [n_out]
    std::vector<int32_t> q_sum;       // [n_out] sum of each q row (VNNI's u8 offset correction)
    std::shared_ptr<const void> packed; // a backend's own copy/handle (oneDNN), opaque here

    bool is_i8() const { return q_ext != nullptr || !q_store.empty(); }
    bool empty() const { return data.empty() && !is_i8(); }
    const float* row(int64_t i) const { return data.data() + i * n_in; }
    const int8_t* q() const { return q_ext ? q_ext : q_store.data(); }
    const float* scale() const { return scale_ext ? scale_ext : scale_store.data(); }
    int64_t bytes() const { return is_i8() ? n_out * n_in + n_out * 4 : int64_t(data.size()) * 4; }
    // Row i as F32 (dequantized for INT8) into out [n_in].
    void row_f32(int64_t i, float* out) const;
};

struct layer_weights {
    weight attn_norm;          // [n_embd]
    weight wq, wk, wv, wo;     // [n_embd, n_embd], [n_embd_kv, n_embd] x2, [n_embd, n_embd]
    weight bq, bk, bv;         // optional biases (Qwen2): [n_embd], [n_embd_kv] x2
    weight ffn_norm;           // [n_embd]
    weight w_gate, w_up;       // [n_ff, n_embd]
    weight w_down;             // [n_embd, n_ff]
};

struct weight_load_options {
    weight_format format = weight_format::f32;
    cpu::thread_pool* pool = nullptr; // quantizes rows in parallel when set
};

struct model_weights {
    weight tok_embd;           // [n_vocab, n_embd]
    weight output_norm;        // [n_embd]
    weight output;             // [n_vocab, n_embd]; empty when tied to tok_embd
    std::vector<layer_weights> layers;

    const weight& logits_weight() const { return output.empty() ? tok_embd : output; }
    int64_t bytes() const;     // what the weights occupy in memory (or in the mapping)

    // Loads and converts every tensor, checking each shape against the config; fills in
    // cfg.n_vocab, cfg.qkv_bias and cfg.tied_output. Throws tandem::error naming the tensor.
    // INT8 tensors of a `tandem quantize` file are used in place (the file must outlive
    // the weights) and need format int8.
    static model_weights load(const gguf::file& f, model_config& cfg, const weight_load_options& opt = {});
};

// Row r of a 2-D GGUF tensor of any supported type (I8 with its .scale tensor) as F32 [ne[0]].
void tensor_row_to_f32(const gguf::file& f, const gguf::tensor_info& t, int64_t r, float* out);

// Symmetric per-row INT8 of an F32 matrix [n_out, n_in] (rows in parallel when pool is set).
weight quantize_weight(const float* data, int64_t n_out, int64_t n_in, cpu::thread_pool* pool = nullptr);
// Fills w.q_sum from its rows.
void compute_row_sums(weight& w, cpu::thread_pool* pool = nullptr);

} // namespace tandem
