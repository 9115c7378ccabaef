// GGUF reader on damaged and hostile input: truncations, mutations, headers, nesting, tensor infos, alignment.
#include "runtime/error.hpp"
#include "runtime/gguf.hpp"
#include "tests/gguf_fixtures.hpp"
#include "tests/test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

using namespace tandem;
using tandem::test::nested;
using tandem::test::required_end;
using tandem::test::rich_writer;

namespace {

// Touches every value and every tensor byte range, so a bad pointer shows up under ASan.
uint64_t walk_value(const gguf::value& v) {
    uint64_t h = uint64_t(v.type);
    if (const auto* a = v.as_array()) {
        for (const auto& item : a->items) h += walk_value(item);
        return h + a->items.size();
    }
    if (const auto* s = v.as_string()) return h + s->size() + (s->empty() ? 0 : uint8_t(s->back()));
    if (auto i = v.as_int()) return h + uint64_t(*i);
    if (auto b = v.as_bool()) return h + *b;
    if (auto d = v.as_float()) return h + (std::isfinite(*d) ? 1 : 2);
    return h;
}

uint64_t walk(const gguf::file& f) {
    uint64_t h = f.version() + f.alignment();
    for (const auto& e : f.metadata()) h += e.key.size() + walk_value(e.val);
    for (const auto& t : f.tensors()) {
        REQUIRE(t.data != nullptr);
        REQUIRE(t.data >= f.bytes().data());
        REQUIRE(t.data + t.n_bytes <= f.bytes().data() + f.bytes().size());
        h += uint64_t(t.n_elements()) + t.data[0] + t.data[t.n_bytes - 1];
    }
    return h;
}

enum class outcome { parsed, rejected };

// Parses a private copy of exactly these bytes (so ASan sees any read past the end). Only
// tandem::error is an acceptable failure, and its message must be one line naming the input.
outcome try_parse(const std::vector<uint8_t>& bytes, std::string* message = nullptr) {
    const std::vector<uint8_t> copy(bytes);
    try {
        gguf::file f = gguf::file::parse(copy, "input");
        walk(f);
        return outcome::parsed;
    } catch (const tandem::error& e) {
        const std::string m = e.what();
        CHECK_MESSAGE(m.rfind("input: ", 0) == 0, m);
        CHECK_MESSAGE(m.find('\n') == std::string::npos, m);
        if (message) *message = m;
        return outcome::rejected;
    }
}

// The message a hostile input must be rejected with; fails the test if it parses.
std::string rejection(const std::vector<uint8_t>& bytes) {
    std::string m;
    const outcome o = try_parse(bytes, &m);
    CHECK_MESSAGE(o == outcome::rejected, "parsed, but expected an error");
    return m;
}

#define CHECK_REJECTS(bytes, needle)                                                                 \
    do {                                                                                             \
        const std::string m_ = rejection(bytes);                                                     \
        CHECK_MESSAGE(m_.find(needle) != std::string::npos, "message: '" << m_ << "' lacks '" << needle << "'"); \
    } while (0)

// Byte-level GGUF builder for files the writer refuses to make.
struct raw {
    std::vector<uint8_t> b;

    // resize + memcpy: GCC 12 warns falsely (-Wstringop-overflow) on small vector inserts.
    raw& bytes(const void* p, size_t n) {
        const size_t at = b.size();
        b.resize(at + n);
        if (n) std::memcpy(b.data() + at, p, n);
        return *this;
    }
    template <class T>
    raw& put(T v) {
        return bytes(&v, sizeof(T));
    }
    raw& u8(uint8_t v) { return put(v); }
    raw& u32(uint32_t v) { return put(v); }
    raw& u64(uint64_t v) { return put(v); }
    raw& str(std::string_view s) {
        u64(s.size());
        return bytes(s.data(), s.size());
    }
    raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        return bytes("GGUF", 4).u32(version).u64(n_tensors).u64(n_kv);
    }
    raw& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
    raw& kv_str(std::string_view key, std::string_view v) { return str(key).u32(8).str(v); }
    raw& tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
        str(name).u32(uint32_t(ne.size()));
        for (uint64_t d : ne) u64(d);
        return u32(type).u64(offset);
    }
    raw& pad(size_t align = 32) {
        b.resize((b.size() + align - 1) / align * align, 0);
        return *this;
    }
    raw& zeros(size_t n) {
        b.resize(b.size() + n, 0);
        return *this;
    }
};

} // namespace

