// Device copies of model weights.
#include "cuda/weights.hpp"

namespace tandem::cuda {

device_model_weights::device_model_weights(const context& ctx, const model_weights& w)
    : tok_embd(ctx, w.tok_embd), output_norm(ctx, w.output_norm), output(ctx, w.output) {
    layers.reserve(w.layers.size());
    for (const auto& l : w.layers) {
        layers.push_back(device_layer{device_weight(ctx, l.attn_norm), device_weight(ctx, l.wq),
                                      device_weight(ctx, l.wk), device_weight(ctx, l.wv), device_weight(ctx, l.wo),
                                      device_weight(ctx, l.bq), device_weight(ctx, l.bk), device_weight(ctx, l.bv),
                                      device_weight(ctx, l.ffn_norm), device_weight(ctx, l.w_gate),
                                      device_weight(ctx, l.w_up), device_weight(ctx, l.w_down)});
    }
    view_.tok_embd = tok_embd.view();
    view_.output_norm = output_norm.view();
    view_.output = output.view();
    for (const device_layer& l : layers)
        view_.layers.push_back(layer_weights{l.attn_norm.view(), l.wq.view(), l.wk.view(), l.wv.view(), l.wo.view(),
                                             l.bq.view(), l.bk.view(), l.bv.view(), l.ffn_norm.view(),
                                             l.w_gate.view(), l.w_up.view(), l.w_down.view()});
}

size_t device_model_weights::bytes() const {
    size_t n = tok_embd.bytes() + output_norm.bytes() + output.bytes();
    for (const auto& l : layers)
        for (const device_weight* w : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv, &l.ffn_norm,
                                       &l.w_gate, &l.w_up, &l.w_down})
            n += w->bytes();
    return n;
}

} // namespace tandem::cuda
