// The scheduler with a sliding window: pages behind what the next token sees go back at once,
// stay cached, and drafts, forks, losses and preemption keep every seen position right.
#include "scheduler_fixtures.hpp"

using namespace tandem;
using namespace tandem::test;

namespace {

// Pages of a sequence's table that it holds (not no_page).
int32_t held(std::span<const int32_t> table) {
    return int32_t(std::count_if(table.begin(), table.end(), [](int32_t p) { return p != no_page; }));
}

// Every position in [first, n) of a sequence holds its token.
bool holds_from(fake_store& st, std::span<const int32_t> pages, std::span<const token_id> tokens, int32_t first,
                int32_t n) {
    for (int32_t pos = first; pos < n; ++pos) {
        const int32_t page = pages[size_t(pos / st.page_size)];
        if (page == no_page) return false;
        auto it = st.content.find(page);
        if (it == st.content.end() || it->second[size_t(pos % st.page_size)] != tokens[size_t(pos)]) return false;
    }
    return true;
}

} // namespace

TEST_CASE("scheduler: with a window, pages wholly before what the next token sees go back at once") {
    // Window 10, pages of 4: a token at position p sees p - 9..p. After n positions are
    // computed the next token (at n) sees n - 9 on, so pages wholly before n - 9 are released.
    fake_store st(4);
    scheduler s(windowed_opts(32, 10), &st);
    s.add(1, seq_tokens(30, 1), 0, clock_type::now());
    s.admit(clock_type::now());
    int32_t computed = 0;
    while (computed < 30) {
        const auto b = seqs_of(s.plan(0, work_kind::prefill));
        REQUIRE(b.size() == 1);
        // every position the chunk's tokens see is in a page; the ones before are no_page
        const int32_t first = std::max(0, b[0].n_past - 9);
        CHECK(holds_from(st, b[0].block_table, s.tokens(1), first, b[0].n_past));
        for (int32_t j = 0; j < first / 4; ++j) CHECK(b[0].block_table[size_t(j)] == no_page);
        st.run(b);
        s.complete(0, true);
        computed = s.n_computed(1);
        const int32_t keep_from = std::max(0, computed - 9);
        CHECK(s.stats().n_pages_used == (computed + 3) / 4 - keep_from / 4);
    }
    // Decode: 40 more tokens; the sequence never holds more than the pages of the positions
    // its step reads and writes: ceil((10 - 1) / 4) + 1 = 4, and it does hold that many.
    int32_t most = 0;
    for (int i = 0; i < 40; ++i) {
        s.append(1, token_id(100 + i));
        const auto d = seqs_of(s.plan(1, work_kind::decode));
        REQUIRE(d.size() == 1);
        most = std::max(most, s.stats().n_pages_used);
        CHECK(held(d[0].block_table) <= 4);
        CHECK(holds_from(st, d[0].block_table, s.tokens(1), std::max(0, d[0].n_past - 9), d[0].n_past));
        for (size_t j = 0; j < d[0].block_table.size(); ++j)
            CHECK(d[0].generations[j] == (d[0].block_table[j] == no_page ? 0u : s.pool().generation(d[0].block_table[j])));
        st.run(d);
        s.complete(1, true);
    }
    CHECK(most == 4);
    // A fork shares the held pages; both release their own references as they go.
    const int32_t before_fork = s.stats().n_pages_used;
    s.fork(1, 2);
    CHECK(s.stats().n_pages_used == before_fork);
    for (uint64_t id : {1, 2}) s.append(id, token_id(7 + int(id)));
    for (int i = 0; i < 12; ++i) {
        const auto d = seqs_of(s.plan(1, work_kind::decode));
        REQUIRE(d.size() == 2);
        for (const auto& v : d) CHECK(holds_from(st, v.block_table, s.tokens(v.id), std::max(0, v.n_past - 9), v.n_past));
        st.run(d);
        s.complete(1, true);
        for (uint64_t id : {1, 2}) s.append(id, token_id(50 + i + int(id)));
    }
    // 12 tokens after the fork: no page from before it is still read, so none is shared.
    CHECK(s.stats().n_pages_used <= 8);
    s.remove(1);
    s.remove(2);
    CHECK(s.pool().n_free() == 32);
    CHECK(s.stats().n_pages_used == 0);
}