// ---------------------------------------------------------------- damaged and hostile input

TEST_CASE("truncated model files are rejected at every offset") {
    for (const char* name : {"stories260K.gguf", "llama-2-tiny-random.gguf"}) {
        CAPTURE(name);
        const auto bytes = test::read_bytes(test::model_path(name));
        const gguf::file full = gguf::file::parse(bytes, "full");
        const uint64_t need = required_end(full);
        std::vector<size_t> cuts;
        for (size_t n = 0; n <= 4096; ++n) cuts.push_back(n);
        // The tokenizer-heavy metadata region (all of it for stories260K, ~600 KB of tokens in
        // the other), then a sample through the tensor data.
        const size_t meta_end = size_t(full.tensors().front().data - bytes.data());
        for (size_t n = 4097; n < meta_end; n += std::max<size_t>(97, meta_end / 300)) cuts.push_back(n);
        for (size_t n = meta_end - 8; n < meta_end + 8; ++n) cuts.push_back(n);
        std::mt19937_64 rng(7);
        for (int i = 0; i < 64; ++i) cuts.push_back(size_t(rng() % bytes.size()));
        cuts.push_back(size_t(need - 1));
        for (size_t n : cuts) {
            const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + std::ptrdiff_t(n));
            std::string m;
            const outcome o = try_parse(prefix, &m);
            if (n < need) REQUIRE_MESSAGE(o == outcome::rejected, "prefix of " << n << " bytes parsed");
        }
        INFO(cuts.size(), " cuts");
    }
    // A vocab-only file: any cut inside its metadata.
    const auto vocab = test::read_bytes(test::model_path("vocab/ggml-vocab-llama-spm.gguf"));
    for (size_t n = 0; n + 32 < vocab.size(); n += 2311) {
        const std::vector<uint8_t> prefix(vocab.begin(), vocab.begin() + std::ptrdiff_t(n));
        REQUIRE(try_parse(prefix) == outcome::rejected);
    }
}

TEST_CASE("seeded random mutations either parse or give one tandem::error") {
    const auto base = rich_writer().serialize();
    REQUIRE(try_parse(base) == outcome::parsed);
    const uint64_t interesting[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 31, 32, 33, 64, 255, 0x7fffffff,
                                    0xffffffff, 0x100000000ull, 1ull << 62, 1ull << 63, ~0ull, ~0ull - 31,
                                    base.size(), base.size() - 1};
    std::mt19937_64 rng(20240601);
    int n_parsed = 0, n_rejected = 0;
    constexpr int n_cases = 20000;
    for (int i = 0; i < n_cases; ++i) {
        std::vector<uint8_t> b = base;
        const int n_mut = 1 + int(rng() % 3);
        for (int m = 0; m < n_mut && !b.empty(); ++m) {
            const size_t at = size_t(rng() % b.size());
            switch (rng() % 6) {
            case 0: b[at] ^= uint8_t(1u << (rng() % 8)); break;
            case 1: b[at] = uint8_t(rng()); break;
            case 2: { // an interesting u64 or u32 at a random spot
                const uint64_t v = interesting[rng() % std::size(interesting)];
                const size_t w = rng() % 2 ? 8 : 4;
                if (at + w <= b.size()) std::memcpy(b.data() + at, &v, w);
                break;
            }
            case 3: b.resize(at); break;
            case 4: b.insert(b.begin() + std::ptrdiff_t(at), size_t(1 + rng() % 16), uint8_t(rng())); break;
            case 5: b.erase(b.begin() + std::ptrdiff_t(at), b.begin() + std::ptrdiff_t(std::min(b.size(), at + 1 + rng() % 16))); break;
            }
        }
        (try_parse(b) == outcome::parsed ? n_parsed : n_rejected)++;
    }
    INFO("parsed ", n_parsed, ", rejected ", n_rejected);
    CHECK(n_parsed + n_rejected == n_cases);
    CHECK(n_parsed > n_cases / 20);   // many flips land in data or values and are harmless
    CHECK(n_rejected > n_cases / 4);

    // Bit flips in a real model's metadata and tensor infos.
    const auto model = test::read_bytes(test::model_path("stories260K.gguf"));
    const gguf::file full = gguf::file::parse(model, "full");
    const size_t meta_end = size_t(full.tensors().front().data - model.data());
    for (int i = 0; i < 1000; ++i) {
        std::vector<uint8_t> b = model;
        b[rng() % meta_end] ^= uint8_t(1u << (rng() % 8));
        try_parse(b);
    }
}

