// The wire messages between the supervisor and its workers: round trips, truncations, caps,
// field values no sender makes, and random mutations that must never crash the decoder.
#include "ipc/wire.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

using namespace tandem;
namespace {

// Three sequences: every token of a wanting logits, none of b, one token of c (the last 41
// bytes: id, n_past, one token, its flag, one page, its generation, with the four counts).
ipc::run_msg sample_run() {
    ipc::run_msg m;
    m.batch_id = 0x0102030405060708ull;
    const std::vector<token_id> ta{1, 2, 3, 4, 5}, tb{-5, 9}, tc{6};
    const std::vector<int32_t> pa{7}, pb{0, 3, 8}, pc{5};
    // any value: a generation is compared, never used as a number
    const std::vector<uint32_t> ga{3}, gb{0, 0xffffffffu, 17}, gc{1};
    m.b.add_seq(11, 0, ta, pa, ga, 0);
    m.b.add_seq(12, 40, tb, pb, gb, 42);
    m.b.add_seq(~0ull, 3, tc, pc, gc, 3);
    return m;
}

bool same(const ipc::run_msg& x, const ipc::run_msg& y) { return x.batch_id == y.batch_id && x.b == y.b; }

template <class T>
std::vector<uint8_t> enc(const T& m) {
    std::vector<uint8_t> out;
    ipc::encode(m, out);
    return out;
}

template <class T>
void put_raw(std::vector<uint8_t>& out, T v) {
    const size_t at = out.size();
    out.resize(at + sizeof v);
    std::memcpy(out.data() + at, &v, sizeof v);
}

} // namespace

TEST_CASE("wire: every message round trips") {
    ipc::hello_msg h;
    h.pid = 1234;
    h.n_threads = 8;
    h.fingerprint = 0xfeedface12345678ull;
    h.device = "cpu (avx512_vnni)";
    auto hb = enc(h);
    auto h2 = ipc::decode_hello(hb);
    REQUIRE(h2);
    CHECK(h2->pid == h.pid);
    CHECK(h2->n_threads == h.n_threads);
    CHECK(h2->fingerprint == h.fingerprint);
    CHECK(h2->device == h.device);

    const auto run = sample_run();
    auto r2 = ipc::decode_run(enc(run));
    REQUIRE(r2);
    CHECK(same(*r2, run));
    ipc::run_msg kinds; // hidden-state and pooled rows (embeddings) travel as they are
    const std::vector<token_id> t{1, 2, 3};
    const std::vector<int32_t> p{4};
    const std::vector<uint32_t> g{9};
    kinds.b.add_seq(1, 0, t, p, g, 0, row_kind::pooled);
    kinds.b.add_seq(2, 0, t, p, g, 2, row_kind::hidden);
    REQUIRE(kinds.b.n_logits() == 2);
    auto k2 = ipc::decode_run(enc(kinds));
    REQUIRE(k2);
    CHECK(same(*k2, kinds));
    CHECK(k2->b.n_logits() == 2);
    ipc::run_msg empty;
    empty.batch_id = 5;
    auto e2 = ipc::decode_run(enc(empty));
    REQUIRE(e2);
    CHECK(same(*e2, empty));

    for (bool ok : {true, false}) {
        ipc::done_msg d;
        d.batch_id = 77;
        d.ok = ok;
        d.error = ok ? "" : "CUDA error: out of memory";
        d.compute_s = 0.125;
        d.kv_upload_bytes = ok ? int64_t(5) << 32 : 0;
        d.kv_kept_bytes = ok ? 12345 : 0;
        auto d2 = ipc::decode_done(enc(d));
        REQUIRE(d2);
        CHECK(d2->batch_id == 77);
        CHECK(d2->ok == ok);
        CHECK(d2->error == d.error);
        CHECK(d2->compute_s == 0.125);
        CHECK(d2->kv_upload_bytes == d.kv_upload_bytes);
        CHECK(d2->kv_kept_bytes == d.kv_kept_bytes);
    }
    // A longer error text is cut to the cap, not refused.
    ipc::done_msg long_err;
    long_err.ok = false;
    long_err.error.assign(ipc::wire_max_string + 100, 'x');
    auto l2 = ipc::decode_done(enc(long_err));
    REQUIRE(l2);
    CHECK(l2->error.size() == ipc::wire_max_string);
}

TEST_CASE("wire: run_bytes is a run message's exact size; result_bytes_max holds the longest hello and done") {
    // sample_run: 3 sequences, 8 tokens, 5 pages
    CHECK(enc(sample_run()).size() == ipc::run_bytes(3, 8, 5));
    ipc::run_msg empty;
    CHECK(enc(empty).size() == ipc::run_bytes(0, 0, 0));
    ipc::done_msg d;
    d.ok = false;
    d.error.assign(200000, 'x'); // cut at wire_max_string
    const auto done_bytes = enc(d).size();
    ipc::hello_msg h;
    h.device.assign(200000, 'y');
    const auto hello_bytes = enc(h).size();
    CHECK(std::max(done_bytes, hello_bytes) == ipc::result_bytes_max());
}

