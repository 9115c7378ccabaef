// The low-bit weight family: repacking keeps the file's values (bit for bit against the GGUF
// dequantizers), and every ISA level's kernel gives the scalar reference's bits.
#include "cpu/isa.hpp"
#include "cpu/ops/ops.hpp"
#include "cpu/thread_pool.hpp"
#include "quant/blocks.hpp"
#include "quant/int8.hpp"
#include "quant/lowbit.hpp"
#include "runtime/gguf.hpp"
#include "runtime/model.hpp"
#include "runtime/reference_forward.hpp"
#include "runtime/synth.hpp"
#include "batch_checks.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace tandem;

namespace {

constexpr dtype formats[] = {dtype::q4_0, dtype::q4_1, dtype::q5_0,  dtype::q5_1,   dtype::q4_k,  dtype::q5_k,
                             dtype::q6_k, dtype::q3_k, dtype::q2_k,  dtype::iq4_nl, dtype::iq4_xs};

// Rows of random values (each row its own magnitude, some rows all positive or with outliers)
// quantized by the reference quantizer, then some code bytes scrambled: any block a file may hold.
std::vector<uint8_t> random_rows(dtype t, int64_t n_out, int64_t n_in, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    const size_t row_bytes = block_bytes_of(t, n_in);
    std::vector<uint8_t> blocks(row_bytes * size_t(n_out));
    std::vector<float> x(static_cast<size_t>(n_in));
    for (int64_t r = 0; r < n_out; ++r) {
        const float scale = std::exp(nd(rng) * 2.0f), shift = r % 3 == 1 ? 2.0f * scale : 0.0f;
        for (auto& v : x) v = nd(rng) * scale + shift;
        if (r % 5 == 2) x[size_t(rng() % uint32_t(n_in))] *= 40.0f;
        quantize_blocks_ref(t, x.data(), blocks.data() + size_t(r) * row_bytes, n_in);
    }
    return blocks;
}

lowbit_matrix pack(dtype t, const std::vector<uint8_t>& rows, int64_t r0, int64_t n_out, int64_t n_in) {
    return pack_lowbit(t, rows.data(), r0, n_out, n_in, [](int64_t n, auto&& fn) { fn(0, n); });
}

std::string name(dtype t) { return std::string(name_of(t)); }

} // namespace

TEST_CASE("low-bit repacking keeps every value: rows read back equal the GGUF dequantizer's, bit for bit") {
    for (const dtype t : formats) {
        INFO(name(t));
        const int64_t n_out = 37, n_in = 512; // a tile and a half of outputs: zero rows pad the last
        const auto rows = random_rows(t, n_out + 3, n_in, 7);
        const lowbit_matrix m = pack(t, rows, 3, n_out, n_in); // from row 3: a part of a fused tensor
        CHECK(m.n_tiles() == 3);
        std::vector<float> want(static_cast<size_t>(n_in)), got(static_cast<size_t>(n_in));
        int bad = 0;
        for (int64_t o = 0; o < n_out; ++o) {
            dequantize_blocks_ref(t, rows.data() + size_t(o + 3) * block_bytes_of(t, n_in), want.data(), n_in);
            lowbit_row_f32(m, o, got.data());
            bad += std::memcmp(want.data(), got.data(), size_t(n_in) * 4) != 0;
        }
        CHECK(bad == 0);
        // The family holds at most 5/4 of the file's bytes for the K-quants and IQ4_XS (the
        // legacy 32-value formats pad their header; Q2_K and Q3_K hold nibbles).
        const double ratio = double(m.bytes()) / double(block_bytes_of(t, n_in) * size_t(m.n_tiles() * 16));
        MESSAGE(name(t), ": ", m.bytes(), " bytes, ", ratio, "x the file's");
        if (t == dtype::q4_k || t == dtype::q6_k || t == dtype::iq4_xs) CHECK(ratio < 1.05);
        CHECK(ratio < 2.0);
    }
}

