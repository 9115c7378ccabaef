// One weight on the device: INT8 rows and scales, or F32 values, uploaded once.
#pragma once

#include "cuda/device.hpp"
#include "runtime/weight.hpp"

namespace tandem::cuda {

// One weight on the device. view() is a `weight` for ops on backend::cuda: its q(), scale()
// and f32() point at the device copies (q_sum stays a host copy for the ops' checks).
class device_weight {
public:
    device_weight() = default;
    device_weight(const context& ctx, const weight& w); // an empty w gives an empty device_weight

    bool empty() const { return n_out_ == 0; }
    bool is_i8() const { return q_.get() != nullptr; }
    int64_t n_out() const { return n_out_; }
    int64_t n_in() const { return n_in_; }
    const int8_t* q() const { return q_.as<int8_t>(); }     // [n_out, n_in] or null
    const float* scale() const { return s_.as<float>(); }   // [n_out] or null
    const float* f32() const { return f_.as<float>(); }     // [n_out, n_in] F32 form or null
    const weight& view() const { return view_; }
    size_t bytes() const { return q_.bytes() + s_.bytes() + f_.bytes(); }

private:
    int64_t n_out_ = 0, n_in_ = 0;
    buffer q_, s_, f_;
    weight view_;
};

} // namespace tandem::cuda
