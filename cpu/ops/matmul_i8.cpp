// INT8 matmul on the CPU: W8A8 as a hand-written GEMV/small GEMM for decode that reads each weight
// byte once per step for the whole batch and oneDNN's int8 matmul for prefill batches.
#include "cpu/dnnl_matmul.hpp"
#include "cpu/intrinsics.hpp"
#include "cpu/isa.hpp"
#include "cpu/ops/matmul_i8_amx.hpp"
#include "cpu/ops/ops.hpp"
#include "cpu/thread_pool.hpp"
#include "quant/int8.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace tandem::cpu {
namespace {

constexpr int tile_rows = 4; // weight rows sharing each activation load
constexpr int tile_tok = 4;  // tokens sharing each weight load

// What a tile pass prefetches for each 64 bytes of K it walks. One pass (one token block, the
// memory-bound case): each of its own rows pf_dist bytes ahead, into L1. Several passes: the
// next tile's rows (contiguous), `lines` cache lines a step from p on, into L2, the driver
// spreading the next tile over the passes.
struct prefetch_plan {
    bool in_row = false;
    const int8_t* p = nullptr;
    int lines = 0;
};

// Measured on the 1.1B shape with one thread, batch-1 decode went from 71% to 88% of the read
// roofline with 8 KiB (16 KiB: the same; 2 KiB: 77%). Fetching the next tile in order instead
// (the same bytes at n_in 2048) ran batch 1 10% slower.
constexpr int64_t pf_dist = 8192;

// acc[t][r] = dot(w + r * n_in, x + t * n_in) for r < tile_rows, t < T; rows past the
// matrix's end point at its last row (their sums are dropped by the caller).
void tile_scalar(const int8_t* const* w, const int8_t* x, int64_t n_in, int nt, const prefetch_plan&,
                 int32_t acc[tile_tok][tile_rows]) {
    for (int r = 0; r < tile_rows; ++r)
        for (int t = 0; t < nt; ++t) acc[t][r] = dot_i8_ref(w[r], x + t * n_in, n_in);
}

// AVX2 has no u8 x s8 dot without 16-bit saturation: |x| (<= 127) times w with x's sign
// keeps every pair sum of vpmaddubsw within int16, so the result is exact.
template <int T>
__attribute__((target("avx2,fma"))) void tile_avx2_t(const int8_t* const* w, const int8_t* x, int64_t n_in,
                                                     int32_t acc[tile_tok][tile_rows]) {
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
            acc[t][r] = s;
        }
    }
}

void tile_avx2(const int8_t* const* w, const int8_t* x, int64_t n_in, int nt, const prefetch_plan&,
               int32_t acc[tile_tok][tile_rows]) {
    switch (nt) {
    case 1: tile_avx2_t<1>(w, x, n_in, acc); return;
    case 2: tile_avx2_t<2>(w, x, n_in, acc); return;
    case 3: tile_avx2_t<3>(w, x, n_in, acc); return;
    default: tile_avx2_t<4>(w, x, n_in, acc); return;
    }
}

// VNNI: vpdpbusd multiplies u8 by s8, so activations go in as u8 = s8 + 128 (the caller flips
// the sign bits once per call) and the caller subtracts 128 * sum(w row). The K tail is a
// masked load of zeros.
#define TANDEM_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

// acc += dot4(u8 x, s8 w) per lane. In asm because GCC 12 ties the intrinsic's accumulator
// badly: it copies each one to a spare register and back around every vpdpbusd, which ran the
// 4x4 tile at a third of the core's vpdpbusd rate (2.3x slower than this at 16 tokens).
TANDEM_VNNI inline __attribute__((always_inline)) void dpbusd(__m512i& acc, __m512i xu, __m512i w) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(xu), "v"(w));
}

#define TANDEM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