TEST_CASE("low-bit reference dot product is the dequantized weights times the INT8 activations") {
    for (const dtype t : formats) {
        INFO(name(t));
        const int64_t n_out = 20, n_in = 768, n_tok = 3;
        const auto rows = random_rows(t, n_out, n_in, 11);
        const lowbit_matrix m = pack(t, rows, 0, n_out, n_in);
        std::mt19937 rng(5);
        std::normal_distribution<float> nd;
        std::vector<float> x(static_cast<size_t>(n_tok * n_in)), sx(static_cast<size_t>(n_tok)), out(static_cast<size_t>(n_tok * n_out)), w(static_cast<size_t>(n_in));
        std::vector<int8_t> qx(x.size());
        for (auto& v : x) v = nd(rng);
        for (int64_t tk = 0; tk < n_tok; ++tk) sx[size_t(tk)] = quantize_row_i8_ref(&x[size_t(tk * n_in)], &qx[size_t(tk * n_in)], n_in);
        matmul_lowbit_ref(out.data(), qx.data(), sx.data(), n_tok, m, nullptr);
        for (int64_t o = 0; o < n_out; ++o) {
            lowbit_row_f32(m, o, w.data());
            for (int64_t tk = 0; tk < n_tok; ++tk) {
                double want = 0, mag = 0;
                for (int64_t i = 0; i < n_in; ++i) {
                    const double p = double(w[size_t(i)]) * double(sx[size_t(tk)]) * qx[size_t(tk * n_in + i)];
                    want += p;
                    mag += std::fabs(p);
                }
                CHECK(std::fabs(out[size_t(tk * n_out + o)] - want) <= 1e-5 * mag + 1e-30);
            }
        }
    }
}

TEST_CASE("low-bit matmul at every ISA level gives the reference's bits (GEMV, small GEMM, prefill sizes)") {
    cpu::thread_pool pool(2);
    const cpu::isa hw = cpu::detect_isa();
    for (const dtype t : formats) {
        const int64_t n_out = 100, n_in = 1024; // 7 tiles: groups of four and two with a remainder
        const auto rows = random_rows(t, n_out, n_in, 3);
        const lowbit_matrix m = pack(t, rows, 0, n_out, n_in);
        for (const int64_t n_tok : {1, 2, 3, 4, 5, 7, 16, 33, 64, 70}) {
            std::mt19937 rng(static_cast<uint32_t>(n_tok));
            std::vector<int8_t> qx(static_cast<size_t>(n_tok * n_in));
            for (auto& v : qx) v = int8_t(int(rng() % 255) - 127);
            std::vector<float> sx(static_cast<size_t>(n_tok)), bias(static_cast<size_t>(n_out));
            for (auto& v : sx) v = float(rng() % 1000 + 1) * 1e-4f;
            for (auto& v : bias) v = float(int(rng() % 200) - 100) * 0.01f;
            std::vector<float> want(static_cast<size_t>(n_tok * n_out)), got(want.size());
            matmul_lowbit_ref(want.data(), qx.data(), sx.data(), n_tok, m, bias.data());
            for (int lvl = 0; lvl <= int(hw); ++lvl) {
                const cpu::isa level = cpu::force_isa(cpu::isa(lvl));
                INFO(name(t), " n_tok=", n_tok, " isa=", std::string(cpu::name_of(level)));
                std::fill(got.begin(), got.end(), -1.0f);
                cpu::matmul_lowbit(pool, got.data(), qx.data(), sx.data(), n_tok, m, lvl % 2 ? bias.data() : nullptr);
                if (lvl % 2 == 0) matmul_lowbit_ref(want.data(), qx.data(), sx.data(), n_tok, m, nullptr);
                else matmul_lowbit_ref(want.data(), qx.data(), sx.data(), n_tok, m, bias.data());
                CHECK(std::memcmp(want.data(), got.data(), want.size() * 4) == 0);
            }
        }
    }
    cpu::force_isa(hw);
    MESSAGE("levels checked up to ", std::string(cpu::name_of(hw)));
}

namespace {

// Greedy continuation of `prompt` on m: the prompt in one step, then a token a step; each
// step's logits kept.
std::vector<token_id> greedy(model& m, const exec_ctx& ctx, const std::vector<token_id>& prompt, int n,
                             std::vector<std::vector<float>>& logits) {
    const int32_t n_vocab = m.config().n_vocab;
    kv_cache kv(m.make_kv_layout(16), 16);
    block_pool pages(kv.n_pages());
    sequence_kv seq(pages, 16);
    REQUIRE(seq.reserve(int32_t(prompt.size()) + n));
    std::vector<token_id> out;
    std::vector<float> row(static_cast<size_t>(n_vocab));
    std::vector<token_id> step = prompt;
    int32_t n_past = 0;
    for (int i = 0; i < n; ++i) {
        batch b;
        b.add_seq(0, n_past, step, seq.block_table(), {}, n_past + int32_t(step.size()) - 1);
        m.forward(ctx, b, kv, row.data());
        n_past += int32_t(step.size());
        logits.push_back(row);
        out.push_back(token_id(std::max_element(row.begin(), row.end()) - row.begin()));
        step = {out.back()};
    }
    return out;
}

// Where a and b first differ (a.size() if nowhere); there the logits `l` (of the run that
// gave a) must hold a near tie between the two ids: within `tol` of their scale.
void same_or_near_tie(const std::vector<token_id>& a, const std::vector<token_id>& b,
                      const std::vector<std::vector<float>>& l, double tol, const std::string& what) {
    size_t i = 0;
    while (i < a.size() && a[i] == b[i]) ++i;
    INFO(what, ": ids agree for ", i, " of ", a.size());
    if (i == a.size()) return;
    double scale = 0;
    for (float v : l[i]) scale = std::max(scale, std::fabs(double(v)));
    const double gap = double(l[i][size_t(a[i])]) - double(l[i][size_t(b[i])]);
    INFO("first difference at ", i, ": ", a[i], " vs ", b[i], ", gap ", gap, " of scale ", scale);
    CHECK(gap <= tol * std::max(1.0, scale));
}

} // namespace

