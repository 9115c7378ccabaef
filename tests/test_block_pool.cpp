// The block pool against a naive model of its contract (vectors, linear scans, a deque for the
// free order), driven by long random operation sequences; targeted eviction cases; prefix_hash.
#include "runtime/block_pool.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <random>
#include <set>
#include <vector>

using namespace tandem;

namespace {

// The contract of block_pool.hpp written as plainly as possible: O(n) everywhere, no links.
class naive_pool {
public:
    explicit naive_pool(int32_t n) : ref_(size_t(n), 0), hash_(size_t(n)), gen_(size_t(n), 0) {
        for (int32_t p = 0; p < n; ++p) free_.push_back(p);
    }

    int32_t n_pages() const { return int32_t(ref_.size()); }
    int32_t n_free() const { return int32_t(free_.size()); }
    int32_t n_cached() const {
        return int32_t(std::count_if(free_.begin(), free_.end(), [&](int32_t p) { return hash_[size_t(p)].has_value(); }));
    }
    // The most pages referenced at once: the driver calls note_use() after every operation.
    int32_t n_used_peak() const { return peak_; }
    void note_use() {
        peak_ = std::max(peak_, int32_t(std::count_if(ref_.begin(), ref_.end(), [](int32_t r) { return r > 0; })));
    }

    std::optional<std::vector<int32_t>> allocate(int32_t n) {
        if (n < 0 || n > n_free()) return std::nullopt;
        std::vector<int32_t> out;
        for (int32_t i = 0; i < n; ++i) {
            const int32_t p = free_.front();
            free_.pop_front();
            ref_[size_t(p)] = 1;
            ++gen_[size_t(p)]; // handed out for new contents
            if (hash_[size_t(p)]) {
                hash_[size_t(p)].reset();
                evicted_.push_back(p);
            }
            out.push_back(p);
        }
        return out;
    }

    void add_ref(int32_t p) {
        if (ref_[size_t(p)] == 0) {
            REQUIRE(hash_[size_t(p)].has_value()); // the driver only revives cached pages
            remove_free(p);
        }
        ++ref_[size_t(p)];
    }

    void release(const std::vector<int32_t>& pages) {
        for (int32_t p : pages) {
            REQUIRE(ref_[size_t(p)] > 0);
            if (--ref_[size_t(p)] > 0) continue;
            if (hash_[size_t(p)])
                free_.push_back(p);
            else
                free_.push_front(p);
        }
    }

    int32_t ref_count(int32_t p) const { return ref_[size_t(p)]; }
    uint32_t generation(int32_t p) const { return gen_[size_t(p)]; }

    bool set_hash(int32_t p, uint64_t h) {
        REQUIRE(ref_[size_t(p)] > 0);
        if (hash_[size_t(p)]) return *hash_[size_t(p)] == h;
        if (lookup(h)) return false;
        hash_[size_t(p)] = h;
        return true;
    }

    std::optional<int32_t> lookup(uint64_t h) const {
        for (int32_t p = 0; p < n_pages(); ++p)
            if (hash_[size_t(p)] == h) return p;
        return std::nullopt;
    }

    std::optional<uint64_t> hash_of(int32_t p) const { return hash_[size_t(p)]; }

    void drop_hash(int32_t p) {
        if (!hash_[size_t(p)]) return;
        hash_[size_t(p)].reset();
        if (ref_[size_t(p)] == 0) {
            remove_free(p);
            free_.push_front(p);
        }
    }

    bool restore_cached(int32_t p, uint64_t h) {
        REQUIRE(ref_[size_t(p)] == 0);
        REQUIRE_FALSE(hash_[size_t(p)].has_value());
        if (lookup(h)) return false;
        remove_free(p);
        hash_[size_t(p)] = h;
        ++gen_[size_t(p)]; // contents from before a restart
        free_.push_back(p);
        return true;
    }

    std::vector<int32_t> take_evicted() {
        std::vector<int32_t> out;
        out.swap(evicted_);
        return out;
    }

