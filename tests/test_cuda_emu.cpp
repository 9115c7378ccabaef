// The CUDA backend's kernels on the emulated device (tests/cuda_emu/), against the scalar
// reference, through cuda/ops/ops.hpp as the runner calls them. This runs everywhere, GPU or
// not; test_backend_ops and test_cuda run the same kernels on a real device.
#include "cpu/ref/ops_ref.hpp"
#include "cuda/device.hpp"
#include "cuda/ops/ops.hpp"
#include "runtime/kv_cache.hpp"
#include "tests/cuda_emu/cuda_emu.hpp"
#include "tests/op_data.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace tandem;
using tandem::test::nmse;
using tandem::test::randn;
using tandem::test::scattered_pages;

namespace {

// One emulated "device": the host.
const cuda::context& host_device() {
    static const cuda::context c(0);
    return c;
}

// A batch of sequences, each with its own scattered pages, K/V written by the reference for
// positions [0, n_past + n_tok), and its new tokens' queries at rows `row` of one q array.
struct batch {
    kv_layout lay;
    int n_head;
    std::vector<attn_seq> segs;
    std::vector<int32_t> tables; // every sequence's block table, one after another
    kv_cache kv;
    std::vector<float> q;
    int64_t n_rows;
    int32_t window = 0;   // attn_params::window
    float softcap = 0.0f; // attn_params::softcap

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
            const int32_t off = int32_t(tables.size());
            for (int32_t i = 0; i < n_pages; ++i) tables.push_back(pool[size_t(next_page++)]);
            const size_t kv_n = size_t(n_pos) * size_t(lay.n_head_kv * lay.head_dim);
            const auto k = randn(kv_n, seed + uint32_t(off) + 1, k_scale), v = randn(kv_n, seed + uint32_t(off) + 2);
            const attn_seq all{0, n_pos, 0, off};
            cpu::ref::kv_store(params({&all, 1}), 1, k.data(), v.data());
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

    // The pages (host memory is the emulated device's) with these sequences over them.
    attn_params params(array_view<attn_seq> seqs) const {
        return attn_params{lay,  const_cast<uint8_t*>(kv.base()), kv.n_pages(), tables.data(), tables, seqs,
                           window, softcap};
    }

    // A window (and soft-cap) from now on; the pages wholly before what each sequence's first
    // new token sees leave its table (no_page), as the scheduler releases them. Returns how many.
    int with_window(int32_t w, float cap) {
        window = w;
        softcap = cap;
        int n = 0;
        for (const attn_seq& s : segs)
            for (int32_t pg = 0; pg < std::max(0, s.n_past - w + 1) / lay.page_size; ++pg, ++n)
                tables[size_t(s.table_begin + pg)] = no_page;
        return n;
    }

    // The reference; row 0 (no one's) stays NaN.
    std::vector<float> reference(float scale) const {
        std::vector<float> out(q.size(), NAN);
        cpu::ref::attention(params(segs), 1, out.data(), q.data(), n_head, scale);
        return out;
    }

