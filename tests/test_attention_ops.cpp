// kv_store and attention over paged KV on every backend and ISA level, against the reference:
// one parameter struct (runtime/attn_params.hpp) for every sequence of a step.
#include "cpu/isa.hpp"
#include "cpu/ref/ops_ref.hpp"
#include "cpu/thread_pool.hpp"
#include "runtime/kv_cache.hpp"
#include "runtime/ops/attention.hpp"
#include "tests/backend_rows.hpp"
#include "tests/op_data.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace tandem;
using namespace tandem::test;

namespace {

// One sequence whose new tokens are rows 0.. at positions n_past.., its table first.
std::vector<attn_seq> one_seq(int32_t n_tok, int32_t n_past) { return {attn_seq{0, n_tok, n_past, 0}}; }

} // namespace

TEST_CASE("paged attention vs reference: KV dtypes, GQA ratios, page sizes, prefill and decode shapes") {
  for (kv_dtype dt : {kv_dtype::f32, kv_dtype::f16, kv_dtype::i8}) {
   for (int hd : {8, 32, 64, 80, 96, 128, 256}) { // 80 (and 8): the per-row block path; the rest: each register-blocked width
    for (int n_gqa : {1, 2, 4, 8}) {
        for (int page_size : {1, 4, 16}) {
            for (int32_t n_tok : {1, 5, 33, 70}) {
                const int n_kv = 2, n_head = n_kv * n_gqa;
                const int32_t n_past = n_tok == 70 ? 0 : 19; // a whole prompt at once, and a chunk after 19
                kv_layout lay{2, n_kv, hd, page_size, dt};
                const int32_t n_pos = n_past + n_tok;
                const int32_t n_pages = (n_pos + page_size - 1) / page_size;
                const std::vector<int32_t> table = scattered_pages(n_pages, n_pages + 5, uint32_t(n_pos));
                kv_cache cache(lay, n_pages + 5);
                const auto k = randn(size_t(n_pos * n_kv * hd), 8), v = randn(size_t(n_pos * n_kv * hd), 9);
                const auto q = randn(size_t(n_tok * n_head * hd), 10);
                const int il = 1;
                const auto all = one_seq(n_pos, 0), fresh = one_seq(n_tok, n_past);
                for_each_cpu_variant([&](const exec_ctx& ctx) {
                    op_mem m(ctx);
                    ops::kv_store(ctx, m.pages(cache, table, all), il, m.in(k), m.in(v));
                    std::vector<float> out(q.size(), NAN);
                    ops::attention(ctx, m.pages(cache, table, fresh), il, m.out(out), m.in(q), n_head,
                                   1.0f / std::sqrt(float(hd)));
                    m.finish();
                    return out;
                }, tol_kv,
                   "attention kv=" + std::string(name_of(dt)) + " hd=" + std::to_string(hd) + " gqa=" +
                       std::to_string(n_gqa) + " page=" + std::to_string(page_size) + " n_tok=" + std::to_string(n_tok));
            }
        }
    }
   }
  }
}

TEST_CASE("F16 and INT8 KV pages hold the values within their precision") {
    for (kv_dtype dt : {kv_dtype::f16, kv_dtype::i8}) {
        kv_layout lay{1, 2, 16, 4, dt};
        kv_cache cache(lay, 2);
        const std::vector<int32_t> table{1, 0};
        const auto k = randn(size_t(5 * 2 * 16), 4), v = randn(size_t(5 * 2 * 16), 5);
        const exec_ctx ref{backend::ref};
        op_mem m(ref);
        ops::kv_store(ref, m.pages(cache, table, one_seq(5, 0)), 0, k.data(), v.data());
        // one query head per kv head with a huge score on position 3 reads back V at 3
        std::vector<float> out(2 * 16);
        std::vector<float> q(2 * 16, 0.0f);
        for (int h = 0; h < 2; ++h)
            for (int i = 0; i < 16; ++i) q[size_t(h * 16 + i)] = 1000.0f * k[size_t((3 * 2 + h) * 16 + i)];
        ops::attention(ref, m.pages(cache, table, one_seq(1, 4)), 0, out.data(), q.data(), 2, 1.0f);
        const std::vector<float> want(v.begin() + 3 * 32, v.begin() + 4 * 32);
        INFO(name_of(dt));
        CHECK(nmse(want, out) < (dt == kv_dtype::f16 ? 1e-6 : 1e-3));
    }
}