// Sums of 16 vectors in one: lane j = sum of v[j]'s int32 lanes. Four levels that each halve
// the width and pair up vectors (15 adds and 30 shuffles for 16 sums, against ~8 ops per sum
// one vector at a time); the order of the inputs in reduce16 makes the output lanes come out
// in order.
TANDEM_AVX512 inline __m512i halve_512(__m512i a, __m512i b) { // [a0+a2 a1+a3 | b0+b2 b1+b3] (128-bit blocks)
    return _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, 0x44), _mm512_shuffle_i32x4(a, b, 0xee));
}
TANDEM_AVX512 inline __m512i halve_256(__m512i a, __m512i b) { // [a0+a1 | a2+a3 | b0+b1 | b2+b3]
    return _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, 0x88), _mm512_shuffle_i32x4(a, b, 0xdd));
}
TANDEM_AVX512 inline __m512i halve_128(__m512i a, __m512i b) { // per 128-bit block: [a0+a2 a1+a3 b0+b2 b1+b3]
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}
TANDEM_AVX512 inline __m512i halve_64(__m512i a, __m512i b) { // per 128-bit block: [a0+a1 a2+a3 b0+b1 b2+b3]
    const __m512 fa = _mm512_castsi512_ps(a), fb = _mm512_castsi512_ps(b);
    return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(fa, fb, 0x88)),
                            _mm512_castps_si512(_mm512_shuffle_ps(fa, fb, 0xdd)));
}
TANDEM_AVX512 inline __m512i reduce16(const __m512i v[16]) {
    const __m512i a0 = halve_512(v[0], v[4]), a1 = halve_512(v[1], v[5]), a2 = halve_512(v[2], v[6]),
                  a3 = halve_512(v[3], v[7]), a8 = halve_512(v[8], v[12]), a9 = halve_512(v[9], v[13]),
                  a10 = halve_512(v[10], v[14]), a11 = halve_512(v[11], v[15]);
    return halve_64(halve_128(halve_256(a0, a8), halve_256(a1, a9)),
                    halve_128(halve_256(a2, a10), halve_256(a3, a11)));
}

// The plan in registers for one tile pass (the hot loops read nothing else from memory).
struct prefetcher {
    bool in_row;
    const char* p; // next-tile mode: where step 0's lines start
    int lines;     // 1 or 2 in next-tile mode (a pass is one of at least two)

    explicit prefetcher(const prefetch_plan& pf)
        : in_row(pf.in_row), p(reinterpret_cast<const char*>(pf.p)), lines(pf.p ? pf.lines : 0) {}

    inline __attribute__((always_inline)) void step(const int8_t* const w[tile_rows], int64_t i) const {
        if (in_row) {
            for (int r = 0; r < tile_rows; ++r)
                _mm_prefetch(reinterpret_cast<const char*>(w[r] + i + pf_dist), _MM_HINT_T0);
        } else if (lines > 0) {
            const char* q = p + (i >> 6) * lines * 64;
            _mm_prefetch(q, _MM_HINT_T1);
            if (lines > 1) _mm_prefetch(q + 64, _MM_HINT_T1);
        }
    }
};

// One 64-byte step of K for the tile: a[t * tile_rows + r] += w[r][i..] . x[t][i..]
template <int T, bool masked>
TANDEM_VNNI inline __attribute__((always_inline)) void vnni_step(__m512i a[16], const int8_t* const w[tile_rows],
                                                                 const uint8_t* x, int64_t n_in, int64_t i,
                                                                 __mmask64 m, const prefetcher& pf) {
    pf.step(w, i);
    __m512i wv[tile_rows];
#pragma GCC unroll 4
    for (int r = 0; r < tile_rows; ++r) {
        wv[r] = masked ? _mm512_maskz_loadu_epi8(m, w[r] + i) : _mm512_loadu_si512(w[r] + i);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
        const __m512i xu = masked ? _mm512_maskz_loadu_epi8(m, x + t * n_in + i) : _mm512_loadu_si512(x + t * n_in + i);
#pragma GCC unroll 4
        for (int r = 0; r < tile_rows; ++r) dpbusd(a[t * tile_rows + r], xu, wv[r]);
    }
}

