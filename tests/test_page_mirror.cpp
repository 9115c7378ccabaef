// The page mirror (what a device keeps of host KV pages between forwards): targeted cases, then
// the real scheduler over random workloads (reallocation, copy-on-write, shared prefixes,
// preemption, appends by another worker, lost batches, device failures and restarts) with a
// simulated device whose every read of a past position is checked against the host's truth,
// and every plan compared with a naive model of the contract.
#include "runtime/error.hpp"
#include "runtime/page_mirror.hpp"
#include "runtime/scheduler.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

using namespace tandem;
using clock_type = std::chrono::steady_clock;

namespace {

using slot_list = std::vector<std::pair<int32_t, int32_t>>; // (host page, position in it)

// The contract of page_mirror.hpp written as plainly as possible: a map of resident pages,
// a set of valid positions per page, a clock per touch, linear scans.
class naive_mirror {
public:
    naive_mirror(int32_t capacity, int32_t n_host, int32_t ps) { reset(capacity, n_host, ps); }

    void reset(int32_t capacity, int32_t n_host, int32_t ps) {
        cap_ = std::min(capacity, n_host);
        ps_ = ps;
        forget();
    }
    void forget() {
        res_.clear();
        pending_.clear();
    }

    struct result {
        slot_list uploaded;              // every position copied to the device, sorted
        slot_list written;               // every new position, sorted
        int64_t n_upload_slots = 0, n_kept_slots = 0;
        std::set<int32_t> resident;      // after the batch is placed
    };

    std::optional<result> prepare(const batch& b) {
        struct need_of {
            uint32_t gen;
            bool known;
            int32_t need = 0;
            int32_t w0 = -1, w1 = -1;
        };
        std::vector<int32_t> order; // first appearance
        std::map<int32_t, need_of> pages;
        result r;
        for (int32_t i = 0; i < b.n_seqs(); ++i) {
            const int32_t n_past = b.n_past(i), n_end = n_past + b.n_new(i);
            const auto table = b.table(i);
            const auto gens = b.table_generations(i);
            for (int32_t pos = 0; pos < n_end; ++pos) {
                const int32_t j = pos / ps_, slot = pos % ps_, page = table[size_t(j)];
                const bool known = !gens.empty();
                auto [it, fresh] = pages.try_emplace(page, need_of{known ? gens[size_t(j)] : 0, known});
                if (fresh) order.push_back(page);
                need_of& n = it->second;
                n.known = n.known && known;
                if (pos < n_past) {
                    n.need = std::max(n.need, slot + 1);
                } else {
                    if (n.w0 < 0) n.w0 = slot;
                    n.w1 = slot + 1;
                    r.written.push_back({page, slot});
                }
            }
        }
        if (int32_t(order.size()) > cap_) return std::nullopt;
        for (int32_t p : order) {
            if (res_.contains(p)) continue;
            if (int32_t(res_.size()) == cap_) { // evict the least recently touched page not in the batch
                int32_t victim = -1;
                for (const auto& [q, st] : res_)
                    if (!pages.contains(q) && (victim < 0 || st.last < res_.at(victim).last)) victim = q;
                REQUIRE(victim >= 0);
                res_.erase(victim);
            }
            res_[p] = state{0, false, std::vector<bool>(size_t(ps_), false), 0};
        }
        for (int32_t p : order) res_.at(p).last = ++clock_;
        for (int32_t p : order) {
            state& st = res_.at(p);
            const need_of& n = pages.at(p);
            if (!n.known || !st.known || st.gen != n.gen) {
                std::fill(st.valid.begin(), st.valid.end(), false);
                st.gen = n.gen;
                st.known = n.known;
            }
            const bool empty = std::none_of(st.valid.begin(), st.valid.end(), [](bool v) { return v; });
            int64_t kept = 0;
            for (int32_t s = 0; s < n.need; ++s) kept += st.valid[size_t(s)];
            if (empty && n.need > 0) { // nothing there: the whole page
                for (int32_t s = 0; s < ps_; ++s) r.uploaded.push_back({p, s});
            } else {
                for (int32_t s = 0; s < n.need; ++s)
                    if (!st.valid[size_t(s)]) r.uploaded.push_back({p, s});
            }
            for (int32_t s = 0; s < n.need; ++s) st.valid[size_t(s)] = true;
            r.n_kept_slots += kept;
            r.n_upload_slots += n.need - kept;
            if (n.w0 >= 0) {
                for (int32_t s = n.w0; s < ps_; ++s) st.valid[size_t(s)] = false;
                pending_.push_back({p, n.w0, n.w1});
            }
        }
        std::sort(r.uploaded.begin(), r.uploaded.end());
        std::sort(r.written.begin(), r.written.end());
        for (const auto& [q, st] : res_) r.resident.insert(q);
        return r;
    }

