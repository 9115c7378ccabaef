// The scheduler alone: prefix reuse and copy-on-write, lazy page growth, preemption,
// priority order, restore after restart, and a random workload that must always drain.
// (Sliding windows: test_scheduler_window.)
#include "scheduler_fixtures.hpp"

using namespace tandem;
using namespace tandem::test;

TEST_CASE("scheduler: chunked prefill takes pages as it goes, decode then grows one page at a time") {
    fake_store st(16);
    scheduler s(opts(32), &st);
    s.add(1, seq_tokens(150, 1), 0, clock_type::now());
    s.admit(clock_type::now());
    CHECK(s.stats().n_pages_used == 0); // nothing computed, nothing taken
    auto b = seqs_of(s.plan(0, work_kind::prefill));
    REQUIRE(b.size() == 1);
    CHECK(b[0].n_past == 0);
    CHECK(b[0].tokens.size() == 64);   // the step budget
    CHECK_FALSE(b[0].wants_row);
    CHECK(b[0].block_table.size() == 4);
    CHECK(s.busy(1));
    st.run(b);
    CHECK(s.complete(0, true).empty());
    CHECK(prefill_all(s, st, 1) == 2); // 64 + 22 more
    CHECK(s.stats().n_pages_used == 10);
    CHECK(s.stats().n_kv_tokens == 150);
    // decode: the decode executor takes it once a token is appended
    CHECK(s.plan(1, work_kind::prefill).empty());
    s.complete(1, true);
    s.append(1, 7);
    auto d = seqs_of(s.plan(1, work_kind::decode));
    REQUIRE(d.size() == 1);
    CHECK(d[0].n_past == 150);
    CHECK(d[0].tokens.size() == 1);
    CHECK(d[0].wants_row);
    st.run(d);
    CHECK(s.complete(1, true) == std::vector<uint64_t>{1});
    CHECK(s.stats().n_pages_used == 10); // 151 positions still fit 10 pages
    CHECK(st.holds(d[0].block_table, s.tokens(1), 151));
    s.remove(1);
    CHECK(s.pool().n_free() == 32);
}

TEST_CASE("scheduler: a repeated prefix reuses cached pages; a match ending inside a page is copied") {
    fake_store st(16);
    scheduler s(opts(32), &st);
    const auto a = seq_tokens(40, 1);
    add_prefilled(s, st, 1, a);
    CHECK(s.plan(0, work_kind::prefill).empty()); // nothing left to prefill
    s.complete(0, true);
    CHECK(st.published_hash.size() == 2); // two full pages computed
    s.remove(1);
    CHECK(s.pool().n_cached() == 2);
    CHECK(s.stats().n_pages_used == 0);

    SUBCASE("longer prompt with the same start: two pages shared, the rest computed") {
        auto b_tokens = a;
        b_tokens.resize(35);
        b_tokens.push_back(999);
        s.add(2, b_tokens, 0, clock_type::now());
        s.admit(clock_type::now());
        CHECK(s.reused_tokens(2) == 32);
        auto b = seqs_of(s.plan(0, work_kind::prefill));
        REQUIRE(b.size() == 1);
        CHECK(b[0].n_past == 32);
        CHECK(b[0].tokens.size() == 4);
        CHECK(st.copies.empty());
        st.run(b);
        s.complete(0, true);
        CHECK(st.holds(b[0].block_table, s.tokens(2), 36));
        CHECK(s.stats().n_prefix_hit_tokens == 32);
    }
    SUBCASE("prompt equal to the cached pages: the last token is recomputed in a copy") {
        std::vector<token_id> b_tokens(a.begin(), a.begin() + 32);
        s.add(2, b_tokens, 0, clock_type::now());
        s.admit(clock_type::now());
        CHECK(s.reused_tokens(2) == 31);
        REQUIRE(st.copies.size() == 1);
        // planned as decode work: one token left to compute
        CHECK(s.plan(0, work_kind::prefill).empty());
        s.complete(0, true);
        auto d = seqs_of(s.plan(1, work_kind::decode));
        REQUIRE(d.size() == 1);
        CHECK(d[0].n_past == 31);
        CHECK(d[0].block_table[1] == st.copies[0].second);
        CHECK(d[0].block_table[1] != st.copies[0].first);
        CHECK(s.pool().ref_count(st.copies[0].first) == 0); // the source stays cached, unshared
        st.run(d);
        CHECK(s.complete(1, true) == std::vector<uint64_t>{2});
        CHECK(st.holds(d[0].block_table, s.tokens(2), 32));
    }
    SUBCASE("another model's seed never matches") {
        // The same page table restored into a scheduler seeded like the first one is found
        // again; under another seed the very same pages are never matched.
        for (uint64_t seed : {uint64_t(42), uint64_t(43)}) {
            CAPTURE(seed);
            scheduler_options o = opts(32);
            o.prefix_seed = seed;
            scheduler other(o, &st);
            for (const auto& [page, hash] : st.published_hash)
                CHECK(other.restore(page, hash, st.published_parent.at(page), st.content[page]));
            other.add(3, a, 0, clock_type::now());
            other.admit(clock_type::now());
            CHECK(other.reused_tokens(3) == (seed == 42 ? 32 : 0));
        }
    }
}

