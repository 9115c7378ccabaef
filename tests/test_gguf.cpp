// GGUF reader/writer, synthetic models and Q8_0: real files, round trips, hostile and damaged input.
#include "quant/q8_0.hpp"
#include "runtime/error.hpp"
#include "runtime/fp16.hpp"
#include "runtime/gguf.hpp"
#include "runtime/synth.hpp"
#include "tests/test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>

using namespace tandem;
namespace fs = std::filesystem;

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

gguf::value make(gguf::value_type t, decltype(gguf::value::v) v) {
    gguf::value out;
    out.type = t;
    out.v = std::move(v);
    return out;
}

gguf::value make_array(gguf::value_type et, std::vector<gguf::value> items) {
    gguf::array_value a;
    a.elem_type = et;
    a.items = std::move(items);
    return make(gguf::value_type::array, std::move(a));
}

// `depth` levels of single-element arrays around an array of one u8.
gguf::value nested(int depth) {
    gguf::value v = make_array(gguf::value_type::u8, {make(gguf::value_type::u8, uint64_t(7))});
    for (int i = 1; i < depth; ++i) v = make_array(gguf::value_type::array, {v});
    return v;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
    std::vector<uint8_t> d(n);
    for (size_t i = 0; i < n; ++i) d[i] = uint8_t(seed + i * 31);
    return d;
}

// A small file with every value type, nested arrays and every tensor type: the mutation base.
gguf::writer rich_writer() {
    using vt = gguf::value_type;
    gguf::writer w;
    w.set("u8", make(vt::u8, uint64_t(200)));
    w.set("i8", make(vt::i8, int64_t(-100)));
    w.set("u16", make(vt::u16, uint64_t(60000)));
    w.set("i16", make(vt::i16, int64_t(-30000)));
    w.set_u32("u32", 4000000000u);
    w.set_i32("i32", -2000000000);
    w.set_f32("f32", 1.5f);
    w.set_bool("bool", true);
    w.set_string("string", std::string("bytes \0\xff\xfe ok", 12));
    w.set_u64("u64", ~uint64_t(0));
    w.set("i64", make(vt::i64, int64_t(INT64_MIN)));
    w.set("f64", make(vt::f64, 2.0e300));
    w.set_string_array("strings", {"", "a", "\xe2\x96\x81the", std::string(1, '\0')});
    w.set_f32_array("floats", {0.0f, -1.0f, 3.25f});
    w.set_i32_array("ints", {1, -2, 3});
    w.set("nested", make_array(vt::array, {make_array(vt::string, {make(vt::string, std::string("x"))}),
                                           make_array(vt::i16, {make(vt::i16, int64_t(-5))}),
                                           make_array(vt::u8, {})}));
    w.set("empty", make_array(vt::f64, {}));
    w.add_tensor("t.f32", dtype::f32, {4, 2}, pattern(32, 1));
    w.add_tensor("t.f16", dtype::f16, {3}, pattern(6, 2));
    w.add_tensor("t.bf16", dtype::bf16, {1, 1, 2, 2}, pattern(8, 3));
    w.add_tensor("t.q8_0", dtype::q8_0, {64, 1, 1}, pattern(68, 4));
    w.add_tensor("t.i8", dtype::i8, {5, 1}, pattern(5, 5));
    return w;
}

// The end of the last tensor's data: every shorter prefix must be rejected.
uint64_t required_end(const gguf::file& f) {
    uint64_t end = 0;
    for (const auto& t : f.tensors())
        end = std::max<uint64_t>(end, uint64_t(t.data - f.bytes().data()) + t.n_bytes);
    return end;
}

} // namespace

// ---------------------------------------------------------------- shared model files

