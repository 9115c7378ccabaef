// Causal attention over paged K/V (F32, F16 or INT8 pages) with online softmax, GQA-aware: one
// pass over the pages per (token, kv head) decodes each page once for all the query heads
// that share that kv head.
#include "cpu/isa.hpp"
#include "cpu/ops/ops.hpp"
#include "cpu/ref/ops_ref.hpp"
#include "cpu/thread_pool.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tandem::cpu {
namespace {

constexpr int lanes = 16; // independent partial sums, so the compiler can vectorize the dots

// Decodes slots [0, n) of (il, K or V, kvh) of a page into dst [n, head_dim]; F16 and INT8
// with AVX-512 when the level allows, otherwise the reference decoder (same values).
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) void decode_avx512(const uint8_t* page, const kv_layout& lay,
                                                                             int il, bool is_v, int kvh, int n,
                                                                             float* dst) {
    const int64_t e0 = lay.offset(il, is_v, kvh);
    const int64_t total = int64_t(n) * lay.head_dim;
    if (lay.dtype == kv_dtype::f16) {
        const uint16_t* src = reinterpret_cast<const uint16_t*>(page) + e0;
        int64_t i = 0;
        for (; i + 16 <= total; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
        for (; i < total; ++i) dst[i] = _cvtsh_ss(src[i]);
        return;
    }
    if (lay.dtype == kv_dtype::i8 && lay.head_dim % 16 == 0) {
        const int8_t* src = reinterpret_cast<const int8_t*>(page) + e0;
        const float* sc = reinterpret_cast<const float*>(page + lay.scales_begin()) + lay.scale_offset(il, is_v, kvh);
        for (int j = 0; j < n; ++j) {
            const __m512 s = _mm512_set1_ps(sc[j]);
            for (int i = 0; i < lay.head_dim; i += 16) {
                const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j * lay.head_dim + i));
                _mm512_storeu_ps(dst + j * lay.head_dim + i, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s));
            }
        }
        return;
    }
    ref::kv_read(page, lay, il, is_v, kvh, 0, n, dst);
}

inline __attribute__((always_inline)) float dot(const float* a, const float* b, int n) {
    float acc[lanes] = {};
    int i = 0;
    for (; i + lanes <= n; i += lanes)
        for (int j = 0; j < lanes; ++j) acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (; i < n; ++i) s += a[i] * b[i];
    for (float v : acc) s += v;
    return s;
}

struct scratch {
    std::vector<float> m, l, s, acc, kb, vb;
    scratch(int n_gqa, int hd, int ps)
        : m(size_t(n_gqa)), l(size_t(n_gqa)), s(size_t(ps)), acc(size_t(n_gqa) * size_t(hd)),
          kb(size_t(ps) * size_t(hd)), vb(size_t(ps) * size_t(hd)) {}
};

// Attention for token t over kv head kvh (all of its query heads); the body is shared by the
// plain and AVX-512 builds below, so both vectorize the same loops at their own width.
inline __attribute__((always_inline)) void attend(scratch& w, float* out, const float* q, int64_t t, int kvh,
                                                  int32_t n_past, int n_head, const uint8_t* kv_base,
                                                  const kv_layout& lay, int il, const int32_t* block_table,
                                                  float scale, bool fast_decode) {
    const int hd = lay.head_dim, n_gqa = n_head / lay.n_head_kv, ps = lay.page_size;
    const int32_t n_ctx = n_past + int32_t(t) + 1;
    std::fill(w.m.begin(), w.m.end(), -INFINITY);
    std::fill(w.l.begin(), w.l.end(), 0.0f);
    std::fill(w.acc.begin(), w.acc.end(), 0.0f);
    for (int32_t p0 = 0; p0 < n_ctx; p0 += ps) {
        const int n = std::min(ps, n_ctx - p0);
        const uint8_t* page = kv_base + int64_t(block_table[p0 / ps]) * lay.page_bytes();
        const float* kp;
        const float* vp;
        if (lay.dtype == kv_dtype::f32) { // read in place
            kp = reinterpret_cast<const float*>(page) + lay.offset(il, false, kvh);
            vp = reinterpret_cast<const float*>(page) + lay.offset(il, true, kvh);
        } else {
            if (fast_decode) {
                decode_avx512(page, lay, il, false, kvh, n, w.kb.data());
                decode_avx512(page, lay, il, true, kvh, n, w.vb.data());
            } else {
                ref::kv_read(page, lay, il, false, kvh, 0, n, w.kb.data());
                ref::kv_read(page, lay, il, true, kvh, 0, n, w.vb.data());
            }
            kp = w.kb.data();
            vp = w.vb.data();
        }
        for (int g = 0; g < n_gqa; ++g) {
            const float* qh = q + (t * n_head + kvh * n_gqa + g) * hd;
            float page_max = -INFINITY;
            for (int j = 0; j < n; ++j) {
                w.s[size_t(j)] = dot(qh, kp + j * hd, hd) * scale;
                page_max = std::max(page_max, w.s[size_t(j)]);
            }
            // rescale what was accumulated so far to the new running max
            const float new_m = std::max(w.m[size_t(g)], page_max);
            const float corr = std::exp(w.m[size_t(g)] - new_m);
            float* ag = w.acc.data() + size_t(g) * hd;
            w.l[size_t(g)] *= corr;
            for (int i = 0; i < hd; ++i) ag[i] *= corr;
            for (int j = 0; j < n; ++j) {
                const float pj = std::exp(w.s[size_t(j)] - new_m);
                w.l[size_t(g)] += pj;
                const float* vj = vp + j * hd;
                for (int i = 0; i < hd; ++i) ag[i] += pj * vj[i];
            }
            w.m[size_t(g)] = new_m;
        }
    }
    for (int g = 0; g < n_gqa; ++g) {
        float* oh = out + (t * n_head + kvh * n_gqa + g) * hd;
        const float inv = 1.0f / w.l[size_t(g)];
        for (int i = 0; i < hd; ++i) oh[i] = w.acc[size_t(g) * hd + i] * inv;
    }
}

void attend_plain(scratch& w, float* out, const float* q, int64_t t, int kvh, int32_t n_past, int n_head,
                  const uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* block_table, float scale) {
    attend(w, out, q, t, kvh, n_past, n_head, kv_base, lay, il, block_table, scale, false);
}

__attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma"))) void attend_avx512(
    scratch& w, float* out, const float* q, int64_t t, int kvh, int32_t n_past, int n_head, const uint8_t* kv_base,
    const kv_layout& lay, int il, const int32_t* block_table, float scale) {
    attend(w, out, q, t, kvh, n_past, n_head, kv_base, lay, il, block_table, scale, true);
}

} // namespace

void attention(thread_pool& pool, float* out, const float* q, int64_t n_tok, int32_t n_past, int n_head,
               const uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* block_table, float scale) {
    const int hd = lay.head_dim;
    const int n_kv = lay.n_head_kv;
    const int n_gqa = n_head / n_kv;
    const auto fn = active_isa() == isa::avx512 ? attend_avx512 : attend_plain;
    const int64_t work = int64_t(n_past + n_tok) * hd * n_gqa * 2; // per job, roughly
    pool.parallel_for(n_tok * n_kv, thread_pool::grain_for(work), [&](int64_t b, int64_t e) {
        scratch w(n_gqa, hd, lay.page_size);
        for (int64_t job = b; job < e; ++job)
            fn(w, out, q, job / n_kv, int(job % n_kv), n_past, n_head, kv_base, lay, il, block_table, scale);
    });
}

} // namespace tandem::cpu