TEST_CASE("scheduler: planned generations: a shared cached prefix keeps its own, reused and copied pages get new ones") {
    fake_store st(16);
    scheduler s(opts(32), &st);
    const auto a = seq_tokens(40, 1);
    s.add(1, a, 0, clock_type::now());
    s.admit(clock_type::now());
    auto b = seqs_of(s.plan(0, work_kind::prefill));
    REQUIRE(b.size() == 1);
    REQUIRE(b[0].block_table.size() == 3);
    REQUIRE(b[0].generations.size() == 3);
    const std::vector<int32_t> pages(b[0].block_table.begin(), b[0].block_table.end());
    const std::vector<uint32_t> gens(b[0].generations.begin(), b[0].generations.end());
    for (size_t j = 0; j < 3; ++j) CHECK(gens[j] == s.pool().generation(pages[j]));
    st.run(b);
    s.complete(0, true);
    s.remove(1); // pages 0 and 1 stay cached; the partial page 2 is plain free

    // Same first 32 tokens and more: the cached pages come back with their generations (a
    // device copy of them is still good); the third page is taken anew.
    auto t2 = a;
    t2.resize(35);
    t2.push_back(999);
    s.add(2, t2, 0, clock_type::now());
    s.admit(clock_type::now());
    auto b2 = seqs_of(s.plan(0, work_kind::prefill));
    REQUIRE(b2.size() == 1);
    REQUIRE(b2[0].block_table.size() == 3);
    CHECK(b2[0].block_table[0] == pages[0]);
    CHECK(b2[0].block_table[1] == pages[1]);
    CHECK(b2[0].generations[0] == gens[0]);
    CHECK(b2[0].generations[1] == gens[1]);
    CHECK(b2[0].block_table[2] == pages[2]); // the free list's head: the old partial page, reused
    CHECK(b2[0].generations[2] != gens[2]);  // with new contents
    st.run(b2);
    s.complete(0, true);

    // The prompt is exactly the two cached pages: the second is copied for its last token; the
    // copy is a new page with new contents, the cached source keeps its generation.
    std::vector<uint32_t> before;
    for (int32_t p = 0; p < s.pool().n_pages(); ++p) before.push_back(s.pool().generation(p));
    std::vector<token_id> t3(a.begin(), a.begin() + 32);
    s.add(3, t3, 0, clock_type::now());
    s.admit(clock_type::now());
    REQUIRE(st.copies.size() == 1);
    const auto [src, dst] = st.copies[0];
    CHECK(src == pages[1]);
    auto d = seqs_of(s.plan(1, work_kind::decode));
    REQUIRE(d.size() == 1);
    CHECK(d[0].block_table[0] == pages[0]);
    CHECK(d[0].generations[0] == gens[0]);
    CHECK(d[0].block_table[1] == dst);
    CHECK(d[0].generations[1] == s.pool().generation(dst));
    CHECK(s.pool().generation(dst) == before[size_t(dst)] + 1);
    CHECK(s.pool().generation(src) == gens[1]);
    st.run(d);
    s.complete(1, true);
}