    void commit() {
        for (const auto& [p, w0, w1] : pending_)
            for (int32_t s = w0; s < w1; ++s) res_.at(p).valid[size_t(s)] = true;
        pending_.clear();
    }

private:
    struct state {
        uint32_t gen;
        bool known;
        std::vector<bool> valid;
        uint64_t last;
    };
    int32_t cap_ = 0, ps_ = 1;
    std::map<int32_t, state> res_;
    std::vector<std::tuple<int32_t, int32_t, int32_t>> pending_;
    uint64_t clock_ = 0;
};

// Every position a list of copies moves, sorted; checks each copy's shape on the way.
slot_list expand(const std::vector<page_copy>& copies, int32_t ps) {
    slot_list out;
    for (const page_copy& c : copies) {
        if (c.whole) CHECK((c.slot_begin == 0 && c.slot_end == ps && c.n_pages >= 1));
        else CHECK((c.n_pages == 1 && 0 <= c.slot_begin && c.slot_begin < c.slot_end && c.slot_end <= ps));
        for (int32_t k = 0; k < c.n_pages; ++k)
            for (int32_t s = c.slot_begin; s < c.slot_end; ++s) out.push_back({c.host_page + k, s});
    }
    std::sort(out.begin(), out.end());
    return out;
}

// A sequence for tests that build batches by hand: tokens only give the count.
struct hand_seq {
    std::vector<token_id> tokens;
    std::vector<int32_t> table;
    std::vector<uint32_t> gens;
    int32_t n_past = 0;
};

// A batch of hand-built sequences (ids by their order).
batch to_batch(const std::vector<hand_seq>& seqs) {
    batch b;
    for (size_t i = 0; i < seqs.size(); ++i) {
        const hand_seq& s = seqs[i];
        b.add_seq(i, s.n_past, s.tokens, s.table, s.gens, s.n_past + int32_t(s.tokens.size()) - 1);
    }
    return b;
}

hand_seq make_seq(std::vector<int32_t> table, std::vector<uint32_t> gens, int32_t n_past, int32_t n_new) {
    return {std::vector<token_id>(size_t(n_new), 1), std::move(table), std::move(gens), n_past};
}

} // namespace

