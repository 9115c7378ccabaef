// The scalar FP32 forward pass (Llama and the architectures model_config describes): the
// readable specification every fast path must match.
#pragma once

#include "runtime/model_config.hpp"
#include "runtime/tokenizer.hpp"
#include "runtime/weights.hpp"

#include <vector>

namespace tandem {

// One sequence, one token at a time, contiguous KV cache, no threads, no SIMD: written
// for reading, in the manner of llama2.c. Tests compare the engine's logits with it.
class reference_forward {
public:
    reference_forward(const model_config& cfg, const model_weights& w, int32_t n_ctx);

    // Runs token `tok` at position `pos` (positions must come in order from 0) and returns
    // the logits [n_vocab].
    const std::vector<float>& forward(token_id tok, int32_t pos);
    // The last forward's final hidden state after the output norm [n_embd] (what embeddings pool).
    const std::vector<float>& hidden() const { return x_; }

private:
    // out [n_embd] = act(xb_ W_gate^T) * (xb_ W_up^T) W_down^T (a dense FFN or an expert)
    void ffn(const weight& w_gate, const weight& w_up, const weight& w_down, float* out);
    // x += the mixture-of-experts FFN of the normed row xb_
    void moe(const layer_weights& l, float* x);

    const model_config& c_;
    const model_weights& w_;
    int32_t n_ctx_;
    std::vector<float> x_, xb_, xb2_, q_, k_, v_, attn_, att_, hb_, hb2_, logits_; // activations
    std::vector<float> key_cache_, value_cache_; // [n_layer, n_ctx, n_embd_kv]
};

} // namespace tandem
