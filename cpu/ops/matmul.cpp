// F32 matmul against row-major weights: each weight row is read once per block of tokens.
#include "cpu/isa.hpp"
#include "cpu/ops/ops.hpp"
#include "cpu/thread_pool.hpp"

#include <immintrin.h>

#include <algorithm>

namespace tandem::cpu {
namespace {

constexpr int tok_block = 4;   // tokens sharing one pass over a weight row
constexpr int64_t row_chunk = 16; // weight rows kept hot in L2 across token blocks

// r[t] = dot(w, x + t * n_in) for t < nt (nt <= tok_block)
void dots_scalar(const float* w, const float* x, int nt, int64_t n_in, float* r) {
    for (int t = 0; t < nt; ++t) {
        const float* xt = x + t * n_in;
        float acc[8] = {};
        int64_t i = 0;
        for (; i + 8 <= n_in; i += 8)
            for (int j = 0; j < 8; ++j) acc[j] += w[i + j] * xt[i + j];
        float sum = 0;
        for (; i < n_in; ++i) sum += w[i] * xt[i];
        for (float a : acc) sum += a;
        r[t] = sum;
    }
}

__attribute__((target("avx2,fma"))) float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) void dots_avx2(const float* w, const float* x, int nt, int64_t n_in, float* r) {
    __m256 acc[tok_block];
    for (int t = 0; t < tok_block; ++t) acc[t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n_in; i += 8) {
        const __m256 wv = _mm256_loadu_ps(w + i);
        for (int t = 0; t < nt; ++t) acc[t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + t * n_in + i), acc[t]);
    }
    for (int t = 0; t < nt; ++t) {
        float sum = hsum256(acc[t]);
        for (int64_t j = i; j < n_in; ++j) sum += w[j] * x[t * n_in + j];
        r[t] = sum;
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) void dots_avx512(const float* w, const float* x, int nt,
                                                                       int64_t n_in, float* r) {
    __m512 acc[tok_block];
    for (int t = 0; t < tok_block; ++t) acc[t] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n_in; i += 16) {
        const __m512 wv = _mm512_loadu_ps(w + i);
        for (int t = 0; t < nt; ++t) acc[t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + t * n_in + i), acc[t]);
    }
    if (i < n_in) {
        const __mmask16 m = __mmask16((1u << (n_in - i)) - 1);
        const __m512 wv = _mm512_maskz_loadu_ps(m, w + i);
        for (int t = 0; t < nt; ++t)
            acc[t] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x + t * n_in + i), acc[t]);
    }
    for (int t = 0; t < nt; ++t) { // fold to 256 bits (GCC 12 warns on _mm512_reduce_add_ps)
        alignas(64) float lanes[16];
        _mm512_store_ps(lanes, acc[t]);
        __m256 v = _mm256_add_ps(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8));
        r[t] = hsum256(v);
    }
}

using dots_fn = void (*)(const float*, const float*, int, int64_t, float*);

dots_fn pick_dots() {
    switch (active_isa()) {
    case isa::amx:
    case isa::avx512: return dots_avx512;
    case isa::avx2: return dots_avx2;
    case isa::scalar: break;
    }
    return dots_scalar;
}

} // namespace

void matmul(thread_pool& pool, float* out, const float* x, int64_t n_tok, const float* w, int64_t n_out,
            int64_t n_in, const float* bias) {
    const dots_fn dots = pick_dots();
    pool.parallel_for(n_out, thread_pool::grain_for(n_in * n_tok, row_chunk), [&](int64_t o_begin, int64_t o_end) {
        float r[tok_block];
        for (int64_t o0 = o_begin; o0 < o_end; o0 += row_chunk) {
            const int64_t o1 = std::min(o_end, o0 + row_chunk);
            for (int64_t t0 = 0; t0 < n_tok; t0 += tok_block) {
                const int nt = int(std::min<int64_t>(tok_block, n_tok - t0));
                for (int64_t o = o0; o < o1; ++o) {
                    dots(w + o * n_in, x + t0 * n_in, nt, n_in, r);
                    const float b = bias ? bias[o] : 0.0f;
                    for (int t = 0; t < nt; ++t) out[(t0 + t) * n_out + o] = r[t] + b;
                }
            }
        }
    });
}

} // namespace tandem::cpu