TEST_CASE("wire: every truncation fails, and so do trailing bytes") {
    const auto rb = enc(sample_run());
    for (size_t n = 0; n < rb.size(); ++n) {
        INFO("run_msg cut at ", n, " of ", rb.size());
        CHECK_FALSE(ipc::decode_run(std::span(rb.data(), n)));
    }
    ipc::hello_msg h;
    h.pid = 1;
    h.device = "dev";
    const auto hb = enc(h);
    ipc::done_msg d;
    d.error = "e";
    const auto db = enc(d);
    for (size_t n = 0; n < hb.size(); ++n) CHECK_FALSE(ipc::decode_hello(std::span(hb.data(), n)));
    for (size_t n = 0; n < db.size(); ++n) CHECK_FALSE(ipc::decode_done(std::span(db.data(), n)));
    for (auto b : {rb, hb, db}) {
        b.push_back(0);
        CHECK_FALSE(ipc::decode_run(b));
        CHECK_FALSE(ipc::decode_hello(b));
        CHECK_FALSE(ipc::decode_done(b));
    }
}

TEST_CASE("wire: counts over the caps and negative fields are refused") {
    // One sequence of the run message: id, n_past, n tokens (and their flags), n_pages pages
    // (and their generations).
    auto put_seq = [](std::vector<uint8_t>& b, uint64_t id, uint32_t n, uint32_t n_pages) {
        put_raw(b, id);
        put_raw(b, int32_t(0));
        put_raw(b, n);
        b.resize(b.size() + size_t(n) * 4, 0);
        put_raw(b, n);
        b.resize(b.size() + size_t(n), 1);
        put_raw(b, n_pages);
        b.resize(b.size() + size_t(n_pages) * 4, 0);
        put_raw(b, n_pages);
        b.resize(b.size() + size_t(n_pages) * 4, 0xff);
    };
    // n_seqs: the cap is accepted, one more is not (with the bytes present).
    for (uint32_t n : {ipc::wire_max_seqs, ipc::wire_max_seqs + 1}) {
        std::vector<uint8_t> b;
        put_raw(b, uint64_t(1));
        put_raw(b, n);
        for (uint32_t i = 0; i < n; ++i) put_seq(b, i, 1, 0);
        CHECK(ipc::decode_run(b).has_value() == (n == ipc::wire_max_seqs));
    }
    // Tokens in one sequence.
    for (uint32_t n : {ipc::wire_max_tokens, ipc::wire_max_tokens + 1}) {
        std::vector<uint8_t> b;
        put_raw(b, uint64_t(1));
        put_raw(b, uint32_t(1));
        put_seq(b, 0, n, 0);
        CHECK(ipc::decode_run(b).has_value() == (n == ipc::wire_max_tokens));
    }
    // Block-table entries with their generations, one per page.
    for (uint32_t n : {ipc::wire_max_tokens, ipc::wire_max_tokens + 1}) {
        std::vector<uint8_t> b;
        put_raw(b, uint64_t(1));
        put_raw(b, uint32_t(1));
        put_seq(b, 0, 1, n);
        CHECK(ipc::decode_run(b).has_value() == (n == ipc::wire_max_tokens));
    }
    // A string one byte over the cap.
    for (uint32_t n : {ipc::wire_max_string, ipc::wire_max_string + 1}) {
        std::vector<uint8_t> b;
        put_raw(b, uint64_t(1));
        put_raw(b, uint8_t(0));
        put_raw(b, n);
        b.resize(b.size() + n, 'e');
        put_raw(b, 0.5);
        put_raw(b, int64_t(0)); // K/V bytes uploaded
        put_raw(b, int64_t(0)); // and kept
        CHECK(ipc::decode_done(b).has_value() == (n == ipc::wire_max_string));
    }
    // Field values no sender makes.
    auto run = sample_run();
    run.b.pos[size_t(run.b.tok_begin[1])] = -1; // n_past
    CHECK_FALSE(ipc::decode_run(enc(run)));
    run = sample_run();
    run.b.wants_row[0] = 4; // no row_kind
    CHECK_FALSE(ipc::decode_run(enc(run)));
    run = sample_run();
    run.b.wants_row[0] = uint8_t(row_kind::pooled); // beside the sequence's logits rows
    CHECK_FALSE(ipc::decode_run(enc(run)));
    run = sample_run();
    run.b.tables[size_t(run.b.table_begin[1]) + 1] = -3; // below no_page
    CHECK_FALSE(ipc::decode_run(enc(run)));
    // A sequence with nothing to compute (the encoder is never given one: patch its count).
    {
        auto b = enc(sample_run());
        const size_t c_tokens_at = b.size() - 41 + 12;
        const uint32_t zero = 0;
        std::memcpy(b.data() + c_tokens_at, &zero, 4); // no tokens
        b.erase(b.begin() + std::ptrdiff_t(c_tokens_at + 4), b.begin() + std::ptrdiff_t(c_tokens_at + 8));
        std::memcpy(b.data() + c_tokens_at + 4, &zero, 4); // and no flags
        b.erase(b.begin() + std::ptrdiff_t(c_tokens_at + 8));
        CHECK_FALSE(ipc::decode_run(b));
    }
    // Generations not one per page (the encoder refuses to make these: patch the count).
    for (uint32_t n_gen : {2u, 4u, 0u}) {
        auto b = enc(sample_run());
        // Sequence c is the last 41 bytes; sequence b's 3 generations and their count come
        // just before it.
        const size_t c_begin = b.size() - 41, count_at = c_begin - 3 * 4 - 4;
        uint32_t was = 0;
        std::memcpy(&was, b.data() + count_at, 4);
        REQUIRE(was == 3);
        std::memcpy(b.data() + count_at, &n_gen, 4);
        // the bytes the new count asks for, so that only the mismatch is wrong
        const auto c_at = b.begin() + std::ptrdiff_t(c_begin);
        if (n_gen < 3) b.erase(c_at - std::ptrdiff_t((3 - n_gen) * 4), c_at);
        else b.insert(c_at, size_t(n_gen - 3) * 4, uint8_t(0));
        INFO("generations ", n_gen, " for 3 pages");
        CHECK_FALSE(ipc::decode_run(b));
    }
    auto db = enc(ipc::done_msg{});
    db[8] = 2; // the ok flag
    CHECK_FALSE(ipc::decode_done(db));
    ipc::done_msg neg;
    neg.kv_kept_bytes = -1; // byte counts are never negative
    CHECK_FALSE(ipc::decode_done(enc(neg)));
    ipc::hello_msg h; // pid 0
    CHECK_FALSE(ipc::decode_hello(enc(h)));
}

