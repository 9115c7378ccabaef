// What the scheduler suites share (test_scheduler, test_scheduler_window): options, a page
// store that records what it is told, and walks of sequences through planned batches.
#pragma once

#include "runtime/scheduler.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

namespace tandem::test {

using clock_type = std::chrono::steady_clock;

// One sequence's share of a planned batch, as the tests read it.
struct seq_view {
    uint64_t id;
    int32_t n_past;
    std::span<const token_id> tokens;
    std::span<const int32_t> block_table;
    std::span<const uint32_t> generations;
    bool wants_row; // its last new token wants logits
};

inline std::vector<seq_view> seqs_of(const batch& b) {
    std::vector<seq_view> out;
    for (int32_t i = 0; i < b.n_seqs(); ++i)
        out.push_back({b.seq_id[size_t(i)], b.n_past(i), b.seq_tokens(i), b.table(i), b.table_generations(i),
                       b.wants_row[size_t(b.tok_begin[size_t(i) + 1] - 1)] != 0});
    return out;
}

// Records what the scheduler tells the page table, and keeps fake page contents: each
// page holds the tokens written at each slot, so copy-on-write can be checked.
struct fake_store final : page_store {
    int32_t page_size;
    std::map<int32_t, std::vector<int32_t>> content;        // page -> tokens written (-1 unwritten)
    std::map<int32_t, uint64_t> published_hash;
    std::map<int32_t, uint64_t> published_parent;
    std::vector<std::pair<int32_t, int32_t>> copies;
    std::set<int32_t> cleared_pages;

    explicit fake_store(int32_t ps) : page_size(ps) {}
    void published(int32_t page, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) override {
        published_hash[page] = hash;
        published_parent[page] = parent;
        CHECK(int32_t(tokens.size()) == page_size);
        auto& c = content[page];
        CHECK(std::equal(tokens.begin(), tokens.end(), c.begin())); // what was computed there
    }
    void cleared(int32_t page) override {
        published_hash.erase(page);
        cleared_pages.insert(page);
    }
    void copy_page(int32_t src, int32_t dst) override {
        copies.emplace_back(src, dst);
        content[dst] = content[src];
    }
    // What a worker does with a planned batch: writes each token into its page slot.
    void run(const std::vector<seq_view>& batch) {
        for (const auto& p : batch) {
            for (size_t i = 0; i < p.tokens.size(); ++i) {
                const int32_t pos = p.n_past + int32_t(i);
                REQUIRE(size_t(pos / page_size) < p.block_table.size());
                auto& c = content[p.block_table[size_t(pos / page_size)]];
                c.resize(size_t(page_size), -1);
                c[size_t(pos % page_size)] = p.tokens[i];
            }
        }
    }
    // Every position below n of a sequence holds its token (K/V are "right").
    bool holds(std::span<const int32_t> pages, std::span<const token_id> tokens, int32_t n) {
        for (int32_t pos = 0; pos < n; ++pos) {
            auto it = content.find(pages[size_t(pos / page_size)]);
            if (it == content.end() || it->second[size_t(pos % page_size)] != tokens[size_t(pos)]) return false;
        }
        return true;
    }
};

inline std::vector<token_id> seq_tokens(int n, int salt) {
    std::vector<token_id> t(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t[size_t(i)] = (i * 7 + salt * 13) % 500 + 3;
    return t;
}

inline scheduler_options opts(int32_t n_pages, int32_t ps = 16) {
    scheduler_options o;
    o.page_size = ps;
    o.n_pages = n_pages;
    o.max_running = 8;
    o.step_tokens = 64;
    o.prefix_seed = 42;
    return o;
}

// Runs prefill until `id` is due; returns the number of batches.
inline int prefill_all(scheduler& s, fake_store& st, uint64_t id) {
    int n = 0;
    for (;;) {
        auto b = seqs_of(s.plan(0, work_kind::prefill));
        REQUIRE(!b.empty());
        st.run(b);
        ++n;
        auto due = s.complete(0, true);
        if (std::find(due.begin(), due.end(), id) != due.end()) return n;
    }
}

// Adds `id` with `tokens`, admits it and runs its prefill to the end.
inline void add_prefilled(scheduler& s, fake_store& st, uint64_t id, const std::vector<token_id>& tokens) {
    s.add(id, tokens, 0, clock_type::now());
    s.admit(clock_type::now());
    prefill_all(s, st, id);
}

// Options with every layer windowed (window W over pages of 4), 8 tokens a step.
inline scheduler_options windowed_opts(int32_t n_pages, int32_t window) {
    scheduler_options o = opts(n_pages, 4);
    o.kv_window = window;
    o.step_tokens = 8;
    return o;
}

} // namespace tandem::test
