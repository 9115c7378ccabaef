// Scalar reference Q8_0 quantize/dequantize, the spec for any SIMD twin.
#include "quant/q8_0.hpp"

#include "runtime/dtype.hpp"
#include "runtime/error.hpp"
#include "runtime/fp16.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tandem {

void quantize_q8_0_ref(const float* x, uint8_t* blocks, int64_t n) {
    TANDEM_ASSERT(n % q8_0_block == 0, "q8_0: n = {} is not a multiple of {}", n, q8_0_block);
    for (int64_t b = 0; b < n / q8_0_block; ++b) {
        const float* xb = x + b * q8_0_block;
        uint8_t* out = blocks + b * int64_t(q8_0_block_bytes);
        float amax = 0.0f;
        for (int64_t i = 0; i < q8_0_block; ++i)
            if (std::isfinite(xb[i])) amax = std::max(amax, std::fabs(xb[i]));
        const float d = amax / 127.0f;
        const float id = d > 0.0f ? 1.0f / d : 0.0f;
        // The f16 scale is what readers see, but q uses the exact d as GGML does.
        const uint16_t dh = f32_to_fp16(d);
        std::memcpy(out, &dh, 2);
        for (int64_t i = 0; i < q8_0_block; ++i) {
            float q = std::isnan(xb[i]) ? 0.0f : std::round(xb[i] * id);
            if (std::isinf(xb[i])) q = xb[i] > 0 ? 127.0f : -127.0f; // inf * 0 would be NaN
            q = std::clamp(q, -127.0f, 127.0f);
            out[2 + i] = uint8_t(int8_t(q));
        }
    }
}

void dequantize_q8_0_ref(const uint8_t* blocks, float* out, int64_t n) {
    TANDEM_ASSERT(n % q8_0_block == 0, "q8_0: n = {} is not a multiple of {}", n, q8_0_block);
    for (int64_t b = 0; b < n / q8_0_block; ++b) {
        const uint8_t* in = blocks + b * int64_t(q8_0_block_bytes);
        const float d = load_f16(in);
        for (int64_t i = 0; i < q8_0_block; ++i) out[b * q8_0_block + i] = d * float(int8_t(in[2 + i]));
    }
}

} // namespace tandem
