// The low-bit family's matmul on the CPU (runtime/weight.hpp's lowbit_matrix, W4..6 x A8): per
// tile of 16 outputs and super-block, the codes are unpacked once into 64-byte lines of 16
// outputs x 4 inputs (the INT8 blocked layout's line) in an L1 buffer, then every pass of up
// to four tokens multiplies them by broadcast activations: vpdpbusd (u8 codes x s8
// activations, the code offset taken off with the group's activation sum) from the VNNI level
// up, vpmaddubsw on signed values with the sign trick on AVX2. The integer sums are exact, and
// the float steps per super-block are the reference's (quant/lowbit.hpp) in its order, so
// every level gives matmul_lowbit_ref's bits (built with -ffp-contract=off).
#include "cpu/intrinsics.hpp"
#include "cpu/isa.hpp"
#include "cpu/ops/ops.hpp"
#include "cpu/thread_pool.hpp"
#include "quant/lowbit.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace tandem::cpu {
namespace {

#define TANDEM_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))
#define TANDEM_AVX2 __attribute__((target("avx2,fma,f16c")))

using lines_buf = std::vector<uint8_t, cacheline_allocator<uint8_t>>;

// What a pass needs: the super-block's bytes, its unpacked lines, tokens [t0, t0 + T).
struct pass_args {
    const lowbit_matrix* m;
    const uint8_t* p;      // the super-block's packed bytes (header)
    const uint8_t* u;      // its lines: super / 4 of them, line q = inputs 4q..4q+3
    const int8_t* x;       // token t0's activations at the super-block's first input; rows n_in apart
    const int32_t* xs;     // token t0's group sums at the super-block's first group; rows n_gsum apart
    int64_t n_gsum;
    float* r;              // [T][16] running sums of the tile, token t0 first
};

int64_t sc_offset(const lowbit_matrix& m) { return m.has_min ? 64 : 32; }

// ---- VNNI ----

TANDEM_VNNI inline __attribute__((always_inline)) void dpbusd(__m512i& acc, __m512i u, __m512i x) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(x));
}

// Codes u (0..255, the table's where there is one) of a super-block into lines.
TANDEM_VNNI void unpack_vnni(const lowbit_matrix& m, const uint8_t* p, uint8_t* u) {
    // Each line of the tile's super-block two ahead into L1 as this one is read: a group's
    // tiles are as many streams, which the hardware's prefetchers followed less well than one.
    const uint8_t* ahead = p + 2 * m.super_bytes;
    if (p + 3 * m.super_bytes <= m.data.data() + m.data.size())
        for (int64_t i = 0; i < m.super_bytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + i), _MM_HINT_T0);
    const uint8_t* nib = p + m.header_bytes;
    const __m512i low4 = _mm512_set1_epi8(0x0F), low2 = _mm512_set1_epi8(0x03);
    const __m512i tbl = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m.table)));
    for (int64_t j = 0; j < m.super / 8; ++j) {
        const __m512i b = _mm512_load_si512(nib + 64 * j);
        __m512i lo = _mm512_and_si512(b, low4), hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), low4);
        if (m.has_table) {
            lo = _mm512_shuffle_epi8(tbl, lo);
            hi = _mm512_shuffle_epi8(tbl, hi);
        }
        _mm512_store_si512(u + 128 * j, lo);
        _mm512_store_si512(u + 128 * j + 64, hi);
    }
    if (!m.has_hi) return;
    const uint8_t* hp = nib + m.super * 8;
    for (int64_t j = 0; j < m.super / 16; ++j) {
        const __m512i h = _mm512_load_si512(hp + 64 * j);
        for (int s = 0; s < 4; ++s) {
            uint8_t* line = u + 64 * (4 * j + s);
            const __m512i bits = _mm512_and_si512(_mm512_srli_epi16(h, unsigned(2 * s)), low2);
            _mm512_store_si512(line, _mm512_or_si512(_mm512_load_si512(line), _mm512_slli_epi16(bits, 4)));
        }
    }
}

