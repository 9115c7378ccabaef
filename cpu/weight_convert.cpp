// Load-time weight conversion: AVX2 kernels that repeat the reference's float operations in the
// same order (so give its bits), and the dispatch on active_isa().
#include "cpu/weight_convert.hpp"

#include "cpu/isa.hpp"
#include "quant/blocks.hpp"
#include "quant/int8.hpp"
#include "quant/k_blocks.hpp"
#include "quant/q8_0.hpp"
#include "runtime/error.hpp"
#include "runtime/fp16.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tandem::cpu {
namespace {

// Built with -ffp-contract=off and without the FMA target: a multiply followed by an add or
// subtract must round twice, as the reference's does. The F32 kernels need no case for inf or
// NaN scales: each value is the same IEEE operations on the same operands in the same order as
// the reference's, and x86 makes the same NaN for a vector operation as for a scalar one
// (tested with such blocks).

uint16_t load_u16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return h;
}


// Four vectors of 8 int32 (values 0..31 of a group, in order) -> 32 int8 codes in order,
// clamped to [-127, 127] as the reference clamps (the packs saturate at 127 and -128).
__attribute__((target("avx2"))) __m256i pack_codes(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
    const __m256i p01 = _mm256_packs_epi32(a0, a1); // per 128-bit lane: a0[0:4] a1[0:4] | a0[4:8] a1[4:8]
    const __m256i p23 = _mm256_packs_epi32(a2, a3);
    const __m256i b = _mm256_packs_epi16(p01, p23); // 4-byte groups: a0 a1 a2 a3 [0:4] | a0 a1 a2 a3 [4:8]
    const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    return _mm256_max_epi8(ordered, _mm256_set1_epi8(-127));
}

// Adds the 32 codes of v to acc as four 64-bit sums of (q + 128): vpsadbw against zero.
__attribute__((target("avx2"))) __m256i add_code_sums(__m256i acc, __m256i v) {
    return _mm256_add_epi64(acc, _mm256_sad_epu8(_mm256_xor_si256(v, _mm256_set1_epi8(-128)), _mm256_setzero_si256()));
}

__attribute__((target("avx2"))) int64_t lane_sum(__m256i acc) {
    alignas(32) int64_t s[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(s), acc);
    return s[0] + s[1] + s[2] + s[3];
}

// quantize_row_i8_ref + sum_i8_ref: the max pass (any inf or NaN: the reference), then 32
// values at a time x * inv rounded to nearest even (cvtps2dq, as nearbyint in the default
// rounding mode), the tail with the reference's own expression.
__attribute__((target("avx2"))) float row_to_i8_avx2(const float* x, int8_t* q, int32_t* sum, int64_t n) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 inf = _mm256_set1_ps(INFINITY);
    __m256 mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask);
        mx = _mm256_max_ps(mx, a);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ)); // inf, or NaN (unordered)
    }
    const auto reference = [&] {
        const float s = quantize_row_i8_ref(x, q, n);
        *sum = sum_i8_ref(q, n);
        return s;
    };
    if (_mm256_movemask_ps(bad)) return reference();
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mx);
    float amax = 0.0f;
    for (const float v : lanes) amax = std::max(amax, v);
    for (int64_t t = i; t < n; ++t) {
        if (!std::isfinite(x[t])) return reference();
        amax = std::max(amax, std::fabs(x[t]));
    }
    const float scale = amax / 127.0f;
    const float inv = scale > 0.0f ? 127.0f / amax : 0.0f;
    if (!std::isfinite(inv)) return reference(); // max below ~4e-37: 127 / max overflows
    const __m256 vinv = _mm256_set1_ps(inv);
    __m256i acc = _mm256_setzero_si256();
    for (i = 0; i + 32 <= n; i += 32) {
        __m256i c[4];
        for (int k = 0; k < 4; ++k) c[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), vinv));
        const __m256i v = pack_codes(c[0], c[1], c[2], c[3]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), v);
        acc = add_code_sums(acc, v);
    }
    int64_t s = lane_sum(acc) - 128 * i;
    for (; i < n; ++i) {
        q[i] = int8_t(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
        s += q[i];
    }
    *sum = int32_t(s);
    return scale;
}

// 32 int8 codes at p -> four vectors of 8 floats (values 0..31 in order).
__attribute__((target("avx2"))) void codes_to_f32(const uint8_t* p, __m256 f[4]) {
    for (int k = 0; k < 4; ++k) f[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadu_si64(p + 8 * k)));
}

// Q8_0: x = d * q, as dequantize_q8_0_ref.
__attribute__((target("avx2"))) void q8_0_to_f32_avx2(const uint8_t* blocks, float* out, int64_t n) {
    for (int64_t b = 0; b < n / q8_0_block; ++b) {
        const uint8_t* p = blocks + b * int64_t(q8_0_block_bytes);
        float* y = out + b * q8_0_block;
        const float d = load_f16(p);
        __m256 f[4];
        codes_to_f32(p + 2, f);
        for (int k = 0; k < 4; ++k) _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(f[k], _mm256_set1_ps(d)));
    }
}