// x: u8 activations (s8 + 128). acc[t][r] is lane t * tile_rows + r of the reduced tile.
template <int T>
TANDEM_VNNI void tile_vnni_t(const int8_t* const* w, const uint8_t* x, int64_t n_in, const prefetch_plan& pf,
                             int32_t acc[tile_tok][tile_rows]) {
    static_assert(tile_rows * tile_tok == 16, "one reduce16 per tile");
    __m512i a[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) a[j] = _mm512_setzero_si512();
    const int8_t* const rows[tile_rows] = {w[0], w[1], w[2], w[3]};
    const prefetcher pre(pf);
    int64_t i = 0;
    for (; i + 128 <= n_in; i += 128) { // two steps an iteration: the loop's own uops are a tenth, not a fifth
        vnni_step<T, false>(a, rows, x, n_in, i, 0, pre);
        vnni_step<T, false>(a, rows, x, n_in, i + 64, 0, pre);
    }
    if (i + 64 <= n_in) {
        vnni_step<T, false>(a, rows, x, n_in, i, 0, pre);
        i += 64;
    }
    if (i < n_in) vnni_step<T, true>(a, rows, x, n_in, i, (__mmask64(1) << (n_in - i)) - 1, pre);
    _mm512_storeu_si512(&acc[0][0], reduce16(a));
}

void tile_vnni(const int8_t* const* w, const uint8_t* x, int64_t n_in, int nt, const prefetch_plan& pf,
               int32_t acc[tile_tok][tile_rows]) {
    switch (nt) {
    case 1: tile_vnni_t<1>(w, x, n_in, pf, acc); return;
    case 2: tile_vnni_t<2>(w, x, n_in, pf, acc); return;
    case 3: tile_vnni_t<3>(w, x, n_in, pf, acc); return;
    default: tile_vnni_t<4>(w, x, n_in, pf, acc); return;
    }
}

// Batches from this size go to oneDNN; both read the weights once per call. Measured with two
// threads (OMP_WAIT_POLICY=PASSIVE, as tandem runs) on the 1.1B down projection, 2048 x 5632,
// two runs each: 32 tokens took 1.4-1.6 ms on the VNNI small GEMM and 1.8-2.3 on oneDNN, 64
// tokens 2.5-2.9 against 2.2-3.4, 128 tokens 4.9-6.1 against 3.8-4.6. Batch-16 decode passes
// 32 rows to the down projection (two int8 terms), which went to oneDNN at the old bound of 32.
constexpr int64_t dnnl_min_tokens = 64;

// Batches from this size go to the AMX tiles where the CPU has them; one or two tokens run
// faster on the VNNI GEMV. Measured on the 1.1B shape, two threads (issue 15, helper runs of
// 2026-12-02): the AMX kernel for every size made the one-token step 45-47 ms against 40-42
// on the GEMV; from 3 tokens it made a 5-token verify step 1.23x a one-token step against
// 1.31-1.33x, and batch-16 decode 220-229 tok/s against 200-201. Bit for bit the same sums
// and epilogue as the GEMV (test_backend_ops: every batch size gives each token the same bits
// as alone).
constexpr int64_t amx_min_tokens = 5;