TEST_CASE("a token's attention output does not depend on how its sequence was split into steps") {
    // Prefix-cache hits, preemption, chunked prefill and drafts compute the same positions in
    // steps of other sizes; the text stays byte-identical only if each row comes out bit for bit the same.
    for (kv_dtype dt : {kv_dtype::f16, kv_dtype::i8}) {
        for (int hd : {32, 64, 80, 96, 128, 256}) {
            const int n_kv = 2, n_gqa = 4, n_head = n_kv * n_gqa, page_size = 16;
            kv_layout lay{1, n_kv, hd, page_size, dt};
            const int32_t n_pos = 75;
            std::vector<int32_t> table(size_t((n_pos + page_size - 1) / page_size));
            for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(table.size() - 1 - i);
            const auto k = randn(size_t(n_pos * n_kv * hd), 51), v = randn(k.size(), 52);
            const auto q = randn(size_t(n_pos * n_head * hd), 53);
            const size_t row = size_t(n_head * hd);
            // The pieces 40, 1, 33 and 1 tokens long, as sequences of one op (a mixed step: two
            // chunks and two decode tokens), and one op each.
            std::vector<attn_seq> pieces;
            for (int32_t at = 0; int32_t n : {40, 1, 33, 1}) {
                pieces.push_back({at, n, at, 0});
                at += n;
            }
            // Without a window, and with one (21: the pieces start before, inside and after
            // it) with and without a soft-cap; each piece's table has no page before its window.
            struct mask { int32_t window; float softcap; };
            for (const mask mk : {mask{0, 0.0f}, mask{21, 0.0f}, mask{21, 1.5f}, mask{0, 1.5f}})
            for (int lvl = 0; lvl <= int(cpu::detect_isa()); ++lvl) {
                cpu::force_isa(cpu::isa(lvl));
                cpu::thread_pool pool(2);
                const exec_ctx ctx{backend::cpu, &pool};
                kv_cache cache(lay, int32_t(table.size()));
                op_mem m(ctx);
                ops::kv_store(ctx, m.pages(cache, table, one_seq(n_pos, 0)), 0, k.data(), v.data());
                std::vector<float> whole(q.size()), mixed(q.size()), apart(q.size());
                ops::attention(ctx, m.pages(cache, table, one_seq(n_pos, 0), mk.window, mk.softcap), 0, whole.data(),
                               q.data(), n_head, 0.125f);
                ops::attention(ctx, m.pages(cache, table, pieces, mk.window, mk.softcap), 0, mixed.data(), q.data(),
                               n_head, 0.125f);
                for (const attn_seq& s : pieces) {
                    std::vector<int32_t> holed = table;
                    const int32_t first = mk.window > 0 ? std::max(0, s.n_past - mk.window + 1) : 0;
                    for (int32_t pg = 0; pg < first / page_size; ++pg) holed[size_t(pg)] = no_page;
                    ops::attention(ctx, m.pages(cache, holed, {s}, mk.window, mk.softcap), 0, apart.data(), q.data(),
                                   n_head, 0.125f);
                }
                INFO("kv=", std::string(name_of(dt)), " hd=", hd, " isa=", std::string(cpu::name_of(cpu::isa(lvl))),
                     " window=", mk.window, " softcap=", mk.softcap);
                CHECK(std::memcmp(whole.data(), mixed.data(), q.size() * sizeof(float)) == 0);
                CHECK(std::memcmp(whole.data(), apart.data(), n_pos * row * sizeof(float)) == 0);
            }
            cpu::force_isa(cpu::detect_isa());
        }
    }
}