TEST_CASE("page_mirror: decode steps upload only what the device lacks; another worker's appends come as ranges") {
    page_mirror m;
    m.reset(8, 8, 4); // every host page has its own device page (identity)
    CHECK(m.capacity() == 8);
    mirror_plan plan;
    // Positions 0..9 were computed elsewhere (a CPU prefill); the first decode step brings
    // them over: pages 2 and 3 whole in one copy, the partial page 5 whole too.
    hand_seq s = make_seq({2, 3, 5}, {1, 1, 1}, 10, 1);
    batch b = to_batch({s});
    REQUIRE(m.prepare(b, plan));
    REQUIRE(plan.uploads.size() == 2);
    CHECK((plan.uploads[0].host_page == 2 && plan.uploads[0].dev_page == 2 && plan.uploads[0].n_pages == 2 &&
           plan.uploads[0].whole));
    CHECK((plan.uploads[1].host_page == 5 && plan.uploads[1].n_pages == 1 && plan.uploads[1].whole));
    CHECK(plan.n_upload_slots == 10);
    CHECK(plan.n_kept_slots == 0);
    CHECK(plan.tables == std::vector<int32_t>{2, 3, 5});
    CHECK(plan.table_begin == std::vector<int32_t>{0});
    REQUIRE(plan.writes.size() == 1);
    CHECK((plan.writes[0].host_page == 5 && !plan.writes[0].whole && plan.writes[0].slot_begin == 2 &&
           plan.writes[0].slot_end == 3));
    CHECK(m.valid_of(5) == 2); // the new position is not valid until the forward succeeded
    m.commit();
    CHECK(m.valid_of(5) == 3);

    // The next steps upload nothing: the device wrote those positions itself.
    s.n_past = 11;
    b = to_batch({s});
    REQUIRE(m.prepare(b, plan));
    CHECK(plan.uploads.empty());
    CHECK(plan.n_kept_slots == 11);
    m.commit();
    s = make_seq({2, 3, 5, 6}, {1, 1, 1, 1}, 12, 1); // a new page for position 12
    b = to_batch({s});
    REQUIRE(m.prepare(b, plan));
    CHECK(plan.uploads.empty());
    CHECK(plan.n_kept_slots == 12);
    REQUIRE(plan.writes.size() == 1);
    CHECK((plan.writes[0].host_page == 6 && plan.writes[0].slot_begin == 0 && plan.writes[0].slot_end == 1 &&
           !plan.writes[0].whole));
    m.commit();

    // Another worker computed positions 13..17: page 6 gets the range it lacks, page 7 (new) whole.
    s = make_seq({2, 3, 5, 6, 7}, {1, 1, 1, 1, 1}, 18, 1);
    b = to_batch({s});
    REQUIRE(m.prepare(b, plan));
    REQUIRE(plan.uploads.size() == 2);
    CHECK((plan.uploads[0].host_page == 6 && !plan.uploads[0].whole && plan.uploads[0].slot_begin == 1 &&
           plan.uploads[0].slot_end == 4));
    CHECK((plan.uploads[1].host_page == 7 && plan.uploads[1].whole));
    CHECK(plan.n_upload_slots == 3 + 2);
    CHECK(plan.n_kept_slots == 12 + 1);
    m.commit();

    // Page 3 given new contents (another generation): whole again; the rest stays.
    s = make_seq({2, 3, 5, 6, 7}, {1, 2, 1, 1, 1}, 19, 1);
    b = to_batch({s});
    REQUIRE(m.prepare(b, plan));
    REQUIRE(plan.uploads.size() == 1);
    CHECK((plan.uploads[0].host_page == 3 && plan.uploads[0].whole));
    CHECK(plan.n_upload_slots == 4);
    m.commit();

    // Without generations nothing can be vouched for: every past position each time.
    s.gens.clear();
    s.table.push_back(4);
    s.n_past = 20;
    for (int rep = 0; rep < 2; ++rep) {
        b = to_batch({s});
        REQUIRE(m.prepare(b, plan));
        CHECK(plan.n_upload_slots == 20);
        CHECK(plan.n_kept_slots == 0);
        m.commit();
    }
}

TEST_CASE("page_mirror: sequences sharing prefix pages share their device pages, uploaded once") {
    page_mirror m;
    m.reset(16, 16, 4);
    hand_seq a = make_seq({0, 1, 2}, {5, 5, 5}, 10, 1), c = make_seq({0, 1, 3}, {5, 5, 9}, 9, 1);
    const batch b = to_batch({a, c});
    mirror_plan plan;
    REQUIRE(m.prepare(b, plan));
    CHECK(plan.n_pages == 4);
    REQUIRE(plan.uploads.size() == 1); // pages 0..3, first appearance order, consecutive
    CHECK((plan.uploads[0].host_page == 0 && plan.uploads[0].n_pages == 4 && plan.uploads[0].whole));
    CHECK(plan.n_upload_slots == 4 + 4 + 2 + 1);
    CHECK(plan.tables == std::vector<int32_t>{0, 1, 2, 0, 1, 3});
    CHECK(plan.table_begin == std::vector<int32_t>{0, 3});
    CHECK(plan.writes.size() == 2);
    m.commit();
    CHECK(m.valid_of(2) == 3);
    CHECK(m.valid_of(3) == 2);
}

