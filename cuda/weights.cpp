// Device copies of model weights.
#include "cuda/weights.hpp"

namespace tandem::cuda {

device_model_weights::device_model_weights(const context& ctx, const model_weights& w)
    : tok_embd(ctx, w.tok_embd), output_norm(ctx, w.output_norm), output(ctx, w.output),
      rope_freqs(ctx, w.rope_freqs) {
    layers.reserve(w.layers.size());
    for (const auto& l : w.layers) {
        device_layer& d = layers.emplace_back();
        d.reserve(layer_weight_fields.size());
        for (const auto field : layer_weight_fields) d.emplace_back(ctx, l.*field);
    }
    view_.tok_embd = tok_embd.view();
    view_.output_norm = output_norm.view();
    view_.output = output.view();
    view_.rope_freqs = rope_freqs.view();
    for (const device_layer& d : layers) {
        layer_weights& l = view_.layers.emplace_back();
        for (size_t i = 0; i < layer_weight_fields.size(); ++i) l.*layer_weight_fields[i] = d[i].view();
    }
}

size_t device_model_weights::bytes() const {
    size_t n = tok_embd.bytes() + output_norm.bytes() + output.bytes() + rope_freqs.bytes();
    for (const auto& d : layers)
        for (const device_weight& w : d) n += w.bytes();
    return n;
}

} // namespace tandem::cuda
