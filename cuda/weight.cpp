// One weight on the device.
#include "cuda/weight.hpp"

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
        f_ = to_device(ctx, w.f32(), size_t(w.n_out * w.n_in) * sizeof(float));
        view_.n_out = w.n_out;
        view_.n_in = w.n_in;
        view_.data_ext = f_.as<float>();
    }
}

} // namespace tandem::cuda