TEST_CASE("stories260K matches PROVENANCE.md") {
    const std::string path = test::model_path("stories260K.gguf");
    const gguf::file f = gguf::file::open(path);
    CHECK(f.path() == path);
    CHECK(f.version() == 3);
    CHECK(f.alignment() == 32);
    CHECK(f.bytes().size() == 1185376);
    CHECK(f.get_string("general.architecture") == "llama");
    CHECK(f.get_int("llama.block_count") == 5);
    CHECK(f.get_int("llama.embedding_length") == 64);
    CHECK(f.get_int("llama.attention.head_count") == 8);
    CHECK(f.get_int("llama.attention.head_count_kv") == 4);
    CHECK(f.get_int("llama.feed_forward_length") == 172);
    CHECK(f.get_int("llama.context_length") == 2048);
    CHECK(f.get_int("llama.rope.dimension_count") == 8);
    CHECK(f.get_float("llama.attention.layer_norm_rms_epsilon").value() == doctest::Approx(1e-5));
    CHECK_FALSE(f.get_float("llama.rope.freq_base").has_value());
    CHECK(f.get_string("tokenizer.ggml.model") == "llama");
    CHECK_FALSE(f.find("tokenizer.ggml.pre"));
    CHECK_FALSE(f.find("tokenizer.ggml.add_bos_token"));
    CHECK(f.get_int("tokenizer.ggml.bos_token_id") == 1);
    CHECK(f.get_int("tokenizer.ggml.eos_token_id") == 2);
    CHECK(f.get_int("tokenizer.ggml.unknown_token_id") == 0);
    const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    CHECK(tokens.size() == 512);
    CHECK(tokens[0] == "<unk>");
    CHECK(f.get_f32_array("tokenizer.ggml.scores").size() == 512);
    const auto types = f.get_i32_array("tokenizer.ggml.token_type");
    CHECK(types.size() == 512);
    CHECK(types[0] == 2);

    CHECK(f.tensors().size() == 48);
    int64_t n_params = 0;
    for (const auto& t : f.tensors()) {
        CHECK(t.type == dtype::f32);
        CHECK(t.n_bytes == uint64_t(t.n_elements()) * 4);
        CHECK(t.offset % 32 == 0);
        n_params += t.n_elements();
    }
    CHECK(n_params == 292800);
    auto shape = [&](const char* name) {
        const auto* t = f.find_tensor(name);
        REQUIRE_MESSAGE(t, name);
        return t->ne;
    };
    CHECK(shape("token_embd.weight") == std::vector<int64_t>{64, 512});
    CHECK(shape("output.weight") == std::vector<int64_t>{64, 512});
    CHECK(shape("output_norm.weight") == std::vector<int64_t>{64});
    for (int il = 0; il < 5; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        CHECK(shape((b + "attn_q.weight").c_str()) == std::vector<int64_t>{64, 64});
        CHECK(shape((b + "attn_k.weight").c_str()) == std::vector<int64_t>{64, 32});
        CHECK(shape((b + "attn_v.weight").c_str()) == std::vector<int64_t>{64, 32});
        CHECK(shape((b + "attn_output.weight").c_str()) == std::vector<int64_t>{64, 64});
        CHECK(shape((b + "attn_norm.weight").c_str()) == std::vector<int64_t>{64});
        CHECK(shape((b + "ffn_gate.weight").c_str()) == std::vector<int64_t>{64, 172});
        CHECK(shape((b + "ffn_up.weight").c_str()) == std::vector<int64_t>{64, 172});
        CHECK(shape((b + "ffn_down.weight").c_str()) == std::vector<int64_t>{172, 64});
        CHECK(shape((b + "ffn_norm.weight").c_str()) == std::vector<int64_t>{64});
    }
    CHECK_FALSE(f.find_tensor("blk.5.attn_q.weight"));
    CHECK(required_end(f) <= f.bytes().size());

    // parse() over the same bytes agrees with open(), and a moved file keeps its views.
    const auto bytes = test::read_bytes(path);
    gguf::file g = gguf::file::parse(bytes, "copy");
    gguf::file moved = std::move(g);
    REQUIRE(moved.find_tensor("output.weight"));
    CHECK(std::memcmp(moved.find_tensor("output.weight")->data, f.find_tensor("output.weight")->data, 64 * 512 * 4) == 0);
    CHECK(moved.get_string_array("tokenizer.ggml.tokens") == tokens);
}

TEST_CASE("llama-2-tiny-random matches PROVENANCE.md and the llama-spm vocab") {
    const gguf::file f = gguf::file::open(test::model_path("llama-2-tiny-random.gguf"));
    CHECK(f.bytes().size() == 1750560);
    CHECK(f.get_string("general.name") == "LLaMA v2");
    CHECK(f.get_string("general.architecture") == "llama");
    CHECK(f.get_int("general.file_type") == 1);
    CHECK(f.get_int("llama.block_count") == 1);
    CHECK(f.get_int("llama.embedding_length") == 8);
    CHECK(f.get_int("llama.attention.head_count") == 2);
    CHECK(f.get_int("llama.attention.head_count_kv") == 2);
    CHECK(f.get_int("llama.feed_forward_length") == 32);
    CHECK(f.get_int("llama.context_length") == 4096);
    CHECK(f.get_int("llama.rope.dimension_count") == 4);
    CHECK(f.get_float("llama.attention.layer_norm_rms_epsilon").value() == doctest::Approx(1e-5));
    CHECK(f.tensors().size() == 12);
    int n_f16 = 0, n_f32 = 0;
    for (const auto& t : f.tensors()) {
        const bool is_norm = t.name.find("norm") != std::string::npos;
        CHECK_MESSAGE(t.type == (is_norm ? dtype::f32 : dtype::f16), t.name);
        (t.type == dtype::f16 ? n_f16 : n_f32)++;
    }
    CHECK(n_f16 == 9);
    CHECK(n_f32 == 3);
    REQUIRE(f.find_tensor("token_embd.weight"));
    CHECK(f.find_tensor("token_embd.weight")->ne == std::vector<int64_t>{8, 32000});
    CHECK(f.find_tensor("token_embd.weight")->n_bytes == 8 * 32000 * 2);
    CHECK(f.find_tensor("output.weight")->ne == std::vector<int64_t>{8, 32000});
    CHECK(f.find_tensor("blk.0.ffn_down.weight")->ne == std::vector<int64_t>{32, 8});

    const gguf::file v = gguf::file::open(test::model_path("vocab/ggml-vocab-llama-spm.gguf"));
    const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    CHECK(tokens.size() == 32000);
    CHECK(tokens == v.get_string_array("tokenizer.ggml.tokens"));
    CHECK(f.get_f32_array("tokenizer.ggml.scores") == v.get_f32_array("tokenizer.ggml.scores"));
    CHECK(f.get_i32_array("tokenizer.ggml.token_type") == v.get_i32_array("tokenizer.ggml.token_type"));
    CHECK(f.get_int("tokenizer.ggml.bos_token_id") == 1);
    CHECK(f.get_int("tokenizer.ggml.eos_token_id") == 2);
    CHECK(f.get_int("tokenizer.ggml.unknown_token_id") == 0);
}

