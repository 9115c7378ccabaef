// Scalar reference IQ4_NL / IQ4_XS blocks, written from their layouts (quant/iq4_blocks.hpp).
#include "quant/iq4_blocks.hpp"

#include "runtime/error.hpp"
#include "runtime/fp16.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tandem {
namespace {

// 32 values from 16 bytes of codes, scaled by d.
void decode32(const uint8_t* qs, float d, float* y) {
    for (int j = 0; j < 16; ++j) {
        y[j] = d * float(iq4_values[qs[j] & 0x0F]);
        y[j + 16] = d * float(iq4_values[qs[j] >> 4]);
    }
}

// The code whose table entry is nearest r (in table units); NaN takes the entry nearest zero.
int nearest_code(float r) {
    if (!(r == r)) return 8;
    int best = 0;
    for (int k = 1; k < 16; ++k)
        if (std::fabs(r - float(iq4_values[k])) < std::fabs(r - float(iq4_values[best]))) best = k;
    return best;
}

// 32 values to 16 bytes of codes for the step d.
void encode32(const float* x, float d, uint8_t* qs) {
    const float inv = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < 16; ++j) qs[j] = uint8_t(nearest_code(x[j] * inv) | nearest_code(x[j + 16] * inv) << 4);
}

// The step that puts the value of largest magnitude among 32 on the table's -127.
float step_of(const float* x) {
    float big = 0;
    for (int j = 0; j < 32; ++j)
        if (std::fabs(x[j]) > std::fabs(big)) big = x[j];
    return big / -127.0f;
}

} // namespace

void dequantize_iq4_nl_ref(const uint8_t* blocks, float* out, int64_t n) {
    TANDEM_ASSERT(n % 32 == 0, "IQ4_NL: n = {} is not a multiple of 32", n);
    for (int64_t i = 0; i < n / 32; ++i) decode32(blocks + i * 18 + 2, load_f16(blocks + i * 18), out + i * 32);
}

void quantize_iq4_nl_ref(const float* x, uint8_t* blocks, int64_t n) {
    TANDEM_ASSERT(n % 32 == 0, "IQ4_NL: n = {} is not a multiple of 32", n);
    for (int64_t i = 0; i < n / 32; ++i) {
        uint8_t* b = blocks + i * 18;
        store_f16(b, step_of(x + i * 32));
        encode32(x + i * 32, load_f16(b), b + 2);
    }
}

void dequantize_iq4_xs_ref(const uint8_t* blocks, float* out, int64_t n) {
    TANDEM_ASSERT(n % 256 == 0, "IQ4_XS: n = {} is not a multiple of 256", n);
    for (int64_t i = 0; i < n / 256; ++i) {
        const uint8_t* b = blocks + i * 136;
        const float d = load_f16(b);
        uint16_t scales_h;
        std::memcpy(&scales_h, b + 2, 2); // little-endian, as the file stores it
        const uint8_t* scales_l = b + 4;
        for (int j = 0; j < 8; ++j) {
            const int ls = (scales_l[j / 2] >> (4 * (j % 2)) & 0x0F) | (scales_h >> (2 * j) & 3) << 4;
            decode32(b + 8 + 16 * j, d * float(ls - 32), out + i * 256 + 32 * j);
        }
    }
}

void quantize_iq4_xs_ref(const float* x, uint8_t* blocks, int64_t n) {
    TANDEM_ASSERT(n % 256 == 0, "IQ4_XS: n = {} is not a multiple of 256", n);
    for (int64_t i = 0; i < n / 256; ++i) {
        const float* xb = x + i * 256;
        uint8_t* b = blocks + i * 136;
        float step[8], amax = 0;
        for (int j = 0; j < 8; ++j) {
            step[j] = step_of(xb + 32 * j);
            amax = std::max(amax, std::fabs(step[j]));
        }
        store_f16(b, amax / 31);
        const float d = load_f16(b); // what the decoder will use
        uint16_t scales_h = 0;
        uint8_t* scales_l = b + 4;
        std::memset(scales_l, 0, 4);
        for (int j = 0; j < 8; ++j) {
            const int sc = d > 0 ? std::clamp(int(std::lround(step[j] / d)), -32, 31) : 0;
            const int ls = sc + 32;
            scales_l[j / 2] = uint8_t(scales_l[j / 2] | (ls & 0x0F) << (4 * (j % 2)));
            scales_h = uint16_t(scales_h | (ls >> 4) << (2 * j));
            encode32(xb + 32 * j, d * float(sc), b + 8 + 16 * j);
        }
        std::memcpy(b + 2, &scales_h, 2);
    }
}

} // namespace tandem