TEST_CASE("page_mirror: fewer device pages than host pages: least recently used evicted, batch pages never") {
    page_mirror m;
    m.reset(3, 10, 2);
    CHECK(m.capacity() == 3);
    mirror_plan plan;
    auto one = [&](int32_t page, uint32_t gen = 1) {
        hand_seq s = make_seq({page}, {gen}, 1, 1);
        const batch b = to_batch({s});
        REQUIRE(m.prepare(b, plan));
        m.commit();
    };
    one(4);
    one(7);
    one(1);
    CHECK((m.dev_page_of(4) == 0 && m.dev_page_of(7) == 1 && m.dev_page_of(1) == 2));
    CHECK(m.n_resident() == 3);
    one(4); // 4 is used again: 7 is now the least recently used
    CHECK(plan.uploads.empty());
    one(9);
    CHECK(m.dev_page_of(7) == -1);
    CHECK(m.dev_page_of(9) == 1);
    CHECK(m.valid_of(9) == 2);
    // A batch of four pages does not fit: refused, nothing changed.
    {
        hand_seq s = make_seq({0, 2, 3, 5}, {1, 1, 1, 1}, 6, 1);
        const batch b = to_batch({s});
        CHECK_FALSE(m.prepare(b, plan));
        CHECK(plan.n_pages == 4);
        CHECK((m.dev_page_of(4) == 0 && m.dev_page_of(9) == 1 && m.dev_page_of(1) == 2));
        CHECK(m.valid_of(4) == 2);
    }
    // The batch's own resident pages are kept even when they are the least recently used:
    // 1 is the oldest, but it is in the batch, so 4 goes.
    {
        hand_seq s = make_seq({1, 9, 5}, {1, 1, 1}, 5, 1);
        const batch b = to_batch({s});
        REQUIRE(m.prepare(b, plan));
        CHECK(m.dev_page_of(4) == -1);
        CHECK(m.dev_page_of(5) == 0);
        CHECK(plan.n_kept_slots == 4); // pages 1 and 9 were resident and full
        CHECK(plan.tables == std::vector<int32_t>{2, 1, 0});
        m.commit();
    }
    // Within one batch, first appearance is oldest: after {6, 8, 0} the next page evicts 6.
    {
        hand_seq s = make_seq({6, 8, 0}, {1, 1, 1}, 5, 1);
        const batch b = to_batch({s});
        REQUIRE(m.prepare(b, plan));
        m.commit();
        one(2);
        CHECK(m.dev_page_of(6) == -1);
        CHECK(m.dev_page_of(8) >= 0);
        CHECK(m.dev_page_of(0) >= 0);
    }
}

TEST_CASE("page_mirror: batches no pool owner sends are errors that change nothing") {
    page_mirror m;
    m.reset(4, 4, 2);
    mirror_plan plan;
    hand_seq good = make_seq({1, 2, 3}, {3, 3, 3}, 3, 1); // a table may be longer than the positions need
    batch b = to_batch({good});
    REQUIRE(m.prepare(b, plan));
    m.commit();
    auto bad = [&](std::vector<hand_seq> seqs) {
        CHECK_THROWS_AS(m.prepare(to_batch(seqs), plan), error);
    };
    bad({make_seq({1, 2}, {3}, 3, 1)});                                     // a generation missing
    bad({make_seq({1, 4}, {3, 3}, 3, 1)});                                  // page outside the pool
    bad({make_seq({1}, {3}, 3, 1)});                                        // pages do not cover the positions
    bad({make_seq({1, 2}, {3, 3}, 3, 1), make_seq({0, 2}, {1, 3}, 2, 1)}); // two sequences write page 2
    bad({make_seq({1, 2}, {3, 3}, 3, 1), make_seq({1, 0}, {4, 1}, 2, 1)}); // page 1 with two generations
    // Nothing changed, nothing left marked: the next batch plans as if they never came.
    CHECK(m.valid_of(1) == 2);
    CHECK(m.valid_of(2) == 2);
    good.n_past = 4;
    b = to_batch({good});
    REQUIRE(m.prepare(b, plan));
    CHECK(plan.uploads.empty());
    CHECK(plan.n_kept_slots == 4);
    CHECK(plan.n_pages == 3);
    m.commit();
}

