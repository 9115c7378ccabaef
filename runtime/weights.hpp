// Model weights in the engine's layout, converted from any supported GGUF tensor type.
#pragma once

#include "runtime/model_config.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

namespace gguf { class file; }

// A dense F32 weight: a matrix [n_out, n_in] stored row-major (each output's inputs are
// contiguous, as GGUF stores them), or a vector [n_out] with n_in == 1.
struct weight {
    std::vector<float> data;
    int64_t n_out = 0;
    int64_t n_in = 0;

    bool empty() const { return data.empty(); }
    const float* row(int64_t i) const { return data.data() + i * n_in; }
};

struct layer_weights {
    weight attn_norm;          // [n_embd]
    weight wq, wk, wv, wo;     // [n_embd, n_embd], [n_embd_kv, n_embd] x2, [n_embd, n_embd]
    weight bq, bk, bv;         // optional biases (Qwen2): [n_embd], [n_embd_kv] x2
    weight ffn_norm;           // [n_embd]
    weight w_gate, w_up;       // [n_ff, n_embd]
    weight w_down;             // [n_embd, n_ff]
};

struct model_weights {
    weight tok_embd;           // [n_vocab, n_embd]
    weight output_norm;        // [n_embd]
    weight output;             // [n_vocab, n_embd]; empty when tied to tok_embd
    std::vector<layer_weights> layers;

    const weight& logits_weight() const { return output.empty() ? tok_embd : output; }

    // Loads and converts every tensor, checking each shape against the config; fills in
    // cfg.n_vocab, cfg.qkv_bias and cfg.tied_output. Throws tandem::error naming the tensor.
    static model_weights load(const gguf::file& f, model_config& cfg);
};

} // namespace tandem