    std::vector<int32_t> free_list() const { return {free_.begin(), free_.end()}; }

private:
    void remove_free(int32_t p) {
        auto it = std::find(free_.begin(), free_.end(), p);
        REQUIRE(it != free_.end());
        free_.erase(it);
    }

    std::vector<int32_t> ref_;
    std::vector<std::optional<uint64_t>> hash_;
    std::vector<uint32_t> gen_;
    std::deque<int32_t> free_; // front: where allocation takes from
    std::vector<int32_t> evicted_;
    int32_t peak_ = 0;
};

// Every observable of the two pools is equal. `hashes` are the values the driver uses.
void require_same(const block_pool& pool, const naive_pool& ref, uint64_t n_hashes) {
    REQUIRE(pool.n_pages() == ref.n_pages());
    REQUIRE(pool.n_free() == ref.n_free());
    REQUIRE(pool.n_cached() == ref.n_cached());
    REQUIRE(pool.n_used_peak() == ref.n_used_peak());
    REQUIRE(pool.free_list() == ref.free_list());
    for (int32_t p = 0; p < ref.n_pages(); ++p) {
        REQUIRE(pool.ref_count(p) == ref.ref_count(p));
        REQUIRE(pool.hash_of(p) == ref.hash_of(p));
        REQUIRE(pool.generation(p) == ref.generation(p));
    }
    for (uint64_t h = 0; h < n_hashes; ++h) REQUIRE(pool.lookup(h) == ref.lookup(h));
}

// One random sequence of every operation on a pool of n_pages; arguments are always valid
// by the contract (the model's state says which are).
void drive(uint32_t seed, int32_t n_pages, int n_steps) {
    std::mt19937 g(seed);
    auto pick = [&](uint64_t n) { return g() % n; };
    // Few distinct hashes so that set_hash and restore_cached collide often.
    const uint64_t n_hashes = uint64_t(n_pages) + 3;
    block_pool pool(n_pages);
    naive_pool ref(n_pages);
    std::vector<int32_t> held; // one entry per reference the driver holds
    int counts[10] = {};
    for (int step = 0; step < n_steps; ++step) {
        const int op = int(pick(10));
        CAPTURE(seed);
        CAPTURE(n_pages);
        CAPTURE(step);
        CAPTURE(op);
        switch (op) {
        case 0:
        case 1: { // allocate, sometimes more than is free
            const int32_t n = int32_t(pick(uint64_t(std::min(n_pages, 8)) + 2));
            const auto a = pool.allocate(n);
            const auto b = ref.allocate(n);
            REQUIRE(a == b);
            if (a) held.insert(held.end(), a->begin(), a->end());
            break;
        }
        case 2:
        case 3: { // release a random handful of held references, in random order
            if (held.empty()) break;
            std::shuffle(held.begin(), held.end(), g);
            const size_t k = 1 + pick(std::min<size_t>(held.size(), 6));
            std::vector<int32_t> pages(held.end() - long(k), held.end());
            held.resize(held.size() - k);
            pool.release(pages);
            ref.release(pages);
            break;
        }
        case 4: { // add_ref: a referenced page, or revive a cached free one (found by lookup)
            std::vector<int32_t> ok;
            for (int32_t p = 0; p < n_pages; ++p)
                if (ref.ref_count(p) > 0 || ref.hash_of(p)) ok.push_back(p);
            if (ok.empty()) break;
            int32_t p = ok[pick(ok.size())];
            if (pick(2) == 0 && ref.hash_of(p)) { // the way the owner finds it: by its hash
                const auto found = pool.lookup(*ref.hash_of(p));
                REQUIRE(found == std::optional<int32_t>(p));
            }
            pool.add_ref(p);
            ref.add_ref(p);
            held.push_back(p);
            break;
        }
        case 5: { // set_hash on a referenced page
            if (held.empty()) break;
            const int32_t p = held[pick(held.size())];
            const uint64_t h = pick(n_hashes);
            REQUIRE(pool.set_hash(p, h) == ref.set_hash(p, h));
            break;
        }
        case 6: { // lookup (compared for every hash after each step; also a revival path)
            const uint64_t h = pick(n_hashes);
            REQUIRE(pool.lookup(h) == ref.lookup(h));
            break;
        }
        case 7: { // drop_hash of any page, hashed or not, free or not
            const int32_t p = int32_t(pick(uint64_t(n_pages)));
            pool.drop_hash(p);
            ref.drop_hash(p);
            break;
        }
        case 8: { // restore_cached on a free page without a hash
            std::vector<int32_t> ok;
            for (int32_t p = 0; p < n_pages; ++p)
                if (ref.ref_count(p) == 0 && !ref.hash_of(p)) ok.push_back(p);
            if (ok.empty()) break;
            const int32_t p = ok[pick(ok.size())];
            const uint64_t h = pick(n_hashes);
            REQUIRE(pool.restore_cached(p, h) == ref.restore_cached(p, h));
            break;
        }
        case 9:
            REQUIRE(pool.take_evicted() == ref.take_evicted());
            break;
        }
        ++counts[op];
        ref.note_use();
        require_same(pool, ref, n_hashes);
    }
    REQUIRE(pool.take_evicted() == ref.take_evicted());
    pool.release(held);
    ref.release(held);
    require_same(pool, ref, n_hashes);
    CHECK(pool.n_free() == n_pages);
    CHECK(pool.n_used_peak() > 0);
    for (int c : counts) CHECK(c > 0); // every operation was exercised
}

} // namespace