// The driver both GEMVs share: tiles of tile_rows weight rows x tile_tok tokens, each tile's
// rows (a few KiB) kept in L1 while every token block passes over them, and chunks of
// ~128 KiB of weights handed out dynamically (the cores may be shared); a matrix too small
// to be worth a second thread runs on one. epilogue(o, t0, nr, nt, acc) writes a tile's sums
// out: acc[t * tile_rows + r] is for row o + r, token t0 + t (r < nr, t < nt).
// With several passes (token blocks) per tile, they prefetch the next tile's rows into L2,
// spread evenly over the passes: with 16 tokens (four passes) and one thread, the gate/up
// matrices of the 1.1B shape took 62 ms a step this way against 80 ms with each pass
// prefetching 8 KiB ahead in its own rows (the first pass then asks for everything and the
// other three for lines already there).
template <class Acc, class X, class Tile, class Epilogue>
void tiled_rows(thread_pool& pool, const weight& w, const X* x, int64_t n_tok, Tile tile, const Epilogue& epilogue,
                int64_t o_begin = 0) {
    const int64_t n_out = w.n_out, n_in = w.n_in;
    const int8_t* q = w.q();
    const int64_t chunk =
        std::max<int64_t>(tile_rows, (int64_t(1) << 17) / std::max<int64_t>(1, n_in) / tile_rows * tile_rows);
    const auto body = [&](int64_t o0, int64_t o1) {
        Acc acc[tile_tok][tile_rows];
        for (int64_t o = o0; o < o1; o += tile_rows) {
            const int nr = int(std::min<int64_t>(tile_rows, o1 - o));
            const int8_t* rows[tile_rows];
            for (int r = 0; r < tile_rows; ++r) rows[r] = q + (o + std::min(r, nr - 1)) * n_in;
            const int8_t* next = o + tile_rows < n_out ? q + (o + tile_rows) * n_in : nullptr;
            for (int64_t t0 = 0; t0 < n_tok; t0 += tile_tok) {
                const int nt = int(std::min<int64_t>(tile_tok, n_tok - t0));
                // pass p of n_pass fetches `lines` rows' worth of the next tile
                const int64_t pass = t0 / tile_tok, n_pass = (n_tok + tile_tok - 1) / tile_tok;
                const int lines = int(std::max<int64_t>(1, (tile_rows + n_pass - 1) / n_pass));
                prefetch_plan pf;
                if (n_pass == 1) pf.in_row = true;
                else if (next && pass * lines < tile_rows) pf = {false, next + pass * lines * n_in, lines};
                tile(rows, x + t0 * n_in, n_in, nt, pf, acc);
                epilogue(o, t0, nr, nt, &acc[0][0]);
            }
        }
    };
    const int64_t n_rows = n_out - o_begin;
    if (n_rows <= 0) return;
    const auto rows_from = [&](int64_t b, int64_t e) { body(o_begin + b, o_begin + e); };
    if (n_rows * n_in * n_tok < thread_pool::min_parallel_work) rows_from(0, n_rows);
    else pool.parallel_for_dynamic(n_rows, chunk, rows_from);
}

// A tile epilogue from an element one, f(t, o, sum).
template <class F>
auto per_element(const F& f) {
    return [&f](int64_t o, int64_t t0, int nr, int nt, const auto* acc) {
        for (int t = 0; t < nt; ++t)
            for (int r = 0; r < nr; ++r) f(t0 + t, o + r, acc[t * tile_rows + r]);
    };
}

// Writes v (lane t * tile_rows + r) to out[t0 + t][o + r] for r < nr, t < nt: a token's four
// rows are one 128-bit block.
TANDEM_AVX512 inline void store_tile(float* out, int64_t n_out, int64_t o, int64_t t0, int nr, int nt, __m512 v) {
    const __mmask8 rm = __mmask8((1u << nr) - 1);
    float* p = out + t0 * n_out + o;
    _mm_mask_storeu_ps(p, rm, _mm512_castps512_ps128(v));
    if (nt > 1) _mm_mask_storeu_ps(p + n_out, rm, _mm512_extractf32x4_ps(v, 1));
    if (nt > 2) _mm_mask_storeu_ps(p + 2 * n_out, rm, _mm512_extractf32x4_ps(v, 2));
    if (nt > 3) _mm_mask_storeu_ps(p + 3 * n_out, rm, _mm512_extractf32x4_ps(v, 3));
}