TEST_CASE("scheduler: a cached page only its sequence holds is rewritten without a free page (rejected drafts, a full pool)") {
    fake_store st(4);
    scheduler_options o = opts(3, 4);
    o.decode_tokens = 2; // verify steps of a token and one draft
    scheduler s(o, &st);
    add_prefilled(s, st, 1, seq_tokens(6, 1)); // pages 0..3 and 4..5
    const token_id step[] = {200, 201};        // a verify step: the sampled token and one draft (positions 6, 7)
    s.append(1, step);
    s.set_logits_from(1, 6);
    const auto d = seqs_of(s.plan(1, work_kind::decode));
    REQUIRE(d.size() == 1);
    st.run(d);
    s.complete(1, true);
    const int32_t page = d[0].block_table[1];
    REQUIRE(s.pool().hash_of(page).has_value()); // full, so published, with the draft in it
    add_prefilled(s, st, 2, seq_tokens(3, 2));   // a later request takes the last page
    REQUIRE(s.pool().n_free() == 0);
    s.truncate(1, 7); // the draft rejected: position 7 is written again
    const uint32_t gen = s.pool().generation(page);
    s.append(1, token_id(300));
    const auto d2 = seqs_of(s.plan(1, work_kind::decode));
    REQUIRE(d2.size() == 1);
    CHECK(d2[0].n_past == 7);
    // The page went back to the free list and was taken again as it is: no copy, no other
    // page needed, so nobody was preempted for it (before: request 2 was).
    CHECK(d2[0].block_table[1] == page);
    CHECK(s.pool().generation(page) != gen); // its contents change: device copies are stale
    CHECK_FALSE(s.pool().hash_of(page).has_value());
    CHECK(st.cleared_pages.contains(page));
    CHECK(st.copies.empty());
    CHECK(s.stats().n_preemptions == 0);
    CHECK(s.stats().n_running == 2);
    st.run(d2);
    s.complete(1, true);
    CHECK(st.holds(d2[0].block_table, s.tokens(1), 8));
    CHECK(s.pool().n_used_peak() == 3);

    // With a free page the rewritten page is copied and its cached prefix stays on the free list.
    o.n_pages = 4;
    scheduler roomy(o, &st);
    st.copies.clear();
    add_prefilled(roomy, st, 1, seq_tokens(6, 1));
    roomy.append(1, step);
    st.run(seqs_of(roomy.plan(1, work_kind::decode)));
    roomy.complete(1, true);
    roomy.truncate(1, 7);
    roomy.append(1, token_id(300));
    const auto d3 = seqs_of(roomy.plan(1, work_kind::decode));
    REQUIRE(st.copies.size() == 1);
    CHECK(d3[0].block_table[1] == st.copies[0].second);
    CHECK(roomy.pool().hash_of(st.copies[0].first).has_value());
    CHECK(roomy.pool().ref_count(st.copies[0].first) == 0);
    CHECK(roomy.pool().n_used_peak() == 2);
}

TEST_CASE("scheduler: a prefix hit ending inside a cached page admits with that page as the only one free") {
    // The prompt is two cached pages exactly: the second is rewritten at its last position. It
    // is revived, then goes back and is taken again (the only free page), so no copy is needed.
    fake_store st(4);
    scheduler s(opts(3, 4), &st);
    const auto prompt = seq_tokens(8, 5);
    add_prefilled(s, st, 1, prompt);
    s.remove(1); // both pages cached, the third plain free
    add_prefilled(s, st, 2, seq_tokens(3, 6)); // takes the plain page
    REQUIRE(s.pool().n_free() == 2);
    s.add(3, prompt, 0, clock_type::now());
    s.admit(clock_type::now());
    REQUIRE(s.stats().n_running == 2);
    CHECK(s.n_computed(3) == 7);
    CHECK(st.copies.empty());
    CHECK(s.pool().n_free() == 0);
    const auto b = seqs_of(s.plan(1, work_kind::decode)); // the prompt's last token
    REQUIRE(b.size() == 1);
    CHECK(b[0].n_past == 7);
    st.run(b);
    s.complete(1, true);
    CHECK(st.holds(b[0].block_table, s.tokens(3), 8));
}