TEST_CASE("decode attention of several sequences in one op equals one op per sequence") {
  for (kv_dtype dt : {kv_dtype::f32, kv_dtype::f16, kv_dtype::i8}) {
    for (int hd : {8, 64}) {
        for (int n_gqa : {1, 4}) {
            const int n_kv = 2, n_head = n_kv * n_gqa, page_size = 4;
            kv_layout lay{2, n_kv, hd, page_size, dt};
            // Four sequences with their own pages and lengths, their tables concatenated; their
            // queries are rows 3, 0, 4 and 1 of q (row 2 belongs to none and must stay untouched).
            const std::vector<int32_t> n_past{0, 9, 2, 30};
            const std::vector<int64_t> rows{3, 0, 4, 1};
            std::vector<int32_t> tables;
            std::vector<attn_seq> decode, stored;
            for (size_t i = 0; i < n_past.size(); ++i) {
                const int32_t begin = int32_t(tables.size()), n = (n_past[i] + 1 + page_size - 1) / page_size;
                for (int32_t pg = 0; pg < n; ++pg) tables.push_back(begin + n - 1 - pg); // not in page order
                decode.push_back({rows[i], 1, n_past[i], begin});
                stored.push_back({0, n_past[i] + 1, 0, begin});
            }
            const int32_t n_pages = int32_t(tables.size());
            const auto q = randn(size_t(5 * n_head * hd), 21);
            const int il = 1;
            const std::string what = "decode attention kv=" + std::string(name_of(dt)) + " hd=" + std::to_string(hd) +
                                     " gqa=" + std::to_string(n_gqa);
            // Each sequence's K and V live as long as the op: op_mem keeps one device copy per host
            // array, found by its address, which a dead vector's successor may reuse.
            std::vector<std::vector<float>> ks, vs;
            for (size_t i = 0; i < n_past.size(); ++i) {
                ks.push_back(randn(size_t((n_past[i] + 1) * n_kv * hd), uint32_t(30 + i)));
                vs.push_back(randn(ks.back().size(), uint32_t(40 + i)));
            }
            auto fill = [&](const exec_ctx& ctx, kv_cache& cache, op_mem& m) {
                for (size_t i = 0; i < n_past.size(); ++i)
                    ops::kv_store(ctx, m.pages(cache, tables, {stored[i]}), il, m.in(ks[i]), m.in(vs[i]));
            };
            for_each_cpu_variant([&](const exec_ctx& ctx) {
                kv_cache cache(lay, n_pages);
                op_mem m(ctx);
                fill(ctx, cache, m);
                std::vector<float> out(q.size(), -7.0f);
                ops::attention(ctx, m.pages(cache, tables, decode), il, m.out(out), m.in(q), n_head, 0.125f);
                m.finish();
                return out;
            }, tol_kv, what);
            // On the CPU, bit for bit what one op per sequence gives, at every ISA level.
            for (int lvl = 0; lvl <= int(cpu::detect_isa()); ++lvl) {
                cpu::force_isa(cpu::isa(lvl));
                cpu::thread_pool pool(2);
                const exec_ctx ctx{backend::cpu, &pool};
                kv_cache cache(lay, n_pages);
                op_mem m(ctx);
                fill(ctx, cache, m);
                std::vector<float> one_op(q.size(), -7.0f), per_seq(q.size(), -7.0f);
                ops::attention(ctx, m.pages(cache, tables, decode), il, one_op.data(), q.data(), n_head, 0.125f);
                for (const attn_seq& s : decode)
                    ops::attention(ctx, m.pages(cache, tables, {s}), il, per_seq.data(), q.data(), n_head, 0.125f);
                const size_t stride = size_t(n_head * hd);
                INFO(what, " isa=", std::string(cpu::name_of(cpu::isa(lvl))));
                CHECK(std::memcmp(one_op.data(), per_seq.data(), q.size() * sizeof(float)) == 0);
                CHECK(std::all_of(one_op.begin() + 2 * stride, one_op.begin() + 3 * stride,
                                  [](float x) { return x == -7.0f; }));
            }
            cpu::force_isa(cpu::detect_isa());
        }
    }
  }
}

TEST_CASE("attention with one position equals that position's value") {
    kv_layout lay{1, 1, 4, 4};
    kv_cache cache(lay, 1);
    const std::vector<int32_t> table{0};
    const std::vector<float> k{1, 2, 3, 4}, v{5, 6, 7, 8}, q{0.3f, -1, 2, 0.5f};
    cpu::thread_pool pool(1);
    for (backend be : {backend::ref, backend::cpu, backend::cuda}) {
        exec_ctx ctx{be, &pool};
        if (be == backend::cuda) {
            if (!cuda_available("attention one position")) continue;
#if TANDEM_HAVE_CUDA
            ctx.cuda = cuda_device();
#endif
        }
        op_mem m(ctx);
        const auto seq = one_seq(1, 0);
        const attn_params p = m.pages(cache, table, seq); // holds pointers to table and seq
        ops::kv_store(ctx, p, 0, m.in(k), m.in(v));
        std::vector<float> out(4);
        ops::attention(ctx, p, 0, m.out(out), m.in(q), 1, 0.5f);
        m.finish();
        INFO(name_of(be));
        CHECK(out == v);
    }
}