TEST_CASE("vocab-only files match PROVENANCE.md") {
    struct expect {
        const char* file;
        const char* arch;
        int64_t n_layer, n_embd, n_head, n_ff, n_ctx;
        const char* model;
        const char* pre;
        size_t n_vocab, n_merges;
        int64_t bos, eos;
        bool add_bos;
    };
    const expect cases[] = {
        {"ggml-vocab-gpt-2.gguf", "gpt2", 12, 768, 12, 3072, 1024, "gpt2", "gpt-2", 50257, 50000, 50256, 50256, false},
        {"ggml-vocab-deepseek-coder.gguf", "llama", 32, 4096, 32, 11008, 16384, "gpt2", "deepseek-coder", 32256, 31757,
         32013, 32014, true},
        {"ggml-vocab-llama-spm.gguf", "llama", 32, 4096, 32, 11008, 4096, "llama", "default", 32000, 0, 1, 2, true},
    };
    for (const expect& e : cases) {
        CAPTURE(e.file);
        const gguf::file f = gguf::file::open(test::model_path(std::string("vocab/") + e.file));
        const std::string a = e.arch;
        CHECK(f.tensors().empty());
        CHECK(f.version() == 3);
        CHECK(f.get_string("general.architecture") == a);
        CHECK(f.get_int(a + ".block_count") == e.n_layer);
        CHECK(f.get_int(a + ".embedding_length") == e.n_embd);
        CHECK(f.get_int(a + ".attention.head_count") == e.n_head);
        CHECK(f.get_int(a + ".feed_forward_length") == e.n_ff);
        CHECK(f.get_int(a + ".context_length") == e.n_ctx);
        CHECK(f.get_string("tokenizer.ggml.model") == e.model);
        CHECK(f.get_string("tokenizer.ggml.pre") == e.pre);
        CHECK(f.get_string_array("tokenizer.ggml.tokens").size() == e.n_vocab);
        CHECK(f.get_i32_array("tokenizer.ggml.token_type").size() == e.n_vocab);
        CHECK(f.get_string_array("tokenizer.ggml.merges").size() == e.n_merges);
        CHECK(f.get_int("tokenizer.ggml.bos_token_id") == e.bos);
        CHECK(f.get_int("tokenizer.ggml.eos_token_id") == e.eos);
        CHECK(f.get_bool("tokenizer.ggml.add_bos_token").value_or(false) == e.add_bos);
    }
    const gguf::file ds = gguf::file::open(test::model_path("vocab/ggml-vocab-deepseek-coder.gguf"));
    CHECK(ds.get_float("llama.rope.freq_base") == 100000.0);
    CHECK(ds.get_string_array("tokenizer.ggml.merges")[0] == "\xc4\xa0 \xc4\xa0"); // "Ġ Ġ"
}

TEST_CASE("typed look-ups convert or name the key and type") {
    const gguf::file f = gguf::file::open(test::model_path("stories260K.gguf"));
    CHECK_FALSE(f.get_int("no.such.key").has_value());
    CHECK_FALSE(f.get_string("no.such.key").has_value());
    CHECK(f.get_array("no.such.key") == nullptr);
    CHECK(f.get_string_array("no.such.key").empty());
    CHECK(f.get_int("tokenizer.ggml.padding_token_id") == 4294967295);
    CHECK(f.get_float("llama.block_count") == 5.0); // integers read as floats
    CHECK_THROWS_WITH_AS(f.get_int("general.architecture"),
                         doctest::Contains("general.architecture is string, expected an integer"), tandem::error);
    CHECK_THROWS_AS(f.get_string("llama.block_count"), tandem::error);
    CHECK_THROWS_AS(f.get_bool("llama.block_count"), tandem::error);
    CHECK_THROWS_AS(f.get_float("general.name"), tandem::error);
    CHECK_THROWS_AS(f.get_array("general.name"), tandem::error);
    CHECK_THROWS_AS(f.get_f32_array("tokenizer.ggml.tokens"), tandem::error);
    CHECK_THROWS_AS(f.get_i32_array("tokenizer.ggml.scores"), tandem::error);
    CHECK_THROWS_AS(f.get_string_array("tokenizer.ggml.scores"), tandem::error);
    CHECK(f.get_f32_array("tokenizer.ggml.token_type").size() == 512); // integers read as floats

    gguf::writer w;
    w.set_u64("big", ~uint64_t(0));
    w.set("wide", make_array(gguf::value_type::i64, {make(gguf::value_type::i64, int64_t(1) << 40)}));
    const auto bytes = w.serialize();
    const gguf::file g = gguf::file::parse(bytes, "mem");
    CHECK_THROWS_WITH_AS(g.get_int("big"), doctest::Contains("too large"), tandem::error);
    CHECK_THROWS_WITH_AS(g.get_i32_array("wide"), doctest::Contains("does not fit in int32"), tandem::error);
}