// Four per-row values of rows [o, o + nr) in every 128-bit block (zeros past nr).
TANDEM_AVX512 inline __m512 row_values(const float* v, int64_t o, int nr) {
    return _mm512_broadcast_f32x4(_mm_maskz_loadu_ps(__mmask8((1u << nr) - 1), v + o));
}

// The VNNI tile's epilogue, vectorized (the per-element one cost as much as a fifth of a
// small GEMM at 16 tokens): out = float(acc - 128 * q_sum[o]) * sx[t] * sw[o] + bias[o], the
// reference's expression and order (multiplies and an add, no FMA), so results are the same.
struct vnni_epilogue {
    float* out;
    int64_t n_out;
    const float* sx;
    const float* sw;
    const int32_t* q_sum;
    const float* bias;

    TANDEM_AVX512 void operator()(int64_t o, int64_t t0, int nr, int nt, const int32_t* acc) const {
        const __mmask8 rm = __mmask8((1u << nr) - 1);
        const __m512i corr = _mm512_slli_epi32(_mm512_broadcast_i32x4(_mm_maskz_loadu_epi32(rm, q_sum + o)), 7);
        const __m512 s = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                               _mm512_castps128_ps512(_mm_maskz_loadu_ps(__mmask8((1u << nt) - 1), sx + t0)));
        __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(acc), corr));
        v = _mm512_mul_ps(_mm512_mul_ps(v, s), row_values(sw, o, nr));
        v = _mm512_add_ps(v, bias ? row_values(bias, o, nr) : _mm512_setzero_ps());
        store_tile(out, n_out, o, t0, nr, nt, v);
    }
};

// oneDNN's int32 sums of one token, turned into floats in place: the VNNI epilogue's expression
// float(acc - 128 * q_sum[o]) * sx * sw[o] + bias[o], 16 outputs at a time.
TANDEM_AVX512 void scale_row(float* row, int64_t n_out, float sx, const float* sw, const int32_t* q_sum,
                             const float* bias) {
    const __m512 s = _mm512_set1_ps(sx);
    for (int64_t o = 0; o < n_out; o += 16) {
        const __mmask16 m = n_out - o >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n_out - o)) - 1);
        const __m512i a = _mm512_maskz_loadu_epi32(m, row + o); // the int32 sum in the float's bytes
        const __m512i corr = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m, q_sum + o), 7);
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a, corr)), s),
                                 _mm512_maskz_loadu_ps(m, sw + o));
        v = _mm512_add_ps(v, bias ? _mm512_maskz_loadu_ps(m, bias + o) : _mm512_setzero_ps());
        _mm512_mask_storeu_ps(row + o, m, v);
    }
}

// The activations as u8 (s8 + 128) for the kernels that take them so, in a buffer of the
// calling thread's (workers only see the pointer).
TANDEM_AVX512 void flip_range(uint8_t* xu, const int8_t* qx, int64_t b, int64_t e) {
    const __m512i sign = _mm512_set1_epi8(char(0x80));
    int64_t i = b;
    for (; i + 64 <= e; i += 64)
        _mm512_storeu_si512(xu + i, _mm512_xor_si512(_mm512_loadu_si512(qx + i), sign));
    if (i < e) {
        const __mmask64 m = (__mmask64(1) << (e - i)) - 1;
        _mm512_mask_storeu_epi8(xu + i, m, _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, qx + i), sign));
    }
}

const uint8_t* flip_to_u8(thread_pool& pool, const int8_t* qx, int64_t n) {
    thread_local std::vector<uint8_t, cacheline_allocator<uint8_t>> buf; // rows on cache lines (n_in % 64 == 0)
    buf.resize(size_t(n));
    uint8_t* xu = buf.data();
    if (n < (int64_t(1) << 18)) flip_range(xu, qx, 0, n);
    else pool.parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) { flip_range(xu, qx, b, e); });
    return xu;
}

} // namespace

