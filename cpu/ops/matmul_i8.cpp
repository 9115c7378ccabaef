// INT8 matmul on the CPU: W8A8 on weights in the blocked layout (runtime/weight.hpp) from the
// VNNI level up: a GEMV/small GEMM for decode that reads each weight byte once per step for the
// whole batch, the AMX tiles for 5 to 63 tokens where the CPU has them, and oneDNN's int8
// matmul for prefill batches, all three reading the same bytes. Below VNNI (and for weights in
// rows) a row-tiled GEMV.
#include "cpu/dnnl_matmul.hpp"
#include "cpu/intrinsics.hpp"
#include "cpu/isa.hpp"
#include "cpu/ops/matmul_i8_amx.hpp"
#include "cpu/ops/matmul_i8_sums.hpp"
#include "cpu/ops/ops.hpp"
#include "cpu/thread_pool.hpp"
#include "quant/int8.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace tandem::cpu {
namespace {

// ---- Weights in rows, and every weight below the VNNI level ----

constexpr int tile_rows = 4; // weight rows sharing each activation load
constexpr int tile_tok = 4;  // tokens sharing each weight load

// acc[t][r] = dot(w + r * n_in, x + t * n_in) for r < tile_rows, t < T; rows past the
// matrix's end point at its last row (their sums are dropped by the caller).
void tile_scalar(const int8_t* const* w, const int8_t* x, int64_t n_in, int nt, int32_t acc[tile_tok][tile_rows]) {
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

void tile_avx2(const int8_t* const* w, const int8_t* x, int64_t n_in, int nt, int32_t acc[tile_tok][tile_rows]) {
    switch (nt) {
    case 1: tile_avx2_t<1>(w, x, n_in, acc); return;
    case 2: tile_avx2_t<2>(w, x, n_in, acc); return;
    case 3: tile_avx2_t<3>(w, x, n_in, acc); return;
    default: tile_avx2_t<4>(w, x, n_in, acc); return;
    }
}

// The row GEMV's driver: tiles of tile_rows weight rows x tile_tok tokens, each tile's rows kept
// in L1 while every token block passes over them, chunks of ~128 KiB of weights handed out
// dynamically (the cores may be shared); a matrix too small to be worth a second thread runs on
// one. Blocked weights are read back a tile's rows at a time (what a test that forces a lower
// ISA level on a loaded model meets; the loader lays them out in rows there).
// epilogue(t, o, sum) writes one output.
template <class Tile, class Epilogue>
void tiled_rows(thread_pool& pool, const weight& w, const int8_t* x, int64_t n_tok, Tile tile, const Epilogue& epilogue) {
    const int64_t n_out = w.n_out, n_in = w.n_in;
    const int64_t chunk =
        std::max<int64_t>(tile_rows, (int64_t(1) << 17) / std::max<int64_t>(1, n_in) / tile_rows * tile_rows);
    const auto body = [&](int64_t o0, int64_t o1) {
        thread_local std::vector<int8_t> unpacked;
        int32_t acc[tile_tok][tile_rows];
        for (int64_t o = o0; o < o1; o += tile_rows) {
            const int nr = int(std::min<int64_t>(tile_rows, o1 - o));
            const int8_t* rows[tile_rows];
            if (w.layout == q_layout::rows) {
                for (int r = 0; r < tile_rows; ++r) rows[r] = w.q() + (o + std::min(r, nr - 1)) * n_in;
            } else {
                unpacked.resize(size_t(tile_rows * n_in));
                for (int r = 0; r < nr; ++r) w.q_row(o + r, &unpacked[size_t(r * n_in)]);
                for (int r = 0; r < tile_rows; ++r) rows[r] = &unpacked[size_t(std::min(r, nr - 1) * n_in)];
            }
            for (int64_t t0 = 0; t0 < n_tok; t0 += tile_tok) {
                const int nt = int(std::min<int64_t>(tile_tok, n_tok - t0));
                tile(rows, x + t0 * n_in, n_in, nt, acc);
                for (int t = 0; t < nt; ++t)
                    for (int r = 0; r < nr; ++r) epilogue(t0 + t, o + r, acc[t][r]);
            }
        }
    };
    if (n_out * n_in * n_tok < thread_pool::min_parallel_work) body(0, n_out);
    else pool.parallel_for_dynamic(n_out, chunk, body);
}

void row_gemm(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w,
              const float* bias, isa level) {
    const int64_t n_out = w.n_out;
    const float* sw = w.scale();
    const auto epilogue = [&](int64_t t, int64_t o, int32_t a) {
        out[t * n_out + o] = float(a) * sx[t] * sw[o] + (bias ? bias[o] : 0.0f);
    };
    if (level >= isa::avx2) tiled_rows(pool, w, qx, n_tok, tile_avx2, epilogue);
    else tiled_rows(pool, w, qx, n_tok, tile_scalar, epilogue);
}

// ---- Blocked weights from the VNNI level up ----

// VNNI: vpdpbusd multiplies u8 by s8, so activations go in as u8 = s8 + 128 (flipped once per
// call) and the epilogue subtracts 128 * sum(w row).
#define TANDEM_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define TANDEM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

// acc += dot4(u8 x, s8 w) per lane. In asm because GCC 12 ties the intrinsic's accumulator
// badly: it copies each one to a spare register and back around every vpdpbusd, which ran a
// register-blocked tile at a third of the core's vpdpbusd rate.
TANDEM_VNNI inline __attribute__((always_inline)) void dpbusd(__m512i& acc, __m512i xu, __m512i w) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(xu), "v"(w));
}