TEST_CASE("open reports missing, directory and empty files") {
    test::scratch_dir dir("gguf-open");
    CHECK_THROWS_WITH_AS(gguf::file::open(dir.file("missing.gguf")),
                         doctest::Contains("missing.gguf: cannot open: No such file"), tandem::error);
    CHECK_THROWS_WITH_AS(gguf::file::open(dir.path.string()), doctest::Contains("is a directory"), tandem::error);
    { std::ofstream(dir.file("empty.gguf")); }
    CHECK_THROWS_WITH_AS(gguf::file::open(dir.file("empty.gguf")), doctest::Contains("empty.gguf: empty file"),
                         tandem::error);
    { std::ofstream(dir.file("text.gguf")) << "hello, world"; }
    CHECK_THROWS_WITH_AS(gguf::file::open(dir.file("text.gguf")), doctest::Contains("text.gguf: not a GGUF file"),
                         tandem::error);
}

// ---------------------------------------------------------------- writer

TEST_CASE("writer round trip: every value type, nested arrays, every tensor type") {
    using vt = gguf::value_type;
    const gguf::writer w = rich_writer();
    const auto bytes = w.serialize();
    const gguf::file f = gguf::file::parse(bytes, "rich");
    CHECK(f.version() == 3);
    CHECK(f.alignment() == 32);
    CHECK(f.metadata().size() == 17);

    auto type_of = [&](const char* k) { return f.find(k)->type; };
    CHECK(type_of("u8") == vt::u8);
    CHECK(type_of("i8") == vt::i8);
    CHECK(type_of("u16") == vt::u16);
    CHECK(type_of("i16") == vt::i16);
    CHECK(type_of("u32") == vt::u32);
    CHECK(type_of("i32") == vt::i32);
    CHECK(type_of("f32") == vt::f32);
    CHECK(type_of("bool") == vt::boolean);
    CHECK(type_of("string") == vt::string);
    CHECK(type_of("u64") == vt::u64);
    CHECK(type_of("i64") == vt::i64);
    CHECK(type_of("f64") == vt::f64);
    CHECK(f.get_int("u8") == 200);
    CHECK(f.get_int("i8") == -100);
    CHECK(f.get_int("u16") == 60000);
    CHECK(f.get_int("i16") == -30000);
    CHECK(f.get_int("u32") == 4000000000);
    CHECK(f.get_int("i32") == -2000000000);
    CHECK(f.get_float("f32") == 1.5);
    CHECK(f.get_bool("bool") == true);
    CHECK(f.get_string("string") == std::string("bytes \0\xff\xfe ok", 12));
    CHECK(std::get<uint64_t>(f.find("u64")->v) == ~uint64_t(0));
    CHECK(f.get_int("i64") == INT64_MIN);
    CHECK(f.get_float("f64") == 2.0e300);
    CHECK(f.get_string_array("strings") == std::vector<std::string>{"", "a", "\xe2\x96\x81the", std::string(1, '\0')});
    CHECK(f.get_f32_array("floats") == std::vector<float>{0.0f, -1.0f, 3.25f});
    CHECK(f.get_i32_array("ints") == std::vector<int32_t>{1, -2, 3});
    const auto* n = f.get_array("nested");
    REQUIRE(n);
    CHECK(n->elem_type == vt::array);
    REQUIRE(n->items.size() == 3);
    CHECK(n->items[0].as_array()->elem_type == vt::string);
    CHECK(*n->items[0].as_array()->items[0].as_string() == "x");
    CHECK(n->items[1].as_array()->items[0].as_int() == -5);
    CHECK(n->items[1].as_array()->items[0].type == vt::i16);
    CHECK(n->items[2].as_array()->items.empty());
    CHECK(f.get_array("empty")->elem_type == vt::f64);
    CHECK(f.get_array("empty")->items.empty());

    const std::pair<const char*, dtype> tensors[] = {
        {"t.f32", dtype::f32}, {"t.f16", dtype::f16}, {"t.bf16", dtype::bf16}, {"t.q8_0", dtype::q8_0}, {"t.i8", dtype::i8}};
    const std::vector<int64_t> shapes[] = {{4, 2}, {3}, {1, 1, 2, 2}, {64, 1, 1}, {5, 1}};
    const size_t sizes[] = {32, 6, 8, 68, 5};
    REQUIRE(f.tensors().size() == 5);
    for (size_t i = 0; i < 5; ++i) {
        CAPTURE(tensors[i].first);
        const auto* t = f.find_tensor(tensors[i].first);
        REQUIRE(t);
        CHECK(t->type == tensors[i].second);
        CHECK(t->ne == shapes[i]);
        CHECK(t->n_bytes == sizes[i]);
        CHECK(t->offset % 32 == 0);
        CHECK(uintptr_t(t->data - bytes.data()) % 32 == 0);
        const auto want = pattern(sizes[i], uint8_t(i + 1));
        CHECK(std::equal(want.begin(), want.end(), t->data));
    }
    CHECK(bytes.size() % 32 == 0); // data padded to the alignment
    CHECK(bytes.size() == required_end(f) + (32 - sizes[4] % 32) % 32);

    // Re-writing what was read gives the same bytes.
    gguf::writer again;
    for (const auto& e : f.metadata()) again.set(e.key, e.val);
    for (const auto& t : f.tensors()) again.add_tensor(t.name, t.type, t.ne, {t.data, size_t(t.n_bytes)});
    CHECK(again.serialize() == bytes);
}

