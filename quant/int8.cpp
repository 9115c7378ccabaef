// Scalar reference INT8 row quantize/dequantize and dots, the spec for the SIMD kernels.
#include "quant/int8.hpp"

#include <algorithm>
#include <cmath>

namespace tandem {

float quantize_row_i8_ref(const float* x, int8_t* q, int64_t n) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i)
        if (std::isfinite(x[i])) amax = std::max(amax, std::fabs(x[i]));
    const float scale = amax / 127.0f;
    const float inv = scale > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        float v = std::isnan(x[i]) ? 0.0f : std::nearbyint(x[i] * inv);
        if (std::isinf(x[i])) v = x[i] > 0 ? 127.0f : -127.0f; // inf * 0 would be NaN
        q[i] = int8_t(std::clamp(v, -127.0f, 127.0f));
    }
    return scale;
}

void dequantize_row_i8_ref(const int8_t* q, float scale, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = scale * float(q[i]);
}

int32_t dot_i8_ref(const int8_t* a, const int8_t* b, int64_t n) {
    int32_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += int32_t(a[i]) * int32_t(b[i]);
    return s;
}

int32_t sum_i8_ref(const int8_t* q, int64_t n) {
    int32_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += q[i];
    return s;
}

} // namespace tandem