namespace {

// The GEMV / small GEMM of one ISA level (scalar, avx2 or the VNNI avx512) for the output rows
// [o_begin, n_out).
void small_gemm_rows(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w,
                     const float* bias, isa level, int64_t o_begin) {
    const int64_t n_out = w.n_out, n_in = w.n_in;
    const float* sw = w.scale();
    if (level < isa::avx512) {
        const auto epilogue = [&](int64_t t, int64_t o, int32_t a) {
            out[t * n_out + o] = float(a) * sx[t] * sw[o] + (bias ? bias[o] : 0.0f);
        };
        tiled_rows<int32_t>(pool, w, qx, n_tok, level == isa::avx2 ? tile_avx2 : tile_scalar, per_element(epilogue),
                            o_begin);
        return;
    }
    const uint8_t* xu = flip_to_u8(pool, qx, n_tok * n_in); // u8 activations: subtract 128 * row sum
    tiled_rows<int32_t>(pool, w, xu, n_tok, tile_vnni, vnni_epilogue{out, n_out, sx, sw, w.q_sum.data(), bias},
                        o_begin);
}

} // namespace

void matmul_i8(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w,
               const float* bias) {
    const int64_t n_out = w.n_out, n_in = w.n_in;
    const float* sw = w.scale();
    const isa level = active_isa();
    // TANDEM_AMX_PREFILL: batches of 64 tokens and more on the tiles too, for measuring them
    // against oneDNN (level within the noise on the H200 machine's Xeon: docs/cpu.md).
    static const bool amx_prefill = std::getenv("TANDEM_AMX_PREFILL") != nullptr;
    if (level >= isa::avx512 && n_tok >= dnnl_min_tokens && !(level == isa::amx && amx_prefill)) {
        // oneDNN takes the rows of whole multiples of dnnl_min_tokens, the rest go below (the same
        // bits): it builds a primitive per row count, and a server's batches come in every size,
        // which grew the prefill worker by 64-130 KiB a size (issue 19's soak), so there are at
        // most step_tokens / 64 per weight shape. It takes u8 activations too; the int32 sums land
        // in `out` itself and are turned into floats in place with the GEMV's expression.
        const int64_t m = n_tok - n_tok % dnnl_min_tokens;
        const uint8_t* xu = flip_to_u8(pool, qx, m * n_in);
        int32_t* acc = reinterpret_cast<int32_t*>(out); // same size, converted element by element
        if (dnnl_matmul_u8s8(pool, acc, xu, m, w)) {
            pool.parallel_for(m, thread_pool::grain_for(n_out), [&](int64_t t0, int64_t t1) {
                for (int64_t t = t0; t < t1; ++t) scale_row(out + t * n_out, n_out, sx[t], sw, w.q_sum.data(), bias);
            });
            if (m == n_tok) return;
            out += m * n_out;
            qx += m * n_in;
            sx += m;
            n_tok -= m;
        }
    }
    int64_t done = 0; // rows the AMX kernel took; the GEMV does the rest
    if (level == isa::amx && n_tok >= amx_min_tokens && amx_fits(w))
        done = matmul_i8_amx(pool, out, qx, sx, n_tok, w, bias, amx_exec::hardware);
    small_gemm_rows(pool, out, qx, sx, n_tok, w, bias, std::min(level, isa::avx512), done);
}

void prepare_matmul_i8(const weight& w, int64_t max_tok) {
    if (active_isa() < isa::avx512) return;
    for (int64_t m = dnnl_min_tokens; m <= max_tok; m += dnnl_min_tokens) dnnl_prepare(m, w);
}

void matmul_i8_amx_emulated(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok,
                            const weight& w, const float* bias) {
    int64_t done = 0;
    if (amx_fits(w)) done = matmul_i8_amx(pool, out, qx, sx, n_tok, w, bias, amx_exec::emulated);
    small_gemm_rows(pool, out, qx, sx, n_tok, w, bias, std::min(active_isa(), isa::avx512), done);
}

} // namespace tandem::cpu