TEST_CASE("scheduler: a fork shares every page; each sequence's first own token copies only the shared last page") {
    fake_store st(4);
    scheduler_options o = opts(32, 4);
    o.prefix_cache = false; // sharing by fork alone
    scheduler s(o, &st);
    const auto prompt = seq_tokens(10, 3); // pages 0..2, the last one half full
    s.add(1, prompt, 0, clock_type::now());
    s.admit(clock_type::now());
    auto b = seqs_of(s.plan(0, work_kind::prefill));
    REQUIRE(b.size() == 1);
    st.run(b);
    s.complete(0, true);
    const std::vector<int32_t> pages(b[0].block_table.begin(), b[0].block_table.end());
    REQUIRE(pages.size() == 3);
    const int32_t used = s.stats().n_pages_used;
    for (uint64_t child : {2, 3, 4}) s.fork(1, child);
    CHECK(s.stats().n_pages_used == used); // nothing copied yet
    for (int32_t p : pages) CHECK(s.pool().ref_count(p) == 4);
    CHECK(s.n_computed(4) == 10);
    for (uint64_t id : {1, 2, 3, 4}) s.append(id, token_id(100 + id)); // each its own next token
    auto d = seqs_of(s.plan(1, work_kind::decode));
    REQUIRE(d.size() == 4);
    // Three of the four copy the half-full page (the last one to be planned has it alone
    // by then); the full pages stay shared by all four.
    CHECK(st.copies.size() == 3);
    std::set<int32_t> last_pages;
    for (const auto& v : d) {
        CHECK(v.n_past == 10);
        REQUIRE(v.block_table.size() == 3);
        CHECK(v.block_table[0] == pages[0]);
        CHECK(v.block_table[1] == pages[1]);
        last_pages.insert(v.block_table[2]);
    }
    CHECK(last_pages.size() == 4);
    for (const auto& [src, dst] : st.copies) CHECK(src == pages[2]);
    CHECK(s.pool().ref_count(pages[0]) == 4);
    CHECK(s.pool().ref_count(pages[2]) == 1);
    st.run(d);
    CHECK(s.complete(1, true).size() == 4);
    for (const auto& v : d) CHECK(st.holds(v.block_table, s.tokens(v.id), 11)); // the prompt's K/V copied, then its own
    CHECK(s.stats().n_pages_used == used + 3);
    CHECK(s.stats().n_prompt_tokens == 10); // the prompt counts once
    for (uint64_t id : {1, 2, 3, 4}) s.remove(id);
    CHECK(s.stats().n_pages_used == 0);
}