TEST_CASE("hostile headers, counts and strings") {
    raw ok;
    ok.header(1, 1).kv_str("general.name", "x").tensor("a", {32}, 0, 0).pad().zeros(128);
    CHECK(try_parse(ok.b) == outcome::parsed);

    CHECK_REJECTS(std::vector<uint8_t>{}, "too short");
    CHECK_REJECTS((std::vector<uint8_t>{'G', 'G', 'U'}), "too short");
    CHECK_REJECTS((std::vector<uint8_t>{'G', 'G', 'U', 'F'}), "truncated");
    CHECK_REJECTS((std::vector<uint8_t>{'P', 'K', 3, 4, 0, 0, 0, 0}), "not a GGUF file");
    CHECK_REJECTS((std::vector<uint8_t>{'t', 'j', 'g', 'g', 3, 0, 0, 0}), "GGJT");
    CHECK_REJECTS(raw().header(0, 0, 1).b, "v1 is not supported");
    CHECK_REJECTS(raw().header(0, 0, 4).b, "unsupported GGUF version 4");
    CHECK_REJECTS(raw().header(0, 0, 0x03000000).b, "big-endian");
    raw be;
    be.b = {'F', 'U', 'G', 'G', 0, 0, 0, 3};
    CHECK_REJECTS(be.b, "big-endian");
    CHECK(try_parse(raw().header(0, 0, 2).b) == outcome::parsed); // v2 is the same layout

    CHECK_REJECTS(raw().header(0, 1ull << 62).b, "metadata count");
    CHECK_REJECTS(raw().header(1ull << 62, 0).b, "tensor count");
    CHECK_REJECTS(raw().header(~0ull, ~0ull).b, "count");
    CHECK_REJECTS(raw().header(0, 1).u64(1ull << 63).zeros(16).b, "truncated: key");
    CHECK_REJECTS(raw().header(0, 1).u64(0).u32(4).u32(1).b, "empty key");
    CHECK_REJECTS(raw().header(0, 1).str("k").u32(8).u64(~0ull).b, "truncated: string value of metadata key 'k'");
    CHECK_REJECTS(raw().header(0, 1).str("k").u32(13).u32(0).b, "unknown value type 13");
    CHECK_REJECTS(raw().header(0, 1).str("k").u32(~0u).u32(0).b, "unknown value type");
    CHECK_REJECTS(raw().header(0, 1).str("k").u32(9).u32(13).u64(0).b, "unknown element type 13");
    CHECK_REJECTS(raw().header(0, 1).str("k").u32(9).u32(0).u64(1ull << 60).b, "array length");
    CHECK_REJECTS(raw().header(0, 1).str("k").u32(9).u32(10).u64(10).zeros(40).b, "array length"); // 10 u64 need 80
    CHECK_REJECTS(raw().header(0, 1).str("k").u32(9).u32(8).u64(1000).zeros(7992).b, "array length"); // 1000 strings need 8000
    raw strings;
    strings.header(0, 1).str("k").u32(9).u32(8).u64(1000);
    for (int i = 0; i < 999; ++i) strings.str("x");
    strings.u64(1); // the last string's byte is missing
    CHECK_REJECTS(strings.b, "truncated: string value of metadata key 'k' claims 1 bytes");
    CHECK_REJECTS(raw().header(0, 1).str("k").u32(9).u32(9).u64(1ull << 40).zeros(64).b, "array length");
    CHECK_REJECTS(raw().header(0, 1).str("k").u32(7).u8(2).b, "neither 0 nor 1");
    CHECK_REJECTS(raw().header(0, 2).kv_u32("k", 1).kv_u32("k", 2).b, "metadata key 'k' appears twice");
    CHECK_REJECTS(raw().header(0, 2).kv_u32("a\nb", 1).kv_u32("a\nb", 2).b, "a\\x0ab");
    CHECK(try_parse(raw().header(0, 1).str("k").u32(9).u32(8).u64(1000).zeros(8000).b) == outcome::parsed);
    // 2^24 + 1 one-byte items: present in the file, but each would cost ~50 bytes parsed.
    raw many;
    many.header(0, 2).str("a").u32(9).u32(0).u64(2).u8(1).u8(2);
    many.str("b").u32(9).u32(0).u64((1 << 24) - 1).zeros((1 << 24) - 1);
    CHECK_REJECTS(many.b, "more than 16777216 items in all (at metadata key 'b')");
    CHECK(try_parse(raw().header(0, 1).str(std::string("\xff\x00\x01", 3)).u32(0).u8(1).b) == outcome::parsed);
}

