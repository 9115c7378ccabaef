// Checks of the batch contract that every runner keeps (multi-token steps with logits for any
// token, truncated drafts recomputed), shared by the CPU and CUDA suites.
#pragma once

#include "cpu/ref/ops_ref.hpp"
#include "runtime/engine.hpp"
#include "runtime/kv_cache.hpp"
#include "runtime/model.hpp"
#include "runtime/runner.hpp"
#include "runtime/scheduler.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace tandem::test {

// A KV cache with the block_pool its sequences take pages from: tests run models and workers
// without a scheduler. Constructed as kv_cache is: its own pages, or a view of others'.
struct paged_kv : kv_cache {
    block_pool pages;
    paged_kv(const kv_layout& layout, int32_t n_pages) : kv_cache(layout, n_pages), pages(n_pages) {}
    paged_kv(const kv_layout& layout, int32_t n_pages, uint8_t* base) : kv_cache(layout, n_pages, base), pages(n_pages) {}
    sequence_kv sequence() { return sequence_kv(pages, layout().page_size); }
};

inline double nmse(std::span<const float> want, std::span<const float> got) {
    double err = 0, ref = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        err += double(want[i] - got[i]) * double(want[i] - got[i]);
        ref += double(want[i]) * double(want[i]);
    }
    return ref > 0 ? err / ref : err;
}

// The decoded K and V of positions [0, n) of one sequence in every layer, flattened.
inline std::vector<float> read_kv(const kv_cache& kv, std::span<const int32_t> table, int32_t n) {
    const kv_layout& lay = kv.layout();
    std::vector<float> out, row(static_cast<size_t>(lay.head_dim));
    for (int il = 0; il < lay.n_layer; ++il)
        for (bool is_v : {false, true})
            for (int h = 0; h < lay.n_head_kv; ++h)
                for (int32_t p = 0; p < n; ++p) {
                    const uint8_t* page = kv.base() + int64_t(table[size_t(p / lay.page_size)]) * lay.page_bytes();
                    cpu::ref::kv_read(page, lay, il, is_v, h, p % lay.page_size, 1, row.data());
                    out.insert(out.end(), row.begin(), row.end());
                }
    return out;
}

// One sequence through a runner: forward steps of the given tokens at the sequence's end.
// `r` may change between steps: another device continues on the same pages.
struct seq_driver {
    runner* r;
    paged_kv& kv;
    sequence_kv seq;
    int32_t n_past = 0;
    std::vector<float> logits;
    bool generations = false;      // pass the pages' generations (a runner keeping pages uses them)
    std::vector<uint32_t> gens;

    seq_driver(runner& r_, paged_kv& kv_, int32_t n_vocab) : r(&r_), kv(kv_), seq(kv_.sequence()), logits(size_t(n_vocab)) {}

