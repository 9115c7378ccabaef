// Synthetic models (runtime/synth): presets, names and shapes, determinism by seed; the Q8_0 reference they use.
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