TEST_CASE("writer alignment, files on disk and streamed tensors") {
    test::scratch_dir dir("gguf-writer");
    gguf::writer w;
    w.set_string("general.name", "aligned");
    w.set_alignment(64);
    int calls = 0;
    w.add_tensor("streamed", dtype::f32, {16, 3}, [&](std::span<uint8_t> out) {
        ++calls;
        CHECK(out.size() == 16 * 3 * 4);
        CHECK(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0; }));
        for (size_t i = 0; i < out.size(); ++i) out[i] = uint8_t(i);
    });
    w.add_tensor("copied", dtype::i8, {7}, pattern(7, 9));
    CHECK(calls == 0); // sources run when the file is written, not before
    const std::string path = dir.file("a.gguf");
    w.write(path);
    CHECK(calls == 1);
    const auto mem = w.serialize();
    CHECK(calls == 2);
    CHECK(test::read_bytes(path) == mem);
    for (const auto& e : fs::directory_iterator(dir.path)) CHECK(e.path().filename() == "a.gguf"); // no temp left

    const gguf::file f = gguf::file::open(path);
    CHECK(f.alignment() == 64);
    CHECK(f.get_int("general.alignment") == 64);
    CHECK(f.find("general.alignment")->type == gguf::value_type::u32);
    for (const auto& t : f.tensors()) CHECK(uintptr_t(t.data - f.bytes().data()) % 64 == 0);
    CHECK(f.find_tensor("streamed")->data[5] == 5);
    CHECK(f.find_tensor("copied")->data[6] == pattern(7, 9)[6]);

    // A failing source leaves neither the target nor a temp file behind.
    gguf::writer bad;
    bad.add_tensor("boom", dtype::f32, {8}, [](std::span<uint8_t>) { tandem::fail("source failed"); });
    CHECK_THROWS_WITH_AS(bad.write(dir.file("b.gguf")), "source failed", tandem::error);
    CHECK_FALSE(fs::exists(dir.file("b.gguf")));
    size_t n_files = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path)) ++n_files;
    CHECK(n_files == 1);
    CHECK_THROWS_AS(w.write(dir.file("no/such/dir/c.gguf")), tandem::error);
}

TEST_CASE("writer rejects what the reader would reject") {
    using vt = gguf::value_type;
    gguf::writer w;
    w.set_u32("k", 1);
    CHECK_THROWS_WITH_AS(w.set_u32("k", 2), doctest::Contains("set twice"), tandem::error);
    CHECK_THROWS_AS(w.set_u32("", 2), tandem::error);
    CHECK_THROWS_AS(w.set("u8", make(vt::u8, uint64_t(256))), tandem::error);
    CHECK_THROWS_AS(w.set("i8", make(vt::i8, int64_t(-129))), tandem::error);
    CHECK_THROWS_AS(w.set("str", make(vt::string, uint64_t(1))), tandem::error);
    CHECK_THROWS_AS(w.set("arr", make_array(vt::u32, {make(vt::u16, uint64_t(1))})), tandem::error);
    CHECK_THROWS_AS(w.set("bad", make(vt(13), uint64_t(1))), tandem::error);
    w.set("deep16", nested(16));
    CHECK_THROWS_WITH_AS(w.set("deep17", nested(17)), doctest::Contains("deeper"), tandem::error);
    CHECK_THROWS_AS(w.set_alignment(0), tandem::error);
    CHECK_THROWS_AS(w.set_alignment(48), tandem::error);
    CHECK_THROWS_AS(w.set_u32("general.alignment", 3), tandem::error);
    CHECK_THROWS_AS(w.set_u64("general.alignment", 64), tandem::error);

    w.add_tensor("t", dtype::f32, {2}, pattern(8, 0));
    CHECK_THROWS_WITH_AS(w.add_tensor("t", dtype::f32, {2}, pattern(8, 0)), doctest::Contains("added twice"),
                         tandem::error);
    CHECK_THROWS_AS(w.add_tensor("size", dtype::f32, {3}, pattern(8, 0)), tandem::error);
    CHECK_THROWS_AS(w.add_tensor("q4k", dtype(12), {256}, pattern(144, 0)), tandem::error);
    CHECK_THROWS_AS(w.add_tensor("q8", dtype::q8_0, {48}, pattern(51, 0)), tandem::error);
    const std::span<const uint8_t> none;
    CHECK_THROWS_AS(w.add_tensor("dims0", dtype::f32, {}, none), tandem::error);
    CHECK_THROWS_AS(w.add_tensor("dims5", dtype::f32, {1, 1, 1, 1, 1}, pattern(4, 0)), tandem::error);
    CHECK_THROWS_AS(w.add_tensor("zero", dtype::f32, {0}, none), tandem::error);
    CHECK_THROWS_AS(w.add_tensor("huge", dtype::f32, {int64_t(1) << 32, int64_t(1) << 32}, none), tandem::error);
    const auto bytes = w.serialize();
    const gguf::file f = gguf::file::parse(bytes, "w");
    CHECK(f.tensors().size() == 1);
    CHECK(f.find("deep16"));
}

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
    raw q4k;
    q4k.header(1, 0).tensor("blk.0.attn_q.weight", {256}, 12, 0).pad().zeros(144);
    CHECK(rejection(q4k.b) ==
          "input: tensor blk.0.attn_q.weight has type Q4_K, which Tandem does not support (F32, F16, BF16, Q8_0, I8)");
    CHECK_REJECTS(file({32}, 2), "has type Q4_0, which Tandem does not support");
    CHECK_REJECTS(file({32}, 99), "unknown type 99");
    CHECK_REJECTS(file({48}, 8), "not a multiple of the Q8_0 block size 32");
    CHECK(try_parse(file({64, 2}, 8, 0, 160)) == outcome::parsed); // 4 blocks of 34 bytes
    CHECK_REJECTS(file({64, 2}, 8, 0, 128), "runs past the end");
    for (uint32_t t : {0u, 1u, 8u, 24u, 30u}) CHECK(try_parse(file({32}, t, 0, 160)) == outcome::parsed);

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