TEST_CASE("block_pool equals a naive model over random operation sequences") {
    for (uint32_t seed : {1u, 2u, 3u, 7u, 42u, 1234u}) {
        for (int32_t n_pages : {1, 2, 3, 5, 8, 17, 64}) drive(seed * 1000 + uint32_t(n_pages), n_pages, 3000);
        std::mt19937 g(seed);
        for (int i = 0; i < 4; ++i) drive(seed * 7919 + uint32_t(i), int32_t(1 + g() % 64), 3000);
    }
}

TEST_CASE("a fresh pool: every page free, in page order, none cached") {
    block_pool pool(5);
    CHECK(pool.n_free() == 5);
    CHECK(pool.n_cached() == 0);
    CHECK(pool.free_list() == std::vector<int32_t>{0, 1, 2, 3, 4});
    CHECK(pool.allocate(0) == std::vector<int32_t>{});
    CHECK_FALSE(pool.allocate(-1).has_value());
    CHECK(pool.take_evicted().empty());
}

TEST_CASE("eviction is least recently used: released hashed pages A then B, allocation evicts A first") {
    block_pool pool(4);
    const auto ab = *pool.allocate(2);
    const int32_t a = ab[0], b = ab[1];
    REQUIRE(pool.set_hash(a, 100));
    REQUIRE(pool.set_hash(b, 200));
    pool.release(std::vector{a});
    pool.release(std::vector{b});
    CHECK(pool.n_cached() == 2);
    CHECK(pool.free_list() == std::vector<int32_t>{2, 3, a, b});

    const auto got = *pool.allocate(3); // the two plain pages, then A
    CHECK(got == std::vector<int32_t>{2, 3, a});
    CHECK(pool.take_evicted() == std::vector<int32_t>{a});
    CHECK(pool.take_evicted().empty()); // taken once
    CHECK_FALSE(pool.lookup(100).has_value());
    CHECK_FALSE(pool.hash_of(a).has_value());
    CHECK(pool.lookup(200) == std::optional<int32_t>(b));
    CHECK(pool.n_cached() == 1);

    CHECK(*pool.allocate(1) == std::vector<int32_t>{b});
    CHECK(pool.take_evicted() == std::vector<int32_t>{b});
    CHECK(pool.n_free() == 0);
}

TEST_CASE("unhashed released pages are reused before cached ones") {
    block_pool pool(3);
    const auto p = *pool.allocate(3);
    REQUIRE(pool.set_hash(p[0], 7));
    pool.release(std::vector{p[0]}); // cached: tail
    pool.release(std::vector{p[1]}); // plain: head
    CHECK(pool.free_list() == std::vector<int32_t>{p[1], p[0]});
    CHECK(*pool.allocate(1) == std::vector<int32_t>{p[1]});
    CHECK(pool.take_evicted().empty());
    CHECK(pool.lookup(7) == std::optional<int32_t>(p[0]));

    // a plain page released after a cached one still goes before it
    pool.release(std::vector{p[2]});
    CHECK(pool.free_list() == std::vector<int32_t>{p[2], p[0]});
}