TEST_CASE("a low-bit synthetic model: greedy ids as the reference over the dequantized weights, INT8 activations") {
    test::scratch_dir dir("lowbit");
    cpu::thread_pool pool(2);
    const std::vector<std::string> types = {"q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k",
                                            "q3_k", "q2_k", "iq4_nl", "iq4_xs", "q4_k_m"};
    for (const std::string& type : types) {
        synth_params p;
        p.n_layer = 2;
        p.n_embd = 256;
        p.n_head = 4;
        p.n_head_kv = 2;
        p.n_ff = 512;
        p.n_vocab = 600;
        p.seed = 9;
        const std::map<std::string, dtype> by_name = {
            {"q4_0", dtype::q4_0}, {"q4_1", dtype::q4_1}, {"q5_0", dtype::q5_0}, {"q5_1", dtype::q5_1},
            {"q4_k", dtype::q4_k}, {"q5_k", dtype::q5_k}, {"q6_k", dtype::q6_k}, {"q3_k", dtype::q3_k},
            {"q2_k", dtype::q2_k}, {"iq4_nl", dtype::iq4_nl}, {"iq4_xs", dtype::iq4_xs}, {"q4_k_m", dtype::q4_k}};
        p.type = by_name.at(type);
        if (type == "q4_k_m") p.mix_type = dtype::q6_k;
        const std::string path = dir.file(type + ".gguf");
        synth_write(p, path);
        gguf::file f = gguf::file::open(path);
        model_config cfg = model_config::from_gguf(f);
        model_weights w = model_weights::load(f, cfg, {weight_format::native, &pool, cpu::matmul_i8_layout()});
        INFO(type);
        CHECK(w.family() == "low-bit");
        CHECK(w.layers[0].wq.is_lowbit());
        CHECK(w.tok_embd.is_lowbit()); // the embed op dequantizes its rows
        if (type == "q4_k_m") {
            CHECK(dtype(w.layers[0].wv.lb->type) == dtype::q6_k);
            CHECK(dtype(w.layers[1].wv.lb->type) == dtype::q4_k);
            CHECK(dtype(w.output.lb->type) == dtype::q6_k);
        }
        model m(std::move(cfg), std::move(w));
        const std::vector<token_id> prompt = test::random_ids(12, m.config().n_vocab, 3);
        const int n = 24;
        std::vector<std::vector<float>> l_cpu, l_ref;
        const auto ids_cpu = greedy(m, exec_ctx{backend::cpu, &pool}, prompt, n, l_cpu);
        // The reference ops: matmul_lowbit_ref over the file's integers, the reference INT8
        // activation quantizers, attention and the rest as written for reading.
        const auto ids_ref = greedy(m, exec_ctx{backend::ref, &pool}, prompt, n, l_ref);
        CHECK(ids_cpu == ids_ref);
        same_or_near_tie(ids_ref, ids_cpu, l_ref, 1e-3, type + " cpu vs ref ops");
        // The F32 reference forward over the dequantized weights (activations unquantized):
        // the same ids but where INT8 activations may turn a near tie.
        reference_forward rf(m.config(), m.weights(), int32_t(prompt.size()) + n);
        std::vector<token_id> ids_f32;
        std::vector<std::vector<float>> l_f32;
        std::vector<token_id> ctx_toks = prompt;
        for (int i = 0; i < n; ++i) {
            const size_t from = i == 0 ? 0 : ctx_toks.size() - 1;
            std::vector<float> last;
            for (size_t k = from; k < ctx_toks.size(); ++k) last = rf.forward(ctx_toks[k], int32_t(k));
            l_f32.push_back(last);
            ids_f32.push_back(token_id(std::max_element(last.begin(), last.end()) - last.begin()));
            ctx_toks.push_back(ids_cpu[size_t(i)]); // teacher-forced on the engine's ids
        }
        same_or_near_tie(ids_f32, ids_cpu, l_f32, 0.05, type + " cpu vs F32 reference forward");
    }
}
