// CUDA kernels' own source run on the CPU under tests/cuda_emu.hpp, against the scalar
// reference: the paged flash-attention kernel (cuda/ops/attention_kernel.cuh) with its launch
// planning. This runs everywhere, GPU or not; test_backend_ops runs the same kernel on a device.
#include "tests/cuda_emu.hpp"

#include "cuda/ops/attention_kernel.cuh"

#include "cpu/ref/ops_ref.hpp"
#include "runtime/kv_cache.hpp"
#include "tests/op_data.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace tandem;
using tandem::test::nmse;
using tandem::test::randn;
using tandem::test::scattered_pages;

namespace {

// What the device would compute: every launch fa_launches plans, run under the emulation.
void emulated_attention(float* out, const float* q, const std::vector<cuda::attn_seg>& segs, int n_head,
                        const kv_cache& kv, int il, const int32_t* tables, float scale, int* n_launches = nullptr) {
    const kv_layout& lay = kv.layout();
    int launches = 0;
    cuda::fa_launches(out, q, segs.data(), int64_t(segs.size()), n_head, kv.base(), lay, il, tables, scale,
                      [&](const cuda::fa_params& prm, int n_warps, int64_t n_blocks) {
                          ++launches;
                          const cuda::fa_smem L = cuda::fa_smem_of(prm.hd_pad, n_warps, lay.dtype == kv_dtype::f32,
                                                                   lay.dtype != kv_dtype::f16);
                          const dim3 grid{unsigned(n_blocks), unsigned(lay.n_head_kv), 1};
                          const dim3 block{unsigned(n_warps * 32), 1, 1};
                          cuda_emu::launch(grid, block, L.total, [&] {
                              switch (lay.dtype) {
                              case kv_dtype::f32: cuda::flash_attention_kernel<kv_dtype::f32>(prm); break;
                              case kv_dtype::f16: cuda::flash_attention_kernel<kv_dtype::f16>(prm); break;
                              case kv_dtype::i8: cuda::flash_attention_kernel<kv_dtype::i8>(prm); break;
                              }
                          });
                      });
    if (n_launches) *n_launches = launches;
}

// A batch of sequences, each with its own scattered pages, K/V written by the reference for
// positions [0, n_past + n_tok), and its new tokens' queries at rows q_row of one q array.
struct batch {
    kv_layout lay;
    int n_head;
    std::vector<cuda::attn_seg> segs;
    std::vector<int32_t> tables; // every sequence's block table, one after another
    kv_cache kv;
    std::vector<float> q;
    int64_t n_rows;

    // seqs: {n_tok, n_past} each; their rows go in reverse order, row 0 left to no one.
    batch(kv_layout l, int heads, const std::vector<std::pair<int32_t, int32_t>>& seqs, uint32_t seed,
          float q_scale = 1.0f, float k_scale = 1.0f)
        : lay(l), n_head(heads), kv(l, pages_for(l, seqs)) {
        int64_t rows = 1;
        for (const auto& s : seqs) rows += s.first;
        n_rows = rows;
        int32_t next_page = 0;
        const std::vector<int32_t> pool = scattered_pages(kv.n_pages(), kv.n_pages(), seed);
        for (const auto& [n_tok, n_past] : seqs) {
            const int32_t n_pos = n_past + n_tok;
            const int32_t n_pages = (n_pos + lay.page_size - 1) / lay.page_size;
            const int64_t off = int64_t(tables.size());
            for (int32_t i = 0; i < n_pages; ++i) tables.push_back(pool[size_t(next_page++)]);
            const size_t kv_n = size_t(n_pos) * size_t(lay.n_head_kv * lay.head_dim);
            const auto k = randn(kv_n, seed + uint32_t(off) + 1, k_scale), v = randn(kv_n, seed + uint32_t(off) + 2);
            cpu::ref::kv_store(kv.base(), lay, 1, tables.data() + off, 0, k.data(), v.data(), n_pos);
            rows -= n_tok;
            segs.push_back({rows, n_tok, n_past, off});
        }
        q = randn(size_t(n_rows * n_head * lay.head_dim), seed + 99, q_scale);
    }

    static int32_t pages_for(const kv_layout& l, const std::vector<std::pair<int32_t, int32_t>>& seqs) {
        int32_t n = 0;
        for (const auto& [n_tok, n_past] : seqs) n += (n_past + n_tok + l.page_size - 1) / l.page_size;
        return n + 3;
    }

    // The reference, one sequence at a time; row 0 (no one's) stays NaN.
    std::vector<float> reference(float scale) const {
        std::vector<float> out(q.size(), NAN);
        const int64_t stride = int64_t(n_head) * lay.head_dim;
        for (const auto& s : segs)
            cpu::ref::attention(out.data() + s.q_row * stride, q.data() + s.q_row * stride, s.n_tok, s.n_past, n_head,
                                kv.base(), lay, 1, tables.data() + s.table_off, scale);
        return out;
    }

