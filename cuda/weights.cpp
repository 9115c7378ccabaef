// Device copies of model weights.
#include "cuda/weights.hpp"

namespace tandem::cuda {

device_weight::device_weight(const context& ctx, const weight& w) : n_out_(w.n_out), n_in_(w.n_in) {
    if (w.empty()) {
        n_out_ = n_in_ = 0;
        return;
    }
    if (w.is_i8()) {
        q_ = to_device(ctx, w.q(), size_t(w.n_out * w.n_in));
        s_ = to_device(ctx, w.scale(), size_t(w.n_out) * sizeof(float));
        view_.n_out = w.n_out;
        view_.n_in = w.n_in;
        view_.q_ext = q_.as<int8_t>();
        view_.scale_ext = s_.as<float>();
        view_.q_sum = w.q_sum;
    } else {
        f_ = to_device(ctx, w.data.data(), w.data.size() * sizeof(float));
    }
}

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
