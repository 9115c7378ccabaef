// Per-token INT8 activation quantization on the CPU, plain and fused with RMSNorm / SwiGLU, and
// the KV store (F16 and INT8 pages hold the reference's bytes).
#include "cpu/intrinsics.hpp"
#include "cpu/isa.hpp"
#include "cpu/ops/ops.hpp"
#include "cpu/ref/ops_ref.hpp"
#include "cpu/simd_exp.hpp"
#include "cpu/thread_pool.hpp"
#include "quant/int8.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace tandem::cpu {
namespace {

// Same contract and rounding (nearest-even of x * 127/amax) as quantize_row_i8_ref, for finite x;
// a row with an inf or NaN is left to the reference (it returns the reference's result).
__attribute__((target("avx512f,avx512bw,avx512vl"))) float quantize_row_avx512(const float* x, int8_t* q, int64_t n) {
    const __m512 inf = _mm512_set1_ps(INFINITY);
    __m512 mx = _mm512_setzero_ps();
    __mmask16 finite = 0xffff;
    int64_t i = 0;
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
        const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(m, x + i));
        mx = _mm512_max_ps(mx, a);
        finite &= _mm512_cmp_ps_mask(a, inf, _CMP_LT_OQ); // false for inf and NaN
    }
    if (finite != 0xffff) return quantize_row_i8_ref(x, q, n);
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

// r = x - s * float(q): the first term's rounding error, the reference's expression (no FMA).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void residual_avx512(const float* x, const int8_t* q, float s,
                                                                          float* r, int64_t n) {
    const __m512 vs = _mm512_set1_ps(s);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
        const __m512 qv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, q + i)));
        _mm512_mask_storeu_ps(r + i, m, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_mul_ps(vs, qv)));
    }
}

// row = w * (x * (1 / sqrt(mean(x^2) + eps))), the reference's expression: the sum of squares in
// double (eight lanes, so only the order of the additions differs), multiplies without FMA.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void rms_norm_row_avx512(const float* x, const float* w,
                                                                              float* row, int64_t n, float eps) {
    __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), b = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
        acc0 = _mm512_add_pd(acc0, _mm512_mul_pd(a, a));
        acc1 = _mm512_add_pd(acc1, _mm512_mul_pd(b, b));
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
    for (; i < n; ++i) ss += double(x[i]) * x[i];
    const __m512 scale = _mm512_set1_ps(float(1.0 / std::sqrt(ss / double(n) + eps)));
    for (i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
        const __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), scale));
        _mm512_mask_storeu_ps(row + i, m, y);
    }
}

// F16 with F16C (round to nearest even, overflow to inf like the reference); a NaN becomes the
// reference's quiet NaN with its sign rather than keeping its payload.
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) void f16_row_avx512(const float* x, uint16_t* h, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m256i r = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        if (nan) {
            const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 16), _mm512_set1_epi32(0x8000));
            const __m256i quiet = _mm512_cvtepi32_epi16(_mm512_or_si512(sign, _mm512_set1_epi32(0x7e00)));
            r = _mm256_mask_mov_epi16(r, nan, quiet);
        }
        _mm256_mask_storeu_epi16(h + i, m, r);
    }
}

} // namespace

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

void quantize_rows(thread_pool& pool, int8_t* q, float* s, const float* x, int64_t n_tok, int64_t n) {
    const quant_fn fn = pick_quant();
    pool.parallel_for(n_tok, thread_pool::grain_for(2 * n), [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) s[t] = fn(x + t * n, q + t * n, n);
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
            s_hi[t] = fn(xt, q_hi + t * n, n);
            if (fn != quantize_row_i8_ref)
                residual_avx512(xt, qt, s_hi[t], r.data(), n);
            else
                for (int64_t i = 0; i < n; ++i) r[size_t(i)] = xt[i] - s_hi[t] * float(qt[i]);
            s_lo[t] = fn(r.data(), q_lo + t * n, n);
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
            if (fn != quantize_row_i8_ref) {
                rms_norm_row_avx512(xt, w, row.data(), n, eps);
            } else {
                double ss = 0;
                for (int64_t i = 0; i < n; ++i) ss += double(xt[i]) * xt[i];
                const float scale = float(1.0 / std::sqrt(ss / double(n) + eps));
                for (int64_t i = 0; i < n; ++i) row[size_t(i)] = w[i] * (xt[i] * scale);
            }
            s[t] = fn(row.data(), q + t * n, n);
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
            s[t] = fn(row.data(), q + t * n, n);
        }
    });
}

void kv_store(thread_pool& pool, const attn_params& p, int il, const float* k, const float* v) {
    const kv_layout& lay = p.lay;
    const quant_fn fn = pick_quant();
    if (lay.dtype == kv_dtype::f32 || fn == quantize_row_i8_ref) {
        ref::kv_store(p, il, k, v);
        return;
    }
    // Every new token of every sequence, one job each: (its row, its slot's page and index).
    struct slot_job {
        int64_t row;
        uint8_t* page;
        int slot;
    };
    thread_local std::vector<slot_job> reused; // a step calls this once per layer
    std::vector<slot_job>& jobs = reused;        // (the pool's threads see this thread's vector)
    jobs.clear();
    for (const attn_seq& s : p.seqs)
        for (int32_t t = 0; t < s.n_tok; ++t) {
            const int32_t pos = s.n_past + t;
            jobs.push_back({s.row + t, p.kv_base + int64_t(p.table(s)[pos / lay.page_size]) * lay.page_bytes(),
                            pos % lay.page_size});
        }
    const int hd = lay.head_dim, n_kv = lay.n_head_kv;
    pool.parallel_for(int64_t(jobs.size()), thread_pool::grain_for(int64_t(8) * n_kv * hd), [&](int64_t j0, int64_t j1) {
        for (int64_t j = j0; j < j1; ++j) { // each token has its own slot: no two threads share bytes
            const slot_job& job = jobs[size_t(j)];
            for (int h = 0; h < n_kv; ++h)
                for (const bool is_v : {false, true}) {
                    const float* src = (is_v ? v : k) + (job.row * n_kv + h) * hd;
                    const int64_t e = lay.offset(il, is_v, h) + int64_t(job.slot) * hd;
                    if (lay.dtype == kv_dtype::f16) {
                        f16_row_avx512(src, reinterpret_cast<uint16_t*>(job.page) + e, hd);
                    } else {
                        const float sc = fn(src, reinterpret_cast<int8_t*>(job.page) + e, hd);
                        std::memcpy(job.page + lay.scales_begin() + (lay.scale_offset(il, is_v, h) + job.slot) * 4,
                                    &sc, 4);
                    }
                }
        }
    });
}

} // namespace tandem::cpu
