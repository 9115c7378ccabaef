// INT8 small GEMM on AMX tiles (TDPBSSD, s8 x s8 -> s32) for decode batches: the weights are
// the A operand straight from their row-major layout, the activations the B operand.
//
// A tile is 16 weight rows x 64 bytes of K, loaded with the row stride; B is 64 bytes of K x 16
// tokens in the VNNI order TDPBSSD wants (B[k/4][t*4 + k%4]), re-laid out once per call from
// the activations (n_tok x K bytes, cheap); C is 16 rows x 16 tokens of int32. Each step of K
// loads two A tiles (32 rows) and up to two B tiles (32 tokens) into four C tiles, so the
// weights are read once per call for up to 32 tokens, and the int8 arithmetic (1024
// multiply-adds a cycle a core) is far above what memory delivers: batch 16 should cost about
// what batch 1 does. s8 x s8 needs no offset correction (VNNI's u8 x s8 does).
//
// Tails: the last K step, when K is not a multiple of 64, is shifted back to end at K (so
// every A load stays inside its rows) and its B tile has zeros where it overlaps the step
// before; rows past the last whole 16-row block are left to the caller (the VNNI GEMV).
//
// Never executed on the machines this was written on (their VM hides AMX); the tests run the
// same kernel on a scalar model of the tiles (amx_exec::emulated), and on a CPU with AMX
// test_backend_ops runs it for real at isa::amx against the reference.
#include "cpu/ops/matmul_i8_amx.hpp"

#include "cpu/amx_tile.hpp"
#include "cpu/thread_pool.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace tandem::cpu {
namespace {

constexpr int tile_m = 16;  // weight rows in an A (and C) tile
constexpr int tile_n = 16;  // tokens in a B (and C) tile
constexpr int tile_k = 64;  // bytes of K in an A tile row; B holds them as 16 rows of 4 x 16
constexpr int64_t pf_dist = 8192; // as the VNNI GEMV: each row's bytes this far ahead, into L1

// Tile registers: C (sums) 0-3, A (weights) 4-5, B (activations) 6-7.
constexpr int tc00 = 0, tc01 = 1, tc10 = 2, tc11 = 3, ta0 = 4, ta1 = 5, tb0 = 6, tb1 = 7;

// The tile instructions on the CPU. Inline asm rather than GCC 12's _tile_* macros: those have
// no memory clobber (the compiler may move a tilestored past the reads of what it stored), and
// they paste the tile number into the mnemonic, which a template parameter cannot be; "%c"
// prints the constant. AT&T order: tdpbssd B, A, C is C += A . B.
struct amx_hw {
    static void config(const tile_config& c) { __asm__ volatile("ldtilecfg %0" ::"m"(c)); }
    static void release() { __asm__ volatile("tilerelease" ::: "memory"); }
    template <int t>
    static void zero() {
        __asm__ volatile("tilezero %%tmm%c0" ::"i"(t));
    }
    template <int t>
    static void load(const void* p, int64_t stride) {
        __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(p), "r"(stride), "i"(t) : "memory");
    }
    template <int c, int a, int b>
    static void dpbssd() {
        __asm__ volatile("tdpbssd %%tmm%c0, %%tmm%c1, %%tmm%c2" ::"i"(b), "i"(a), "i"(c));
    }
    template <int t>
    static void store(void* p, int64_t stride) {
        __asm__ volatile("tilestored %%tmm%c0, (%1,%2,1)" ::"i"(t), "r"(p), "r"(stride) : "memory");
    }
};