    // cuda::attention of every segment in one call; n_launches: how many kernel launches it took.
    std::vector<float> emulated(float scale, int* n_launches = nullptr) const {
        std::vector<float> out(q.size(), NAN);
        const uint64_t before = cuda_emu::state().launches;
        cuda::attention(host_device(), params(segs), 1, out.data(), q.data(), n_head, scale);
        if (n_launches) *n_launches = int(cuda_emu::state().launches - before);
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

constexpr bool sanitized = TANDEM_EMU_ASAN;

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

TEST_CASE("CUDA flash attention (emulated): long contexts split over their positions, then combined") {
    // Decoding sequences past 1,024 positions, and a short chunk after a long past, are split
    // into blocks of 512 positions; a 600-position sequence and a prompt are not.
    for (kv_dtype dt : {kv_dtype::f16, kv_dtype::i8}) {
        for (int n_gqa : {1, 4}) {
            const kv_layout lay{2, 2, 64, 16, dt};
            const batch b(lay, 2 * n_gqa, {{1, 1500}, {1, 600}, {5, 1030}, {1, 2100}, {40, 0}}, uint32_t(n_gqa + 50));
            const double e = rows_nmse(b, b.reference(0.125f), b.emulated(0.125f));
            INFO("kv=", name_of(dt), " gqa=", n_gqa, " nmse=", e);
            CHECK(e < tol_split);
        }
    }
}

TEST_CASE("CUDA flash attention (emulated): windows and soft-caps, pages before the window missing") {
    // A prompt, a chunk, a few tokens and three decoding sequences in one call, with windows of
    // one position, not a multiple of the page or of the 32-position tile, one tile, and longer
    // than every sequence; each sequence's pages before its window are no_page. (Under the
    // sanitizers, several times slower, a corner of it.)
    const std::vector<kv_dtype> dts = sanitized ? std::vector<kv_dtype>{kv_dtype::f16}
                                                : std::vector<kv_dtype>{kv_dtype::f16, kv_dtype::i8};
    const std::vector<int> gqas = sanitized ? std::vector<int>{4} : std::vector<int>{1, 4};
    const std::vector<int32_t> windows = sanitized ? std::vector<int32_t>{9, 40} : std::vector<int32_t>{1, 9, 32, 40, 200};
    for (kv_dtype dt : dts) {
        for (int n_gqa : gqas) {
            for (int page_size : {16, 7}) {
                for (int32_t window : windows) {
                    for (float cap : {0.0f, 1.5f}) {
                        if (page_size == 7 && cap > 0) continue;
                        const kv_layout lay{2, 2, 64, page_size, dt};
                        batch b(lay, 2 * n_gqa, {{70, 0}, {33, 19}, {4, 50}, {1, 0}, {1, 40}, {1, 95}},
                                uint32_t(window + n_gqa), 1.5f, 1.5f);
                        const int holes = b.with_window(window, cap);
                        if (window <= 32) REQUIRE(holes > 0);
                        const double e = rows_nmse(b, b.reference(0.125f), b.emulated(0.125f));
                        INFO("kv=", name_of(dt), " gqa=", n_gqa, " page=", page_size, " window=", window,
                             " softcap=", cap, " nmse=", e);
                        CHECK(e < tol_split);
                    }
                }
            }
        }
    }
    // Long decoding contexts split over their positions (from the window's first tile on), and
    // a chunk after a long past.
    for (float cap : sanitized ? std::vector<float>{1.5f} : std::vector<float>{0.0f, 1.5f}) {
        const kv_layout lay{2, 2, 64, 16, kv_dtype::f16};
        batch b(lay, 8, {{1, 1500}, {1, 2100}, {5, 1030}, {40, 0}}, 77);
        REQUIRE(b.with_window(1100, cap) > 0);
        const double e = rows_nmse(b, b.reference(0.125f), b.emulated(0.125f));
        INFO("long, softcap=", cap, " nmse=", e);
        CHECK(e < tol_split);
    }
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
        int* sh = reinterpret_cast<int*>(cuda_emu::dynamic_smem());
        sh[threadIdx.x] = int(threadIdx.x) + 1;
        __syncthreads();
        seen[threadIdx.x] = sh[63 - threadIdx.x];
    });
    for (int i = 0; i < 64; ++i) CHECK(seen[size_t(i)] == 64 - i);
}

namespace {

bool same_bytes(const void* a, const void* b, size_t n) { return std::memcmp(a, b, n) == 0; }

// Rows with the values that trip quantizers up: inf, -inf, NaN, huge, all zero.
std::vector<float> awkward_rows(int64_t n_tok, int64_t n, uint32_t seed) {
    auto x = randn(size_t(n_tok * n), seed, 3.0f);
    if (n_tok >= 4 && n >= 4) {
        x[size_t(n + 1)] = INFINITY;
        x[size_t(2 * n + 2)] = -INFINITY;
        x[size_t(2 * n + 3)] = NAN;
        x[size_t(3 * n)] = 1e30f;
        std::fill(x.begin(), x.begin() + n, 0.0f); // row 0: all zero (scale 0)
    }
    return x;
}

} // namespace

TEST_CASE("CUDA row kernels (emulated): RMSNorm, RoPE, SwiGLU, add, embedding rows, row gather") {
    const cuda::context& c = host_device();
    for (int64_t n : {1, 37, 256, 1000}) { // below, at and above one block's 256 threads
        const int64_t n_tok = 5;
        const auto x = randn(size_t(n_tok * n), uint32_t(n), 2.0f), w = randn(size_t(n), 2);
        std::vector<float> want(x.size()), got(x.size(), NAN);
        INFO("n=", n);
        // eps at a size where it moves the result by percents: a kernel that drops it fails
        for (const float eps : {1e-5f, 0.25f}) {
            cpu::ref::rms_norm(want.data(), x.data(), w.data(), n_tok, n, eps);
            cuda::rms_norm(c, got.data(), x.data(), w.data(), n_tok, n, eps);
            CHECK_MESSAGE(nmse(want, got) < 1e-13, "eps ", eps); // the sum of squares in double, in another order
        }

        const auto g = randn(size_t(n), 3, 3.0f), u = randn(size_t(n), 4);
        std::vector<float> sw_want(static_cast<size_t>(n)), sw_got(size_t(n), NAN);
        cpu::ref::swiglu(sw_want.data(), g.data(), u.data(), n);
        cuda::swiglu(c, sw_got.data(), g.data(), u.data(), n);
        CHECK(same_bytes(sw_want.data(), sw_got.data(), size_t(n) * 4)); // the host's expf on both sides

        std::vector<float> gg_want(static_cast<size_t>(n)), gg_got(size_t(n), NAN);
        cpu::ref::geglu(gg_want.data(), g.data(), u.data(), n);
        cuda::geglu(c, gg_got.data(), g.data(), u.data(), n);
        CHECK(nmse(gg_want, gg_got) < 1e-12); // the host's tanhf on both sides; the kernel's order of steps

        auto sc_want = g, sc_got = g;
        cpu::ref::scale(sc_want.data(), 0.75f, n);
        cpu::ref::softcap(sc_want.data(), 2.0f, n);
        cuda::scale(c, sc_got.data(), 0.75f, n);
        cuda::softcap(c, sc_got.data(), 2.0f, n);
        CHECK(nmse(sc_want, sc_got) < 1e-12);

        auto a_want = x, a_got = x;
        cpu::ref::add(a_want.data(), g.data(), n);
        cuda::add(c, a_got.data(), g.data(), n);
        CHECK(same_bytes(a_want.data(), a_got.data(), x.size() * 4));
    }
    for (bool neox : {false, true}) {
        for (int n_rot : {64, 32}) { // all of a 64-dim head, and half of it
            const int64_t n_tok = 6;
            const int n_head = 3, hd = 64;
            const std::vector<int32_t> pos{0, 1, 7, 100, 4095, 3};
            auto want = randn(size_t(n_tok * n_head * hd), 5), got = want;
            std::vector<float> table(static_cast<size_t>(n_rot / 2));
            for (int i = 0; i < n_rot / 2; ++i) table[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(n_rot)) / float(1 + i % 3);
            const rope_params rp{n_rot, table.data(), 0.5f, 1.25f, neox};
            cpu::ref::rope(want.data(), pos.data(), n_tok, n_head, hd, rp);
            cuda::rope(c, got.data(), pos.data(), n_tok, n_head, hd, rp);
            INFO("neox=", neox, " n_rot=", n_rot);
            CHECK(nmse(want, got) < 1e-12); // sincosf/pow of the host on both sides; the order of steps is the kernel's
        }
    }
    {
        const int64_t n_vocab = 9, n_embd = 300;
        std::vector<int8_t> q(size_t(n_vocab * n_embd));
        for (size_t i = 0; i < q.size(); ++i) q[i] = int8_t(int(i * 37 % 255) - 127);
        const auto scale = randn(size_t(n_vocab), 6), f = randn(size_t(n_vocab * n_embd), 7);
        const std::vector<int32_t> tokens{3, 0, 8, 3};
        std::vector<float> got_q(tokens.size() * size_t(n_embd), NAN), got_f = got_q;
        cuda::embed(c, got_q.data(), tokens.data(), int64_t(tokens.size()), q.data(), scale.data(), nullptr, n_embd);
        cuda::embed(c, got_f.data(), tokens.data(), int64_t(tokens.size()), nullptr, nullptr, f.data(), n_embd);
        for (size_t t = 0; t < tokens.size(); ++t)
            for (int64_t i = 0; i < n_embd; ++i) {
                const size_t src = size_t(tokens[t] * n_embd + i), dst = t * size_t(n_embd) + size_t(i);
                REQUIRE(got_q[dst] == scale[size_t(tokens[t])] * float(q[src]));
                REQUIRE(got_f[dst] == f[src]);
            }
        const std::vector<int32_t> rows{2, 0};
        std::vector<float> gathered(2 * size_t(n_embd), NAN);
        cuda::gather_rows(c, gathered.data(), got_f.data(), rows.data(), 2, n_embd);
        CHECK(same_bytes(gathered.data(), got_f.data() + 2 * n_embd, size_t(n_embd) * 4));
        CHECK(same_bytes(gathered.data() + n_embd, got_f.data(), size_t(n_embd) * 4));
    }
}

TEST_CASE("CUDA INT8 activation kernels (emulated): the reference's bytes and scales") {
    const cuda::context& c = host_device();
    for (int64_t n : {4, 37, 300, 1024}) {
        const int64_t n_tok = 5;
        const auto x = awkward_rows(n_tok, n, uint32_t(n));
        const size_t qn = size_t(n_tok * n);
        INFO("n=", n);
        {
            std::vector<int8_t> qw(qn), qg(qn);
            std::vector<float> sw(static_cast<size_t>(n_tok)), sg(size_t(n_tok), NAN);
            cpu::ref::quantize_rows(qw.data(), sw.data(), x.data(), n_tok, n);
            cuda::quantize_rows(c, qg.data(), sg.data(), x.data(), n_tok, n);
            CHECK(same_bytes(qw.data(), qg.data(), qn));
            CHECK(same_bytes(sw.data(), sg.data(), sw.size() * 4));
        }
        {
            const auto g = randn(qn, 8, 3.0f), u = randn(qn, 9);
            std::vector<int8_t> qw(qn), qg(qn);
            std::vector<float> sw(static_cast<size_t>(n_tok)), sg(size_t(n_tok), NAN);
            cpu::ref::swiglu_quant(qw.data(), sw.data(), g.data(), u.data(), n_tok, n);
            cuda::swiglu_quant(c, qg.data(), sg.data(), g.data(), u.data(), n_tok, n);
            CHECK(same_bytes(qw.data(), qg.data(), qn));
            CHECK(same_bytes(sw.data(), sg.data(), sw.size() * 4));
        }
        {
            std::vector<int8_t> hw(qn), hg(qn), lw(qn), lg(qn);
            std::vector<float> shw(static_cast<size_t>(n_tok)), shg(size_t(n_tok), NAN), slw(static_cast<size_t>(n_tok)), slg(size_t(n_tok), NAN);
            cpu::ref::quantize_rows_split(hw.data(), shw.data(), lw.data(), slw.data(), x.data(), n_tok, n);
            cuda::quantize_rows_split(c, hg.data(), shg.data(), lg.data(), slg.data(), x.data(), n_tok, n);
            CHECK(same_bytes(hw.data(), hg.data(), qn));
            CHECK(same_bytes(lw.data(), lg.data(), qn));
            CHECK(same_bytes(shw.data(), shg.data(), shw.size() * 4));
            CHECK(same_bytes(slw.data(), slg.data(), slw.size() * 4));
        }
        {
            // The sum of squares is a reduction in another order: the norm may differ in its last
            // bit, and so, rarely, may a rounding to int8. Dequantized, the rows agree.
            // eps at a size where it moves the result by percents: a kernel that drops it fails
            const auto xr = randn(qn, 10, 2.0f), w = randn(size_t(n), 11);
            for (const float eps : {1e-5f, 0.25f}) {
                std::vector<int8_t> qw(qn), qg(qn);
                std::vector<float> sw(static_cast<size_t>(n_tok)), sg(size_t(n_tok), NAN);
                cpu::ref::rms_norm_quant(qw.data(), sw.data(), xr.data(), w.data(), n_tok, n, eps);
                cuda::rms_norm_quant(c, qg.data(), sg.data(), xr.data(), w.data(), n_tok, n, eps);
                std::vector<float> dw(qn), dg(qn);
                for (size_t i = 0; i < qn; ++i) {
                    dw[i] = sw[i / size_t(n)] * float(qw[i]);
                    dg[i] = sg[i / size_t(n)] * float(qg[i]);
                }
                CHECK_MESSAGE(nmse(dw, dg) < 1e-5, "eps ", eps);
            }
        }
    }
}

TEST_CASE("CUDA KV store (emulated): the same page bytes as the reference, every dtype") {
    const cuda::context& c = host_device();
    for (kv_dtype dt : {kv_dtype::f32, kv_dtype::f16, kv_dtype::i8}) {
        for (int hd : {8, 64, 80}) {
            const kv_layout lay{2, 3, hd, 4, dt};
            const int32_t pos0 = 5, n_tok = 11, n_pages = (pos0 + n_tok + 3) / 4;
            const std::vector<int32_t> table = scattered_pages(n_pages, n_pages + 2, uint32_t(hd));
            auto k = randn(size_t(n_tok * 3 * hd), 12, 2.0f), v = randn(k.size(), 13);
            k[5] = NAN;
            k[7] = std::bit_cast<float>(0x7f800123u); // a NaN with a payload
            v[3] = INFINITY;
            v[size_t(hd)] = 1e30f;
            kv_cache want(lay, n_pages + 2), got(lay, n_pages + 2);
            std::memset(want.base(), 0x5a, size_t(want.bytes()));
            std::memset(got.base(), 0x5a, size_t(got.bytes()));
            const attn_seq seq{0, n_tok, pos0, 0};
            cpu::ref::kv_store({lay, want.base(), want.n_pages(), table.data(), table, {&seq, 1}}, 1, k.data(), v.data());
            cuda::kv_store(c, {lay, got.base(), got.n_pages(), table.data(), table, {&seq, 1}}, 1, k.data(), v.data());
            INFO("kv=", name_of(dt), " hd=", hd);
            CHECK(same_bytes(want.base(), got.base(), size_t(want.bytes()))); // untouched bytes too
        }
    }
}

TEST_CASE("CUDA KV store of a batch's segments in one launch (emulated): each sequence's reference bytes") {
    const cuda::context& c = host_device();
    for (kv_dtype dt : {kv_dtype::f16, kv_dtype::i8}) {
        const kv_layout lay{2, 2, 64, 8, dt};
        // 70 sequences (two launches): chunks of 1 to 9 tokens after 0 to 29 positions, rows
        // in reverse order, each with its own pages.
        std::vector<attn_seq> segs;
        std::vector<int32_t> tables;
        int64_t n_rows = 0;
        for (int i = 0; i < 70; ++i) n_rows += 1 + i % 9;
        int64_t row = n_rows;
        for (int i = 0; i < 70; ++i) {
            const int32_t n_tok = 1 + i % 9, n_past = (i * 7) % 30;
            const int32_t n_pages = (n_past + n_tok + lay.page_size - 1) / lay.page_size;
            row -= n_tok;
            segs.push_back({row, n_tok, n_past, int32_t(tables.size())});
            for (int32_t pg = 0; pg < n_pages; ++pg) tables.push_back(int32_t(tables.size()));
        }
        const auto k = randn(size_t(n_rows * 2 * 64), 31), v = randn(k.size(), 32);
        kv_cache want(lay, int32_t(tables.size())), got(lay, int32_t(tables.size()));
        std::memset(want.base(), 0x5a, size_t(want.bytes()));
        std::memset(got.base(), 0x5a, size_t(got.bytes()));
        for (const auto& s : segs) // the reference one sequence at a time
            cpu::ref::kv_store({lay, want.base(), want.n_pages(), tables.data(), tables, {&s, 1}}, 1, k.data(),
                               v.data());
        const uint64_t before = cuda_emu::state().launches;
        cuda::kv_store(c, {lay, got.base(), got.n_pages(), tables.data(), tables, segs}, 1, k.data(), v.data());
        INFO("kv=", name_of(dt));
        CHECK(cuda_emu::state().launches - before == 2);
        CHECK(same_bytes(want.base(), got.base(), size_t(want.bytes())));
    }
}

TEST_CASE("CUDA INT8 GEMM, tiled dp4a kernel and through cuBLASLt (emulated): the reference's results") {
    const cuda::context& c = host_device();
    for (int64_t n_in : {7, 32, 100, 96}) { // 7, 100: the byte-wise loader; 32, 96: 8-byte loads
        for (int64_t n_tok : {1, 5, 70}) {
            for (int64_t n_out : {3, 64, 130}) {
                std::vector<int8_t> qx(size_t(n_tok * n_in)), qw(size_t(n_out * n_in));
                for (size_t i = 0; i < qx.size(); ++i) qx[i] = int8_t(int(i * 53 % 255) - 127);
                for (size_t i = 0; i < qw.size(); ++i) qw[i] = int8_t(int(i * 29 % 255) - 127);
                const auto sx = randn(size_t(n_tok), 14), sw = randn(size_t(n_out), 15), bias = randn(size_t(n_out), 16);
                std::vector<float> want(size_t(n_tok * n_out)), got(want.size(), NAN), got_lt(want.size(), NAN);
                cpu::ref::matmul_i8(want.data(), qx.data(), sx.data(), n_tok, qw.data(), sw.data(), nullptr, n_out,
                                    n_in, bias.data());
                CHECK(cuda::matmul_i8(c, got.data(), qx.data(), sx.data(), n_tok, qw.data(), sw.data(), n_out, n_in,
                                      bias.data(), cuda::gemm_impl::tiled) == cuda::gemm_impl::tiled);
                // cuBLASLt (its stand-in computes the int32 dots from the descriptors) and our epilogue;
                // it takes rows of a multiple of 4 bytes only.
                const cuda::gemm_impl lt = cuda::matmul_i8(c, got_lt.data(), qx.data(), sx.data(), n_tok, qw.data(),
                                                           sw.data(), n_out, n_in, bias.data(),
                                                           cuda::gemm_impl::cublaslt);
                CHECK((lt == cuda::gemm_impl::cublaslt) == (n_in % 4 == 0 && n_out % 4 == 0));
                INFO("n_in=", n_in, " n_tok=", n_tok, " n_out=", n_out);
                CHECK(same_bytes(want.data(), got.data(), want.size() * 4));
                CHECK(same_bytes(want.data(), got_lt.data(), want.size() * 4));
            }
        }
    }
}