TEST_CASE("scheduler: with a window, rejected drafts stay within the pages kept; a deeper cut recomputes") {
    fake_store st(4);
    scheduler_options o = opts(32, 4);
    o.kv_window = 6;
    o.decode_tokens = 4; // a verify step: a token and 3 drafts
    scheduler s(o, &st);
    add_prefilled(s, st, 1, seq_tokens(21, 1));
    for (int round = 0; round < 6; ++round) {
        const int32_t n = int32_t(s.tokens(1).size());
        const token_id next[] = {token_id(200 + round), 11, 12, 13}; // the sampled token and 3 drafts
        s.append(1, next);
        s.set_logits_from(1, n);
        const auto d = seqs_of(s.plan(1, work_kind::decode));
        REQUIRE(d.size() == 1);
        REQUIRE(d[0].n_past == n);
        CHECK(holds_from(st, d[0].block_table, s.tokens(1), std::max(0, n - 5), n));
        st.run(d);
        s.complete(1, true);
        // every draft rejected: back to the sampled token; what the next token sees is kept
        s.truncate(1, n + 1);
        CHECK(s.n_computed(1) == n + 1);
    }
    // A cut further back than any verify step (the draft model's resync): recomputed from 0.
    const int32_t n = s.n_computed(1);
    s.truncate(1, n - 12);
    CHECK(s.n_computed(1) == 0);
    CHECK(s.stats().n_pages_used == 0);
    prefill_all(s, st, 1);
    CHECK(s.n_computed(1) == n - 12);
    s.remove(1);
    CHECK(s.pool().n_free() == 32);
}

TEST_CASE("scheduler: with a window, released pages stay cached and a prefix hit needs only the window's pages") {
    // The rule: pages released behind the window keep their prefix hash and stay on the free
    // list as cached pages (least recently used first), like any released page. A new request
    // takes the longest match whose pages from its first computed token's window on are cached;
    // the matched pages before that window go back at once (or are no_page from the start).
    fake_store st(4);
    scheduler s(windowed_opts(12, 6), &st);
    const auto prompt = seq_tokens(26, 3);
    add_prefilled(s, st, 1, prompt);
    // The next token (26) sees 21..26: pages 0..4 are released with their hashes, 5 and 6 held.
    CHECK(s.stats().n_pages_used == 2);
    CHECK(s.stats().n_pages_cached == 5);
    s.remove(1);
    CHECK(s.stats().n_pages_used == 0);
    // The same prompt again: 6 full pages match (24 positions), 25 is computed.
    s.add(2, prompt, 0, clock_type::now());
    s.admit(clock_type::now());
    CHECK(s.reused_tokens(2) == 24);
    CHECK(s.stats().n_pages_used == 2);    // pages 4 and 5 (19..23, seen by 24); 0..3 released again
    const auto b = seqs_of(s.plan(0, work_kind::prefill));
    REQUIRE(b.size() == 1);
    CHECK(b[0].n_past == 24);
    CHECK(holds_from(st, b[0].block_table, s.tokens(2), 19, 24));
    st.run(b);
    s.complete(0, true);
    s.remove(2);
    // Evict every cached page of the prompt (a request of other tokens as long as the pool
    // takes, releasing behind its window as it goes, cycles through every page): no hit.
    add_prefilled(s, st, 3, seq_tokens(44, 9));
    s.remove(3);
    s.add(4, prompt, 0, clock_type::now());
    s.admit(clock_type::now());
    CHECK(s.reused_tokens(4) == 0);
    s.remove(4);
    CHECK(s.pool().n_free() == 12);
}

TEST_CASE("scheduler: with a window, a prompt whose first pages were evicted still hits on its window's pages") {
    // Window 6, pages of 4, a pool of 9. The 26-token prompt leaves pages 0..5 cached (released
    // behind the window in the order 0, 1, 3, 2, 4, then 5 at removal) and its partial page 6
    // free. A 16-token request takes the three uncached pages, then evicts the oldest cached
    // page: the prompt's page 0. The prompt again reuses 24 positions: its first computed token
    // (24) reads 19..23, pages 4 and 5, which are cached; pages 0..3 stay no_page.
    fake_store st(4);
    scheduler s(windowed_opts(9, 6), &st);
    const auto prompt = seq_tokens(26, 3);
    add_prefilled(s, st, 1, prompt);
    s.remove(1);
    CHECK(s.stats().n_pages_cached == 6);
    add_prefilled(s, st, 2, seq_tokens(16, 7));
    s.remove(2);
    s.add(3, prompt, 0, clock_type::now());
    s.admit(clock_type::now());
    CHECK(s.reused_tokens(3) == 24);
    const auto b = seqs_of(s.plan(0, work_kind::prefill));
    REQUIRE(b.size() == 1);
    CHECK(b[0].n_past == 24);
    for (int32_t j = 0; j < 4; ++j) CHECK(b[0].block_table[size_t(j)] == no_page);
    CHECK(holds_from(st, b[0].block_table, s.tokens(3), 19, 24)); // the cached pages hold the prompt's K/V
    st.run(b);
    s.complete(0, true);
    s.remove(3);
    CHECK(s.pool().n_free() == 9);
}

