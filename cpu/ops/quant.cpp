// Per-token INT8 activation quantization on the CPU, plain and fused with RMSNorm / SwiGLU.
#include "cpu/isa.hpp"
#include "cpu/ops/ops.hpp"
#include "cpu/simd_exp.hpp"
#include "cpu/thread_pool.hpp"
#include "quant/int8.hpp"

#include <immintrin.h>

// GCC 12 flags the _mm512_undefined_* sources inside its own intrinsics as uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cmath>
#include <vector>

namespace tandem::cpu {
namespace {

// Same contract and rounding (nearest-even of x * 127/amax) as quantize_row_i8_ref, for finite x.
__attribute__((target("avx512f,avx512bw,avx512vl"))) float quantize_row_avx512(const float* x, int8_t* q, int64_t n) {
    const __m512 inf = _mm512_set1_ps(INFINITY);
    __m512 mx = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
        const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(m, x + i));
        mx = _mm512_mask_max_ps(mx, _mm512_cmp_ps_mask(a, inf, _CMP_LT_OQ), mx, a); // finite only
    }
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, mx);
    float amax = 0.0f;
    for (float v : lanes) amax = std::max(amax, v);
    const float scale = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(scale > 0.0f ? 127.0f / amax : 0.0f);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
        __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv)); // nearest-even
        v = _mm512_min_epi32(_mm512_max_epi32(v, lo), hi);
        _mm512_mask_cvtepi32_storeu_epi8(q + i, m, v);
    }
    return scale;
}

using quant_fn = float (*)(const float*, int8_t*, int64_t);

quant_fn pick_quant() {
    // AVX2 gains little here (the row is in L1 and tiny next to the matmul): it uses the reference.
    return active_isa() >= isa::avx512 ? quantize_row_avx512 : quantize_row_i8_ref;
}

bool all_finite(const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(x[i])) return false;
    return true;
}

// The reference handles NaN/inf; the SIMD path assumes finite rows, which activations are.
float quantize_row(quant_fn fn, const float* x, int8_t* q, int64_t n) {
    return fn == quantize_row_i8_ref || !all_finite(x, n) ? quantize_row_i8_ref(x, q, n) : fn(x, q, n);
}

// row [n] = silu(g) * u, 16 lanes at a time with the polynomial exp
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void swiglu_row_avx512(const float* g, const float* u,
                                                                                 float* row, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
        const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        const __m512 y = _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(m, u + i));
        _mm512_mask_storeu_ps(row + i, m, y);
    }
}

} // namespace

void quantize_rows(thread_pool& pool, int8_t* q, float* s, const float* x, int64_t n_tok, int64_t n) {
    const quant_fn fn = pick_quant();
    pool.parallel_for(n_tok, thread_pool::grain_for(2 * n), [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) s[t] = quantize_row(fn, x + t * n, q + t * n, n);
    });
}

void quantize_rows_split(thread_pool& pool, int8_t* q_hi, float* s_hi, int8_t* q_lo, float* s_lo, const float* x,
                         int64_t n_tok, int64_t n) {
    const quant_fn fn = pick_quant();
    pool.parallel_for(n_tok, thread_pool::grain_for(4 * n), [&](int64_t t0, int64_t t1) {
        std::vector<float> r(static_cast<size_t>(n)); // the first term's rounding error
        for (int64_t t = t0; t < t1; ++t) {
            const float* xt = x + t * n;
            const int8_t* qt = q_hi + t * n;
            s_hi[t] = quantize_row(fn, xt, q_hi + t * n, n);
            for (int64_t i = 0; i < n; ++i) r[size_t(i)] = xt[i] - s_hi[t] * float(qt[i]);
            s_lo[t] = quantize_row(fn, r.data(), q_lo + t * n, n);
        }
    });
}

void rms_norm_quant(thread_pool& pool, int8_t* q, float* s, const float* x, const float* w, int64_t n_tok, int64_t n,
                    float eps) {
    const quant_fn fn = pick_quant();
    pool.parallel_for(n_tok, thread_pool::grain_for(4 * n), [&](int64_t t0, int64_t t1) {
        std::vector<float> row(static_cast<size_t>(n)); // stays in L1 between the two passes
        for (int64_t t = t0; t < t1; ++t) {
            const float* xt = x + t * n;
            double ss = 0;
            for (int64_t i = 0; i < n; ++i) ss += double(xt[i]) * xt[i];
            const float scale = float(1.0 / std::sqrt(ss / double(n) + eps));
            for (int64_t i = 0; i < n; ++i) row[size_t(i)] = w[i] * (xt[i] * scale);
            s[t] = quantize_row(fn, row.data(), q + t * n, n);
        }
    });
}

void swiglu_quant(thread_pool& pool, int8_t* q, float* s, const float* gate, const float* up, int64_t n_tok,
                  int64_t n) {
    const quant_fn fn = pick_quant();
    pool.parallel_for(n_tok, thread_pool::grain_for(20 * n), [&](int64_t t0, int64_t t1) {
        std::vector<float> row(static_cast<size_t>(n));
        for (int64_t t = t0; t < t1; ++t) {
            const float* g = gate + t * n;
            const float* u = up + t * n;
            if (fn != quantize_row_i8_ref)
                swiglu_row_avx512(g, u, row.data(), n);
            else
                for (int64_t i = 0; i < n; ++i) row[size_t(i)] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
            s[t] = quantize_row(fn, row.data(), q + t * n, n);
        }
    });
}

} // namespace tandem::cpu