TEST_CASE("wire: random mutations never crash, and what decodes is within the caps") {
    ipc::hello_msg h;
    h.pid = 5;
    h.device = "cuda:0 NVIDIA H200";
    ipc::done_msg d;
    d.ok = false;
    d.error = "boom";
    const std::vector<std::vector<uint8_t>> seeds = {enc(sample_run()), enc(h), enc(d), enc(ipc::run_msg{})};
    const uint32_t interesting[] = {0, 1, 0xffffffffu, 0x80000000u, 0x7fffffffu, ipc::wire_max_seqs,
                                    ipc::wire_max_seqs + 1, ipc::wire_max_tokens, ipc::wire_max_tokens + 1};
    std::mt19937 rng(2024);
    int decoded = 0;
    for (int it = 0; it < 20000; ++it) {
        std::vector<uint8_t> b = seeds[rng() % seeds.size()];
        const int n_mut = 1 + int(rng() % 4);
        for (int k = 0; k < n_mut; ++k) {
            const uint32_t op = rng() % 4;
            if (op == 0 && !b.empty()) {
                b[rng() % b.size()] ^= uint8_t(1u << (rng() % 8));
            } else if (op == 1 && b.size() >= 4) {
                const uint32_t v = interesting[rng() % std::size(interesting)];
                std::memcpy(b.data() + rng() % (b.size() - 3), &v, 4);
            } else if (op == 2 && !b.empty()) {
                b.resize(rng() % b.size());
            } else {
                b.insert(b.begin() + std::ptrdiff_t(b.empty() ? 0 : rng() % b.size()), uint8_t(rng()));
            }
        }
        if (auto r = ipc::decode_run(b)) {
            ++decoded;
            const batch& rb = r->b;
            CHECK(uint32_t(rb.n_seqs()) <= ipc::wire_max_seqs);
            CHECK(rb.generations.size() == rb.tables.size());
            for (int32_t i = 0; i < rb.n_seqs(); ++i) {
                CHECK(rb.n_new(i) >= 1);
                CHECK(uint32_t(rb.n_new(i)) <= ipc::wire_max_tokens);
                CHECK(rb.table(i).size() <= ipc::wire_max_tokens);
                CHECK(rb.n_past(i) >= 0);
            }
            for (uint8_t w : rb.wants_row) CHECK(w <= uint8_t(row_kind::pooled));
        }
        if (auto m = ipc::decode_hello(b)) {
            ++decoded;
            CHECK(m->device.size() <= ipc::wire_max_string);
        }
        if (auto m = ipc::decode_done(b)) {
            ++decoded;
            CHECK(m->error.size() <= ipc::wire_max_string);
        }
    }
    CHECK(decoded > 0); // the mutations are mild enough that some still parse
    MESSAGE(decoded, " of 20000 mutated payloads decoded");
}
