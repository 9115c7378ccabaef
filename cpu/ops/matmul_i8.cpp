// INT8 matmul on the CPU: W8A8 as a hand-written GEMV/small GEMM for decode that reads each weight
// byte once per step for the whole batch and oneDNN's int8 matmul for prefill batches; and W8A32.
#include "cpu/dnnl_matmul.hpp"
#include "cpu/isa.hpp"
#include "cpu/ops/ops.hpp"
#include "cpu/thread_pool.hpp"
#include "quant/int8.hpp"

#include <immintrin.h>

// GCC 12 flags the _mm512_undefined_* sources inside its own intrinsics as uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cstring>
#include <vector>

namespace tandem::cpu {
namespace {

constexpr int tile_rows = 4; // weight rows sharing each activation load
constexpr int tile_tok = 4;  // tokens sharing each weight load

// acc[r][t] = dot(w + r * n_in, x + t * n_in) for r < tile_rows, t < T; rows past the
// matrix's end point at its last row (their sums are dropped by the caller).
using tile_fn = void (*)(const int8_t* const* w, const int8_t* x, int64_t n_in, int nt, int32_t acc[tile_rows][tile_tok]);

void tile_scalar(const int8_t* const* w, const int8_t* x, int64_t n_in, int nt, int32_t acc[tile_rows][tile_tok]) {
    for (int r = 0; r < tile_rows; ++r)
        for (int t = 0; t < nt; ++t) acc[r][t] = dot_i8_ref(w[r], x + t * n_in, n_in);
}

// AVX2 has no u8 x s8 dot without 16-bit saturation: |x| (<= 127) times w with x's sign
// keeps every pair sum of vpmaddubsw within int16, so the result is exact.
template <int T>
__attribute__((target("avx2,fma"))) void tile_avx2_t(const int8_t* const* w, const int8_t* x, int64_t n_in,
                                                     int32_t acc[tile_rows][tile_tok]) {
    __m256i a[tile_rows][T];
    for (int r = 0; r < tile_rows; ++r)
        for (int t = 0; t < T; ++t) a[r][t] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    int64_t i = 0;
    for (; i + 32 <= n_in; i += 32) {
        __m256i wv[tile_rows];
        for (int r = 0; r < tile_rows; ++r) wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + i));
        for (int t = 0; t < T; ++t) {
            const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + t * n_in + i));
            const __m256i ax = _mm256_sign_epi8(xv, xv);
            for (int r = 0; r < tile_rows; ++r) {
                const __m256i p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv[r], xv));
                a[r][t] = _mm256_add_epi32(a[r][t], _mm256_madd_epi16(p, ones));
            }
        }
    }
    for (int r = 0; r < tile_rows; ++r) {
        for (int t = 0; t < T; ++t) {
            alignas(32) int32_t lanes[8];
            _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a[r][t]);
            int32_t s = 0;
            for (int32_t v : lanes) s += v;
            for (int64_t j = i; j < n_in; ++j) s += int32_t(w[r][j]) * int32_t(x[t * n_in + j]);
            acc[r][t] = s;
        }
    }
}

void tile_avx2(const int8_t* const* w, const int8_t* x, int64_t n_in, int nt, int32_t acc[tile_rows][tile_tok]) {
    switch (nt) {
    case 1: tile_avx2_t<1>(w, x, n_in, acc); return;
    case 2: tile_avx2_t<2>(w, x, n_in, acc); return;
    case 3: tile_avx2_t<3>(w, x, n_in, acc); return;
    default: tile_avx2_t<4>(w, x, n_in, acc); return;
    }
}

// VNNI: vpdpbusd multiplies u8 by s8, so activations go in as u8 = s8 + 128 (an xor of the
// sign bit) and the caller subtracts 128 * sum(w row). The K tail is a masked load of zeros.
// Software prefetch distance in bytes: measured on the 1.1B shape with one thread, decode went
// from 71% to 88% of the read roofline with 8 KiB (16 KiB: the same; 2 KiB: 77%).
constexpr int64_t pf_dist = 8192;

template <int T>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void tile_vnni_t(const int8_t* const* w,
                                                                                const int8_t* x, int64_t n_in,
                                                                                int32_t acc[tile_rows][tile_tok]) {
    __m512i a[tile_rows][T];
    for (int r = 0; r < tile_rows; ++r)
        for (int t = 0; t < T; ++t) a[r][t] = _mm512_setzero_si512();
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    for (int64_t i = 0; i < n_in; i += 64) {
        const __mmask64 m = n_in - i >= 64 ? ~__mmask64(0) : (__mmask64(1) << (n_in - i)) - 1;
        __m512i wv[tile_rows];
        for (int r = 0; r < tile_rows; ++r) {
            // the next tile's rows follow these in memory: ask for them a tile ahead
            _mm_prefetch(reinterpret_cast<const char*>(w[r] + i + pf_dist), _MM_HINT_T0);
            wv[r] = _mm512_maskz_loadu_epi8(m, w[r] + i);
        }
        for (int t = 0; t < T; ++t) {
            const __m512i xu = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, x + t * n_in + i), flip);
            for (int r = 0; r < tile_rows; ++r) a[r][t] = _mm512_dpbusd_epi32(a[r][t], xu, wv[r]);
        }
    }
    for (int r = 0; r < tile_rows; ++r) {
        for (int t = 0; t < T; ++t) {
            const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(a[r][t]), _mm512_extracti64x4_epi64(a[r][t], 1));
            __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
            acc[r][t] = _mm_cvtsi128_si32(s);
        }
    }
}