// A pass over NT tiles (their lines side by side in u, super * 16 bytes apart) and T tokens:
// each token's four activations are broadcast once for NT lines of 16 outputs, so that the
// broadcasts do not bind the loop (one dpbusd each ran batch 16 at half the INT8 kernel's
// speed). Registers: 2 x NT x T sums; NT x T <= 8.
struct multi_args {
    const lowbit_matrix* m;
    const uint8_t* p[4];   // each tile's super-block bytes
    const uint8_t* u;      // their lines
    const int8_t* x;       // token t0's activations at the super-block's first input
    const int32_t* xs;     // token t0's group sums at the super-block's first group
    int64_t n_gsum;
    float* r;              // tile k, token t0 + t: r + k * r_stride + 16 * t
    int64_t r_stride;
};

template <int NT, int T>
TANDEM_VNNI void pass_vnni(const multi_args& a) {
    const lowbit_matrix& m = *a.m;
    const int32_t per = m.group / 4, n_grp = m.n_grp();
    const int64_t us = m.super * 16;
    const int64_t so = sc_offset(m);
    __m512i ia[NT][T];
#pragma GCC unroll 4
    for (int k = 0; k < NT; ++k)
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) ia[k][t] = _mm512_setzero_si512();
    for (int g = 0; g < n_grp; ++g) {
        __m512i raw[NT][T];
#pragma GCC unroll 4
        for (int k = 0; k < NT; ++k)
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) raw[k][t] = _mm512_setzero_si512();
        for (int q = g * per; q < (g + 1) * per; ++q) {
            __m512i w[NT];
#pragma GCC unroll 4
            for (int k = 0; k < NT; ++k) w[k] = _mm512_load_si512(a.u + k * us + 64 * q);
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) {
                int32_t x4;
                std::memcpy(&x4, a.x + t * m.n_in + 4 * q, 4);
                const __m512i xb = _mm512_set1_epi32(x4);
#pragma GCC unroll 4
                for (int k = 0; k < NT; ++k) dpbusd(raw[k][t], w[k], xb);
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            const __m512i offx = _mm512_set1_epi32(m.off * a.xs[t * a.n_gsum + g]);
#pragma GCC unroll 4
            for (int k = 0; k < NT; ++k) {
                const __m512i dot = _mm512_sub_epi32(raw[k][t], offx);
                if (m.unit_sc) {
                    ia[k][t] = _mm512_add_epi32(ia[k][t], dot);
                } else {
                    const auto* sc = reinterpret_cast<const __m128i*>(a.p[k] + so + 16 * g);
                    ia[k][t] = _mm512_add_epi32(ia[k][t], _mm512_mullo_epi32(_mm512_cvtepi8_epi32(_mm_load_si128(sc)), dot));
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < NT; ++k) {
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(a.p[k])));
        const __m512 dm = m.has_min ? _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(a.p[k] + 32)))
                                    : _mm512_setzero_ps();
        const int8_t* mg = reinterpret_cast<const int8_t*>(a.p[k] + so + 16 * n_grp);
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            __m512i ib = _mm512_setzero_si512(); // sum_g mg_g * xs_g
            if (m.has_min)
                for (int g = 0; g < n_grp; ++g) {
                    const __m512i xsv = _mm512_set1_epi32(a.xs[t * a.n_gsum + g]);
                    ib = _mm512_add_epi32(ib, m.unit_sc ? xsv
                                                        : _mm512_mullo_epi32(_mm512_cvtepi8_epi32(_mm_load_si128(
                                                                                 reinterpret_cast<const __m128i*>(mg + 16 * g))),
                                                                             xsv));
                }
            const __m512 t1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(ia[k][t]));
            const __m512 t2 = _mm512_mul_ps(dm, _mm512_cvtepi32_ps(ib));
            float* r = a.r + k * a.r_stride + 16 * t;
            _mm512_store_ps(r, _mm512_add_ps(_mm512_load_ps(r), _mm512_add_ps(t1, t2)));
        }
    }
}

using multi_fn = void (*)(const multi_args&);
// [tiles][tokens]: four tiles take one or two tokens, two tiles up to four.
constexpr multi_fn vnni_multi[5][5] = {
    {},
    {nullptr, pass_vnni<1, 1>, pass_vnni<1, 2>, pass_vnni<1, 3>, pass_vnni<1, 4>},
    {nullptr, pass_vnni<2, 1>, pass_vnni<2, 2>, pass_vnni<2, 3>, pass_vnni<2, 4>},
    {nullptr, pass_vnni<3, 1>, pass_vnni<3, 2>, nullptr, nullptr},
    {nullptr, pass_vnni<4, 1>, pass_vnni<4, 2>, nullptr, nullptr}};