// Q8_0 -> INT8 in two passes over the row's blocks. The row's max |x| is the largest of |d| *
// max|q| over its blocks: each d * q is exact in float (an f16 times an int8 needs 18 bits),
// so that equals the reference's max over the dequantized floats. Then each value is
// dequantized (d * q) and scaled (* inv) in the reference's order, rounded, packed and summed.
__attribute__((target("avx2"))) float q8_0_to_i8_avx2(const uint8_t* blocks, int8_t* q, int32_t* sum, float* tmp,
                                                     int64_t n) {
    const int64_t nb = n / q8_0_block;
    float amax = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = blocks + b * int64_t(q8_0_block_bytes);
        const float d = load_f16(p);
        if (!std::isfinite(d)) return blocks_to_i8_ref(dtype::q8_0, blocks, q, sum, tmp, n);
        const __m256i a = _mm256_abs_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2))); // -128: 0x80
        __m128i m = _mm_max_epu8(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
        m = _mm_max_epu8(m, _mm_srli_si128(m, 8));
        m = _mm_max_epu8(m, _mm_srli_si128(m, 4));
        m = _mm_max_epu8(m, _mm_srli_si128(m, 2));
        m = _mm_max_epu8(m, _mm_srli_si128(m, 1));
        amax = std::max(amax, std::fabs(d) * float(_mm_extract_epi8(m, 0)));
    }
    const float scale = amax / 127.0f;
    const float inv = scale > 0.0f ? 127.0f / amax : 0.0f; // amax is 0 or at least 2^-24
    const __m256 vinv = _mm256_set1_ps(inv);
    __m256i acc = _mm256_setzero_si256();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = blocks + b * int64_t(q8_0_block_bytes);
        const __m256 d = _mm256_set1_ps(load_f16(p));
        __m256 f[4];
        codes_to_f32(p + 2, f);
        __m256i c[4];
        for (int k = 0; k < 4; ++k) c[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(f[k], d), vinv));
        const __m256i v = pack_codes(c[0], c[1], c[2], c[3]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * q8_0_block), v);
        acc = add_code_sums(acc, v);
    }
    *sum = int32_t(lane_sum(acc) - 128 * n);
    return scale;
}

// Q4_K: per sub-block step = d * sc and base = dmin * m, then x = step * q - base, the
// reference's (d * sc) * q - dmin * m.
__attribute__((target("avx2"))) void q4_k_to_f32_avx2(const uint8_t* blocks, float* out, int64_t n) {
    const __m256i low4 = _mm256_set1_epi32(0x0F);
    for (int64_t i = 0; i < n / 256; ++i) {
        const uint8_t* b = blocks + i * 144;
        float* y = out + i * 256;
        const float d = load_f16(b), dmin = load_f16(b + 2);
        const uint8_t* qs = b + 16;
        for (int pair = 0; pair < 4; ++pair) {
            int sc0, m0, sc1, m1;
            k_scale_min(b + 4, 2 * pair, sc0, m0);
            k_scale_min(b + 4, 2 * pair + 1, sc1, m1);
            const __m256 step0 = _mm256_set1_ps(d * float(sc0)), base0 = _mm256_set1_ps(dmin * float(m0));
            const __m256 step1 = _mm256_set1_ps(d * float(sc1)), base1 = _mm256_set1_ps(dmin * float(m1));
            for (int c = 0; c < 4; ++c) {
                const __m256i x = _mm256_cvtepu8_epi32(_mm_loadu_si64(qs + 32 * pair + 8 * c));
                const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(x, low4));
                const __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(x, 4));
                _mm256_storeu_ps(y + 64 * pair + 8 * c, _mm256_sub_ps(_mm256_mul_ps(step0, lo), base0));
                _mm256_storeu_ps(y + 64 * pair + 32 + 8 * c, _mm256_sub_ps(_mm256_mul_ps(step1, hi), base1));
            }
        }
    }
}