TEST_CASE("scheduler: drafts are decode work up to decode_tokens; logits rows stay within max_logits") {
    fake_store st(4);
    scheduler_options o = opts(32, 4);
    o.decode_tokens = 4;
    o.max_logits = 6;
    scheduler s(o, &st);
    for (uint64_t id : {1, 2}) s.add(id, seq_tokens(6, int(id)), 0, clock_type::now());
    s.admit(clock_type::now());
    auto p = seqs_of(s.plan(0, work_kind::prefill));
    REQUIRE(p.size() == 2);
    st.run(p);
    s.complete(0, true);
    // Sequence 1 gets 3 drafts after its next token (4 to compute, all with logits);
    // sequence 2 one token. 4 + 1 rows fit in 6.
    const token_id drafts[] = {11, 12, 13, 14};
    s.append(1, drafts);
    s.set_logits_from(1, 6);
    s.append(2, token_id(20));
    CHECK(s.plan(1, work_kind::prefill).empty()); // neither is prefill work now
    s.complete(1, true);
    const batch& b = s.plan(1, work_kind::decode);
    REQUIRE(b.n_seqs() == 2);
    CHECK(b.n_new(0) == 4);
    CHECK(b.n_seq_logits(0) == 4);
    CHECK(b.n_seq_logits(1) == 1);
    CHECK(b.n_logits() == 5);
    st.run(seqs_of(b));
    s.complete(1, true);
    // Two sequences with 4 drafts each want 8 rows: the second waits for the next step.
    s.append(1, drafts);
    s.append(2, drafts);
    s.set_logits_from(2, 7);
    const batch& b2 = s.plan(1, work_kind::decode);
    CHECK(b2.n_seqs() == 1);
    CHECK(b2.n_logits() == 4);
    st.run(seqs_of(b2));
    s.complete(1, true);
    const batch& b3 = s.plan(1, work_kind::decode);
    CHECK(b3.n_seqs() == 1);
    st.run(seqs_of(b3));
    s.complete(1, true);
}

TEST_CASE("scheduler: prefix cache survives a restart through the page table") {
    fake_store st(8);
    std::map<int32_t, std::tuple<uint64_t, uint64_t, std::vector<int32_t>>> table;
    struct recording_store final : page_store {
        fake_store& inner;
        std::map<int32_t, std::tuple<uint64_t, uint64_t, std::vector<int32_t>>>& table;
        recording_store(fake_store& f, decltype(table) t) : inner(f), table(t) {}
        void published(int32_t p, uint64_t h, uint64_t parent, std::span<const int32_t> t) override {
            inner.published(p, h, parent, t);
            table[p] = {h, parent, std::vector<int32_t>(t.begin(), t.end())};
        }
        void cleared(int32_t p) override { table.erase(p); }
        void copy_page(int32_t a, int32_t b) override { inner.copy_page(a, b); }
    } rec(st, table);
    const auto a = seq_tokens(30, 5);
    {
        scheduler s(opts(16, 8), &rec);
        s.add(1, a, 0, clock_type::now());
        s.admit(clock_type::now());
        prefill_all(s, st, 1);
        s.remove(1);
    }
    CHECK(table.size() == 3); // 24 of 30 tokens in full pages
    scheduler s2(opts(16, 8), &rec);
    for (const auto& [p, e] : table) CHECK(s2.restore(p, std::get<0>(e), std::get<1>(e), std::get<2>(e)));
    // a corrupt entry (tokens not matching its hash) is refused
    CHECK_FALSE(s2.restore(15, 12345, 0, std::vector<int32_t>(8, 1)));
    CHECK(s2.pool().n_cached() == 3);
    s2.add(2, a, 0, clock_type::now());
    s2.admit(clock_type::now());
    CHECK(s2.reused_tokens(2) == 24);
}

TEST_CASE("scheduler: a full pool preempts the latest idle sequence, which comes back and recomputes") {
    fake_store st(4);
    scheduler_options o = opts(6, 4); // 24 positions
    scheduler s(o, &st);
    const auto t1 = seq_tokens(7, 1), t2 = seq_tokens(7, 2);
    s.add(1, t1, 0, clock_type::now());
    s.add(2, t2, 0, clock_type::now());
    s.admit(clock_type::now());
    auto b = seqs_of(s.plan(0, work_kind::prefill));
    CHECK(b.size() == 2);
    st.run(b);
    for (uint64_t id : s.complete(0, true)) s.append(id, 99);
    // both decode until the pool runs out: 4 pages used, 2 free
    int preempted = 0;
    for (int step = 0; step < 12; ++step) {
        auto d = seqs_of(s.plan(1, work_kind::decode));
        auto p = seqs_of(s.plan(0, work_kind::prefill));
        st.run(d);
        st.run(p);
        auto due = s.complete(1, true);
        auto due_p = s.complete(0, true);
        due.insert(due.end(), due_p.begin(), due_p.end());
        for (uint64_t id : due) s.append(id, token_id(100 + step));
        preempted += int(s.take_preempted().size());
        s.admit(clock_type::now());
    }
    CHECK(preempted >= 1);
    CHECK(s.stats().n_preemptions == uint64_t(preempted));
    // the first arrival was never the victim: it kept growing
    CHECK(s.tokens(1).size() > t1.size() + 8);
    for (uint64_t id : {uint64_t(1), uint64_t(2)}) s.remove(id);
    CHECK(s.pool().n_free() == 6);
}