// One pass of the blocked GEMV over a 64-output block: its four 16-output groups for tokens
// [t0, t0 + T) and the steps of K (four inputs each) [g0, g1). Each step reads one 64-byte line
// per group (four inputs of 16 outputs) and broadcasts four inputs of each token against
// them, so the 4 x T accumulators hold 16 outputs' sums each, with nothing to reduce across
// lanes. A pass that does not start at K's start adds to the sums in `partial`, one that does
// not end at k_pad leaves them there; the last one writes the outputs. The activations are
// read up to k_pad (the weights are zero past n_in; flip_to_u8 pads the buffer's end).
struct block_pass {
    const int8_t* blk;  // the block's bytes
    int64_t o0;         // its first output
    int64_t n_g;        // steps of K in all: k_pad / 4
    int64_t g0, g1;     // this pass's
    const uint8_t* x;   // token t0's u8 activations; rows n_in apart
    int64_t n_in;
    int64_t t0;
    int32_t* partial;   // [n_tok][4][16] sums between passes
    // One pass per block (memory-bound): each line 8 KiB ahead into L1. Passes over chunks of K
    // (below): the next chunk's lines into L2, asked for by every pass over this one, so that
    // they come in while this chunk is computed on rather than when its first pass reads them
    // (batch 16 ran at 214-273 tok/s against 190-216 without, five alternating runs on Zen 4;
    // asking only in the first pass, or in all but the first, gained less).
    enum { ahead_l1, next_chunk_l2 } prefetch;
};

constexpr int64_t pf_dist = 8192;

// Steps of K a pass takes when several token passes share a block: 16 KiB of weights, which
// stay in L1 while every 4 tokens go over them (a whole block, 128-352 KiB for the 1.1B shape,
// came from L2 for each: batch 16 ran 40% slower that way on Zen 4).
constexpr int64_t k_chunk_steps = 64;