// Q6_K: per 16 values step = d * sc, then x = step * (q - 32), the reference's order.
__attribute__((target("avx2"))) void q6_k_to_f32_avx2(const uint8_t* blocks, float* out, int64_t n) {
    const __m256i three = _mm256_set1_epi32(3), low4 = _mm256_set1_epi32(0x0F), bias = _mm256_set1_epi32(32);
    for (int64_t i = 0; i < n / 256; ++i) {
        const uint8_t* b = blocks + i * 210;
        const float d = load_f16(b + 208);
        for (int h = 0; h < 2; ++h) { // two halves of 128 values
            const uint8_t* ql = b + 64 * h;
            const uint8_t* qh = b + 128 + 32 * h;
            const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h;
            float* y = out + i * 256 + 128 * h;
            for (int l = 0; l < 32; l += 8) { // values l.. l + 7 of each quarter, one scale each
                const __m256i a = _mm256_cvtepu8_epi32(_mm_loadu_si64(ql + l));
                const __m256i c = _mm256_cvtepu8_epi32(_mm_loadu_si64(ql + l + 32));
                const __m256i hb = _mm256_cvtepu8_epi32(_mm_loadu_si64(qh + l));
                const __m256i qv[4] = {
                    _mm256_or_si256(_mm256_and_si256(a, low4), _mm256_slli_epi32(_mm256_and_si256(hb, three), 4)),
                    _mm256_or_si256(_mm256_and_si256(c, low4),
                                    _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, 2), three), 4)),
                    _mm256_or_si256(_mm256_srli_epi32(a, 4),
                                    _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, 4), three), 4)),
                    _mm256_or_si256(_mm256_srli_epi32(c, 4), _mm256_slli_epi32(_mm256_srli_epi32(hb, 6), 4))};
                for (int k = 0; k < 4; ++k) {
                    const __m256 step = _mm256_set1_ps(d * float(sc[l / 16 + 2 * k]));
                    const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(qv[k], bias));
                    _mm256_storeu_ps(y + l + 32 * k, _mm256_mul_ps(step, v));
                }
            }
        }
    }
}

// F16 with F16C: vcvtph2ps widens every finite value and inf exactly, as fp16_to_f32 does; it
// quiets a signaling NaN, which the reference does not, so 8 values holding any NaN go to it.
__attribute__((target("avx2,f16c"))) void f16_to_f32_avx2(const uint8_t* p, float* out, int64_t n) {
    const __m128i abs_mask = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
        if (_mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(h, abs_mask), inf))) { // a NaN among them
            for (int64_t k = i; k < i + 8; ++k) out[k] = fp16_to_f32(load_u16(p + 2 * k));
            continue;
        }
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; ++i) out[i] = fp16_to_f32(load_u16(p + 2 * i));
}

// BF16: the 16 bits are the top half of the float's, for every value NaN included.
__attribute__((target("avx2"))) void bf16_to_f32_avx2(const uint8_t* p, float* out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i)));
        _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; ++i) out[i] = bf16_to_f32(load_u16(p + 2 * i));
}

bool use_avx2() { return active_isa() >= isa::avx2; }

} // namespace

float row_to_i8(const float* x, int8_t* q, int32_t* sum, int64_t n) {
    if (use_avx2()) return row_to_i8_avx2(x, q, sum, n);
    const float s = quantize_row_i8_ref(x, q, n);
    *sum = sum_i8_ref(q, n);
    return s;
}

void blocks_to_f32(dtype t, const uint8_t* blocks, float* out, int64_t n) {
    if (use_avx2()) {
        switch (t) {
        case dtype::q8_0:
            TANDEM_ASSERT(n % q8_0_block == 0, "q8_0: n = {} is not a multiple of {}", n, q8_0_block);
            return q8_0_to_f32_avx2(blocks, out, n);
        case dtype::q4_k:
            TANDEM_ASSERT(n % 256 == 0, "q4_k: n = {} is not a multiple of 256", n);
            return q4_k_to_f32_avx2(blocks, out, n);
        case dtype::q6_k:
            TANDEM_ASSERT(n % 256 == 0, "q6_k: n = {} is not a multiple of 256", n);
            return q6_k_to_f32_avx2(blocks, out, n);
        default: break;
        }
    }
    dequantize_blocks_ref(t, blocks, out, n);
}

void halves_to_f32(dtype t, const uint8_t* p, float* out, int64_t n) {
    TANDEM_ASSERT(t == dtype::f16 || t == dtype::bf16, "halves_to_f32: {} is not F16 or BF16", name_of(t));
    if (use_avx2()) return t == dtype::f16 ? f16_to_f32_avx2(p, out, n) : bf16_to_f32_avx2(p, out, n);
    for (int64_t i = 0; i < n; ++i) out[i] = t == dtype::f16 ? fp16_to_f32(load_u16(p + 2 * i)) : bf16_to_f32(load_u16(p + 2 * i));
}

float blocks_to_i8(dtype t, const uint8_t* blocks, int8_t* q, int32_t* sum, float* tmp, int64_t n) {
    if (!use_avx2()) return blocks_to_i8_ref(t, blocks, q, sum, tmp, n);
    if (t == dtype::q8_0) {
        TANDEM_ASSERT(n % q8_0_block == 0, "q8_0: n = {} is not a multiple of {}", n, q8_0_block);
        return q8_0_to_i8_avx2(blocks, q, sum, tmp, n);
    }
    blocks_to_f32(t, blocks, tmp, n);
    return row_to_i8_avx2(tmp, q, sum, n);
}

float blocks_to_i8_ref(dtype t, const uint8_t* blocks, int8_t* q, int32_t* sum, float* tmp, int64_t n) {
    dequantize_blocks_ref(t, blocks, tmp, n);
    const float s = quantize_row_i8_ref(tmp, q, n);
    *sum = sum_i8_ref(q, n);
    return s;
}

} // namespace tandem::cpu