TEST_CASE("scheduler: windowed random workloads with forks, drafts, losses and preemption drain and keep every seen position right") {
    for (uint32_t seed : {11u, 12u, 13u, 14u, 15u, 16u}) {
        std::mt19937 rng(seed);
        const int32_t ps = 1 + int32_t(rng() % 6);
        const int32_t window = 1 + int32_t(rng() % 20);
        const int32_t n_pages = 6 + int32_t(rng() % 20);
        scheduler_options o = opts(n_pages, ps);
        o.kv_window = window;
        o.max_running = 1 + int32_t(rng() % 5);
        o.step_tokens = 4 + int32_t(rng() % 30);
        o.decode_tokens = 1 + int32_t(rng() % 3);
        fake_store st(ps);
        scheduler s(o, &st);
        struct want {
            int32_t left;   // tokens still to generate
            int32_t drafts; // appended after the last sampled token (may be rejected)
        };
        std::map<uint64_t, want> live;
        uint64_t next_id = 1;
        int finished = 0;
        const std::vector<token_id> prefix = seq_tokens(3 * ps + 2, 5);
        for (int step = 0; step < 4000 && (finished < 30 || !live.empty()); ++step) {
            if (finished + int(live.size()) < 30 && rng() % 3 == 0) {
                std::vector<token_id> p = prefix;
                p.resize(p.size() + 1 + rng() % 20, token_id(rng() % 400 + 3));
                if (s.pages_for(int64_t(p.size()) + 40) <= n_pages) {
                    s.add(next_id, p, int32_t(rng() % 2), clock_type::now());
                    live[next_id++] = {5 + int32_t(rng() % 30), 0};
                }
            }
            s.admit(clock_type::now());
            auto pre = seqs_of(s.plan(0, work_kind::prefill));
            auto dec = seqs_of(s.plan(1, work_kind::decode));
            for (const auto& b : {pre, dec})
                for (const auto& p : b) {
                    REQUIRE(holds_from(st, p.block_table, s.tokens(p.id), std::max(0, p.n_past - window + 1), p.n_past));
                    for (size_t j = 0; j < p.block_table.size(); ++j)
                        if (p.block_table[j] != no_page) REQUIRE(p.generations[j] == s.pool().generation(p.block_table[j]));
                    // what a step writes and reads is held; nothing wholly behind the window is
                    const int32_t gone = std::max(0, p.n_past - window + 1 - (o.decode_tokens - 1)) / ps;
                    for (int32_t j = 0; j < std::min(gone, int32_t(p.block_table.size())); ++j)
                        CHECK(p.block_table[size_t(j)] == no_page);
                }
            const bool lose = rng() % 17 == 0;
            if (!lose) st.run(pre);
            st.run(dec);
            std::vector<uint64_t> due = s.complete(0, !lose);
            const auto due_d = s.complete(1, true);
            due.insert(due.end(), due_d.begin(), due_d.end());
            for (uint64_t id : due) {
                if (!live.contains(id)) continue;
                // drafts: some rejected (truncate back, never past the sampled token)
                want& w = live.at(id);
                const int32_t n = int32_t(s.tokens(id).size());
                const int32_t rejected = int32_t(rng() % size_t(w.drafts + 1));
                if (rejected > 0) s.truncate(id, n - rejected);
                if (--w.left <= 0) {
                    s.remove(id);
                    live.erase(id);
                    ++finished;
                    continue;
                }
                const int32_t n_drafts = int32_t(rng() % size_t(o.decode_tokens));
                std::vector<token_id> t{token_id(rng() % 400 + 3)};
                for (int32_t k = 0; k < n_drafts; ++k) t.push_back(token_id(rng() % 400 + 3));
                s.append(id, t);
                w.drafts = n_drafts;
                if (rng() % 20 == 0 && !s.busy(id) && finished + int(live.size()) < 30) { // a fork (n > 1)
                    s.fork(id, next_id);
                    live[next_id++] = {3, n_drafts};
                }
            }
        }
        CHECK_MESSAGE(live.empty(), "seed ", seed);
        CHECK(s.pool().n_free() == n_pages);
        CHECK(s.stats().n_running == 0);
    }
}