// The engine may remove a sequence (a beam search drops a beam) between the step that preempted
// it and reading take_preempted; it then looked the sequence up and crashed (issue 19's soak).
TEST_CASE("scheduler: a sequence removed after its preemption is not reported as preempted") {
    fake_store st(4);
    scheduler s(opts(6, 4), &st); // 24 positions
    s.add(1, seq_tokens(7, 1), 0, clock_type::now());
    s.add(2, seq_tokens(7, 2), 0, clock_type::now());
    s.admit(clock_type::now());
    st.run(seqs_of(s.plan(0, work_kind::prefill)));
    for (uint64_t id : s.complete(0, true)) s.append(id, 99);
    for (int step = 0; step < 12 && s.stats().n_preemptions == 0; ++step) {
        st.run(seqs_of(s.plan(1, work_kind::decode)));
        for (uint64_t id : s.complete(1, true)) s.append(id, token_id(100 + step));
    }
    REQUIRE(s.stats().n_preemptions == 1);
    s.remove(2); // the victim (the latest arrival), before the engine hears of it
    CHECK(s.take_preempted().empty());
    s.remove(1);
    CHECK(s.pool().n_free() == 6);
}

TEST_CASE("scheduler: higher priority joins first, FIFO within a priority, waiting ages") {
    fake_store st(16);
    scheduler_options o = opts(64);
    o.max_running = 1;
    o.priority_aging_s = 10;
    scheduler s(o, &st);
    const auto t0 = clock_type::now();
    s.add(1, seq_tokens(5, 1), 0, t0);
    s.add(2, seq_tokens(5, 2), 5, t0);
    s.add(3, seq_tokens(5, 3), 5, t0);
    s.admit(t0);
    CHECK(s.take_admitted() == std::vector<uint64_t>{2});
    s.remove(2);
    s.admit(t0);
    CHECK(s.take_admitted() == std::vector<uint64_t>{3});
    s.remove(3);
    // 1 waited 60 s: 0 + 6 > 5
    s.add(4, seq_tokens(5, 4), 5, t0 + std::chrono::seconds(60));
    s.admit(t0 + std::chrono::seconds(60));
    CHECK(s.take_admitted() == std::vector<uint64_t>{1});
}