void tile_vnni(const int8_t* const* w, const int8_t* x, int64_t n_in, int nt, int32_t acc[tile_rows][tile_tok]) {
    switch (nt) {
    case 1: tile_vnni_t<1>(w, x, n_in, acc); return;
    case 2: tile_vnni_t<2>(w, x, n_in, acc); return;
    case 3: tile_vnni_t<3>(w, x, n_in, acc); return;
    default: tile_vnni_t<4>(w, x, n_in, acc); return;
    }
}

// Batches from this size go to oneDNN; both read the weights once per call. Measured on the
// 1.1B shape: with one thread, batch-16 decode ran at 74 tok/s on the GEMV and 90 on oneDNN,
// but with two threads 143 on the GEMV and 65 on oneDNN (its OpenMP threads and this pool's
// spinning workers share the two cores), so decode batches stay on the GEMV.
constexpr int64_t dnnl_min_tokens = 32;

// The driver both GEMVs share: tiles of tile_rows weight rows x tile_tok tokens, each tile's
// rows (a few KiB) kept in L1 while every token block passes over them, and chunks of
// ~128 KiB of weights handed out dynamically (the cores may be shared); a matrix too small
// to be worth a second thread runs on one. epilogue(t, o, acc) writes out[t][o].
template <class Acc, class X, class Tile, class Epilogue>
void tiled_rows(thread_pool& pool, const weight& w, const X* x, int64_t n_tok, Tile tile, const Epilogue& epilogue) {
    const int64_t n_out = w.n_out, n_in = w.n_in;
    const int8_t* q = w.q();
    const int64_t chunk =
        std::max<int64_t>(tile_rows, (int64_t(1) << 17) / std::max<int64_t>(1, n_in) / tile_rows * tile_rows);
    const auto body = [&](int64_t o0, int64_t o1) {
        Acc acc[tile_rows][tile_tok];
        for (int64_t o = o0; o < o1; o += tile_rows) {
            const int nr = int(std::min<int64_t>(tile_rows, o1 - o));
            const int8_t* rows[tile_rows];
            for (int r = 0; r < tile_rows; ++r) rows[r] = q + (o + std::min(r, nr - 1)) * n_in;
            for (int64_t t0 = 0; t0 < n_tok; t0 += tile_tok) {
                const int nt = int(std::min<int64_t>(tile_tok, n_tok - t0));
                tile(rows, x + t0 * n_in, n_in, nt, acc);
                for (int r = 0; r < nr; ++r)
                    for (int t = 0; t < nt; ++t) epilogue(t0 + t, o + r, acc[r][t]);
            }
        }
    };
    if (n_out * n_in * n_tok < thread_pool::min_parallel_work) body(0, n_out);
    else pool.parallel_for_dynamic(n_out, chunk, body);
}

} // namespace

void matmul_i8(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w,
               const float* bias) {
    const int64_t n_out = w.n_out, n_in = w.n_in;
    const float* sw = w.scale();
    const isa level = active_isa();
    if (level == isa::avx512 && n_tok >= dnnl_min_tokens) {
        // oneDNN's fast int8 kernels take u8 activations; the int32 sums land in `out` itself
        // and are turned into floats in place with the GEMV's own expression.
        thread_local std::vector<uint8_t> xu_buf; // the caller's; workers see only the pointer
        xu_buf.resize(size_t(n_tok * n_in));
        uint8_t* xu = xu_buf.data();
        pool.parallel_for(n_tok * n_in, 1 << 16, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) xu[i] = uint8_t(qx[i] ^ int8_t(-128));
        });
        int32_t* acc = reinterpret_cast<int32_t*>(out); // same size, converted element by element
        if (dnnl_matmul_u8s8(pool, acc, xu, n_tok, w)) {
            pool.parallel_for(n_tok, thread_pool::grain_for(n_out), [&](int64_t t0, int64_t t1) {
                for (int64_t t = t0; t < t1; ++t)
                    for (int64_t o = 0; o < n_out; ++o) {
                        int32_t a; // read as int32 through memcpy: the same bytes are then written as a float
                        std::memcpy(&a, &out[t * n_out + o], sizeof a);
                        a -= 128 * w.q_sum[size_t(o)];
                        out[t * n_out + o] = float(a) * sx[t] * sw[o] + (bias ? bias[o] : 0.0f);
                    }
            });
            return;
        }
    }
    const tile_fn tile = level == isa::avx512 ? tile_vnni : level == isa::avx2 ? tile_avx2 : tile_scalar;
    const bool offset = level == isa::avx512; // u8 activations: subtract 128 * row sum
    tiled_rows<int32_t>(pool, w, qx, n_tok, tile, [&](int64_t t, int64_t o, int32_t a) {
        const int32_t corr = offset ? 128 * w.q_sum[size_t(o)] : 0;
        out[t * n_out + o] = float(a - corr) * sx[t] * sw[o] + (bias ? bias[o] : 0.0f);
    });
}