// A scalar model of the same instructions (Intel SDM semantics for palette 1: a load fills
// rows x colsb bytes and zeroes the rest; TDPBSSD: C[m][n] += sum over k of the four signed
// byte products of A[m] dword k and B[k] dword n), one register file per thread.
struct amx_emu {
    struct state {
        tile_config cfg;
        alignas(64) uint8_t t[8][16][64];
    };
    static state& st() {
        thread_local state s;
        return s;
    }
    static void config(const tile_config& c) {
        st().cfg = c;
        std::memset(st().t, 0, sizeof st().t);
    }
    static void release() { std::memset(st().t, 0, sizeof st().t); }
    template <int t>
    static void zero() {
        std::memset(st().t[t], 0, sizeof st().t[t]);
    }
    template <int t>
    static void load(const void* p, int64_t stride) {
        state& s = st();
        std::memset(s.t[t], 0, sizeof s.t[t]);
        for (int r = 0; r < s.cfg.rows[t]; ++r)
            std::memcpy(s.t[t][r], static_cast<const uint8_t*>(p) + r * stride, s.cfg.colsb[t]);
    }
    template <int c, int a, int b>
    static void dpbssd() {
        state& s = st();
        const int m_rows = s.cfg.rows[c], n_cols = s.cfg.colsb[c] / 4, k_dw = s.cfg.colsb[a] / 4;
        for (int m = 0; m < m_rows; ++m)
            for (int n = 0; n < n_cols; ++n) {
                int32_t acc;
                std::memcpy(&acc, &s.t[c][m][4 * n], 4);
                for (int k = 0; k < k_dw; ++k)
                    for (int i = 0; i < 4; ++i)
                        acc += int32_t(int8_t(s.t[a][m][4 * k + i])) * int32_t(int8_t(s.t[b][k][4 * n + i]));
                std::memcpy(&s.t[c][m][4 * n], &acc, 4);
            }
    }
    template <int t>
    static void store(void* p, int64_t stride) {
        const state& s = st();
        for (int r = 0; r < s.cfg.rows[t]; ++r)
            std::memcpy(static_cast<uint8_t*>(p) + r * stride, s.t[t][r], s.cfg.colsb[t]);
    }
};

// Where K step kc starts: kc * 64, but the last step of a K that is not a multiple of 64
// ends at K instead (its first bytes were the step before's last).
int64_t step_k0(int64_t kc, int64_t n_in) { return std::min<int64_t>(kc * tile_k, n_in - tile_k); }

// B tiles for every (token block, K step): [n_tb][n_kc][16][64] bytes, row j of step kc
// holding, for each token t of the block, the four activations k0 + 4j .. k0 + 4j + 3 at
// bytes 4t .. 4t + 3; zeros for tokens past n_tok and for the bytes of a shifted last step
// that lie below kc * 64 (already counted).
void pack_b(thread_pool& pool, int8_t* b, const int8_t* qx, int64_t n_tok, int64_t n_in) {
    const int64_t n_kc = (n_in + tile_k - 1) / tile_k, n_tb = (n_tok + tile_n - 1) / tile_n;
    const auto steps = [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; ++s) {
            const int64_t tb = s / n_kc, kc = s % n_kc, k0 = step_k0(kc, n_in);
            int8_t* dst = b + s * (tile_k * tile_n);
            std::memset(dst, 0, tile_k * tile_n);
            const int64_t skip = kc * tile_k - k0; // bytes of this step already counted
            for (int t = 0; t < tile_n && tb * tile_n + t < n_tok; ++t) {
                const int8_t* src = qx + (tb * tile_n + t) * n_in + k0;
                for (int j = 0; j < tile_k / 4; ++j) std::memcpy(dst + j * 64 + t * 4, src + 4 * j, 4);
                for (int64_t i = 0; i < skip; ++i) dst[(i / 4) * 64 + t * 4 + i % 4] = 0;
            }
        }
    };
    const int64_t n_steps = n_tb * n_kc;
    if (n_steps < 64) steps(0, n_steps);
    else pool.parallel_for(n_steps, 16, steps);
}