// ---------------------------------------------------------------- Q8_0

TEST_CASE("q8_0 quantize/dequantize: layout and error bound") {
    // A known block: x = i - 16, so max|x| = 16 and d = 16/127.
    float x[32], y[32];
    for (int i = 0; i < 32; ++i) x[i] = float(i - 16);
    uint8_t block[34];
    quantize_q8_0_ref(x, block, 32);
    uint16_t dh;
    std::memcpy(&dh, block, 2);
    CHECK(dh == f32_to_fp16(16.0f / 127.0f));
    CHECK(int8_t(block[2 + 0]) == -127);
    CHECK(int8_t(block[2 + 16]) == 0);
    CHECK(int8_t(block[2 + 31]) == 119); // round(15 * 127 / 16)
    dequantize_q8_0_ref(block, y, 32);
    CHECK(y[0] == doctest::Approx(-16.0).epsilon(1e-3));

    // Random data at many scales: |x - deq(q(x))| <= d/2 plus the f16 rounding of d.
    std::mt19937_64 rng(3);
    std::normal_distribution<float> normal;
    const int64_t n = 32 * 512;
    std::vector<float> in(n), out(n);
    std::vector<uint8_t> q(size_t(n / 32 * 34));
    // Scales from 1e-2 to 1e4 keep d a normal f16; tinier blocks lose precision in d (as in GGML).
    for (int64_t i = 0; i < n; ++i) in[size_t(i)] = normal(rng) * std::pow(10.0f, float(i / 32 % 7) - 2.0f);
    quantize_q8_0_ref(in.data(), q.data(), n);
    dequantize_q8_0_ref(q.data(), out.data(), n);
    double max_rel = 0;
    for (int64_t b = 0; b < n / 32; ++b) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(in[size_t(b * 32 + i)]));
        for (int i = 0; i < 32; ++i) {
            const float err = std::fabs(in[size_t(b * 32 + i)] - out[size_t(b * 32 + i)]);
            REQUIRE(err <= amax / 127.0f * 0.57f);
            max_rel = std::max(max_rel, double(err / amax));
        }
    }
    CHECK(max_rel > 0.001); // the bound is tight enough to matter

    // Zeros, NaN and infinities stay finite and sane.
    float special[32] = {};
    uint8_t sb[34];
    quantize_q8_0_ref(special, sb, 32);
    dequantize_q8_0_ref(sb, y, 32);
    CHECK(std::all_of(y, y + 32, [](float v) { return v == 0.0f; }));
    special[0] = NAN;
    special[1] = INFINITY;
    special[2] = -INFINITY;
    special[3] = 2.0f;
    quantize_q8_0_ref(special, sb, 32);
    dequantize_q8_0_ref(sb, y, 32);
    CHECK(y[0] == 0.0f);
    CHECK(y[1] == doctest::Approx(2.0).epsilon(1e-3));
    CHECK(y[2] == doctest::Approx(-2.0).epsilon(1e-3));
    CHECK(y[3] == doctest::Approx(2.0).epsilon(1e-3));
}

// ---------------------------------------------------------------- synthetic models