TEST_CASE("a window attends to the last positions only, and skips the pages before it") {
    // Attention does not depend on absolute positions (RoPE is in q and k already), so a token
    // at position p with window w must see what a token at position w - 1 sees in a sequence
    // holding only positions p - w + 1..p. The windowed sequence's pages wholly before its first
    // token's window are no_page.
    const int n_kv = 2, n_head = 4, hd = 16, page_size = 4;
    for (kv_dtype dt : {kv_dtype::f32, kv_dtype::f16}) {
        kv_layout lay{1, n_kv, hd, page_size, dt};
        const int32_t n_pos = 30, window = 9, n_tok = 3; // tokens at 27, 28, 29 see 19..27, 20..28, 21..29
        const int32_t n_pages = (n_pos + page_size - 1) / page_size;
        const auto k = randn(size_t(n_pos * n_kv * hd), 61), v = randn(k.size(), 62);
        const auto q = randn(size_t(n_tok * n_head * hd), 63);
        const size_t kv_row = size_t(n_kv * hd), row = size_t(n_head * hd);
        const exec_ctx ref{backend::ref};
        // The windowed sequence: every position stored, then the pages before 19 given back.
        std::vector<int32_t> table(static_cast<size_t>(n_pages));
        for (int32_t i = 0; i < n_pages; ++i) table[size_t(i)] = n_pages - 1 - i;
        kv_cache cache(lay, n_pages);
        {
            op_mem m(ref);
            ops::kv_store(ref, m.pages(cache, table, one_seq(n_pos, 0)), 0, k.data(), v.data());
        }
        std::vector<int32_t> holed = table;
        for (int32_t pg = 0; pg < (n_pos - n_tok - window + 1) / page_size; ++pg) holed[size_t(pg)] = no_page;
        REQUIRE(holed[3] == no_page); // positions 12..15: wholly before 19
        REQUIRE(holed[4] != no_page); // 16..19: holds 19
        // Each token alone, in a fresh sequence of its window's positions.
        std::vector<float> want(q.size(), NAN);
        for (int32_t t = 0; t < n_tok; ++t) {
            const int32_t first = n_pos - n_tok + t - window + 1;
            const std::vector<float> ks(k.begin() + first * kv_row, k.begin() + (first + window) * kv_row),
                vs(v.begin() + first * kv_row, v.begin() + (first + window) * kv_row);
            const std::vector<float> qt(q.begin() + t * row, q.begin() + (t + 1) * row);
            std::vector<int32_t> fresh_table{0, 1, 2};
            kv_cache fresh(lay, 3);
            std::vector<float> out(row);
            op_mem m(ref);
            ops::kv_store(ref, m.pages(fresh, fresh_table, one_seq(window, 0)), 0, ks.data(), vs.data());
            ops::attention(ref, m.pages(fresh, fresh_table, one_seq(1, window - 1)), 0, out.data(), qt.data(), n_head,
                           0.25f);
            std::copy(out.begin(), out.end(), want.begin() + t * row);
        }
        cpu::thread_pool pool(2);
        for (const exec_ctx& ctx : {ref, exec_ctx{backend::cpu, &pool}}) {
            op_mem m(ctx);
            std::vector<float> got(q.size(), NAN);
            ops::attention(ctx, m.pages(cache, holed, one_seq(n_tok, n_pos - n_tok), window), 0, got.data(), q.data(),
                           n_head, 0.25f);
            INFO(name_of(dt), " on ", name_of(ctx.be));
            CHECK(nmse(want, got) < 1e-12);
        }
        // Without the window the holes are refused: those positions are seen.
        op_mem m(ref);
        std::vector<float> out(q.size());
        CHECK_THROWS(ops::attention(ref, m.pages(cache, holed, one_seq(n_tok, n_pos - n_tok)), 0, out.data(), q.data(),
                                    n_head, 0.25f));
    }
}

