// One weight on the device.
#include "cuda/weight.hpp"

#include <vector>

namespace tandem::cuda {

device_weight::device_weight(const context& ctx, const weight& w) : n_out_(w.n_out), n_in_(w.n_in) {
    if (w.empty()) {
        n_out_ = n_in_ = 0;
        return;
    }
    if (w.is_i8()) {
        if (w.layout == q_layout::rows) {
            q_ = to_device(ctx, w.q(), size_t(w.n_out * w.n_in));
        } else { // laid out for the CPU kernels (a process running both): the device reads rows
            std::vector<int8_t> rows(size_t(w.n_out * w.n_in));
            for (int64_t o = 0; o < w.n_out; ++o) w.q_row(o, rows.data() + o * w.n_in);
            q_ = to_device(ctx, rows.data(), rows.size());
        }
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