TEST_CASE("synth presets") {
    const synth_params tiny = synth_preset("tiny");
    CHECK(tiny.n_layer == 2);
    CHECK(tiny.n_embd == 64);
    CHECK(tiny.n_vocab == 512);
    const synth_params big = synth_preset("tinyllama-1.1b");
    CHECK(big.n_layer == 22);
    CHECK(big.n_embd == 2048);
    CHECK(big.n_head == 32);
    CHECK(big.n_head_kv == 4);
    CHECK(big.n_ff == 5632);
    CHECK(big.n_vocab == 32000);
    CHECK(big.n_ctx == 2048);
    CHECK(big.type == dtype::q8_0);
    CHECK_THROWS_WITH_AS(synth_preset("huge"), doctest::Contains("unknown preset 'huge'"), tandem::error);
}

TEST_CASE("synth writes a llama GGUF with llama.cpp's names and shapes") {
    test::scratch_dir dir("gguf-synth");
    synth_params p = synth_preset("tiny");
    p.n_layer = 3;
    p.n_vocab = 1000;
    const std::string path = dir.file("tiny.gguf");
    synth_write(p, path);
    const gguf::file f = gguf::file::open(path);
    CHECK(f.get_string("general.architecture") == "llama");
    CHECK(f.get_string("general.name") == p.name);
    CHECK(f.get_int("general.file_type") == 0);
    CHECK(f.get_int("llama.context_length") == 256);
    CHECK(f.get_int("llama.embedding_length") == 64);
    CHECK(f.get_int("llama.block_count") == 3);
    CHECK(f.get_int("llama.feed_forward_length") == 160);
    CHECK(f.get_int("llama.attention.head_count") == 4);
    CHECK(f.get_int("llama.attention.head_count_kv") == 2);
    CHECK(f.get_int("llama.rope.dimension_count") == 16);
    CHECK(f.get_float("llama.rope.freq_base") == 10000.0);
    CHECK(f.get_float("llama.attention.layer_norm_rms_epsilon").value() == doctest::Approx(1e-5));
    CHECK(f.get_int("llama.vocab_size") == 1000);
    CHECK(f.get_string("tokenizer.ggml.model") == "llama");
    CHECK(f.get_string("tokenizer.ggml.pre") == "default");
    CHECK(f.get_int("tokenizer.ggml.bos_token_id") == 1);
    CHECK(f.get_int("tokenizer.ggml.eos_token_id") == 2);
    CHECK(f.get_int("tokenizer.ggml.unknown_token_id") == 0);
    CHECK(f.get_bool("tokenizer.ggml.add_bos_token") == true);

    const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    const auto scores = f.get_f32_array("tokenizer.ggml.scores");
    const auto types = f.get_i32_array("tokenizer.ggml.token_type");
    REQUIRE(tokens.size() == 1000);
    REQUIRE(scores.size() == 1000);
    REQUIRE(types.size() == 1000);
    CHECK(std::set<std::string>(tokens.begin(), tokens.end()).size() == 1000);
    CHECK(tokens[0] == "<unk>");
    CHECK(types[0] == 2);
    CHECK(tokens[1] == "<s>");
    CHECK(tokens[2] == "</s>");
    CHECK(types[1] == 3);
    CHECK(types[2] == 3);
    CHECK(tokens[3] == "<0x00>");
    CHECK(tokens[3 + 0x41] == "<0x41>");
    CHECK(tokens[258] == "<0xFF>");
    for (int i = 3; i < 259; ++i) CHECK(types[size_t(i)] == 6);
    CHECK(tokens[259] == "\xe2\x96\x81");
    for (size_t i = 259; i < tokens.size(); ++i) {
        CHECK(types[i] == 1);
        CHECK(!tokens[i].empty());
        if (i > 259) CHECK(scores[i] < scores[i - 1]);
    }
    CHECK(std::find(tokens.begin(), tokens.end(), "\xe2\x96\x81the") != tokens.end());

    const int64_t e = 64, kv = 32, ff = 160, V = 1000;
    CHECK(f.tensors().size() == 3 + 9 * 3);
    auto check = [&](const std::string& name, std::vector<int64_t> ne, dtype t) {
        CAPTURE(name);
        const auto* ti = f.find_tensor(name);
        REQUIRE(ti);
        CHECK(ti->ne == ne);
        CHECK(ti->type == t);
    };
    check("token_embd.weight", {e, V}, dtype::f32);
    check("output_norm.weight", {e}, dtype::f32);
    check("output.weight", {e, V}, dtype::f32);
    for (int il = 0; il < 3; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        check(b + "attn_norm.weight", {e}, dtype::f32);
        check(b + "attn_q.weight", {e, e}, dtype::f32);
        check(b + "attn_k.weight", {e, kv}, dtype::f32);
        check(b + "attn_v.weight", {e, kv}, dtype::f32);
        check(b + "attn_output.weight", {e, e}, dtype::f32);
        check(b + "ffn_norm.weight", {e}, dtype::f32);
        check(b + "ffn_gate.weight", {e, ff}, dtype::f32);
        check(b + "ffn_up.weight", {e, ff}, dtype::f32);
        check(b + "ffn_down.weight", {ff, e}, dtype::f32);
    }

    // Values: norms near 1, matrices near N(0, 1/fan_in), no two tensors alike.
    auto stats = [&](const char* name) {
        const auto* t = f.find_tensor(name);
        const float* v = reinterpret_cast<const float*>(t->data);
        double s = 0, s2 = 0;
        for (int64_t i = 0; i < t->n_elements(); ++i) s += v[i], s2 += double(v[i]) * v[i];
        const double mean = s / double(t->n_elements());
        return std::pair{mean, std::sqrt(s2 / double(t->n_elements()) - mean * mean)};
    };
    auto [norm_mean, norm_std] = stats("blk.1.ffn_norm.weight");
    CHECK(norm_mean == doctest::Approx(1.0).epsilon(0.05));
    CHECK(norm_std < 0.1);
    auto [q_mean, q_std] = stats("blk.0.attn_q.weight");
    CHECK(std::fabs(q_mean) < 0.01);
    CHECK(q_std == doctest::Approx(1.0 / 8.0).epsilon(0.05));
    auto [d_mean, d_std] = stats("blk.2.ffn_down.weight");
    CHECK(d_std == doctest::Approx(1.0 / std::sqrt(160.0)).epsilon(0.05));
    CHECK(std::memcmp(f.find_tensor("blk.0.attn_q.weight")->data, f.find_tensor("blk.1.attn_q.weight")->data, 256) != 0);
}