TEST_CASE("hostile nesting: depth bombs are cut off at 16 levels") {
    for (int depth : {1, 15, 16, 17, 64, 100000}) {
        CAPTURE(depth);
        raw r;
        r.header(0, 1).str("deep").u32(9);
        for (int i = 1; i < depth; ++i) r.u32(9).u64(1); // array of one array ...
        r.u32(0).u64(1).u8(42);                           // ... of one u8
        if (depth <= 16) {
            REQUIRE(try_parse(r.b) == outcome::parsed);
            const gguf::file f = gguf::file::parse(r.b, "deep");
            const gguf::value* v = f.find("deep");
            for (int i = 1; i < depth; ++i) v = &v->as_array()->items.at(0);
            CHECK(v->as_array()->items.at(0).as_int() == 42);
        } else {
            CHECK_REJECTS(r.b, "nested deeper than 16");
        }
    }
    // The writer's own 16-level file reads back.
    gguf::writer w;
    w.set("deep", nested(16));
    CHECK(try_parse(w.serialize()) == outcome::parsed);
}

TEST_CASE("hostile tensor infos") {
    auto file = [](std::vector<uint64_t> ne, uint32_t type = 0, uint64_t offset = 0, size_t data = 128) {
        raw r;
        r.header(1, 0).tensor("t", std::move(ne), type, offset).pad().zeros(data);
        return r.b;
    };
    CHECK(try_parse(file({32})) == outcome::parsed);
    CHECK(try_parse(file({2, 2, 2, 4})) == outcome::parsed);
    CHECK_REJECTS(file({}), "0 dimensions");
    CHECK_REJECTS(file({1, 1, 1, 1, 1}), "5 dimensions");
    CHECK_REJECTS(raw().header(1, 0).str("t").u32(~0u).zeros(64).b, "4294967295 dimensions");
    CHECK_REJECTS(raw().header(1, 0).str("t").u32(1).b, "tensor count of the header is 1");
    CHECK_REJECTS(file({0}), "dimension 0 = 0");
    CHECK_REJECTS(file({4, 1ull << 63}), "dimension 1 = 9223372036854775808");
    CHECK_REJECTS(file({~0ull}), "dimension 0");
    CHECK_REJECTS(file({1ull << 32, 1ull << 32}), "more than 2^63-1 elements");
    CHECK_REJECTS(file({1ull << 62, 2}), "more than 2^63-1 elements");
    CHECK_REJECTS(file({1ull << 31, 1ull << 31, 4}), "more than 2^63-1 elements");
    CHECK_REJECTS(file({1ull << 61, 2}), "needs more bytes than the file has"); // 2^62 elements * 4 bytes
    CHECK_REJECTS(file({1ull << 40}), "needs more bytes than the file has");
    CHECK_REJECTS(file({64}, 0, 0, 200), "runs past the end of the file"); // 256 bytes, 200 present
    CHECK_REJECTS(file({32}, 0, 16), "not a multiple of the alignment");
    CHECK_REJECTS(file({32}, 0, ~0ull - 31), "runs past the end of the file"); // offset overflow
    CHECK_REJECTS(file({32}, 0, 1ull << 63), "runs past the end of the file");
    CHECK_REJECTS(file({32}, 0, 128), "runs past the end of the file");
    CHECK_REJECTS(raw().header(1, 0).tensor("t", {8}, 0, 0).b, "truncated"); // no data section at all
    CHECK_REJECTS(raw().header(1, 0).tensor("t", {8}, 0, 0).zeros(3).b, "truncated");
    CHECK_REJECTS(raw().header(1, 0).u64(0).zeros(64).b, "empty name");
    CHECK_REJECTS(raw().header(1, 0).str("t").u32(4).u64(1).u64(1).u32(0).b, "truncated: dimension of tensor t");

    // Types: the unsupported ones are named, as a user would search for them.
    raw iq3s;
    iq3s.header(1, 0).tensor("blk.0.attn_q.weight", {256}, 21, 0).pad().zeros(110);
    CHECK(rejection(iq3s.b) ==
          "input: tensor blk.0.attn_q.weight has type IQ3_S, which Tandem does not support (F32, F16, BF16, Q4_0, "
          "Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, I8)");
    CHECK_REJECTS(file({256}, 16), "has type IQ2_XXS, which Tandem does not support");
    CHECK_REJECTS(file({32}, 15), "has type Q8_K, which Tandem does not support");
    CHECK_REJECTS(file({128}, 12), "not a multiple of the Q4_K block size 256");
    CHECK_REJECTS(file({128}, 23), "not a multiple of the IQ4_XS block size 256");
    CHECK_REJECTS(file({48}, 20), "not a multiple of the IQ4_NL block size 32");
    CHECK_REJECTS(file({48}, 2), "not a multiple of the Q4_0 block size 32");
    CHECK_REJECTS(file({32}, 99), "unknown type 99");
    CHECK_REJECTS(file({48}, 8), "not a multiple of the Q8_0 block size 32");
    CHECK(try_parse(file({64, 2}, 8, 0, 160)) == outcome::parsed); // 4 blocks of 34 bytes
    CHECK_REJECTS(file({64, 2}, 8, 0, 128), "runs past the end");
    for (uint32_t t : {0u, 1u, 2u, 3u, 6u, 7u, 8u, 24u, 30u}) CHECK(try_parse(file({32}, t, 0, 160)) == outcome::parsed);
    for (uint32_t t : {10u, 11u, 12u, 13u, 14u, 23u}) CHECK(try_parse(file({256}, t, 0, 224)) == outcome::parsed); // one super-block
    CHECK(try_parse(file({32}, 20, 0, 160)) == outcome::parsed); // IQ4_NL: one block of 18 bytes
    CHECK_REJECTS(file({256}, 11, 0, 100), "runs past the end");  // Q3_K: 110 bytes

    // Two tensors: overlap and duplicate names.
    auto two = [](const char* a, uint64_t off_a, const char* b, uint64_t off_b) {
        raw r;
        r.header(2, 0).tensor(a, {32}, 0, off_a).tensor(b, {32}, 0, off_b).pad().zeros(512);
        return r.b;
    };
    CHECK(try_parse(two("a", 0, "b", 128)) == outcome::parsed);
    CHECK(try_parse(two("a", 256, "b", 0)) == outcome::parsed); // order in the data need not follow the infos
    CHECK_REJECTS(two("a", 0, "b", 96), "tensors a and b overlap");
    CHECK_REJECTS(two("a", 96, "b", 0), "tensors b and a overlap");
    CHECK_REJECTS(two("a", 64, "b", 64), "overlap");
    CHECK_REJECTS(two("a", 0, "a", 128), "tensor a appears twice");
}