TEST_CASE("windowed and soft-capped attention vs reference: every backend, windows below, at and past the "
          "context, pages before the window missing, prefill chunks and decode tokens in one step") {
    // Five sequences in one op (a mixed step): a whole prompt, a chunk after 45 positions, a
    // few tokens after 30 (drafts), and two decode tokens (after 60 and after 3). Each has its
    // own scattered pages; the ones wholly before what its first new token sees are no_page.
    // Head dims 8 (the per-token kernel), 80 (the block kernel) and 64 (the register-blocked
    // one); windows of one position, not a multiple of the page size, a page, longer than some
    // sequences and longer than all.
    struct piece { int32_t n_tok, n_past; };
    const std::vector<piece> pieces{{37, 0}, {20, 45}, {3, 30}, {1, 60}, {1, 3}};
    const int n_kv = 2, n_gqa = 2, n_head = n_kv * n_gqa;
    for (kv_dtype dt : {kv_dtype::f16, kv_dtype::i8, kv_dtype::f32}) {
        for (int hd : {8, 64, 80}) {
            for (int page_size : {4, 16}) {
                for (int32_t window : {1, 7, 16, 23, 61, 500}) {
                    for (float softcap : {0.0f, 1.5f}) {
                        if (dt == kv_dtype::f32 && (softcap > 0 || page_size == 16)) continue; // a corner of it
                        const kv_layout lay{2, n_kv, hd, page_size, dt};
                        std::vector<int32_t> full, holed;
                        std::vector<attn_seq> stored, step;
                        int64_t n_rows = 0;
                        for (const piece& pc : pieces) n_rows += pc.n_tok;
                        int32_t n_pool = 0;
                        for (const piece& pc : pieces) n_pool += (pc.n_past + pc.n_tok + page_size - 1) / page_size;
                        const std::vector<int32_t> order = scattered_pages(n_pool, n_pool, uint32_t(hd + window));
                        int64_t row = n_rows; // rows in reverse order of the sequences
                        for (const piece& pc : pieces) {
                            const int32_t begin = int32_t(full.size()), n_pos = pc.n_past + pc.n_tok;
                            const int32_t first = std::max(0, pc.n_past - window + 1);
                            for (int32_t pg = 0; pg < (n_pos + page_size - 1) / page_size; ++pg) {
                                full.push_back(order[full.size()]);
                                holed.push_back(pg < first / page_size ? no_page : full.back());
                            }
                            row -= pc.n_tok;
                            stored.push_back({0, n_pos, 0, begin});
                            step.push_back({row, pc.n_tok, pc.n_past, begin});
                        }
                        // the small windows leave holes (the chunk after 45 and the token after 60 have some)
                        if (window <= 23) REQUIRE(std::count(holed.begin(), holed.end(), no_page) >= 2);
                        if (window == 500) REQUIRE(std::count(holed.begin(), holed.end(), no_page) == 0);
                        std::vector<std::vector<float>> ks, vs;
                        for (size_t i = 0; i < pieces.size(); ++i) {
                            ks.push_back(randn(size_t(stored[i].n_tok) * size_t(n_kv * hd), uint32_t(70 + i), 1.5f));
                            vs.push_back(randn(ks.back().size(), uint32_t(80 + i)));
                        }
                        const auto q = randn(size_t(n_rows) * size_t(n_head * hd), 90, 1.5f);
                        const std::string what = "windowed attention kv=" + std::string(name_of(dt)) +
                                                 " hd=" + std::to_string(hd) + " page=" + std::to_string(page_size) +
                                                 " window=" + std::to_string(window) +
                                                 " softcap=" + std::to_string(softcap);
                        for_each_cpu_variant([&](const exec_ctx& ctx) {
                            kv_cache cache(lay, n_pool);
                            op_mem m(ctx);
                            for (size_t i = 0; i < pieces.size(); ++i)
                                ops::kv_store(ctx, m.pages(cache, full, {stored[i]}), 1, m.in(ks[i]), m.in(vs[i]));
                            std::vector<float> out(q.size(), NAN);
                            ops::attention(ctx, m.pages(cache, holed, step, window, softcap), 1, m.out(out), m.in(q),
                                           n_head, 1.0f / std::sqrt(float(hd)));
                            m.finish();
                            return out;
                        }, tol_kv, what);
                    }
                }
            }
        }
    }
}