template <int T>
TANDEM_VNNI void vnni_block(const block_pass& p, const i8_sums_out& sums) {
    constexpr int S = 4;
    __m512i acc[S * T];
#pragma GCC unroll 16
    for (int j = 0; j < S * T; ++j)
        acc[j] = p.g0 == 0 ? _mm512_setzero_si512() : _mm512_load_si512(p.partial + ((p.t0 + j % T) * S + j / T) * 16);
    const int8_t* line = p.blk + p.g0 * 4 * q_block_rows;
#pragma GCC unroll 2
    for (int64_t g = p.g0; g < p.g1; ++g, line += 4 * q_block_rows) {
        if (p.prefetch == block_pass::ahead_l1)
#pragma GCC unroll 4
            for (int s = 0; s < S; ++s) _mm_prefetch(reinterpret_cast<const char*>(line + s * 64 + pf_dist), _MM_HINT_T0);
        else
#pragma GCC unroll 4
            for (int s = 0; s < S; ++s)
                _mm_prefetch(reinterpret_cast<const char*>(line + s * 64 + k_chunk_steps * 4 * q_block_rows), _MM_HINT_T1);
        __m512i wv[S];
#pragma GCC unroll 4
        for (int s = 0; s < S; ++s) wv[s] = _mm512_load_si512(line + s * 64);
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            int32_t x4;
            std::memcpy(&x4, p.x + t * p.n_in + 4 * g, 4);
            const __m512i xb = _mm512_set1_epi32(x4);
#pragma GCC unroll 4
            for (int s = 0; s < S; ++s) dpbusd(acc[s * T + t], xb, wv[s]);
        }
    }
    // unrolled, as every loop over acc: an index the compiler cannot fold puts acc on the stack
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            if (p.g1 == p.n_g) sums.store(p.o0 + s * 16, p.t0 + t, acc[s * T + t]);
            else _mm512_store_si512(p.partial + ((p.t0 + t) * S + s) * 16, acc[s * T + t]);
        }
}

using vnni_block_fn = void (*)(const block_pass&, const i8_sums_out&);
constexpr vnni_block_fn vnni_blocks[] = {nullptr, vnni_block<1>, vnni_block<2>, vnni_block<3>, vnni_block<4>};

void vnni_gemm(thread_pool& pool, const uint8_t* xu, int64_t n_tok, const weight& w, const i8_sums_out& sums) {
    const int64_t kp = w.k_pad(), n_blk = w.n_blocks(), n_g = kp / 4;
    const auto body = [&](int64_t b0, int64_t b1) {
        thread_local std::vector<int32_t, cacheline_allocator<int32_t>> partial;
        if (n_tok > 4) partial.resize(size_t(n_tok * 4 * 16));
        for (int64_t b = b0; b < b1; ++b) {
            block_pass p{w.q_block(b), b * q_block_rows, n_g, 0, n_g, xu, w.n_in, 0, partial.data(),
                         n_tok <= 4 ? block_pass::ahead_l1 : block_pass::next_chunk_l2};
            if (n_tok <= 4) {
                vnni_blocks[n_tok](p, sums);
                continue;
            }
            for (p.g0 = 0; p.g0 < n_g; p.g0 = p.g1) {
                p.g1 = std::min(n_g, p.g0 + k_chunk_steps);
                for (p.t0 = 0; p.t0 < n_tok; p.t0 += 4) {
                    p.x = xu + p.t0 * w.n_in;
                    vnni_blocks[std::min<int64_t>(4, n_tok - p.t0)](p, sums);
                }
            }
        }
    };
    // chunks of ~128 KiB of weights, handed out dynamically
    const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 17) / (q_block_rows * kp));
    if (n_blk * q_block_rows * kp * n_tok < thread_pool::min_parallel_work) body(0, n_blk);
    else pool.parallel_for_dynamic(n_blk, chunk, body);
}

// oneDNN's int32 sums of tokens [t0, t1), turned into floats in place (same bytes per element).
TANDEM_AVX512 void finish_rows(const i8_sums_out& sums, int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
        for (int64_t o = 0; o < sums.n_out; o += 16) {
            const int64_t left = sums.n_out - o;
            const __mmask16 m = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
            sums.store(o, t, _mm512_maskz_loadu_epi32(m, sums.out + t * sums.n_out + o));
        }
}

// The activations as u8 (s8 + 128) for the kernels that take them so, in a buffer of the
// calling thread's (workers only see the pointer), with 64 zero bytes after the last row (the
// blocked GEMV reads a row up to k_pad).
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
    thread_local std::vector<uint8_t, cacheline_allocator<uint8_t>> buf;
    buf.resize(size_t(n + q_block_k));
    uint8_t* xu = buf.data();
    std::memset(xu + n, 0, q_block_k);
    if (n < (int64_t(1) << 18)) flip_range(xu, qx, 0, n);
    else pool.parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) { flip_range(xu, qx, b, e); });
    return xu;
}