TEST_CASE("hostile alignment") {
    auto aligned = [](gguf::value_type t, uint64_t a, uint64_t offset) {
        raw r;
        r.header(1, 1).str("general.alignment").u32(uint32_t(t));
        if (t == gguf::value_type::string) r.str("64");
        else r.u32(uint32_t(a));
        r.tensor("t", {8}, 0, offset).pad(64).zeros(256);
        return r.b;
    };
    using vt = gguf::value_type;
    CHECK(try_parse(aligned(vt::u32, 64, 64)) == outcome::parsed);
    CHECK(gguf::file::parse(aligned(vt::u32, 64, 64), "a").alignment() == 64);
    CHECK(try_parse(aligned(vt::u32, 1, 3)) == outcome::parsed);
    CHECK_REJECTS(aligned(vt::u32, 64, 32), "not a multiple of the alignment 64");
    CHECK_REJECTS(aligned(vt::u32, 0, 0), "general.alignment is 0, expected a nonzero power of two");
    CHECK_REJECTS(aligned(vt::u32, 3, 0), "general.alignment is 3");
    CHECK_REJECTS(aligned(vt::u32, 96, 0), "general.alignment is 96");
    CHECK_REJECTS(aligned(vt::i32, 0xffffffc0u, 0), "general.alignment is -64");
    CHECK_REJECTS(aligned(vt::string, 0, 0), "general.alignment is string, expected an integer");
    // 2^31 alignment: the data section would start far past the end.
    CHECK_REJECTS(aligned(vt::u32, 1u << 31, 0), "truncated");
}