    std::vector<float> emulated(float scale, int* n_launches = nullptr) const {
        std::vector<float> out(q.size(), NAN);
        emulated_attention(out.data(), q.data(), segs, n_head, kv, 1, tables.data(), scale, n_launches);
        return out;
    }
};

// nmse over the rows the segments cover; row 0 must still be NaN (nobody's).
double rows_nmse(const batch& b, const std::vector<float>& want, const std::vector<float>& got) {
    const size_t stride = size_t(b.n_head * b.lay.head_dim);
    REQUIRE(std::all_of(got.begin(), got.begin() + long(stride), [](float x) { return std::isnan(x); }));
    return nmse(std::vector<float>(want.begin() + long(stride), want.end()),
                std::vector<float>(got.begin() + long(stride), got.end()));
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool sanitized = true;
#elif defined(__has_feature)
constexpr bool sanitized = __has_feature(address_sanitizer);
#else
constexpr bool sanitized = false;
#endif

// Q and P are split into two f16 terms and f16/int8 K and V are exact: the error is that of
// f32 sums in another order, far below what an f16 operand would leave (~1e-7).
constexpr double tol_split = 1e-10;

} // namespace

TEST_CASE("CUDA flash attention (emulated): KV dtypes, head dims, GQA, page sizes, prefill, chunks, decode") {
    // Under the sanitizers (several times slower) a corner of the grid: the narrowest and the
    // widest head, one and eight query heads per kv head.
    const std::vector<int> hds = sanitized ? std::vector<int>{8, 256} : std::vector<int>{8, 64, 80, 256};
    const std::vector<int> gqas = sanitized ? std::vector<int>{1, 8} : std::vector<int>{1, 4, 8};
    for (kv_dtype dt : {kv_dtype::f16, kv_dtype::i8, kv_dtype::f32}) {
        for (int hd : hds) { // 8, 80: padded to a multiple of 16; 256: two warps a block
            for (int n_gqa : gqas) {
                const int page_size = hd == 64 ? 4 : 16;
                const kv_layout lay{2, 2, hd, page_size, dt};
                const int n_head = 2 * n_gqa;
                // A whole prompt (70 positions: three tiles, and two blocks of rows even at
                // one query head per kv head), a chunk of 33 after 19 positions, and three
                // decoding sequences (one token after 0, 40 and 95 positions), all in one call.
                // The emulation is slow; the other dtypes take a shorter prompt.
                const int32_t prompt = dt == kv_dtype::f16 ? 70 : 40;
                const batch b(lay, n_head, {{prompt, 0}, {33, 19}, {1, 0}, {1, 40}, {1, 95}},
                              uint32_t(hd * 10 + n_gqa));
                const float scale = 1.0f / std::sqrt(float(hd));
                const double e = rows_nmse(b, b.reference(scale), b.emulated(scale));
                INFO("kv=", name_of(dt), " hd=", hd, " gqa=", n_gqa, " page=", page_size, " nmse=", e);
                CHECK(e < tol_split);
            }
        }
    }
}

TEST_CASE("CUDA flash attention (emulated): a decode step of 70 sequences takes two launches") {
    const kv_layout lay{2, 2, 64, 16, kv_dtype::f16};
    std::vector<std::pair<int32_t, int32_t>> seqs;
    for (int i = 0; i < 70; ++i) seqs.push_back({1, (i * 7) % 50});
    const batch b(lay, 8, seqs, 5);
    int launches = 0;
    const auto got = b.emulated(0.125f, &launches);
    CHECK(launches == 2); // 64 segments a launch
    CHECK(rows_nmse(b, b.reference(0.125f), got) < tol_split);
}

TEST_CASE("CUDA flash attention (emulated): Q and K far outside f16's range keep their precision") {
    // |q| ~ 1e6 and ~ 1e-6 would overflow or vanish as plain f16 operands; scaled by powers of
    // two first, their split keeps 22 bits. f32 pages' K at 1e5 likewise.
    for (float q_scale : {1e6f, 1e-6f}) {
        for (kv_dtype dt : {kv_dtype::f16, kv_dtype::f32}) {
            const float k_scale = dt == kv_dtype::f32 ? 1e5f : 1.0f;
            const batch b({1, 1, 32, 8, dt}, 2, {{20, 5}}, 7, q_scale, k_scale);
            const float scale = 1.0f / (q_scale * k_scale); // scores of order one
            const double e = rows_nmse(b, b.reference(scale), b.emulated(scale));
            INFO("kv=", name_of(dt), " q_scale=", q_scale, " nmse=", e);
            CHECK(e < tol_split);
        }
    }
}

TEST_CASE("the emulation catches a barrier not every thread reaches") {
    const dim3 grid{1, 1, 1}, block{64, 1, 1};
    CHECK_THROWS_WITH_AS(cuda_emu::launch(grid, block, 0, [] {
        if (threadIdx.x < 32) __syncthreads(); // the second warp never arrives
    }), doctest::Contains("deadlock"), std::runtime_error);
    // and lets a correct one through: every thread sees every other's write
    std::vector<int> seen(64, 0);
    cuda_emu::launch(grid, block, 64 * sizeof(int), [&] {
        int* sh = reinterpret_cast<int*>(cuda::dynamic_smem());
        sh[threadIdx.x] = int(threadIdx.x) + 1;
        __syncthreads();
        seen[threadIdx.x] = sh[63 - threadIdx.x];
    });
    for (int i = 0; i < 64; ++i) CHECK(seen[size_t(i)] == 64 - i);
}