namespace {

// W8A32: the same tiling over f32 activations; each int8 weight is widened to f32 in
// registers, so the weights are still read once per step as bytes.
using tile_f_fn = void (*)(const int8_t* const* w, const float* x, int64_t n_in, int nt, float acc[tile_rows][tile_tok]);

void tile_f_scalar(const int8_t* const* w, const float* x, int64_t n_in, int nt, float acc[tile_rows][tile_tok]) {
    for (int r = 0; r < tile_rows; ++r)
        for (int t = 0; t < nt; ++t) acc[r][t] = dot_i8_f32_ref(w[r], x + t * n_in, n_in);
}

template <int T>
__attribute__((target("avx2,fma"))) void tile_f_avx2_t(const int8_t* const* w, const float* x, int64_t n_in,
                                                       float acc[tile_rows][tile_tok]) {
    __m256 a[tile_rows][T];
    for (int r = 0; r < tile_rows; ++r)
        for (int t = 0; t < T; ++t) a[r][t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n_in; i += 8) {
        __m256 wv[tile_rows];
        for (int r = 0; r < tile_rows; ++r)
            wv[r] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w[r] + i))));
        for (int t = 0; t < T; ++t) {
            const __m256 xv = _mm256_loadu_ps(x + t * n_in + i);
            for (int r = 0; r < tile_rows; ++r) a[r][t] = _mm256_fmadd_ps(wv[r], xv, a[r][t]);
        }
    }
    for (int r = 0; r < tile_rows; ++r) {
        for (int t = 0; t < T; ++t) {
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(a[r][t]), _mm256_extractf128_ps(a[r][t], 1));
            s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            s = _mm_add_ss(s, _mm_movehdup_ps(s));
            float v = _mm_cvtss_f32(s);
            for (int64_t j = i; j < n_in; ++j) v += float(w[r][j]) * x[t * n_in + j];
            acc[r][t] = v;
        }
    }
}

void tile_f_avx2(const int8_t* const* w, const float* x, int64_t n_in, int nt, float acc[tile_rows][tile_tok]) {
    switch (nt) {
    case 1: tile_f_avx2_t<1>(w, x, n_in, acc); return;
    case 2: tile_f_avx2_t<2>(w, x, n_in, acc); return;
    case 3: tile_f_avx2_t<3>(w, x, n_in, acc); return;
    default: tile_f_avx2_t<4>(w, x, n_in, acc); return;
    }
}

// 16 weights per step; the K tail is a masked load of zeros.
template <int T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void tile_f_avx512_t(const int8_t* const* w, const float* x,
                                                                         int64_t n_in, float acc[tile_rows][tile_tok]) {
    __m512 a[tile_rows][T];
    for (int r = 0; r < tile_rows; ++r)
        for (int t = 0; t < T; ++t) a[r][t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n_in; i += 16) {
        const __mmask16 m = n_in - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n_in - i)) - 1);
        __m512 wv[tile_rows];
        for (int r = 0; r < tile_rows; ++r) {
            if ((i & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(w[r] + i + pf_dist), _MM_HINT_T0);
            wv[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, w[r] + i)));
        }
        for (int t = 0; t < T; ++t) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * n_in + i);
            for (int r = 0; r < tile_rows; ++r) a[r][t] = _mm512_fmadd_ps(wv[r], xv, a[r][t]);
        }
    }
    for (int r = 0; r < tile_rows; ++r)
        for (int t = 0; t < T; ++t) acc[r][t] = _mm512_reduce_add_ps(a[r][t]);
}

void tile_f_avx512(const int8_t* const* w, const float* x, int64_t n_in, int nt, float acc[tile_rows][tile_tok]) {
    switch (nt) {
    case 1: tile_f_avx512_t<1>(w, x, n_in, acc); return;
    case 2: tile_f_avx512_t<2>(w, x, n_in, acc); return;
    case 3: tile_f_avx512_t<3>(w, x, n_in, acc); return;
    default: tile_f_avx512_t<4>(w, x, n_in, acc); return;
    }
}

} // namespace

void matmul_w8a32(thread_pool& pool, float* out, const float* x, int64_t n_tok, const weight& w, const float* bias) {
    const int64_t n_out = w.n_out;
    const float* sw = w.scale();
    const isa level = active_isa();
    const tile_f_fn tile = level == isa::avx512 ? tile_f_avx512 : level == isa::avx2 ? tile_f_avx2 : tile_f_scalar;
    tiled_rows<float>(pool, w, x, n_tok, tile, [&](int64_t t, int64_t o, float a) {
        out[t * n_out + o] = a * sw[o] + (bias ? bias[o] : 0.0f);
    });
}

} // namespace tandem::cpu