// ---- AVX2: signed values, 8 outputs (half a line) at a time ----

TANDEM_AVX2 void unpack_avx2(const lowbit_matrix& m, const uint8_t* p, uint8_t* u) {
    const uint8_t* nib = p + m.header_bytes;
    const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(0x03), off = _mm256_set1_epi8(char(m.off));
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m.table)));
    for (int64_t j = 0; j < m.super / 8; ++j)
        for (int h = 0; h < 2; ++h) {
            const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(nib + 64 * j + 32 * h));
            __m256i lo = _mm256_and_si256(b, low4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low4);
            if (m.has_table) {
                lo = _mm256_shuffle_epi8(tbl, lo);
                hi = _mm256_shuffle_epi8(tbl, hi);
            }
            _mm256_store_si256(reinterpret_cast<__m256i*>(u + 128 * j + 32 * h), lo);
            _mm256_store_si256(reinterpret_cast<__m256i*>(u + 128 * j + 64 + 32 * h), hi);
        }
    if (m.has_hi) {
        const uint8_t* hp = nib + m.super * 8;
        for (int64_t j = 0; j < m.super / 16; ++j)
            for (int h = 0; h < 2; ++h) {
                const __m256i hv = _mm256_load_si256(reinterpret_cast<const __m256i*>(hp + 64 * j + 32 * h));
                for (int s = 0; s < 4; ++s) {
                    auto* line = reinterpret_cast<__m256i*>(u + 64 * (4 * j + s) + 32 * h);
                    const __m256i bits = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * s), low2);
                    _mm256_store_si256(line, _mm256_or_si256(_mm256_load_si256(line), _mm256_slli_epi16(bits, 4)));
                }
            }
    }
    for (int64_t i = 0; i < m.super * 16; i += 32) { // u - off: every value fits in s8
        auto* v = reinterpret_cast<__m256i*>(u + i);
        _mm256_store_si256(v, _mm256_sub_epi8(_mm256_load_si256(v), off));
    }
}

template <int T>
TANDEM_AVX2 void pass_avx2(const pass_args& a) {
    const lowbit_matrix& m = *a.m;
    const int32_t per = m.group / 4, n_grp = m.n_grp();
    const int8_t* sc = reinterpret_cast<const int8_t*>(a.p + sc_offset(m));
    const int8_t* mg = sc + 16 * n_grp;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; ++h) {
        __m256i ia[T], ib[T];
        for (int t = 0; t < T; ++t) ia[t] = ib[t] = _mm256_setzero_si256();
        for (int g = 0; g < n_grp; ++g) {
            __m256i raw[T];
            for (int t = 0; t < T; ++t) raw[t] = _mm256_setzero_si256();
            for (int q = g * per; q < (g + 1) * per; ++q) {
                const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(a.u + 64 * q + 32 * h));
                for (int t = 0; t < T; ++t) {
                    int32_t x4;
                    std::memcpy(&x4, a.x + t * m.n_in + 4 * q, 4);
                    const __m256i xb = _mm256_set1_epi32(x4);
                    const __m256i pr = _mm256_maddubs_epi16(_mm256_sign_epi8(xb, xb), _mm256_sign_epi8(w, xb));
                    raw[t] = _mm256_add_epi32(raw[t], _mm256_madd_epi16(pr, ones));
                }
            }
            const __m256i scv = m.unit_sc ? _mm256_set1_epi32(1) : _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 16 * g + 8 * h)));
            const __m256i mgv = m.unit_sc ? _mm256_set1_epi32(1) : _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mg + 16 * g + 8 * h)));
            for (int t = 0; t < T; ++t) {
                ia[t] = _mm256_add_epi32(ia[t], _mm256_mullo_epi32(scv, raw[t]));
                if (m.has_min) ib[t] = _mm256_add_epi32(ib[t], _mm256_mullo_epi32(mgv, _mm256_set1_epi32(a.xs[t * a.n_gsum + g])));
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(a.p + 16 * h)));
        const __m256 dm = m.has_min ? _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(a.p + 32 + 16 * h))) : _mm256_setzero_ps();
        for (int t = 0; t < T; ++t) {
            const __m256 t1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(ia[t]));
            const __m256 t2 = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(ib[t]));
            float* r = a.r + 16 * t + 8 * h;
            _mm256_store_ps(r, _mm256_add_ps(_mm256_load_ps(r), _mm256_add_ps(t1, t2)));
        }
    }
}

