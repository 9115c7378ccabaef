// INT8 small GEMM on AMX tiles (TDPBSSD, s8 x s8 -> s32) for decode batches: the activations
// are the A operand, the weights the B operand straight from their blocked layout.
//
// A is 16 tokens x 64 bytes of K, from a copy of the activations padded with zeros to whole
// tiles, each tile's 1 KiB contiguous (cheap: n_tok x K bytes a call); B is 64 bytes of K x
// 16 outputs, which in the blocked layout (runtime/weight.hpp) are 16 lines' 64-byte quarters
// 256 bytes apart, in the VNNI order TDPBSSD wants (B[k/4][o*4 + k%4]); C is 16 tokens x 16
// outputs of int32, so each row of C is one token's 16 consecutive outputs and the epilogue is
// a vector operation per row. Each step of K loads up to two A tiles (32 tokens) and two B
// tiles (32 outputs) into four C tiles, so the weights are read once per call for up to 32
// tokens, and the int8 arithmetic (1024 multiply-adds a cycle a core) is far above what memory
// delivers: batch 16 should cost about what batch 1 does. Prefill batches (TANDEM_AMX_PREFILL)
// go in blocks of tokens whose A tiles stay in L2 while the output blocks pass over them (in
// matmul_i8_amx). s8 x s8 needs no offset correction (VNNI's u8 x s8 does). The padding (K to
// k_pad, outputs to a multiple of 64) is zeros in both operands' copies, so there are no
// tails: the epilogue stores only the real outputs.
//
// Never executed on the machine this was written on (AMD Zen 4, no AMX); the tests run the
// same kernel on a scalar model of the tiles (amx_exec::emulated), and on a CPU with AMX
// test_backend_ops runs it for real at isa::amx against the reference.
#include "cpu/ops/matmul_i8_amx.hpp"

#include "cpu/amx_tile.hpp"
#include "cpu/ops/matmul_i8_sums.hpp"
#include "cpu/thread_pool.hpp"
#include "runtime/error.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace tandem::cpu {
namespace {

constexpr int tile_m = 16; // tokens in an A (and C) tile
constexpr int tile_n = 16; // outputs in a B (and C) tile
constexpr int tile_k = 64; // bytes of K in an A tile row; B holds them as 16 rows of 4 x 16

// Tile registers: C (sums) 0-3, A (activations) 4-5, B (weights) 6-7.
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

// Bytes of one A tile, and where the tile of token tile tb and K step kc starts: [n_tb][n_kc]
// tiles of 16 rows x 64 bytes, each contiguous (a tile load reads 1 KiB in a row, which the
// prefetchers follow, rather than 16 lines k_pad apart).
constexpr int64_t a_tile_bytes = tile_m * tile_k;
inline int64_t a_tile_at(int64_t tb, int64_t kc, int64_t n_kc) { return (tb * n_kc + kc) * a_tile_bytes; }

// The activations as A tiles (above), zeros past n_tok and n_in.
void pack_a(thread_pool& pool, int8_t* a, const int8_t* qx, int64_t n_tok, int64_t n_in, int64_t kp, int64_t rows) {
    const int64_t n_kc = kp / tile_k;
    const auto copy = [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
            for (int64_t kc = 0; kc < n_kc; ++kc) {
                int8_t* dst = a + a_tile_at(r / tile_m, kc, n_kc) + r % tile_m * tile_k;
                const int64_t n = r < n_tok ? std::clamp<int64_t>(n_in - kc * tile_k, 0, tile_k) : 0;
                if (n) std::memcpy(dst, qx + r * n_in + kc * tile_k, size_t(n));
                std::memset(dst + n, 0, size_t(tile_k - n));
            }
    };
    if (rows * kp < (int64_t(1) << 18)) copy(0, rows);
    else pool.parallel_for(rows, 16, copy);
}

// Blocks [b0, b1) of the weights for token tiles [tt0, tt1): in each block its 16-output groups
// in pairs, tokens in pairs of 16-token tiles.
template <class Tiles>
void amx_blocks(int64_t b0, int64_t b1, int64_t tt0, int64_t tt1, const weight& w, const int8_t* a, int64_t n_tok,
                const i8_sums_out& sums) {
    const int64_t kp = w.k_pad(), n_kc = kp / tile_k;
    const int64_t b_step = (tile_k / 4) * 256;  // bytes of a block per 64 of K
    static const tile_config cfg = full_tile_config();
    Tiles::config(cfg);
    alignas(64) int32_t c[tile_m][tile_n];
    const auto drain = [&](auto store, int64_t o, int64_t t0) {
        store(c);
        for (int m = 0; m < tile_m && t0 + m < n_tok; ++m)
            sums.store(o, t0 + m, &c[m][0]);
    };
    for (int64_t blk = b0; blk < b1; ++blk) {
        const int8_t* wb = w.q_block(blk);
        for (int g = 0; g < 4; g += 2) {
            const int64_t o = blk * q_block_rows + g * tile_n;
            if (o >= w.n_out) break;
            const bool two_b = o + tile_n < w.n_out;
            for (int64_t tb = tt0; tb < tt1; tb += 2) {
                const bool two_a = tb + 1 < tt1;
                const int8_t* a0 = a + a_tile_at(tb, 0, n_kc);
                const int8_t* a1 = a + a_tile_at(tb + 1, 0, n_kc);
                Tiles::template zero<tc00>();
                Tiles::template zero<tc01>();
                Tiles::template zero<tc10>();
                Tiles::template zero<tc11>();
                for (int64_t kc = 0; kc < n_kc; ++kc) {
                    const int8_t* bp = wb + kc * b_step + g * 64;
                    Tiles::template load<ta0>(a0 + kc * a_tile_bytes, tile_k);
                    Tiles::template load<tb0>(bp, 256);
                    Tiles::template dpbssd<tc00, ta0, tb0>();
                    if (two_b) {
                        Tiles::template load<tb1>(bp + 64, 256);
                        Tiles::template dpbssd<tc01, ta0, tb1>();
                    }
                    if (two_a) {
                        Tiles::template load<ta1>(a1 + kc * a_tile_bytes, tile_k);
                        Tiles::template dpbssd<tc10, ta1, tb0>();
                        if (two_b) Tiles::template dpbssd<tc11, ta1, tb1>();
                    }
                }
                const int64_t t0 = tb * tile_m;
                drain([](int32_t(*p)[tile_n]) { Tiles::template store<tc00>(p, tile_n * 4); }, o, t0);
                if (two_b) drain([](int32_t(*p)[tile_n]) { Tiles::template store<tc01>(p, tile_n * 4); }, o + tile_n, t0);
                if (two_a) {
                    drain([](int32_t(*p)[tile_n]) { Tiles::template store<tc10>(p, tile_n * 4); }, o, t0 + tile_m);
                    if (two_b)
                        drain([](int32_t(*p)[tile_n]) { Tiles::template store<tc11>(p, tile_n * 4); }, o + tile_n,
                              t0 + tile_m);
                }
            }
        }
    }
    Tiles::release(); // leave no tile state behind for whatever else runs on this thread (oneDNN)
}

} // namespace

