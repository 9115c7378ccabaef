// GGUF reader and writer: the shared model files, typed look-ups, open errors, writer round trips and refusals.
#include "runtime/error.hpp"
#include "runtime/gguf.hpp"
#include "tests/gguf_fixtures.hpp"
#include "tests/test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>

using namespace tandem;
using tandem::test::make;
using tandem::test::make_array;
using tandem::test::nested;
using tandem::test::pattern;
using tandem::test::required_end;
using tandem::test::rich_writer;
namespace fs = std::filesystem;

// ---------------------------------------------------------------- shared model files
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
    CHECK_THROWS_AS(w.add_tensor("iq3s", dtype(21), {256}, pattern(110, 0)), tandem::error); // IQ3_S: not a type Tandem has
    CHECK_THROWS_AS(w.add_tensor("q3k", dtype::q3_k, {256}, pattern(100, 0)), tandem::error); // Q3_K is 110 bytes
    CHECK_THROWS_AS(w.add_tensor("q4k", dtype::q4_k, {128}, pattern(72, 0)), tandem::error); // half a super-block
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