TEST_CASE("a cached free page is revived by add_ref, keeping its hash") {
    block_pool pool(2);
    const int32_t p = (*pool.allocate(1))[0];
    REQUIRE(pool.set_hash(p, 55));
    pool.release(std::vector{p});
    CHECK(pool.n_free() == 2);
    CHECK(pool.n_cached() == 1);
    CHECK(pool.ref_count(p) == 0);

    const auto found = pool.lookup(55);
    REQUIRE(found == std::optional<int32_t>(p));
    pool.add_ref(*found);
    CHECK(pool.ref_count(p) == 1);
    CHECK(pool.n_free() == 1);
    CHECK(pool.n_cached() == 0);
    CHECK(pool.hash_of(p) == std::optional<uint64_t>(55));
    CHECK(pool.free_list() == std::vector<int32_t>{1 - p});
    pool.add_ref(p); // shared by a second sequence
    CHECK(pool.ref_count(p) == 2);
    pool.release(std::vector{p, p});
    CHECK(pool.free_list() == std::vector<int32_t>{1 - p, p}); // cached again, at the tail
    CHECK(pool.n_cached() == 1);
}

TEST_CASE("allocate is all or nothing: a request over n_free takes nothing and evicts nothing") {
    block_pool pool(4);
    const auto p = *pool.allocate(3);
    REQUIRE(pool.set_hash(p[0], 9));
    pool.release(std::vector{p[0]});
    const auto before = pool.free_list();
    REQUIRE(before.size() == 2);
    CHECK_FALSE(pool.allocate(3).has_value());
    CHECK(pool.free_list() == before);
    CHECK(pool.n_free() == 2);
    CHECK(pool.n_cached() == 1);
    CHECK(pool.lookup(9) == std::optional<int32_t>(p[0]));
    CHECK(pool.take_evicted().empty());
    CHECK(pool.allocate(2)->size() == 2); // exactly n_free is fine
    CHECK(pool.take_evicted() == std::vector<int32_t>{p[0]});
}

TEST_CASE("set_hash: the first page with a hash stays the cached copy; drop_hash; restore_cached") {
    block_pool pool(4);
    const auto p = *pool.allocate(2);
    CHECK(pool.set_hash(p[0], 1));
    CHECK_FALSE(pool.set_hash(p[1], 1)); // another page has it: nothing changes
    CHECK_FALSE(pool.hash_of(p[1]).has_value());
    CHECK(pool.lookup(1) == std::optional<int32_t>(p[0]));
    CHECK(pool.set_hash(p[0], 1)); // the same page, the same hash again

    // drop_hash of a free cached page: a plain free page, moved to the head
    pool.release(std::vector{p[0]});
    CHECK(pool.free_list() == std::vector<int32_t>{2, 3, p[0]});
    pool.drop_hash(p[0]);
    CHECK(pool.free_list() == std::vector<int32_t>{p[0], 2, 3});
    CHECK(pool.n_cached() == 0);
    CHECK_FALSE(pool.lookup(1).has_value());
    CHECK(pool.set_hash(p[1], 1)); // the hash is free to take now

    // restore_cached: in least-recently-used-first order, to the tail; a taken hash is refused
    CHECK(pool.restore_cached(3, 30));
    CHECK(pool.restore_cached(2, 20));
    CHECK_FALSE(pool.restore_cached(p[0], 1)); // p[1] has 1
    CHECK(pool.free_list() == std::vector<int32_t>{p[0], 3, 2});
    CHECK(pool.n_cached() == 2);
    CHECK(pool.lookup(30) == std::optional<int32_t>(3));
    CHECK(*pool.allocate(2) == std::vector<int32_t>{p[0], 3});
    CHECK(pool.take_evicted() == std::vector<int32_t>{3});

    // drop_hash of a referenced page forgets the hash; the page stays referenced
    pool.drop_hash(p[1]);
    CHECK(pool.ref_count(p[1]) == 1);
    CHECK_FALSE(pool.lookup(1).has_value());
    pool.drop_hash(p[1]); // no hash: nothing to do
}

