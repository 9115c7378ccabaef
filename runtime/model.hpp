// The engine's forward pass: a Llama-family model built from ops over a paged KV cache.
#pragma once

#include "runtime/batch.hpp"
#include "runtime/kv_cache.hpp"
#include "runtime/model_config.hpp"
#include "runtime/ops/attention.hpp"
#include "runtime/ops/dispatch.hpp"
#include "runtime/tokenizer.hpp"
#include "runtime/weights.hpp"

#include <span>
#include <vector>

namespace tandem {

class model {
public:
    // kv: the element type of the caches that make_kv_layout describes.
    model(model_config cfg, model_weights weights, kv_dtype kv = kv_dtype::f32);

    const model_config& config() const { return cfg_; }
    const model_weights& weights() const { return w_; }

    // A KV layout for this model with the given page size (and the model's KV dtype).
    kv_layout make_kv_layout(int32_t page_size = 16) const;
    kv_dtype kv_type() const { return kv_; }
    void set_kv_type(kv_dtype kv) { kv_ = kv; }

    // Runs every new token of every sequence as one flat batch (matmuls over all tokens,
    // attention per sequence) and writes the logits of each token that wants them into
    // logits [b.n_logits(), n_vocab], in token order.
    void forward(const exec_ctx& ctx, const batch& b, kv_cache& kv, float* logits);

private:
    void ensure_scratch(int64_t n_tok);

    model_config cfg_;
    model_weights w_;
    kv_dtype kv_;
    // activations for the flat batch of n_tok tokens
    std::vector<float> x_;        // [n_tok, n_embd] residual stream
    std::vector<float> xn_;       // [n_tok, n_embd] normed
    std::vector<float> q_;        // [n_tok, n_embd]
    std::vector<float> k_, v_;    // [n_tok, n_embd_kv]
    std::vector<float> attn_;     // [n_tok, n_embd]
    std::vector<float> proj_;     // [2 * n_tok, n_embd] (the down projection's two terms)
    std::vector<float> gate_, up_;// [n_tok, n_ff]
    std::vector<float> last_;     // [n_logits, n_embd] rows whose logits are wanted
    std::vector<int8_t> xq_;      // [2 * n_tok, max(n_embd, n_ff)] INT8 activations (W8A8 path; two terms for w_down)
    std::vector<float> xs_;       // [2 * n_tok] their per-token scales
    std::vector<float> logits2_;  // [2 * n_rows, n_vocab] the INT8 logits' two terms
    std::vector<ops::decode_seq> decode_; // the batch's one-token sequences (one attention op for all)
};

} // namespace tandem