    // Returns the argmax of the logits after the last token.
    token_id step(std::span<const token_id> toks) {
        REQUIRE(seq.reserve(n_past + int32_t(toks.size())));
        gens.clear();
        if (generations)
            for (int32_t p : seq.block_table()) gens.push_back(kv.pages.generation(p));
        batch b;
        b.add_seq(0, n_past, toks, seq.block_table(), gens, n_past + int32_t(toks.size()) - 1);
        r->forward(b, kv, logits.data());
        n_past += int32_t(toks.size());
        return token_id(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    // The gap between the two largest logits of the last step: how near its argmax was a tie.
    float gap() const {
        float first = -INFINITY, second = -INFINITY;
        for (float v : logits) {
            if (v > first) second = std::exchange(first, v);
            else if (v > second) second = v;
        }
        return first - second;
    }
    // The prompt in chunks of `chunk` tokens; the argmax after it.
    token_id prefill(const std::vector<token_id>& prompt, size_t chunk) {
        token_id next = -1;
        for (size_t i = 0; i < prompt.size(); i += chunk)
            next = step(std::span(prompt).subspan(i, std::min(chunk, prompt.size() - i)));
        return next;
    }
    // n greedy tokens starting from `next` (itself included).
    std::vector<token_id> decode(token_id next, int n) {
        std::vector<token_id> out;
        for (int i = 0; i < n; ++i) {
            out.push_back(next);
            next = step(std::span(&out.back(), 1));
        }
        return out;
    }
};

inline std::vector<token_id> random_ids(int n, int32_t n_vocab, uint32_t seed) {
    std::mt19937 g(seed);
    std::vector<token_id> v(static_cast<size_t>(n));
    for (auto& t : v) t = token_id(g() % uint32_t(n_vocab));
    return v;
}

inline int64_t argmax(std::span<const float> row) { return std::max_element(row.begin(), row.end()) - row.begin(); }

// Compares rows [n_rows, n_vocab] of two runs: the largest nmse of a row, and whether every
// row has the same argmax.
inline void check_rows(std::span<const float> want, std::span<const float> got, int32_t n_vocab, double tol,
                       const char* what) {
    REQUIRE(want.size() == got.size());
    for (size_t r = 0; r * size_t(n_vocab) < want.size(); ++r) {
        const auto w = want.subspan(r * size_t(n_vocab), size_t(n_vocab));
        const auto g = got.subspan(r * size_t(n_vocab), size_t(n_vocab));
        INFO(std::string(what), " row ", r, ": nmse ", nmse(w, g));
        CHECK(nmse(w, g) < tol);
        CHECK(argmax(w) == argmax(g));
    }
}

// One sequence computes 5 tokens in one step with logits for all 5, beside another sequence's
// one decode token; the same on other pages of `kv` as 5 one-token steps gives the same 5 rows,
// the same row for the other sequence, and the same K/V in the pages. `kv` is where `r` writes
// (a view of a worker's shared pool, say); the check takes 18 of its free pages at page size 3.
inline void check_multi_token_step(runner& r, const model& m, paged_kv& kv, double tol) {
    const int32_t n_vocab = m.config().n_vocab;
    const auto prompt = random_ids(13, n_vocab, 1), draft = random_ids(5, n_vocab, 2), other = random_ids(9, n_vocab, 3);
    const int32_t n_prompt = int32_t(prompt.size());
    auto full = prompt;
    full.insert(full.end(), draft.begin(), draft.end());
    std::vector<float> logits(size_t(6) * size_t(n_vocab)), scratch(static_cast<size_t>(n_vocab));
    std::vector<std::vector<float>> kv_of(2);
    std::vector<float> multi, steps;
    // Both paths hold their pages to the end: the second writes pages the first never touched.
    sequence_kv a0 = kv.sequence(), o0 = kv.sequence(), a1 = kv.sequence(), o1 = kv.sequence();
    for (int path = 0; path < 2; ++path) {
        sequence_kv& a = path == 0 ? a0 : a1;
        sequence_kv& o = path == 0 ? o0 : o1;
        REQUIRE(a.reserve(int32_t(full.size())));
        REQUIRE(o.reserve(int32_t(other.size())));
        r.forward(one_sequence(prompt, 0, a.block_table()), kv, scratch.data());
        r.forward(one_sequence(std::span(other).first(other.size() - 1), 0, o.block_table()), kv, scratch.data());
        if (path == 0) {
            batch b;
            b.add_seq(7, n_prompt, draft, a.block_table(), {}, n_prompt); // all 5 want logits
            b.add_seq(9, int32_t(other.size()) - 1, std::span(other).last(1), o.block_table(), {},
                      int32_t(other.size()) - 1);
            REQUIRE(b.n_logits() == 6);
            r.forward(b, kv, logits.data());
            multi = logits;
        } else {
            for (int32_t i = 0; i < 5; ++i) {
                r.forward(one_sequence(std::span(&draft[size_t(i)], 1), n_prompt + i, a.block_table()), kv,
                          scratch.data());
                steps.insert(steps.end(), scratch.begin(), scratch.end());
            }
            r.forward(one_sequence(std::span(other).last(1), int32_t(other.size()) - 1, o.block_table()), kv,
                      scratch.data());
            steps.insert(steps.end(), scratch.begin(), scratch.end());
        }
        kv_of[size_t(path)] = read_kv(kv, a.block_table(), int32_t(full.size()));
    }
    check_rows(steps, multi, n_vocab, tol, "5 tokens in one step");
    CHECK(nmse(kv_of[1], kv_of[0]) < tol);
}

// The same on a private cache of page_size positions a page.
inline void check_multi_token_step(runner& r, const model& m, int32_t page_size, double tol) {
    paged_kv kv(m.make_kv_layout(page_size), 32);
    check_multi_token_step(r, m, kv, tol);
}

// Runs the scheduler's batches on `r` until nothing is left to compute.
inline void run_pending(scheduler& s, runner& r, kv_cache& kv, int32_t n_vocab) {
    std::vector<float> rows;
    for (;;) {
        const batch& b = s.plan(0, work_kind::both);
        if (b.empty()) return;
        rows.resize(size_t(b.n_logits()) * size_t(n_vocab));
        r.forward(b, kv, rows.data());
        s.complete(0, true);
    }
}

// The in-process engine's page store, counting its copies.
struct counting_store final : page_store {
    std::unique_ptr<page_store> inner;
    int n_copies = 0;
    explicit counting_store(kv_cache& kv) : inner(make_local_store(kv)) {}
    void published(int32_t p, uint64_t h, uint64_t parent, std::span<const int32_t> t) override {
        inner->published(p, h, parent, t);
    }
    void cleared(int32_t p) override { inner->cleared(p); }
    void copy_page(int32_t src, int32_t dst) override {
        inner->copy_page(src, dst);
        ++n_copies;
    }
};

// Drafts computed with logits, truncated, and other tokens computed in their place give the
// logits and pages of a sequence that had those tokens from the start; the page whose
// positions are rewritten gets a new generation, the page past the end goes back.
inline void check_truncate_recompute(runner& r, const model& m, double tol) {
    const int32_t n_vocab = m.config().n_vocab, ps = 4;
    kv_cache kv(m.make_kv_layout(ps), 32);
    counting_store store(kv);
    scheduler_options o;
    o.page_size = ps;
    o.n_pages = 32;
    o.prefix_cache = false;
    scheduler s(o, &store);
    const auto prompt = random_ids(10, n_vocab, 4), d1 = random_ids(4, n_vocab, 5), d2 = random_ids(3, n_vocab, 6);
    const auto now = std::chrono::steady_clock::now();
    s.add(1, prompt, 0, now);
    s.admit(now);
    run_pending(s, r, kv, n_vocab);
    s.append(1, d1); // positions 10..13, every one with logits
    s.set_logits_from(1, 10);
    const batch& bd = s.plan(0, work_kind::both);
    REQUIRE(bd.n_logits() == 4);
    REQUIRE(bd.table(0).size() == 4);
    const int32_t page2 = bd.table(0)[2];
    const uint32_t gen2 = bd.generations[2];
    std::vector<float> rows(size_t(4 * n_vocab));
    r.forward(bd, kv, rows.data());
    s.complete(0, true);
    // Keep the first draft token (position 10): position 11 on is rewritten; page 2 (8..11)
    // stays with a new generation, page 3 (12..13) is released.
    const int32_t n_free = s.pool().n_free();
    s.truncate(1, 11);
    CHECK(s.n_computed(1) == 11);
    CHECK(s.pool().n_free() == n_free + 1);
    s.append(1, d2); // positions 11..13
    const batch& b = s.plan(0, work_kind::both);
    REQUIRE(b.n_seqs() == 1);
    CHECK(b.n_past(0) == 11);
    REQUIRE(b.n_logits() == 3);
    CHECK(b.table(0)[2] == page2);
    CHECK(b.generations[2] != gen2);
    const std::vector<int32_t> table1(b.table(0).begin(), b.table(0).end());
    std::vector<float> got(size_t(3 * n_vocab));
    r.forward(b, kv, got.data());
    s.complete(0, true);
    CHECK(store.n_copies == 0); // private pages: renewed in place, never copied

    // The same tokens from the start, in another sequence, in one step.
    auto all = prompt;
    all.push_back(d1[0]);
    all.insert(all.end(), d2.begin(), d2.end());
    const auto t1 = s.tokens(1);
    CHECK(std::vector<token_id>(t1.begin(), t1.end()) == all);
    s.add(2, all, 0, now);
    s.admit(now);
    s.set_logits_from(2, 11);
    const batch& b2 = s.plan(0, work_kind::both);
    REQUIRE(b2.n_logits() == 3);
    const std::vector<int32_t> table2(b2.table(0).begin(), b2.table(0).end());
    std::vector<float> want(size_t(3 * n_vocab));
    r.forward(b2, kv, want.data());
    s.complete(0, true);
    check_rows(want, got, n_vocab, tol, "recomputed after truncate");
    CHECK(nmse(read_kv(kv, table2, 14), read_kv(kv, table1, 14)) < tol);
}

} // namespace tandem::test