TEST_CASE("page_mirror: after a failed forward everything is uploaded again") {
    page_mirror m;
    m.reset(4, 4, 2);
    mirror_plan plan;
    hand_seq s = make_seq({0, 1}, {1, 1}, 3, 1);
    batch b = to_batch({s});
    REQUIRE(m.prepare(b, plan));
    m.commit();
    s.n_past = 4;
    s.table.push_back(2);
    s.gens.push_back(1);
    b = to_batch({s});
    REQUIRE(m.prepare(b, plan));
    CHECK(plan.n_upload_slots == 0);
    m.forget(); // the forward threw: its uploads may not have happened
    CHECK(m.n_resident() == 0);
    REQUIRE(m.prepare(b, plan));
    CHECK(plan.n_upload_slots == 4);
    m.commit();
}

// ---- the scheduler, a host pool and simulated devices over random workloads

namespace {

// K/V of a position stands for the whole prefix up to it: a chained hash of the tokens.
std::vector<uint64_t> kv_values(std::span<const token_id> tokens) {
    std::vector<uint64_t> v(tokens.size());
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < tokens.size(); ++i) {
        h = (h ^ uint64_t(uint32_t(tokens[i]))) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 29;
        v[i] = h | 1; // never 0: 0 is what an unwritten host page holds
    }
    return v;
}

// The shared pool: pages of positions; copy-on-write copies them.
struct host_pool final : page_store {
    int32_t ps;
    std::vector<std::vector<uint64_t>> kv; // [n_pages][ps]
    host_pool(int32_t n_pages, int32_t ps_) : ps(ps_), kv(size_t(n_pages), std::vector<uint64_t>(size_t(ps_), 0)) {}
    void published(int32_t, uint64_t, uint64_t, std::span<const int32_t>) override {}
    void cleared(int32_t) override {}
    void copy_page(int32_t src, int32_t dst) override { kv[size_t(dst)] = kv[size_t(src)]; }

    // Sequence i of b finds its past in its pages.
    bool holds(const batch& b, int32_t i, std::span<const uint64_t> want) const {
        const auto table = b.table(i);
        for (int32_t pos = 0; pos < b.n_past(i); ++pos)
            if (kv[size_t(table[size_t(pos / ps)])][size_t(pos % ps)] != want[size_t(pos)]) return false;
        return true;
    }
    // A CPU worker: computes the new positions into the pages; one that crashes writes only
    // the first `limit`.
    void run(const batch& b, const scheduler& s, size_t limit = SIZE_MAX) {
        for (size_t t = 0; t < b.tokens.size() && t < limit; ++t) {
            const int32_t i = b.seq[t], pos = b.pos[t];
            const auto want = kv_values(s.tokens(b.seq_id[size_t(i)]));
            kv[size_t(b.table(i)[size_t(pos / ps)])][size_t(pos % ps)] = want[size_t(pos)];
        }
    }
};

// A device that runs forwards the way the CUDA runner does: page_mirror plans, the copies
// move values between host pages and device pages, attention reads every past position from
// the device pages, and the new positions are written there and back to the host.
struct sim_device {
    bool keep;                             // keep pages between forwards (decode), else scratch
    int32_t ps, n_host;
    page_mirror m;
    naive_mirror naive;
    std::vector<std::vector<uint64_t>> mem;// [capacity][ps]
    std::mt19937& rng;
    int64_t n_bad_reads = 0, n_upload_slots = 0, n_kept_slots = 0, n_forwards = 0, n_grows = 0;
    int64_t n_partial_uploads = 0; // copies of the positions a page lacks (another worker appended them)