using pass_fn = void (*)(const pass_args&);
constexpr pass_fn avx2_passes[] = {nullptr, pass_avx2<1>, pass_avx2<2>, pass_avx2<3>, pass_avx2<4>};

} // namespace

void matmul_lowbit(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok,
                   const lowbit_matrix& m, const float* bias) {
    const isa level = active_isa();
    if (level == isa::scalar) {
        // The scalar twin: the reference, a range of tiles' outputs per thread.
        pool.parallel_for(m.n_tiles(), 1, [&](int64_t t0, int64_t t1) {
            matmul_lowbit_ref_rows(out, qx, sx, n_tok, m, bias, t0 * 16, std::min(m.n_out, t1 * 16));
        });
        return;
    }
    // Group sums of every token's activations.
    const int64_t n_gsum = m.n_in / m.group;
    thread_local std::vector<int32_t> xs_buf;
    xs_buf.resize(size_t(n_tok * n_gsum));
    for (int64_t t = 0; t < n_tok; ++t) lowbit_group_sums_ref(qx + t * m.n_in, m.n_in, m.group, &xs_buf[size_t(t * n_gsum)]);
    const int32_t* xs = xs_buf.data();
    const bool vnni = level >= isa::avx512;
    // Tiles in groups: four for one or two tokens, two for more (AVX2: one).
    const int64_t group = !vnni ? 1 : n_tok <= 2 ? 4 : 2, t_step = !vnni ? 4 : n_tok <= 2 ? 2 : 4;
    const int64_t n_groups = (m.n_tiles() + group - 1) / group;
    const auto body = [&](int64_t g0, int64_t g1) {
        thread_local lines_buf u, rbuf;
        u.resize(size_t(4 * m.super * 16));
        rbuf.resize(size_t(n_tok * 16 * 4 * 4));
        float* r = reinterpret_cast<float*>(rbuf.data());
        for (int64_t gi = g0; gi < g1; ++gi) {
            const int64_t ti0 = gi * group, nt = std::min(group, m.n_tiles() - ti0);
            std::fill(r, r + nt * n_tok * 16, 0.0f);
            for (int64_t s = 0; s < m.n_super(); ++s) {
                multi_args ma{&m, {}, u.data(), nullptr, nullptr, n_gsum, r, n_tok * 16};
                for (int64_t k = 0; k < nt; ++k) {
                    const uint8_t* p = m.at(ti0 + k, s);
                    if (s + 1 < m.n_super()) _mm_prefetch(reinterpret_cast<const char*>(m.at(ti0 + k, s + 1)), _MM_HINT_T0);
                    ma.p[k] = p;
                    if (vnni) unpack_vnni(m, p, u.data() + k * m.super * 16);
                    else unpack_avx2(m, p, u.data() + k * m.super * 16);
                }
                for (int64_t t = 0; t < n_tok; t += t_step) {
                    const int n_t = int(std::min<int64_t>(t_step, n_tok - t));
                    ma.x = qx + t * m.n_in + s * m.super;
                    ma.xs = xs + t * n_gsum + s * m.n_grp();
                    ma.r = r + 16 * t;
                    if (vnni) vnni_multi[nt][n_t](ma);
                    else avx2_passes[n_t](pass_args{&m, ma.p[0], u.data(), ma.x, ma.xs, n_gsum, ma.r});
                }
            }
            for (int64_t k = 0; k < nt; ++k) {
                const int64_t ti = ti0 + k, n_o = std::min<int64_t>(16, m.n_out - ti * 16);
                const float* rk = r + k * n_tok * 16;
                for (int64_t t = 0; t < n_tok; ++t)
                    for (int64_t l = 0; l < n_o; ++l) {
                        const int64_t o = ti * 16 + l;
                        out[t * m.n_out + o] = bias ? rk[16 * t + l] * sx[t] + bias[o] : rk[16 * t + l] * sx[t];
                    }
            }
        }
    };
    const int64_t group_bytes = group * m.n_super() * m.super_bytes;
    const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 17) / group_bytes);
    if (m.n_tiles() * m.n_super() * m.super_bytes * n_tok < thread_pool::min_parallel_work) body(0, n_groups);
    else pool.parallel_for_dynamic(n_groups, chunk, body);
}

} // namespace tandem::cpu