void matmul_i8_amx(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w,
                   const float* bias, amx_exec how) {
    TANDEM_ASSERT(w.is_i8() && w.layout == q_layout::blocked, "the AMX kernel reads blocked weights");
    const int64_t kp = w.k_pad(), n_blk = w.n_blocks();
    const int64_t rows = (n_tok + tile_m - 1) / tile_m * tile_m;
    thread_local std::vector<int8_t, cacheline_allocator<int8_t>> a_buf; // the caller's; workers see only the pointer
    a_buf.resize(size_t(rows * kp));
    pack_a(pool, a_buf.data(), qx, n_tok, w.n_in, kp, rows);
    const int8_t* a = a_buf.data();
    const i8_sums_out sums{out, w.n_out, sx, w.scale(), bias, nullptr};
    // Work items: chunks of ~128 KiB of weights (as the GEMV), for a block of token tiles whose
    // A tiles (~512 KiB, and 64 tokens at least: a decode batch is always one block) stay in L2
    // while the item's weights pass over them; items handed out dynamically, token block by
    // token block, so the threads share one token block's A at a time and each weight byte is
    // read once per token block.
    const int64_t n_tb = rows / tile_m;
    const int64_t tb_per_block = std::max<int64_t>(4, (int64_t(1) << 19) / (tile_m * kp) / 2 * 2);
    const int64_t n_tblocks = (n_tb + tb_per_block - 1) / tb_per_block;
    const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 17) / (q_block_rows * kp));
    const int64_t n_chunks = (n_blk + chunk - 1) / chunk;
    const auto body = [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
            const int64_t tt0 = i / n_chunks * tb_per_block, tt1 = std::min(n_tb, tt0 + tb_per_block);
            const int64_t b0 = i % n_chunks * chunk, b1 = std::min(n_blk, b0 + chunk);
            if (how == amx_exec::hardware) amx_blocks<amx_hw>(b0, b1, tt0, tt1, w, a, n_tok, sums);
            else amx_blocks<amx_emu>(b0, b1, tt0, tt1, w, a, n_tok, sums);
        }
    };
    const int64_t n_items = n_tblocks * n_chunks;
    if (n_blk * q_block_rows * kp * n_tok < thread_pool::min_parallel_work) body(0, n_items);
    else pool.parallel_for_dynamic(n_items, 1, body);
}

} // namespace tandem::cpu