    sim_device(bool keep_, int32_t capacity, int32_t n_host_, int32_t ps_, std::mt19937& r)
        : keep(keep_), ps(ps_), n_host(n_host_), naive(capacity, n_host_, ps_), rng(r) {
        reset(capacity);
    }
    // New device pages (a grown mirror, or a restarted worker): nothing valid, garbage inside.
    void reset(int32_t capacity) {
        m.reset(capacity, n_host, ps);
        naive.reset(capacity, n_host, ps);
        mem.assign(size_t(m.capacity()), std::vector<uint64_t>(size_t(ps)));
        for (auto& pg : mem)
            for (auto& v : pg) v = rng() | (uint64_t(rng()) << 32);
    }

    // Returns false when the forward failed (after `fail`: uploads done, new positions
    // computed, part of them written back, then an error).
    bool forward(const batch& planned, host_pool& host, const scheduler& s, bool fail, bool drop_some_generations) {
        ++n_forwards;
        batch bs = planned;
        if (drop_some_generations && rng() % 4 == 0) bs.generations.clear(); // a caller that cannot vouch for any
        if (!keep) {
            m.forget();
            naive.forget();
        }
        mirror_plan plan;
        if (!m.prepare(bs, plan)) { // as the runner does: more device pages, dropping the old
            CHECK_FALSE(naive.prepare(bs).has_value());
            CHECK(plan.n_pages > m.capacity());
            reset(std::max(plan.n_pages, m.capacity() * 3 / 2));
            ++n_grows;
            REQUIRE(m.prepare(bs, plan));
        }
        const auto want = naive.prepare(bs);
        REQUIRE(want.has_value());
        CHECK(expand(plan.uploads, ps) == want->uploaded);
        CHECK(expand(plan.writes, ps) == want->written);
        CHECK(plan.n_upload_slots == want->n_upload_slots);
        CHECK(plan.n_kept_slots == want->n_kept_slots);
        CHECK(plan.n_pages <= m.capacity());
        // Residency as the naive model has it, distinct device pages, identity when it fits.
        std::set<int32_t> devs;
        for (int32_t p = 0; p < n_host; ++p) {
            const int32_t d = m.dev_page_of(p);
            CHECK((d >= 0) == want->resident.contains(p));
            if (d < 0) continue;
            CHECK(d < m.capacity());
            CHECK(devs.insert(d).second);
            if (m.capacity() == n_host) CHECK(d == p);
        }
        for (const page_copy& c : plan.uploads)
            for (int32_t k = 0; k < c.n_pages; ++k) CHECK(m.dev_page_of(c.host_page + k) == c.dev_page + k);
        for (const page_copy& c : plan.writes)
            for (int32_t k = 0; k < c.n_pages; ++k) CHECK(m.dev_page_of(c.host_page + k) == c.dev_page + k);
        n_upload_slots += plan.n_upload_slots;
        n_kept_slots += plan.n_kept_slots;
        for (const page_copy& c : plan.uploads) n_partial_uploads += !c.whole;

        for (const page_copy& c : plan.uploads)
            for (int32_t k = 0; k < c.n_pages; ++k)
                for (int32_t sl = c.slot_begin; sl < c.slot_end; ++sl)
                    mem[size_t(c.dev_page + k)][size_t(sl)] = host.kv[size_t(c.host_page + k)][size_t(sl)];
        REQUIRE(int32_t(plan.table_begin.size()) == bs.n_seqs());
        for (int32_t i = 0; i < bs.n_seqs(); ++i) {
            const auto vals = kv_values(s.tokens(bs.seq_id[size_t(i)]));
            const int32_t* table = plan.tables.data() + plan.table_begin[size_t(i)];
            const int32_t n_past = bs.n_past(i);
            for (int32_t pos = 0; pos < n_past; ++pos) { // attention reads the past
                CHECK(table[pos / ps] == m.dev_page_of(bs.table(i)[size_t(pos / ps)]));
                if (mem[size_t(table[pos / ps])][size_t(pos % ps)] != vals[size_t(pos)]) ++n_bad_reads;
            }
            for (int32_t pos = n_past; pos < n_past + bs.n_new(i); ++pos) // kv_store writes the new positions
                mem[size_t(table[pos / ps])][size_t(pos % ps)] = vals[size_t(pos)];
        }
        const size_t n_writes = fail ? rng() % (plan.writes.size() + 1) : plan.writes.size();
        for (size_t w = 0; w < n_writes; ++w) {
            const page_copy& c = plan.writes[w];
            for (int32_t k = 0; k < c.n_pages; ++k)
                for (int32_t sl = c.slot_begin; sl < c.slot_end; ++sl)
                    host.kv[size_t(c.host_page + k)][size_t(sl)] = mem[size_t(c.dev_page + k)][size_t(sl)];
        }
        if (fail) {
            m.forget();
            naive.forget();
            return false;
        }
        m.commit();
        naive.commit();
        return true;
    }
};