// Rows [blk0 * 16, blk1 * 16) in pairs of 16-row blocks, tokens in pairs of 16-token blocks.
template <class Tiles, class Epilogue>
void amx_blocks(int64_t blk0, int64_t blk1, const int8_t* q, int64_t n_in, const int8_t* b, int64_t n_tok,
                const Epilogue& epilogue) {
    const int64_t n_kc = (n_in + tile_k - 1) / tile_k, n_tb = (n_tok + tile_n - 1) / tile_n;
    const int64_t b_block = n_kc * tile_k * tile_n; // bytes of B per token block
    static const tile_config cfg = full_tile_config();
    Tiles::config(cfg);
    alignas(64) int32_t c[tile_m][tile_n];
    const auto drain = [&](auto store, int64_t o, int64_t t0) {
        store(c);
        for (int m = 0; m < tile_m; ++m)
            for (int t = 0; t < tile_n && t0 + t < n_tok; ++t) epilogue(t0 + t, o + m, c[m][t]);
    };
    for (int64_t blk = blk0; blk < blk1; blk += 2) {
        const bool two_a = blk + 1 < blk1;
        const int8_t* a0 = q + blk * tile_m * n_in;
        const int8_t* a1 = a0 + tile_m * n_in;
        for (int64_t tb = 0; tb < n_tb; tb += 2) {
            const bool two_b = tb + 1 < n_tb;
            const int8_t* b0 = b + tb * b_block;
            const int8_t* b1 = b0 + b_block;
            Tiles::template zero<tc00>();
            Tiles::template zero<tc01>();
            Tiles::template zero<tc10>();
            Tiles::template zero<tc11>();
            for (int64_t kc = 0; kc < n_kc; ++kc) {
                const int64_t k0 = step_k0(kc, n_in);
                if (tb == 0) // the first token pass streams the weights: ask for them ahead
                    for (int r = 0; r < (two_a ? 2 : 1) * tile_m; ++r)
                        _mm_prefetch(reinterpret_cast<const char*>(a0 + r * n_in + k0 + pf_dist), _MM_HINT_T0);
                Tiles::template load<ta0>(a0 + k0, n_in);
                Tiles::template load<tb0>(b0 + kc * tile_k * tile_n, 64);
                Tiles::template dpbssd<tc00, ta0, tb0>();
                if (two_b) {
                    Tiles::template load<tb1>(b1 + kc * tile_k * tile_n, 64);
                    Tiles::template dpbssd<tc01, ta0, tb1>();
                }
                if (two_a) {
                    Tiles::template load<ta1>(a1 + k0, n_in);
                    Tiles::template dpbssd<tc10, ta1, tb0>();
                    if (two_b) Tiles::template dpbssd<tc11, ta1, tb1>();
                }
            }
            const int64_t o = blk * tile_m, t0 = tb * tile_n;
            drain([](int32_t(*p)[tile_n]) { Tiles::template store<tc00>(p, tile_n * 4); }, o, t0);
            if (two_b) drain([](int32_t(*p)[tile_n]) { Tiles::template store<tc01>(p, tile_n * 4); }, o, t0 + tile_n);
            if (two_a) {
                drain([](int32_t(*p)[tile_n]) { Tiles::template store<tc10>(p, tile_n * 4); }, o + tile_m, t0);
                if (two_b)
                    drain([](int32_t(*p)[tile_n]) { Tiles::template store<tc11>(p, tile_n * 4); }, o + tile_m,
                          t0 + tile_n);
            }
        }
    }
    Tiles::release(); // leave no tile state behind for whatever else runs on this thread (oneDNN)
}

} // namespace

int64_t matmul_i8_amx(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w,
                      const float* bias, amx_exec how) {
    const int64_t n_out = w.n_out, n_in = w.n_in;
    const int64_t n_blk = n_out / tile_m;
    const float* sw = w.scale();
    const int8_t* q = w.q();

    thread_local std::vector<int8_t> b_buf; // the caller's; workers see only the pointer
    const int64_t n_kc = (n_in + tile_k - 1) / tile_k, n_tb = (n_tok + tile_n - 1) / tile_n;
    b_buf.resize(size_t(n_tb * n_kc * tile_k * tile_n));
    pack_b(pool, b_buf.data(), qx, n_tok, n_in);
    const int8_t* b = b_buf.data();

    const auto epilogue = [&](int64_t t, int64_t o, int32_t a) {
        out[t * n_out + o] = float(a) * sx[t] * sw[o] + (bias ? bias[o] : 0.0f);
    };
    // chunks of whole block pairs, ~128 KiB of weights each, handed out dynamically as the GEMV
    const int64_t chunk = std::max<int64_t>(2, (int64_t(1) << 17) / (tile_m * n_in) / 2 * 2);
    const auto body = [&](int64_t blk0, int64_t blk1) {
        if (how == amx_exec::hardware) amx_blocks<amx_hw>(blk0, blk1, q, n_in, b, n_tok, epilogue);
        else amx_blocks<amx_emu>(blk0, blk1, q, n_in, b, n_tok, epilogue);
    };
    if (n_blk * tile_m * n_in * n_tok < thread_pool::min_parallel_work) body(0, n_blk);
    else pool.parallel_for_dynamic(n_blk, chunk, body);
    return n_blk * tile_m;
}

} // namespace tandem::cpu
