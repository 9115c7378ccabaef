// Scalar reference K-quant super-blocks, written from their layouts (quant/k_blocks.hpp).
#include "quant/k_blocks.hpp"

#include "runtime/error.hpp"
#include "runtime/fp16.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tandem {
namespace {

constexpr int64_t qk = 256;

void check_n(int64_t n) { TANDEM_ASSERT(n % qk == 0, "K-quants: n = {} is not a multiple of {}", n, qk); }

// The inverse: eight 6-bit scales and mins into 12 bytes.
void pack_scale_min(uint8_t* s, const int* sc, const int* m) {
    std::memset(s, 0, 12);
    for (int j = 0; j < 4; ++j) {
        s[j] = uint8_t(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = uint8_t(m[j] | (m[j + 4] >> 4) << 6);
        s[j + 8] = uint8_t((sc[j + 4] & 0x0F) | (m[j + 4] & 0x0F) << 4);
    }
}

// Q4_K and Q5_K (bits 4 or 5): every value of one super-block.
void dequantize_k_minmax(const uint8_t* b, float* y, int bits) {
    const float d = load_f16(b), dmin = load_f16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qh = bits == 5 ? b + 16 : nullptr;
    const uint8_t* qs = b + 16 + (bits == 5 ? 32 : 0);
    for (int pair = 0; pair < 4; ++pair) {
        for (int half = 0; half < 2; ++half) {
            const int j = 2 * pair + half;
            int sc, m;
            k_scale_min(scales, j, sc, m);
            for (int l = 0; l < 32; ++l) {
                int q = half == 0 ? qs[32 * pair + l] & 0x0F : qs[32 * pair + l] >> 4;
                if (qh) q |= (qh[l] >> j & 1) << 4;
                y[32 * j + l] = d * float(sc) * float(q) - dmin * float(m);
            }
        }
    }
}

void quantize_k_minmax(const float* x, uint8_t* b, int bits) {
    const int top = (1 << bits) - 1;
    float scale[8], minv[8]; // per sub-block: step and (non-positive) minimum
    for (int j = 0; j < 8; ++j) {
        const auto [lo, hi] = std::minmax_element(x + 32 * j, x + 32 * j + 32);
        minv[j] = std::min(0.0f, *lo);
        scale[j] = (*hi - minv[j]) / float(top);
    }
    const float max_scale = *std::max_element(scale, scale + 8), max_min = -*std::min_element(minv, minv + 8);
    const float d = max_scale / 63, dmin = max_min / 63;
    store_f16(b, d);
    store_f16(b + 2, dmin);
    const float dq = load_f16(b), dminq = load_f16(b + 2); // what the decoder will use
    int sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
        sc[j] = dq > 0 ? std::clamp(int(std::lround(scale[j] / dq)), 0, 63) : 0;
        m[j] = dminq > 0 ? std::clamp(int(std::lround(-minv[j] / dminq)), 0, 63) : 0;
    }
    pack_scale_min(b + 4, sc, m);
    uint8_t* qh = bits == 5 ? b + 16 : nullptr;
    uint8_t* qs = b + 16 + (bits == 5 ? 32 : 0);
    if (qh) std::memset(qh, 0, 32);
    std::memset(qs, 0, 128);
    for (int j = 0; j < 8; ++j) {
        const float step = dq * float(sc[j]), base = dminq * float(m[j]);
        for (int l = 0; l < 32; ++l) {
            const float v = step > 0 ? (x[32 * j + l] + base) / step : 0.0f;
            const int q = std::isfinite(v) ? std::clamp(int(std::lround(v)), 0, top) : 0;
            qs[32 * (j / 2) + l] = uint8_t(qs[32 * (j / 2) + l] | (q & 0x0F) << (j % 2 ? 4 : 0));
            if (qh) qh[l] = uint8_t(qh[l] | (q >> 4 & 1) << j);
        }
    }
}

// Q2_K and Q3_K: value v of a super-block sits in qs[32 h + l] at bits 2k, 2k + 1 (h = v / 128,
// k = v % 128 / 32, l = v % 32) and belongs to sub-block v / 16.
struct k2_pos {
    int byte, shift, hbit; // qs byte, bit offset there, Q3_K's bit of hmask[v % 32]
};

k2_pos k2_pos_of(int v) {
    const int h = v / 128, k = v % 128 / 32, l = v % 32;
    return {32 * h + l, 2 * k, 4 * h + k};
}

// Q3_K sub-block s's signed 6-bit scale from the 12 packed bytes.
int q3_k_scale(const uint8_t* s, int sb) {
    const int low = sb < 8 ? s[sb] & 0x0F : s[sb - 8] >> 4;
    const int high = s[8 + sb % 4] >> (2 * (sb / 4)) & 3;
    return (low | high << 4) - 32;
}

// The value of largest magnitude among n, with its sign.
float largest(const float* x, int n) {
    float big = 0;
    for (int t = 0; t < n; ++t)
        if (std::fabs(x[t]) > std::fabs(big)) big = x[t];
    return big;
}

} // namespace