TEST_CASE("scheduler: a full batch gives a higher priority the place of its lowest idle sequence") {
    fake_store st(16);
    scheduler_options o = opts(64);
    o.max_running = 2;
    o.priority_aging_s = 5;
    scheduler s(o, &st);
    const auto t0 = clock_type::now();
    s.add(1, seq_tokens(20, 1), -1, t0); // background work, as a batch job sends it
    s.add(2, seq_tokens(20, 2), -1, t0);
    s.admit(t0);
    CHECK(s.take_admitted() == std::vector<uint64_t>{1, 2});
    prefill_all(s, st, 2);
    s.append(1, 7);
    s.append(2, 7);

    // Busy sequences are not taken: the live request waits for the step to end.
    s.add(3, seq_tokens(20, 3), 0, t0 + std::chrono::seconds(1));
    const auto step = seqs_of(s.plan(1, work_kind::decode));
    REQUIRE(step.size() == 2);
    s.admit(t0 + std::chrono::seconds(1));
    CHECK(s.take_admitted().empty());
    CHECK(s.take_preempted().empty());
    st.run(step);
    s.complete(1, true);
    // Then it takes the place of the latest arrived of the two, which waits and recomputes.
    s.admit(t0 + std::chrono::seconds(1));
    CHECK(s.take_preempted() == std::vector<uint64_t>{2});
    CHECK(s.take_admitted() == std::vector<uint64_t>{3});
    CHECK(s.stats().n_preemptions == 1);
    CHECK(s.n_computed(2) == 0);

    // Background work never ages up to a live request (or back into its place), however long
    // it waits or runs; equal priorities never take each other's place.
    const auto later = t0 + std::chrono::minutes(10);
    s.add(4, seq_tokens(20, 4), -1, later);
    s.admit(later);
    CHECK(s.take_preempted().empty());
    CHECK(s.take_admitted().empty());
    s.add(5, seq_tokens(20, 5), 0, later); // a live request after ten minutes of batch work
    s.admit(later);
    CHECK(s.take_preempted() == std::vector<uint64_t>{1});
    CHECK(s.take_admitted() == std::vector<uint64_t>{5});
    s.remove(3); // a live request ends: the oldest background sequence comes back
    s.admit(later);
    CHECK(s.take_admitted() == std::vector<uint64_t>{1});
    prefill_all(s, st, 1); // (its prompt's pages from the prefix cache, the rest computed again)
    s.append(1, 9);
    int found = 0;
    for (const auto& v : seqs_of(s.plan(1, work_kind::decode)))
        if (v.id == 1 && ++found) CHECK(st.holds(v.block_table, s.tokens(1), s.n_computed(1)));
    CHECK(found == 1);
}

TEST_CASE("scheduler: live prompts go first, background work is capped per step and takes turns") {
    fake_store st(16);
    scheduler_options o = opts(64);
    o.background_step_tokens = 8;
    scheduler s(o, &st);
    const auto t0 = clock_type::now();
    auto tokens_of = [](const std::vector<seq_view>& b, bool background) {
        int32_t n = 0;
        for (const auto& v : b)
            if ((v.id >= 100) == background) n += int32_t(v.tokens.size());
        return n;
    };
    // One step of `slot`: runs it, appends a token to every sequence due.
    auto step = [&](int slot, work_kind kind) {
        auto b = seqs_of(s.plan(slot, kind));
        st.run(b);
        for (uint64_t id : s.complete(slot, true)) s.append(id, 7);
        return b;
    };
    // Six background sequences (ids 100..105): their prompts in chunks of at most 8 tokens.
    for (uint64_t i = 0; i < 6; ++i) s.add(100 + i, seq_tokens(10, int(i)), -1, t0);
    s.admit(t0);
    int steps = 0;
    for (; steps < 40 && s.n_computed(105) < 10; ++steps) {
        const auto b = step(0, work_kind::both);
        CHECK(tokens_of(b, true) <= 8);
        CHECK(tokens_of(b, true) > 0);
    }
    CHECK(steps >= 60 / 8); // 60 prompt tokens, 8 at a time
    // All six decode now, in turns: 8 of them would fit, and so every one moves each step.
    for (int i = 0; i < 3; ++i) CHECK(step(0, work_kind::both).size() == 6);

    // A live request: its prompt alone in the batch, whole (the step budget, not the cap), and
    // no background decode on another slot while it is computed.
    s.add(1, seq_tokens(30, 9), 0, t0);
    s.admit(t0);
    const auto live = seqs_of(s.plan(0, work_kind::both));
    REQUIRE(live.size() == 1);
    CHECK(live[0].id == 1);
    CHECK(live[0].tokens.size() == 30);
    CHECK(s.plan(1, work_kind::decode).empty());
    s.complete(1, true);
    st.run(live);
    for (uint64_t id : s.complete(0, true)) s.append(id, 7);
    // Then background work comes back beside the live decode.
    auto b = step(1, work_kind::decode);
    CHECK(tokens_of(b, false) == 1);
    CHECK(tokens_of(b, true) == 6);

    // A background prompt waiting: half the cap is kept for it, the decodes take turns.
    s.add(106, seq_tokens(20, 6), -1, t0);
    s.admit(t0);
    std::map<uint64_t, int> turns;
    for (int i = 0; i < 3; ++i) {
        b = step(0, work_kind::both);
        CHECK(tokens_of(b, true) <= 8);
        int32_t decodes = 0, prefill = 0;
        for (const auto& v : b) {
            if (v.id < 100) continue;
            if (v.id == 106) prefill += int32_t(v.tokens.size());
            else ++decodes, ++turns[v.id];
        }
        CHECK(decodes == 4);
        CHECK(prefill == 4);
    }
    CHECK(turns.size() == 6); // 12 turns over 6 decodes: every one had its turn
    for (const auto& [id, n] : turns) CHECK(n == 2);
}