TEST_CASE("synth is deterministic by seed, for every type") {
    test::scratch_dir dir("gguf-synth-seed");
    synth_params p = synth_preset("tiny");
    p.n_layer = 1;
    p.n_vocab = 300;
    const std::pair<dtype, int64_t> types[] = {{dtype::f32, 0}, {dtype::f16, 1}, {dtype::bf16, 32}, {dtype::q8_0, 7}};
    std::vector<float> ref; // attn_q as F32, from the first pass
    for (const auto& tf : types) {
        const dtype type = tf.first; // not a structured binding: clang 14 cannot capture those
        const int64_t file_type = tf.second;
        CAPTURE(name_of(type));
        p.type = type;
        p.seed = 11;
        synth_write(p, dir.file("a.gguf"));
        synth_write(p, dir.file("b.gguf"));
        p.seed = 12;
        synth_write(p, dir.file("c.gguf"));
        const auto a = test::read_bytes(dir.file("a.gguf"));
        CHECK(a == test::read_bytes(dir.file("b.gguf")));
        CHECK(a != test::read_bytes(dir.file("c.gguf")));

        const gguf::file f = gguf::file::open(dir.file("a.gguf"));
        CHECK(f.get_int("general.file_type") == file_type);
        CHECK(f.find_tensor("blk.0.ffn_norm.weight")->type == dtype::f32);
        const auto* t = f.find_tensor("blk.0.attn_q.weight");
        CHECK(t->type == type);
        CHECK(f.find_tensor("token_embd.weight")->type == type);
        // Every type decodes to the same seeded values, within the type's precision.
        std::vector<float> v(size_t(t->n_elements()));
        for (size_t i = 0; i < v.size(); ++i) {
            uint16_t h;
            switch (type) {
            case dtype::f32: std::memcpy(&v[i], t->data + 4 * i, 4); break;
            case dtype::f16: std::memcpy(&h, t->data + 2 * i, 2), v[i] = fp16_to_f32(h); break;
            case dtype::bf16: std::memcpy(&h, t->data + 2 * i, 2), v[i] = bf16_to_f32(h); break;
            default: break;
            }
        }
        if (type == dtype::q8_0) dequantize_q8_0_ref(t->data, v.data(), t->n_elements());
        if (type == dtype::f32) ref = v;
        REQUIRE(ref.size() == v.size());
        const float tol = type == dtype::f32 ? 0.0f : type == dtype::f16 ? 1e-3f : type == dtype::bf16 ? 8e-3f : 0.02f;
        for (size_t i = 0; i < v.size(); ++i) REQUIRE(std::fabs(v[i] - ref[i]) <= tol * std::max(1.0f, 8.0f * std::fabs(ref[i])));
    }
}

TEST_CASE("synth rejects inconsistent shapes") {
    test::scratch_dir dir("gguf-synth-bad");
    synth_params p = synth_preset("tiny");
    p.n_head = 5;
    CHECK_THROWS_AS(synth_write(p, dir.file("x.gguf")), tandem::error);
    p = synth_preset("tiny");
    p.n_head_kv = 3;
    CHECK_THROWS_AS(synth_write(p, dir.file("x.gguf")), tandem::error);
    p = synth_preset("tiny");
    p.n_vocab = 100;
    CHECK_THROWS_AS(synth_write(p, dir.file("x.gguf")), tandem::error);
    p = synth_preset("tiny");
    p.type = dtype::q8_0;
    p.n_ff = 100;
    CHECK_THROWS_WITH_AS(synth_write(p, dir.file("x.gguf")), doctest::Contains("multiples of 32"), tandem::error);
    p = synth_preset("tiny");
    p.type = dtype::i8;
    CHECK_THROWS_AS(synth_write(p, dir.file("x.gguf")), tandem::error);
    CHECK_FALSE(fs::exists(dir.file("x.gguf")));
}