TEST_CASE("prefix_hash: chained over pages, sensitive to the parent and to every token") {
    const std::vector<int32_t> a{1, 2, 3, 4}, b{1, 2, 3, 5}, c{2, 1, 3, 4};
    const uint64_t seed = 0x1234;
    CHECK(prefix_hash(seed, a) == prefix_hash(seed, a));
    CHECK(prefix_hash(seed, a) != prefix_hash(seed + 1, a)); // different parent
    CHECK(prefix_hash(seed, a) != prefix_hash(seed, b));     // a different last token
    CHECK(prefix_hash(seed, a) != prefix_hash(seed, c));     // the same tokens in another order
    CHECK(prefix_hash(seed, std::span(a).first(3)) != prefix_hash(seed, a)); // a shorter page
    CHECK(prefix_hash(seed, std::vector<int32_t>{}) != prefix_hash(seed + 1, std::vector<int32_t>{}));

    // chains: equal page sequences give equal hashes, page by page
    const uint64_t h1 = prefix_hash(seed, a), h2 = prefix_hash(h1, b);
    CHECK(prefix_hash(prefix_hash(seed, a), b) == h2);
    CHECK(prefix_hash(prefix_hash(seed, b), a) != h2); // the same pages in another order
    CHECK(prefix_hash(prefix_hash(seed + 1, a), b) != h2); // another model (seed)
    CHECK(prefix_hash(prefix_hash(seed, c), b) != h2); // an earlier page differs

    // no collisions among many close inputs (single-token pages, one-token changes)
    std::set<uint64_t> seen;
    for (int32_t t = -8; t < 2000; ++t) seen.insert(prefix_hash(seed, std::vector<int32_t>{t}));
    CHECK(seen.size() == 2008);
    for (uint64_t p = 0; p < 2000; ++p) seen.insert(prefix_hash(p, a));
    CHECK(seen.size() == 4008);
}

TEST_CASE("generation: new contents on allocate (evicting or not) and restore_cached; kept while the contents are") {
    block_pool pool(3);
    for (int32_t p = 0; p < 3; ++p) CHECK(pool.generation(p) == 0);
    auto a = pool.allocate(2); // pages 0, 1
    REQUIRE(a);
    CHECK(pool.generation(0) == 1);
    CHECK(pool.generation(1) == 1);
    CHECK(pool.generation(2) == 0);
    // A full computed page gets a hash, is released to the cache and shared again: same contents.
    REQUIRE(pool.set_hash(0, 77));
    CHECK(pool.generation(0) == 1);
    pool.add_ref(0); // a second sequence shares it
    const int32_t p0[] = {0};
    pool.release(p0);
    pool.release(p0); // free, cached
    CHECK(pool.generation(0) == 1);
    pool.add_ref(*pool.lookup(77)); // revived from the cache
    CHECK(pool.generation(0) == 1);
    pool.release(p0);
    // A page released without a hash, taken again: new contents.
    const int32_t p1[] = {1};
    pool.release(p1);
    CHECK(pool.generation(1) == 1); // released, not yet reused
    auto b = pool.allocate(1);
    REQUIRE(b == std::vector<int32_t>{1});
    CHECK(pool.generation(1) == 2);
    // Evicting the cached page for new contents (also the copy-on-write target's path).
    auto c = pool.allocate(2); // page 2, then the cached page 0
    REQUIRE(c == std::vector<int32_t>{2, 0});
    CHECK(pool.generation(2) == 1);
    CHECK(pool.generation(0) == 2);
    // drop_hash keeps the contents; restore_cached brings contents from another run.
    pool.release(*c);
    pool.release(*b);
    REQUIRE(pool.restore_cached(2, 5));
    CHECK(pool.generation(2) == 2);
    pool.drop_hash(2);
    CHECK(pool.generation(2) == 2);
}