TEST_CASE("a soft-cap changes the scores as c * tanh(s / c), and a window as wide as the context changes nothing") {
    // Two positions: scores s0 = 3 and s1 = 0 (scale 1). Uncapped the weights are e^3 : 1; capped
    // at c = 2 they are e^(2 tanh 1.5) : 1.
    kv_layout lay{1, 1, 16, 4};
    kv_cache cache(lay, 1);
    const std::vector<int32_t> table{0};
    std::vector<float> k(2 * 16, 0.0f), v(2 * 16, 0.0f), q(16, 0.0f);
    k[0] = 3.0f;
    q[0] = 1.0f;
    v[1] = 1.0f;      // position 0's value: (0, 1, 0, ...)
    v[16 + 2] = 1.0f; // position 1's: (0, 0, 1, ...)
    const float c = 2.0f, w0 = std::exp(c * std::tanh(3.0f / c)), w1 = 1.0f;
    cpu::thread_pool pool(1);
    for (backend be : {backend::ref, backend::cpu}) {
        for (int lvl = 0; lvl <= (be == backend::cpu ? int(cpu::detect_isa()) : 0); ++lvl) {
            cpu::force_isa(cpu::isa(lvl));
            const exec_ctx ctx{be, &pool};
            op_mem m(ctx);
            ops::kv_store(ctx, m.pages(cache, table, one_seq(2, 0)), 0, k.data(), v.data());
            std::vector<float> out(16), plain(16);
            ops::attention(ctx, m.pages(cache, table, one_seq(1, 1), 0, c), 0, out.data(), q.data(), 1, 1.0f);
            ops::attention(ctx, m.pages(cache, table, one_seq(1, 1), 2, 0.0f), 0, plain.data(), q.data(), 1, 1.0f);
            INFO(name_of(be), " isa=", std::string(cpu::name_of(cpu::isa(lvl))));
            CHECK(out[1] == doctest::Approx(w0 / (w0 + w1)).epsilon(1e-5));
            CHECK(out[2] == doctest::Approx(w1 / (w0 + w1)).epsilon(1e-5));
            CHECK(plain[1] == doctest::Approx(std::exp(3.0f) / (std::exp(3.0f) + 1.0f)).epsilon(1e-5));
        }
    }
    cpu::force_isa(cpu::detect_isa());
}

TEST_CASE("kv_store writes the reference's page bytes on every backend (f32, f16, i8; split writes, two sequences)") {
    for (kv_dtype dt : {kv_dtype::f32, kv_dtype::f16, kv_dtype::i8}) {
        for (int hd : {8, 64, 80}) {
            for (int page_size : {1, 4, 16}) {
                const int n_kv = 3;
                kv_layout lay{2, n_kv, hd, page_size, dt};
                const int32_t n_pos = 29;
                const int32_t n_pages = (n_pos + page_size - 1) / page_size;
                const std::vector<int32_t> table = scattered_pages(n_pages, n_pages + 3, uint32_t(page_size));
                auto k = randn(size_t(n_pos * n_kv * hd), 18, 2.0f), v = randn(size_t(n_pos * n_kv * hd), 19);
                k[7] = INFINITY; // saturates in i8, overflows to inf in f16
                v[3] = 1e6f;
                k[hd + 2] = std::bit_cast<float>(0xffe00001u); // a NaN with a payload: f16 keeps only the sign
                v[2 * hd + 1] = 3e-8f;                                // an f16 subnormal
                const std::string what = "kv_store kv=" + std::string(name_of(dt)) + " hd=" + std::to_string(hd) +
                                         " page=" + std::to_string(page_size);
                // Positions 0..10, then 11..28 (the second write starts inside a page) as two
                // sequences of one op on the same table: rows 0..17 of k2 at positions 11.., and
                // once more nothing (an empty sequence).
                const std::vector<float> k2(k.begin() + 11 * n_kv * hd, k.end()), v2(v.begin() + 11 * n_kv * hd, v.end());
                auto write = [&](const exec_ctx& ctx, kv_cache& cache) {
                    op_mem m(ctx);
                    ops::kv_store(ctx, m.pages(cache, table, one_seq(11, 0)), 1, m.in(k), m.in(v));
                    ops::kv_store(ctx, m.pages(cache, table, {attn_seq{0, n_pos - 11, 11, 0}, attn_seq{0, 0, 0, 0}}), 1,
                                  m.in(k2), m.in(v2));
                    m.finish();
                };
                kv_cache want(lay, n_pages + 3);
                write(exec_ctx{backend::ref}, want);
                auto same_bytes = [&](const kv_cache& got) {
                    return std::memcmp(want.base(), got.base(), size_t(want.bytes())) == 0;
                };
                cpu::thread_pool pool(2);
                kv_cache on_cpu(lay, n_pages + 3);
                write(exec_ctx{backend::cpu, &pool}, on_cpu);
                INFO(what);
                CHECK(same_bytes(on_cpu));
                if (!cuda_available(what)) continue;
#if TANDEM_HAVE_CUDA
                kv_cache on_cuda(lay, n_pages + 3);
                write(exec_ctx{backend::cuda, nullptr, cuda_device()}, on_cuda);
                CHECK(same_bytes(on_cuda));
#endif
            }
        }
    }
}