TEST_CASE("scheduler: random workloads always drain, never leak pages, keep every position right") {
    for (uint32_t seed : {1u, 2u, 3u, 4u, 5u}) {
        std::mt19937 rng(seed);
        const int32_t ps = 1 + int32_t(rng() % 8);
        const int32_t n_pages = 8 + int32_t(rng() % 24);
        scheduler_options o = opts(n_pages, ps);
        o.max_running = 1 + int32_t(rng() % 6);
        o.step_tokens = 4 + int32_t(rng() % 40);
        fake_store st(ps);
        scheduler s(o, &st);
        struct want {
            int32_t remaining;
        };
        std::map<uint64_t, want> live;
        uint64_t next_id = 1;
        int finished = 0;
        // a few shared prefixes so the cache gets hits
        std::vector<std::vector<token_id>> prefixes = {seq_tokens(3 * ps, 7), seq_tokens(2 * ps + 1, 8)};
        for (int step = 0; step < 3000 && (finished < 40 || !live.empty()); ++step) {
            if (finished + int(live.size()) < 40 && rng() % 3 == 0) {
                std::vector<token_id> p = prefixes[rng() % 2];
                p.resize(p.size() + 1 + rng() % (size_t(ps) * 2), token_id(rng() % 400 + 3));
                const int32_t total = int32_t(p.size()) + 1 + int32_t(rng() % 10);
                if (s.pages_for(total) <= n_pages) {
                    s.add(next_id, p, int32_t(rng() % 3), clock_type::now());
                    live[next_id++] = {total - int32_t(p.size())};
                }
            }
            s.admit(clock_type::now());
            // the two executors, with random completion order and occasional lost batches
            auto pre = seqs_of(s.plan(0, work_kind::prefill));
            auto dec = seqs_of(s.plan(1, work_kind::decode));
            for (const auto& b : {pre, dec})
                for (const auto& p : b) {
                    REQUIRE(st.holds(p.block_table, s.tokens(p.id), p.n_past));
                    REQUIRE(p.generations.size() == p.block_table.size());
                    for (size_t j = 0; j < p.block_table.size(); ++j)
                        REQUIRE(p.generations[j] == s.pool().generation(p.block_table[j]));
                }
            const bool lose = rng() % 17 == 0;
            if (!lose) st.run(pre);
            st.run(dec);
            std::vector<uint64_t> due = s.complete(0, !lose);
            const auto due_d = s.complete(1, true);
            due.insert(due.end(), due_d.begin(), due_d.end());
            for (uint64_t id : due) {
                auto& w = live.at(id);
                if (--w.remaining == 0) {
                    s.remove(id);
                    live.erase(id);
                    ++finished;
                } else {
                    s.append(id, token_id(rng() % 400 + 3));
                }
            }
            // random cancels of idle sequences
            if (!live.empty() && rng() % 50 == 0) {
                auto it = std::next(live.begin(), long(rng() % live.size()));
                if (!s.busy(it->first)) {
                    s.remove(it->first);
                    live.erase(it);
                    ++finished;
                }
            }
        }
        CHECK_MESSAGE(live.empty(), "seed ", seed);
        CHECK(finished == 40);
        CHECK(s.pool().n_free() == n_pages);
        CHECK(s.stats().n_running == 0);
        CHECK(s.stats().n_waiting == 0);
    }
}