struct workload_result {
    int64_t bad_reads = 0, uploaded = 0, kept = 0, forwards = 0, partial_uploads = 0;
    int finished = 0;
};

// The two-worker engine over one scheduler: prefill on the CPU, on a scratch device (GPU
// prefill), or now and then on the decode device itself (one GPU for both: a sequence's
// pages then hold positions it computed and others the CPU appended since); decode on a
// device that keeps its pages; lost batches of both kinds, decode worker restarts, callers
// without generations now and then.
workload_result run_workload(uint32_t seed, int32_t dev_capacity_mode) {
    std::mt19937 rng(seed);
    const int32_t ps = 1 + int32_t(rng() % 8);
    const int32_t n_pages = 8 + int32_t(rng() % 24);
    scheduler_options o;
    o.page_size = ps;
    o.n_pages = n_pages;
    o.max_running = 1 + int32_t(rng() % 6);
    o.step_tokens = 4 + int32_t(rng() % 24); // small: prompts take several chunks
    o.prefix_cache = rng() % 5 != 0;
    o.prefix_seed = 42;
    host_pool host(n_pages, ps);
    scheduler s(o, &host);
    // 0: a device page per host page; 1: fewer (evicting); 2: one, grown as batches need
    const int32_t cap = dev_capacity_mode == 0   ? n_pages
                        : dev_capacity_mode == 1 ? 1 + int32_t(rng() % uint32_t(n_pages))
                                                 : 1;
    sim_device dec(true, cap, n_pages, ps, rng), pre(false, 0, n_pages, ps, rng);
    CAPTURE(seed);
    CAPTURE(dev_capacity_mode);
    CAPTURE(ps);
    CAPTURE(n_pages);

    std::map<uint64_t, int32_t> live; // id -> tokens still to generate
    uint64_t next_id = 1;
    int finished = 0;
    const int n_requests = 40;
    // Shared prefixes so the cache hits, and prompts that end on a cached page (copy-on-write).
    std::vector<std::vector<token_id>> prefixes;
    for (int k = 0; k < 3; ++k) {
        std::vector<token_id> p(size_t(ps) * size_t(1 + k) + size_t(k == 1));
        for (auto& t : p) t = token_id(rng() % 50 + 3);
        prefixes.push_back(p);
    }
    for (int step = 0; step < 4000 && (finished < n_requests || !live.empty()); ++step) {
        if (finished + int(live.size()) < n_requests && rng() % 3 == 0) {
            std::vector<token_id> p = prefixes[rng() % prefixes.size()];
            const size_t extra = rng() % 3 == 0 ? 0 : 1 + rng() % (size_t(ps) * 2);
            for (size_t i = 0; i < extra; ++i) p.push_back(token_id(rng() % 400 + 3));
            const int32_t total = int32_t(p.size()) + 1 + int32_t(rng() % 12);
            if (s.pages_for(total) <= n_pages) {
                s.add(next_id, p, int32_t(rng() % 3), clock_type::now());
                live[next_id++] = total - int32_t(p.size());
            }
        }
        s.admit(clock_type::now());
        const batch& pb = s.plan(0, work_kind::prefill);
        const batch& db = s.plan(1, work_kind::decode);
        for (const batch* b : {&pb, &db})
            for (int32_t i = 0; i < b->n_seqs(); ++i)
                REQUIRE(host.holds(*b, i, kv_values(s.tokens(b->seq_id[size_t(i)]))));

        bool pre_ok = true, dec_ok = true;
        if (!pb.empty()) {
            const bool lose = rng() % 17 == 0;
            const uint32_t where = rng() % 3;
            if (where == 0) { // GPU prefill: scratch device pages
                pre_ok = pre.forward(pb, host, s, lose, false);
            } else if (where == 1) { // on the decode device, which keeps what it computes
                pre_ok = dec.forward(pb, host, s, lose, false);
            } else { // CPU prefill; a crash leaves some positions written
                host.run(pb, s, lose ? rng() % (pb.tokens.size() + 1) : SIZE_MAX);
                pre_ok = !lose;
            }
        }
        if (!db.empty()) {
            const uint32_t ev = rng() % 40;
            dec_ok = dec.forward(db, host, s, ev == 0, rng() % 10 == 0);
            if (dec_ok && ev == 1) { // the worker died after its forward: result lost, device fresh
                dec.reset(dec.m.capacity());
                dec_ok = false;
            }
        }
        if (rng() % 97 == 0) dec.reset(dec.m.capacity()); // restarted while idle
        std::vector<uint64_t> due = s.complete(0, pre_ok);
        const auto due_d = s.complete(1, dec_ok);
        due.insert(due.end(), due_d.begin(), due_d.end());
        for (uint64_t id : due) {
            if (--live.at(id) == 0) {
                s.remove(id);
                live.erase(id);
                ++finished;
            } else {
                s.append(id, token_id(rng() % 400 + 3));
            }
        }
        if (!live.empty() && rng() % 50 == 0) { // a cancel
            auto it = std::next(live.begin(), long(rng() % live.size()));
            if (!s.busy(it->first)) {
                s.remove(it->first);
                live.erase(it);
                ++finished;
            }
        }
    }
    CHECK(live.empty());
    CHECK(s.pool().n_free() == n_pages);
    workload_result r;
    r.bad_reads = dec.n_bad_reads + pre.n_bad_reads;
    r.uploaded = dec.n_upload_slots;
    r.kept = dec.n_kept_slots;
    r.forwards = dec.n_forwards;
    r.partial_uploads = dec.n_partial_uploads;
    r.finished = finished;
    return r;
}

} // namespace

TEST_CASE("page_mirror: random scheduler workloads never read a stale position, and equal the naive model") {
    int64_t uploaded = 0, kept = 0, forwards = 0, partial = 0;
    for (int32_t mode : {0, 1, 2}) {
        for (uint32_t seed = 1; seed <= 12; ++seed) {
            const workload_result r = run_workload(seed * 31 + uint32_t(mode), mode);
            CHECK_MESSAGE(r.bad_reads == 0, "seed ", seed, " mode ", mode);
            CHECK(r.finished == 40);
            uploaded += r.uploaded;
            kept += r.kept;
            forwards += r.forwards;
            partial += r.partial_uploads;
        }
    }
    // The point of the mirror: most of what decode steps read was on the device already.
    MESSAGE(forwards, " forwards on the decode device: ", uploaded, " past positions uploaded (", partial,
            " copies of positions a page lacked), ", kept, " kept on the device");
    CHECK(forwards > 1000);
    CHECK(partial > 50); // the slot-range path is exercised, not only whole pages
    CHECK(kept > 2 * uploaded);
}
