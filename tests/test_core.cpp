// Core pieces: checked arithmetic, thread pool, block pool, KV page bookkeeping, stop strings.
#include "cpu/thread_pool.hpp"
#include "runtime/block_pool.hpp"
#include "runtime/checked.hpp"
#include "runtime/error.hpp"
#include "runtime/generate.hpp"
#include "runtime/kv_cache.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

using namespace tandem;

TEST_CASE("checked arithmetic") {
    CHECK(checked_add(1, 2) == 3u);
    CHECK_FALSE(checked_add(UINT64_MAX, 1));
    CHECK(checked_mul(uint64_t(1) << 31, 4) == uint64_t(1) << 33);
    CHECK_FALSE(checked_mul(uint64_t(1) << 32, uint64_t(1) << 32));
    CHECK(checked_align(33, 32) == 64u);
    CHECK(checked_align(64, 32) == 64u);
    CHECK_FALSE(checked_align(UINT64_MAX - 3, 32));
}

TEST_CASE("tandem::fail formats one line") {
    try {
        fail("{}: bad {}", "x.gguf", 42);
        FAIL("no throw");
    } catch (const error& e) {
        CHECK(std::string(e.what()) == "x.gguf: bad 42");
    }
}

TEST_CASE("thread pool covers every index exactly once") {
    for (int nt : {1, 2, 3, 5}) {
        cpu::thread_pool pool(nt);
        for (int64_t n : {0, 1, 7, 100, 1001}) {
            for (int64_t grain : {1, 16, 64}) {
                std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
                pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
                    CHECK((b % grain == 0));
                    for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
                });
                for (auto& h : hits) REQUIRE(h.load() == 1);
            }
        }
        std::atomic<int> calls{0};
        pool.run([&](int ith, int nth) {
            CHECK(nth == nt);
            CHECK(ith < nth);
            calls++;
        });
        CHECK(calls.load() == nt);
    }
}

TEST_CASE("thread pool: an exception on any thread leaves run() after every thread is done") {
    cpu::thread_pool pool(3);
    for (int thrower : {0, 1, 2}) {
        INFO("thrower " << thrower);
        std::atomic<int> finished{0};
        bool caught = false;
        try {
            pool.run([&](int ith, int) {
                if (ith == thrower) throw std::runtime_error("thrown on thread " + std::to_string(ith));
                std::this_thread::sleep_for(std::chrono::milliseconds(20)); // still in fn when the thrower leaves
                finished++;
            });
        } catch (const std::runtime_error& e) {
            caught = true;
            CHECK(std::string(e.what()) == "thrown on thread " + std::to_string(thrower));
        }
        CHECK(caught);
        CHECK(finished.load() == 2); // the others finished before run() let go of fn
        std::atomic<int> calls{0};
        pool.run([&](int, int) { calls++; }); // still usable
        CHECK(calls.load() == 3);
    }
    // Every thread throwing: one exception comes out, the pool goes on.
    CHECK_THROWS_AS(pool.parallel_for_dynamic(64, 1, [](int64_t, int64_t) { throw std::bad_alloc(); }), std::bad_alloc);
    std::vector<std::atomic<int>> hits(100);
    pool.parallel_for(100, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
    });
    for (auto& h : hits) REQUIRE(h.load() == 1);
}

TEST_CASE("block pool against a naive model") {
    std::mt19937 g(7);
    block_pool pool(37);
    std::map<int32_t, int32_t> refs; // the model: page -> ref count
    std::vector<std::vector<int32_t>> owners;
    for (int step = 0; step < 20000; ++step) {
        const int op = int(g() % 3);
        if (op == 0) {
            const int32_t n = int32_t(g() % 9);
            const int32_t free_before = pool.n_free();
            auto got = pool.allocate(n);
            if (n > free_before) {
                CHECK_FALSE(got.has_value());
                CHECK(pool.n_free() == free_before);
            } else {
                REQUIRE(got.has_value());
                for (int32_t p : *got) {
                    REQUIRE(refs.count(p) == 0); // never hands out a live page
                    refs[p] = 1;
                }
                owners.push_back(*got);
            }
        } else if (op == 1 && !owners.empty()) {
            const size_t i = g() % owners.size();
            pool.release(owners[i]);
            for (int32_t p : owners[i])
                if (--refs[p] == 0) refs.erase(p);
            owners.erase(owners.begin() + long(i));
        } else if (op == 2 && !owners.empty()) { // share a sequence's pages
            auto copy = owners[g() % owners.size()];
            for (int32_t p : copy) {
                pool.add_ref(p);
                refs[p]++;
            }
            owners.push_back(copy);
        }
        REQUIRE(pool.n_free() == pool.n_pages() - int32_t(refs.size()));
        for (auto [p, r] : refs) REQUIRE(pool.ref_count(p) == r);
    }
    for (auto& o : owners) pool.release(o);
    CHECK(pool.n_free() == pool.n_pages());
}

TEST_CASE("sequence_kv reserves whole pages and gives them back") {
    block_pool pool(5);
    {
        sequence_kv a(pool, 16), b(pool, 16);
        CHECK(a.reserve(1));
        CHECK(a.block_table().size() == 1);
        CHECK(a.reserve(16));
        CHECK(a.block_table().size() == 1);
        CHECK(a.reserve(17));
        CHECK(a.block_table().size() == 2);
        CHECK(b.reserve(48));
        CHECK(pool.n_free() == 0);
        CHECK_FALSE(a.reserve(33)); // the pool is empty: no change
        CHECK(a.block_table().size() == 2);
        std::set<int32_t> all(a.block_table().begin(), a.block_table().end());
        all.insert(b.block_table().begin(), b.block_table().end());
        CHECK(all.size() == 5);
    }
    CHECK(pool.n_free() == 5);
}

TEST_CASE("kv layout offsets tile a page without overlap") {
    const kv_layout lay{3, 2, 8, 4};
    std::set<int64_t> starts;
    for (int il = 0; il < 3; ++il)
        for (bool is_v : {false, true})
            for (int h = 0; h < 2; ++h) {
                const int64_t off = lay.offset(il, is_v, h);
                CHECK(off % lay.head_elems() == 0);
                CHECK(off + lay.head_elems() <= lay.page_elems());
                starts.insert(off);
            }
    CHECK(int64_t(starts.size()) * lay.head_elems() == lay.page_elems());
}

TEST_CASE("stop strings: held back while they may match, cut when they do") {
    stop_matcher m({"\n\n", "The end"});
    std::string out;
    for (std::string_view piece : {"Once", " upon", "\n", "a time.", " The", " e", "nd", " and more"}) {
        out += m.push(piece);
        if (m.stopped()) break;
    }
    CHECK(m.stopped());
    CHECK(out == "Once upon\na time. ");
    CHECK(m.flush().empty());

    stop_matcher none({"xyz"});
    CHECK(none.push("abc x") == "abc ");
    CHECK(none.push("y") == "");
    CHECK(none.push("!") == "xy!");
    CHECK_FALSE(none.stopped());
    CHECK(none.push("xy") == "");
    CHECK(none.flush() == "xy"); // the end of generation releases a partial match

    stop_matcher empty({""});
    CHECK(empty.push("abc") == "abc");
}
