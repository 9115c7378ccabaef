// Scalar reference Q4_0 / Q4_1 / Q5_0 / Q5_1 block formats, written from their layouts.
#include "quant/blocks.hpp"

#include "quant/iq4_blocks.hpp"
#include "quant/k_blocks.hpp"
#include "quant/q8_0.hpp"
#include "runtime/error.hpp"
#include "runtime/fp16.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tandem {
namespace {

struct layout {
    int bits;      // 4 or 5
    bool has_min;  // x = d * q + m, else x = d * (q - 2^(bits-1))
    size_t bytes() const { return 2 + (has_min ? 2 : 0) + (bits == 5 ? 4 : 0) + 16; }
};

layout layout_of(dtype t) {
    switch (t) {
    case dtype::q4_0: return {4, false};
    case dtype::q4_1: return {4, true};
    case dtype::q5_0: return {5, false};
    case dtype::q5_1: return {5, true};
    default: break;
    }
    fail("{} is not a 4- or 5-bit block format", name_of(t));
}

} // namespace

bool is_block_format(dtype t) {
    const auto tr = traits_of(uint32_t(t));
    return tr && tr->block > 1; // every other known type is one value an element
}

size_t block_bytes_of(dtype t, int64_t n) {
    const dtype_traits tr = *traits_of(uint32_t(t));
    return size_t(n / tr.block) * tr.block_bytes;
}

void dequantize_blocks_ref(dtype t, const uint8_t* blocks, float* out, int64_t n) {
    if (t == dtype::q8_0) return dequantize_q8_0_ref(blocks, out, n);
    if (t == dtype::q2_k) return dequantize_q2_k_ref(blocks, out, n);
    if (t == dtype::q3_k) return dequantize_q3_k_ref(blocks, out, n);
    if (t == dtype::q4_k) return dequantize_q4_k_ref(blocks, out, n);
    if (t == dtype::q5_k) return dequantize_q5_k_ref(blocks, out, n);
    if (t == dtype::q6_k) return dequantize_q6_k_ref(blocks, out, n);
    if (t == dtype::iq4_nl) return dequantize_iq4_nl_ref(blocks, out, n);
    if (t == dtype::iq4_xs) return dequantize_iq4_xs_ref(blocks, out, n);
    const layout l = layout_of(t);
    TANDEM_ASSERT(n % 32 == 0, "{}: n = {} is not a multiple of 32", name_of(t), n);
    const int offset = l.has_min ? 0 : 1 << (l.bits - 1);
    for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* p = blocks + b * int64_t(l.bytes());
        const float d = load_f16(p);
        const float m = l.has_min ? load_f16(p + 2) : 0.0f;
        const uint8_t* rest = p + (l.has_min ? 4 : 2);
        uint32_t qh = 0;
        if (l.bits == 5) {
            std::memcpy(&qh, rest, 4); // little-endian, as the file stores it
            rest += 4;
        }
        float* o = out + b * 32;
        for (int j = 0; j < 16; ++j) {
            int lo = rest[j] & 0x0F, hi = rest[j] >> 4;
            if (l.bits == 5) {
                lo |= int((qh >> j) & 1) << 4;
                hi |= int((qh >> (j + 16)) & 1) << 4;
            }
            o[j] = l.has_min ? d * float(lo) + m : d * float(lo - offset);
            o[j + 16] = l.has_min ? d * float(hi) + m : d * float(hi - offset);
        }
    }
}

void quantize_blocks_ref(dtype t, const float* x, uint8_t* blocks, int64_t n) {
    if (t == dtype::q8_0) return quantize_q8_0_ref(x, blocks, n);
    if (t == dtype::q2_k) return quantize_q2_k_ref(x, blocks, n);
    if (t == dtype::q3_k) return quantize_q3_k_ref(x, blocks, n);
    if (t == dtype::q4_k) return quantize_q4_k_ref(x, blocks, n);
    if (t == dtype::q5_k) return quantize_q5_k_ref(x, blocks, n);
    if (t == dtype::q6_k) return quantize_q6_k_ref(x, blocks, n);
    if (t == dtype::iq4_nl) return quantize_iq4_nl_ref(x, blocks, n);
    if (t == dtype::iq4_xs) return quantize_iq4_xs_ref(x, blocks, n);
    const layout l = layout_of(t);
    TANDEM_ASSERT(n % 32 == 0, "{}: n = {} is not a multiple of 32", name_of(t), n);
    const int levels = 1 << l.bits, offset = l.has_min ? 0 : levels / 2;
    for (int64_t b = 0; b < n / 32; ++b) {
        const float* xb = x + b * 32;
        float d = 0, m = 0;
        if (l.has_min) {
            const auto [lo, hi] = std::minmax_element(xb, xb + 32);
            m = *lo;
            d = (*hi - *lo) / float(levels - 1);
        } else {
            float big = 0; // the value of largest magnitude, with its sign
            for (int i = 0; i < 32; ++i)
                if (std::fabs(xb[i]) > std::fabs(big)) big = xb[i];
            d = big / float(-offset);
        }
        const float inv = d != 0 ? 1.0f / d : 0.0f;
        uint8_t* p = blocks + b * int64_t(l.bytes());
        const uint16_t dh = f32_to_fp16(d), mh = f32_to_fp16(m);
        std::memcpy(p, &dh, 2);
        if (l.has_min) std::memcpy(p + 2, &mh, 2);
        uint8_t* rest = p + (l.has_min ? 4 : 2);
        uint8_t* qs = rest + (l.bits == 5 ? 4 : 0);
        uint32_t qh = 0;
        for (int j = 0; j < 32; ++j) {
            const float v = l.has_min ? (xb[j] - m) * inv : xb[j] * inv + float(offset);
            const int q = std::isfinite(v) ? std::clamp(int(std::lround(v)), 0, levels - 1) : offset; // NaN: 0
            const int k = j % 16;
            if (j < 16) qs[k] = uint8_t(q & 0x0F);
            else qs[k] = uint8_t(qs[k] | (q & 0x0F) << 4);
            qh |= uint32_t(q >> 4 & 1) << j;
        }
        if (l.bits == 5) std::memcpy(rest, &qh, 4);
    }
}

} // namespace tandem