// Batches from this size go to oneDNN (either layout; it reads the blocked one as its own
// BA16a64b4a). Measured with two threads (OMP_WAIT_POLICY=PASSIVE, as tandem runs) on the 1.1B
// down projection, 2048 x 5632, two runs each, against the row GEMV of the time: 32 tokens took
// 1.4-1.6 ms on it and 1.8-2.3 on oneDNN, 64 tokens 2.5-2.9 against 2.2-3.4, 128 tokens 4.9-6.1
// against 3.8-4.6.
constexpr int64_t dnnl_min_tokens = 64;

// Batches from this size go to the AMX tiles where the CPU has them; fewer tokens run faster
// on the VNNI GEMV. Measured on the 1.1B shape, two threads (issue 15, helper runs of
// 2026-12-02, with weights in rows: the tiles' kernel then read them as A tiles): the AMX
// kernel for every size made the one-token step 45-47 ms against 40-42 on the GEMV; from 3
// tokens it made a 5-token verify step 1.23x a one-token step against 1.31-1.33x, and
// batch-16 decode 220-229 tok/s against 200-201.
constexpr int64_t amx_min_tokens = 5;

// oneDNN on the rows of whole multiples of dnnl_min_tokens (the rest go to the kernels above,
// the same bits): it builds a primitive per row count, and a server's batches come in every
// size, which grew the prefill worker by 64-130 KiB a size (issue 19's soak), so there are at
// most step_tokens / 64 per weight shape. Its int32 sums land in `out` itself and are turned
// into floats in place with the GEMV's expression. Returns the tokens it did.
int64_t dnnl_tokens(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w,
                    const float* bias) {
    const int64_t m = n_tok - n_tok % dnnl_min_tokens;
    const i8_sums_out sums{out, w.n_out, sx, w.scale(), bias, w.q_sum.data()};
    if (!dnnl_matmul_u8s8(pool, reinterpret_cast<int32_t*>(out), flip_to_u8(pool, qx, m * w.n_in), m, w)) return 0;
    pool.parallel_for(m, thread_pool::grain_for(w.n_out), [&](int64_t t0, int64_t t1) { finish_rows(sums, t0, t1); });
    return m;
}

} // namespace

q_layout matmul_i8_layout() { return active_isa() >= isa::avx512 ? q_layout::blocked : q_layout::rows; }

void matmul_i8(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w,
               const float* bias) {
    const isa level = active_isa();
    const bool blocked = level >= isa::avx512 && w.layout == q_layout::blocked;
    // TANDEM_AMX_PREFILL: batches of 64 tokens and more on the tiles too, for measuring them
    // against oneDNN (level within the noise on the H200 machine's Xeon: docs/cpu.md).
    static const bool amx_prefill = std::getenv("TANDEM_AMX_PREFILL") != nullptr;
    if (level >= isa::avx512 && n_tok >= dnnl_min_tokens && !(blocked && level == isa::amx && amx_prefill)) {
        const int64_t m = dnnl_tokens(pool, out, qx, sx, n_tok, w, bias);
        out += m * w.n_out;
        qx += m * w.n_in;
        sx += m;
        n_tok -= m;
        if (n_tok == 0) return;
    }
    if (!blocked) row_gemm(pool, out, qx, sx, n_tok, w, bias, level);
    else if (level == isa::amx && n_tok >= amx_min_tokens) matmul_i8_amx(pool, out, qx, sx, n_tok, w, bias, amx_exec::hardware);
    else vnni_gemm(pool, flip_to_u8(pool, qx, n_tok * w.n_in), n_tok, w, {out, w.n_out, sx, w.scale(), bias, w.q_sum.data()});
}

void prepare_matmul_i8(const weight& w, int64_t max_tok) {
    if (active_isa() < isa::avx512) return;
    for (int64_t m = dnnl_min_tokens; m <= max_tok; m += dnnl_min_tokens) dnnl_prepare(m, w);
}

void matmul_i8_amx_emulated(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok,
                            const weight& w, const float* bias) {
    matmul_i8_amx(pool, out, qx, sx, n_tok, w, bias, amx_exec::emulated);
}

} // namespace tandem::cpu