void k_scale_min(const uint8_t* s, int j, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0x0F) | (s[j - 4] >> 6) << 4;
        m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

void dequantize_q4_k_ref(const uint8_t* blocks, float* out, int64_t n) {
    check_n(n);
    for (int64_t i = 0; i < n / qk; ++i) dequantize_k_minmax(blocks + i * 144, out + i * qk, 4);
}

void dequantize_q5_k_ref(const uint8_t* blocks, float* out, int64_t n) {
    check_n(n);
    for (int64_t i = 0; i < n / qk; ++i) dequantize_k_minmax(blocks + i * 176, out + i * qk, 5);
}

void quantize_q4_k_ref(const float* x, uint8_t* blocks, int64_t n) {
    check_n(n);
    for (int64_t i = 0; i < n / qk; ++i) quantize_k_minmax(x + i * qk, blocks + i * 144, 4);
}

void quantize_q5_k_ref(const float* x, uint8_t* blocks, int64_t n) {
    check_n(n);
    for (int64_t i = 0; i < n / qk; ++i) quantize_k_minmax(x + i * qk, blocks + i * 176, 5);
}

void dequantize_q6_k_ref(const uint8_t* blocks, float* out, int64_t n) {
    check_n(n);
    for (int64_t i = 0; i < n / qk; ++i) {
        const uint8_t* b = blocks + i * 210;
        const float d = load_f16(b + 208);
        for (int h = 0; h < 2; ++h) { // two halves of 128 values
            const uint8_t* ql = b + 64 * h;
            const uint8_t* qh = b + 128 + 32 * h;
            const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h;
            float* y = out + i * qk + 128 * h;
            for (int l = 0; l < 32; ++l) {
                const int q[4] = {(ql[l] & 0x0F) | (qh[l] & 3) << 4, (ql[l + 32] & 0x0F) | (qh[l] >> 2 & 3) << 4,
                                  (ql[l] >> 4) | (qh[l] >> 4 & 3) << 4, (ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4};
                for (int k = 0; k < 4; ++k) y[l + 32 * k] = d * float(sc[l / 16 + 2 * k]) * float(q[k] - 32);
            }
        }
    }
}

void quantize_q6_k_ref(const float* x, uint8_t* blocks, int64_t n) {
    check_n(n);
    for (int64_t i = 0; i < n / qk; ++i) {
        const float* xb = x + i * qk;
        uint8_t* b = blocks + i * 210;
        float scale[16]; // per 16 values: the value of largest magnitude over -32
        for (int s = 0; s < 16; ++s) {
            float big = 0;
            for (int t = 0; t < 16; ++t)
                if (std::fabs(xb[16 * s + t]) > std::fabs(big)) big = xb[16 * s + t];
            scale[s] = big / -32.0f;
        }
        float amax = 0;
        for (float s : scale) amax = std::max(amax, std::fabs(s));
        store_f16(b + 208, amax / 127);
        const float d = load_f16(b + 208);
        int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
        for (int s = 0; s < 16; ++s) sc[s] = int8_t(d > 0 ? std::clamp(int(std::lround(scale[s] / d)), -127, 127) : 0);
        std::memset(b, 0, 192);
        // Value v of the super-block: half h = v / 128, then within it l = v % 32, k = v % 128 / 32.
        for (int v = 0; v < int(qk); ++v) {
            const int h = v / 128, k = v % 128 / 32, l = v % 32;
            const float step = d * float(sc[v / 16]);
            const float r = step != 0 ? xb[v] / step + 32 : 32;
            const int q = std::isfinite(r) ? std::clamp(int(std::lround(r)), 0, 63) : 32;
            uint8_t& low = b[64 * h + l + (k % 2) * 32];
            low = uint8_t(low | (q & 0x0F) << (k >= 2 ? 4 : 0));
            uint8_t& high = b[128 + 32 * h + l];
            high = uint8_t(high | (q >> 4) << (2 * k));
        }
    }
}

void dequantize_q2_k_ref(const uint8_t* blocks, float* out, int64_t n) {
    check_n(n);
    for (int64_t i = 0; i < n / qk; ++i) {
        const uint8_t* b = blocks + i * 84;
        const uint8_t* scales = b;
        const uint8_t* qs = b + 16;
        const float d = load_f16(b + 80), dmin = load_f16(b + 82);
        for (int v = 0; v < int(qk); ++v) {
            const k2_pos p = k2_pos_of(v);
            const int q = qs[p.byte] >> p.shift & 3;
            const int sc = scales[v / 16] & 0x0F, m = scales[v / 16] >> 4;
            out[i * qk + v] = d * float(sc) * float(q) - dmin * float(m);
        }
    }
}

void quantize_q2_k_ref(const float* x, uint8_t* blocks, int64_t n) {
    check_n(n);
    for (int64_t i = 0; i < n / qk; ++i) {
        const float* xb = x + i * qk;
        uint8_t* b = blocks + i * 84;
        float scale[16], minv[16]; // per 16 values: step and (non-positive) minimum
        for (int s = 0; s < 16; ++s) {
            const auto [lo, hi] = std::minmax_element(xb + 16 * s, xb + 16 * s + 16);
            minv[s] = std::min(0.0f, *lo);
            scale[s] = (*hi - minv[s]) / 3;
        }
        const float max_scale = *std::max_element(scale, scale + 16), max_min = -*std::min_element(minv, minv + 16);
        store_f16(b + 80, max_scale / 15);
        store_f16(b + 82, max_min / 15);
        const float d = load_f16(b + 80), dmin = load_f16(b + 82); // what the decoder will use
        int sc[16], m[16];
        for (int s = 0; s < 16; ++s) {
            sc[s] = d > 0 ? std::clamp(int(std::lround(scale[s] / d)), 0, 15) : 0;
            m[s] = dmin > 0 ? std::clamp(int(std::lround(-minv[s] / dmin)), 0, 15) : 0;
            b[s] = uint8_t(sc[s] | m[s] << 4);
        }
        uint8_t* qs = b + 16;
        std::memset(qs, 0, 64);
        for (int v = 0; v < int(qk); ++v) {
            const float step = d * float(sc[v / 16]), base = dmin * float(m[v / 16]);
            const float r = step > 0 ? (xb[v] + base) / step : 0.0f;
            const int q = std::isfinite(r) ? std::clamp(int(std::lround(r)), 0, 3) : 0;
            const k2_pos p = k2_pos_of(v);
            qs[p.byte] = uint8_t(qs[p.byte] | q << p.shift);
        }
    }
}

void dequantize_q3_k_ref(const uint8_t* blocks, float* out, int64_t n) {
    check_n(n);
    for (int64_t i = 0; i < n / qk; ++i) {
        const uint8_t* b = blocks + i * 110;
        const uint8_t* hmask = b;
        const uint8_t* qs = b + 32;
        const uint8_t* scales = b + 96;
        const float d = load_f16(b + 108);
        for (int v = 0; v < int(qk); ++v) {
            const k2_pos p = k2_pos_of(v);
            const int q = (qs[p.byte] >> p.shift & 3) - (hmask[v % 32] >> p.hbit & 1 ? 0 : 4);
            out[i * qk + v] = d * float(q3_k_scale(scales, v / 16)) * float(q);
        }
    }
}

void quantize_q3_k_ref(const float* x, uint8_t* blocks, int64_t n) {
    check_n(n);
    for (int64_t i = 0; i < n / qk; ++i) {
        const float* xb = x + i * qk;
        uint8_t* b = blocks + i * 110;
        float scale[16]; // per 16 values: the value of largest magnitude on code -4
        float amax = 0;
        for (int s = 0; s < 16; ++s) {
            scale[s] = largest(xb + 16 * s, 16) / -4;
            amax = std::max(amax, std::fabs(scale[s]));
        }
        store_f16(b + 108, amax / 31);
        const float d = load_f16(b + 108);
        int sc[16];
        uint8_t* scales = b + 96;
        std::memset(b, 0, 108);
        for (int s = 0; s < 16; ++s) {
            sc[s] = d > 0 ? std::clamp(int(std::lround(scale[s] / d)), -32, 31) : 0;
            const int u = sc[s] + 32; // stored unsigned, 6 bits
            scales[s % 8] = uint8_t(scales[s % 8] | (u & 0x0F) << (s < 8 ? 0 : 4));
            scales[8 + s % 4] = uint8_t(scales[8 + s % 4] | (u >> 4) << (2 * (s / 4)));
        }
        uint8_t* hmask = b;
        uint8_t* qs = b + 32;
        for (int v = 0; v < int(qk); ++v) {
            const float step = d * float(sc[v / 16]);
            const float r = step != 0 ? xb[v] / step : 0.0f;
            const int q = std::isfinite(r) ? std::clamp(int(std::lround(r)), -4, 3) : 0;
            const k2_pos p = k2_pos_of(v);
            qs[p.byte] = uint8_t(qs[p.byte] | (q & 3) << p.shift); // q - 4 and q share the low two bits
            if (q >= 0) hmask[v % 32] = uint8_t(hmask[v % 32] | 1 << p.hbit);
        }
    }
}


} // namespace tandem