TEST_CASE("a page outside the pool or missing from a table is refused before any kernel runs") {
    kv_layout lay{1, 1, 8, 4};
    kv_cache cache(lay, 2);
    const std::vector<float> k(8 * 8), v(8 * 8), q(8 * 8);
    std::vector<float> out(q.size());
    const exec_ctx ref{backend::ref};
    op_mem m(ref);
    CHECK_THROWS(ops::kv_store(ref, m.pages(cache, {0, 2}, one_seq(8, 0)), 0, k.data(), v.data())); // page 2 of 2
    CHECK_THROWS(ops::kv_store(ref, m.pages(cache, {0}, one_seq(8, 0)), 0, k.data(), v.data()));    // table too short
    CHECK_THROWS(ops::attention(ref, m.pages(cache, {no_page, 1}, one_seq(1, 5)), 0, out.data(), q.data(), 1, 1.0f));
    CHECK_NOTHROW(ops::kv_store(ref, m.pages(cache, {1, 0}, one_seq(8, 0)), 0, k.data(), v.data()));
}

TEST_CASE("CUDA attention on long contexts, large heads and odd page sizes vs reference") {
    if (!cuda_available("attention long")) return;
    struct config { kv_dtype dt; int hd, n_kv, n_gqa, page_size; int32_t n_tok, n_past; };
    for (const config cf : {config{kv_dtype::f16, 128, 2, 4, 16, 300, 0},     // prefill over many tiles
                            config{kv_dtype::i8, 256, 1, 2, 16, 20, 100},      // head_dim 256: > 48 KiB smem
                            config{kv_dtype::f32, 64, 4, 1, 16, 1, 1500},      // decode, long context
                            config{kv_dtype::f16, 64, 2, 8, 7, 70, 33},        // page size not a power of 2
                            config{kv_dtype::i8, 96, 2, 3, 32, 41, 64}}) {     // GQA 3, head_dim 96
        const int n_head = cf.n_kv * cf.n_gqa;
        kv_layout lay{3, cf.n_kv, cf.hd, cf.page_size, cf.dt};
        const int32_t n_pos = cf.n_past + cf.n_tok;
        const int32_t n_pages = (n_pos + cf.page_size - 1) / cf.page_size;
        std::vector<int32_t> table(static_cast<size_t>(n_pages));
        for (int32_t i = 0; i < n_pages; ++i) table[size_t(i)] = n_pages - 1 - i; // reversed
        kv_cache cache(lay, n_pages);
        const auto k = randn(size_t(n_pos) * size_t(cf.n_kv * cf.hd), 81, 1.5f);
        const auto v = randn(size_t(n_pos) * size_t(cf.n_kv * cf.hd), 82);
        const auto q = randn(size_t(cf.n_tok) * size_t(n_head * cf.hd), 83, 1.5f);
        const std::string what = "attention kv=" + std::string(name_of(cf.dt)) + " hd=" + std::to_string(cf.hd) +
                                 " n_tok=" + std::to_string(cf.n_tok) + " n_past=" + std::to_string(cf.n_past);
        auto run = [&](const exec_ctx& ctx) {
            op_mem m(ctx);
            ops::kv_store(ctx, m.pages(cache, table, one_seq(n_pos, 0)), 2, m.in(k), m.in(v));
            std::vector<float> out(q.size(), NAN);
            ops::attention(ctx, m.pages(cache, table, one_seq(cf.n_tok, cf.n_past)), 2, m.out(out), m.in(q), n_head,
                           1.0f / std::sqrt(float(cf.hd)));
            m.finish();
            return out;
        };
        run_cuda_row(run, run(exec_ctx{backend::ref}), tol_kv, what);
    }
}
