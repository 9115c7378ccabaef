// Mixture-of-experts models: the routing op, the tokens grouped by expert, and the engine's
// forward against the scalar reference on each synthetic architecture (qwen3moe, qwen2moe,
// Mixtral-style llama) with F32, INT8 and low-bit experts.
#include "cpu/thread_pool.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "runtime/model.hpp"
#include "runtime/ops/moe.hpp"
#include "runtime/quantize_file.hpp"
#include "runtime/reference_forward.hpp"
#include "runtime/synth.hpp"
#include "batch_checks.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <set>

using namespace tandem;

namespace {

// The engine sums in float in other orders than the double-accumulating reference.
constexpr double logits_rel_tol = 1e-4;

double max_rel_diff(const float* got, const std::vector<float>& want) {
    double max_abs = 1, max_diff = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        max_abs = std::max(max_abs, std::abs(double(want[i])));
        max_diff = std::max(max_diff, std::abs(double(got[i]) - want[i]));
    }
    return max_diff / max_abs;
}

std::vector<std::vector<float>> reference_logits(const model& m, const std::vector<token_id>& toks) {
    reference_forward ref(m.config(), m.weights(), int32_t(toks.size()));
    std::vector<std::vector<float>> out;
    for (size_t i = 0; i < toks.size(); ++i) out.push_back(ref.forward(toks[i], int32_t(i)));
    return out;
}

synth_params tiny_moe(const std::string& arch) {
    synth_params p = synth_preset("tiny");
    p.arch = arch;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_expert = 8;
    p.n_expert_used = 2;
    p.n_ff_exp = 64;
    if (arch == "qwen3moe") {
        p.head_dim = 32;
        p.n_expert_used = 3;
    }
    if (arch == "qwen2moe") p.n_ff_shexp = 96;
    return p;
}

std::unique_ptr<model> load_synth(const std::string& path, const synth_params& p, weight_format wf = weight_format::f32,
                                  const std::function<void(model_weights&)>& tweak = {}) {
    synth_write(p, path);
    gguf::file f = gguf::file::open(path);
    model_config cfg = model_config::from_gguf(f);
    model_weights w = model_weights::load(f, cfg, weight_load_options{wf});
    if (tweak) tweak(w);
    return std::make_unique<model>(std::move(cfg), std::move(w));
}

// The engine (ref and CPU backends) against the reference forward: a whole prompt with every
// position's logits, then chunks and single decode tokens over the same pages.
void engine_matches_reference(const std::string& what, const model& m, double tol = logits_rel_tol) {
    const int32_t n_vocab = m.config().n_vocab;
    const auto toks = test::random_ids(30, n_vocab, 42);
    const auto want = reference_logits(m, toks);
    cpu::thread_pool pool(2);
    for (backend be : {backend::ref, backend::cpu}) {
        INFO(what, " on ", name_of(be));
        exec_ctx ctx{be, &pool};
        test::paged_kv kv(m.make_kv_layout(16), 8);
        sequence_kv seq = kv.sequence();
        REQUIRE(seq.reserve(int32_t(toks.size())));
        std::vector<float> all(toks.size() * size_t(n_vocab));
        batch s;
        s.add_seq(0, 0, toks, seq.block_table(), {}, 0);
        const_cast<model&>(m).forward(ctx, s, kv, all.data());
        for (size_t i = 0; i < toks.size(); ++i) {
            INFO("position ", i);
            CHECK(max_rel_diff(&all[i * size_t(n_vocab)], want[i]) <= tol);
        }
        std::vector<float> last(static_cast<size_t>(n_vocab));
        int32_t done = 0;
        for (int32_t chunk : {7, 1, 13}) {
            const_cast<model&>(m).forward(ctx, one_sequence(std::span(toks).subspan(size_t(done), size_t(chunk)), done,
                                                            seq.block_table()),
                                          kv, last.data());
            done += chunk;
            INFO("chunked to ", done);
            CHECK(max_rel_diff(last.data(), want[size_t(done - 1)]) <= tol);
        }
        while (done < int32_t(toks.size())) {
            const_cast<model&>(m).forward(ctx, one_sequence(std::span(&toks[size_t(done)], 1), done, seq.block_table()),
                                          kv, last.data());
            INFO("decode at ", done);
            CHECK(max_rel_diff(last.data(), want[size_t(done)]) <= tol);
            ++done;
        }
    }
}

// The reference's logits with the model's config changed: a feature the engine ignored would
// move them by more than the tolerance.
double reference_change(const model& m, const std::function<void(model_config&)>& change) {
    model_config c = m.config();
    change(c);
    const auto toks = test::random_ids(10, c.n_vocab, 7);
    reference_forward a(m.config(), m.weights(), 10), b(c, m.weights(), 10);
    double worst = 0;
    for (int32_t i = 0; i < 10; ++i) {
        const std::vector<float> la = a.forward(toks[size_t(i)], i);
        worst = std::max(worst, max_rel_diff(b.forward(toks[size_t(i)], i).data(), la));
    }
    return worst;
}

} // namespace

TEST_CASE("routing: softmax, top k with ties to the lower index, weights renormalised or not") {
    cpu::thread_pool pool(2);
    // token 0: a three-way tie for first (experts 1, 2, 4); token 1: all equal; token 2: one clear winner
    const std::vector<float> logits{1, 3, 3, 0, 3, /**/ 0, 0, 0, 0, 0, /**/ -1, 0, 5, 2, 0};
    for (backend be : {backend::ref, backend::cpu}) {
        INFO(name_of(be));
        for (bool norm : {false, true}) {
            std::vector<int32_t> ids(6, -1);
            std::vector<float> w(6, -1);
            ops::moe_route(exec_ctx{be, &pool}, ids.data(), w.data(), logits.data(), 3, 5, 2, norm);
            CHECK(ids == std::vector<int32_t>{1, 2, 0, 1, 2, 3});
            if (norm) {
                for (int j : {0, 1, 2, 3}) CHECK(w[size_t(j)] == doctest::Approx(0.5f));
                const double a = std::exp(5.0), b = std::exp(2.0);
                CHECK(w[4] == doctest::Approx(a / (a + b)));
                CHECK(w[5] == doctest::Approx(b / (a + b)));
            } else {
                const double s0 = 3 * std::exp(3.0) + std::exp(1.0) + 1;
                CHECK(w[0] == doctest::Approx(std::exp(3.0) / s0));
                CHECK(w[1] == doctest::Approx(std::exp(3.0) / s0));
                CHECK(w[2] == doctest::Approx(0.2f));
                const double s2 = std::exp(-1.0) + 2 + std::exp(5.0) + std::exp(2.0);
                CHECK(w[4] == doctest::Approx(std::exp(5.0) / s2));
            }
        }
    }
    // the grouping: tokens ascending within each expert, each with its weight
    const std::vector<int32_t> ids{1, 2, 0, 1, 2, 3};
    const std::vector<float> w{0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
    const ops::expert_groups g = ops::group_by_expert(ids.data(), w.data(), 3, 2, 5);
    CHECK(g.offset == std::vector<int32_t>{0, 1, 3, 5, 6, 6});
    CHECK(g.tokens == std::vector<int32_t>{1, 0, 1, 0, 2, 2});
    CHECK(g.weights == std::vector<float>{0.3f, 0.1f, 0.4f, 0.2f, 0.5f, 0.6f});
    CHECK(g.n_active() == 4);
}

TEST_CASE("engine forward equals the reference forward on each mixture-of-experts architecture") {
    test::scratch_dir dir("moe");
    SUBCASE("qwen3moe: top 3 of 8 renormalised, q/k norms, wide heads") {
        auto m = load_synth(dir.file("qwen3moe.gguf"), tiny_moe("qwen3moe"));
        const model_config& c = m->config();
        CHECK(c.n_expert == 8);
        CHECK(c.n_expert_used == 3);
        CHECK(c.n_ff_exp == 64);
        CHECK(c.n_ff_shexp == 0);
        CHECK(c.expert_norm);
        CHECK(c.qk_norm);
        CHECK(c.rope == rope_style::neox);
        CHECK(m->weights().layers[0].gate_exps.size() == 8);
        CHECK(m->weights().layers[0].w_gate.empty());
        CHECK(reference_change(*m, [](model_config& x) { x.expert_norm = false; }) > 100 * logits_rel_tol);
        CHECK(reference_change(*m, [](model_config& x) { x.n_expert_used = 2; }) > 100 * logits_rel_tol);
        engine_matches_reference("qwen3moe", *m);
    }
    SUBCASE("qwen2moe: the shared expert and its sigmoid gate, no renormalisation, q/k/v biases") {
        auto m = load_synth(dir.file("qwen2moe.gguf"), tiny_moe("qwen2moe"));
        const model_config& c = m->config();
        CHECK(c.n_ff_shexp == 96);
        CHECK_FALSE(c.expert_norm);
        CHECK(c.qkv_bias);
        CHECK(reference_change(*m, [](model_config& x) { x.expert_norm = true; }) > 100 * logits_rel_tol);
        CHECK(reference_change(*m, [](model_config& x) { x.n_ff_shexp = 0; }) > 100 * logits_rel_tol);
        engine_matches_reference("qwen2moe", *m);
    }
    SUBCASE("mixtral: llama with top 2 of 8 experts of n_ff") {
        auto m = load_synth(dir.file("mixtral.gguf"), tiny_moe("mixtral"));
        const model_config& c = m->config();
        CHECK(c.arch == "llama");
        CHECK(c.n_ff_exp == c.n_ff);
        CHECK(c.n_expert_used == 2);
        CHECK(c.expert_norm);
        CHECK(c.rope == rope_style::normal);
        engine_matches_reference("mixtral", *m);
    }
}

TEST_CASE("a step reads each chosen expert once: all tokens on one expert, and every expert touched") {
    test::scratch_dir dir("moe-groups");
    synth_params p = tiny_moe("qwen3moe");
    p.n_expert_used = 1;
    // A router of zeros ties every expert for every token: each picks expert 0.
    auto one = load_synth(dir.file("one.gguf"), p, weight_format::int8, [](model_weights& w) {
        for (layer_weights& l : w.layers) std::fill(l.router.data.begin(), l.router.data.end(), 0.0f);
    });
    const int64_t expert_bytes = one->weights().expert_bytes() / (p.n_expert * p.n_layer);
    cpu::thread_pool pool(2);
    const int32_t n_vocab = one->config().n_vocab;
    for (backend be : {backend::ref, backend::cpu}) {
        test::paged_kv kv(one->make_kv_layout(16), 16);
        sequence_kv a = kv.sequence(), b = kv.sequence();
        REQUIRE(a.reserve(40));
        REQUIRE(b.reserve(40));
        batch s;
        s.add_seq(0, 0, test::random_ids(40, n_vocab, 1), a.block_table(), {}, 39);
        s.add_seq(1, 0, test::random_ids(40, n_vocab, 2), b.block_table(), {}, 39);
        std::vector<float> logits(2 * size_t(n_vocab));
        const model::expert_reads before = one->expert_reads_total();
        one->forward(exec_ctx{be, &pool}, s, kv, logits.data());
        const model::expert_reads after = one->expert_reads_total();
        INFO(name_of(be));
        CHECK(after.runs - before.runs == p.n_layer);                      // one expert a layer for 80 tokens
        CHECK(after.bytes - before.bytes == p.n_layer * expert_bytes);
        for (float x : logits) REQUIRE(std::isfinite(x));
    }
    // Every token on every expert (top 8 of 8) over a prefill of 64 tokens: each expert is run
    // (read) once per layer however many tokens it has; and the engine still equals the
    // reference (the weights summed by expert, not by token).
    synth_params every = tiny_moe("qwen3moe");
    every.n_expert_used = 8;
    auto all = load_synth(dir.file("all.gguf"), every, weight_format::f32);
    engine_matches_reference("top 8 of 8", *all);
    test::paged_kv kv(all->make_kv_layout(16), 8);
    sequence_kv seq = kv.sequence();
    REQUIRE(seq.reserve(64));
    std::vector<float> logits(static_cast<size_t>(n_vocab));
    const model::expert_reads before = all->expert_reads_total();
    all->forward(exec_ctx{backend::cpu, &pool}, one_sequence(test::random_ids(64, n_vocab, 3), 0, seq.block_table()), kv,
                 logits.data());
    const model::expert_reads after = all->expert_reads_total();
    CHECK(after.runs - before.runs == 8 * p.n_layer);
    CHECK(after.bytes - before.bytes == all->weights().expert_bytes());
}

TEST_CASE("INT8 and low-bit experts track the reference, and a batch gives each sequence its solo logits") {
    test::scratch_dir dir("moe-quant");
    cpu::thread_pool pool(2);
    struct variant {
        const char* name;
        dtype type;
        weight_format wf;
        bool lowbit;
    };
    for (const variant& v : {variant{"int8 from Q8_0", dtype::q8_0, weight_format::int8, false},
                             variant{"low-bit Q4_0", dtype::q4_0, weight_format::native, true},
                             variant{"low-bit Q4_K", dtype::q4_k, weight_format::native, true}}) {
        INFO(v.name);
        synth_params p = tiny_moe("qwen2moe");
        p.type = v.type;
        p.n_embd = 256; // K-quants' super-blocks of 256
        p.n_ff = 256;
        p.n_ff_exp = 256;
        p.n_ff_shexp = 256;
        p.n_head = 4;
        p.n_head_kv = 2;
        auto m = load_synth(dir.file(std::string(name_of(v.type)) + ".gguf"), p, v.wf);
        const layer_weights& l = m->weights().layers[1];
        CHECK(l.gate_exps[3].is_lowbit() == v.lowbit);
        CHECK(l.down_exps[7].is_integer());
        CHECK(l.router.is_f32());
        CHECK(m->weights().family() == (v.lowbit ? "low-bit" : "int8"));
        // teacher-forced against the reference over the same (dequantized) weights
        const int32_t n_vocab = m->config().n_vocab;
        const auto toks = test::random_ids(32, n_vocab, 9);
        const auto want = reference_logits(*m, toks);
        test::paged_kv kv(m->make_kv_layout(16), 16);
        sequence_kv seq = kv.sequence();
        REQUIRE(seq.reserve(32));
        std::vector<float> all(toks.size() * size_t(n_vocab));
        batch s;
        s.add_seq(0, 0, toks, seq.block_table(), {}, 0);
        m->forward(exec_ctx{backend::cpu, &pool}, s, kv, all.data());
        int agree = 0;
        for (size_t i = 0; i < toks.size(); ++i) {
            const float* got = &all[i * size_t(n_vocab)];
            agree += std::max_element(got, got + n_vocab) - got ==
                     std::max_element(want[i].begin(), want[i].end()) - want[i].begin();
        }
        INFO("top-1 agreement ", agree, "/", toks.size());
        CHECK(agree >= int(toks.size()) * 9 / 10);
        // three sequences in one step (their tokens grouped by expert together) and each alone
        const std::vector<std::vector<token_id>> prompts{test::random_ids(9, n_vocab, 1), test::random_ids(3, n_vocab, 2),
                                                         test::random_ids(17, n_vocab, 3)};
        std::vector<std::unique_ptr<sequence_kv>> seqs;
        batch b;
        for (const auto& pr : prompts) {
            seqs.push_back(std::make_unique<sequence_kv>(kv.pages, 16));
            REQUIRE(seqs.back()->reserve(int32_t(pr.size())));
            b.add_seq(b.seq_id.size(), 0, pr, seqs.back()->block_table(), {}, int32_t(pr.size()) - 1);
        }
        std::vector<float> together(prompts.size() * size_t(n_vocab)), solo(static_cast<size_t>(n_vocab));
        m->forward(exec_ctx{backend::cpu, &pool}, b, kv, together.data());
        for (size_t i = 0; i < prompts.size(); ++i) {
            sequence_kv alone = kv.sequence();
            REQUIRE(alone.reserve(int32_t(prompts[i].size())));
            m->forward(exec_ctx{backend::cpu, &pool}, one_sequence(prompts[i], 0, alone.block_table()), kv, solo.data());
            INFO("sequence ", i);
            CHECK(max_rel_diff(&together[i * size_t(n_vocab)], solo) <= logits_rel_tol);
        }
    }
}

TEST_CASE("mixture-of-experts keys and tensors Tandem does not handle are refused by name") {
    test::scratch_dir dir("moe-refuse");
    synth_params p = tiny_moe("qwen3moe");
    const std::string path = dir.file("base.gguf");
    synth_write(p, path);
    const auto refusal = [&](const std::function<void(gguf::writer&)>& edit) {
        gguf::file f = gguf::file::open(path);
        gguf::writer w;
        for (const auto& kv : f.metadata()) w.set(kv.key, kv.val);
        edit(w);
        for (const auto& t : f.tensors())
            w.add_tensor(t.name, t.type, t.ne, [&f, name = t.name](std::span<uint8_t> out) {
                const gguf::tensor_info* ti = f.find_tensor(name);
                std::copy(ti->data, ti->data + ti->n_bytes, out.data());
            });
        const std::string edited = dir.file("edited.gguf");
        w.write(edited);
        try {
            gguf::file g = gguf::file::open(edited);
            model_config cfg = model_config::from_gguf(g);
            model_weights::load(g, cfg);
        } catch (const tandem::error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    CHECK(refusal([](gguf::writer& w) { w.set_u32("qwen3moe.expert_gating_func", 2); }).find("expert_gating_func") !=
          std::string::npos);
    CHECK(refusal([](gguf::writer& w) { w.set_u32("qwen3moe.expert_group_count", 4); }).find("expert_group_count") !=
          std::string::npos);
    CHECK(refusal([](gguf::writer& w) { w.set_f32("qwen3moe.expert_weights_scale", 2.5f); })
              .find("expert_weights_scale") != std::string::npos);
    CHECK(refusal([](gguf::writer&) {}).empty());
}

TEST_CASE("tandem quantize keeps the router and the experts, which load as the original's") {
    test::scratch_dir dir("moe-quantize");
    synth_params p = tiny_moe("qwen2moe");
    p.type = dtype::q8_0;
    const std::string in = dir.file("in.gguf"), out = dir.file("out.gguf");
    synth_write(p, in);
    cpu::thread_pool pool(2);
    quantize_gguf(in, out, pool);
    gguf::file f = gguf::file::open(out);
    CHECK(f.find_tensor("blk.0.ffn_gate_inp.weight")->type == dtype::f32);
    CHECK(f.find_tensor("blk.0.ffn_up_exps.weight")->type == dtype::q8_0);
    CHECK(f.find_tensor("blk.0.attn_q.weight")->type == dtype::i8);
    auto a = load_synth(dir.file("again.gguf"), p, weight_format::int8);
    model_config cfg = model_config::from_gguf(f);
    model b(cfg, model_weights::load(f, cfg, weight_load_options{weight_format::int8}));
    const int32_t n_vocab = cfg.n_vocab;
    const auto toks = test::random_ids(12, n_vocab, 5);
    std::vector<float> la(static_cast<size_t>(n_vocab)), lb(la.size());
    for (model* m : {a.get(), &b}) {
        test::paged_kv kv(m->make_kv_layout(16), 4);
        sequence_kv seq = kv.sequence();
        REQUIRE(seq.reserve(12));
        m->forward(exec_ctx{backend::cpu, &pool}, one_sequence(toks, 0, seq.block_table()), kv,
                   (m == &b ? lb : la).data());
    }
    CHECK(max_rel_diff(lb.data(), la) <= logits_rel_tol);
}

TEST_CASE("the weights a model will hold, estimated from the file, and a model that cannot fit refused with them") {
    test::scratch_dir dir("moe-fit");
    synth_params p = tiny_moe("qwen2moe");
    p.type = dtype::q4_0;
    const std::string path = dir.file("q4.gguf");
    synth_write(p, path);
    gguf::file f = gguf::file::open(path);
    for (weight_format wf : {weight_format::native, weight_format::int8, weight_format::f32}) {
        INFO(name_of(wf));
        model_config cfg = model_config::from_gguf(f);
        const model_weights w = model_weights::load(f, cfg, weight_load_options{wf});
        const weight_estimate est = estimate_weight_bytes(f, wf);
        if (wf == weight_format::native) { // the low-bit layout, exactly
            CHECK(est.bytes == w.bytes());
            CHECK(est.expert_bytes == w.expert_bytes());
        } else { // (INT8: the estimate counts the row sums, which bytes() leaves out, not the blocks' padding)
            CHECK(std::abs(double(est.bytes) / double(w.bytes()) - 1) < 0.1);
            CHECK(std::abs(double(est.expert_bytes) / double(w.expert_bytes()) - 1) < 0.1);
        }
        CHECK_NOTHROW(check_weights_fit(path, est, wf, est.bytes));
        std::string why;
        try {
            check_weights_fit(path, est, wf, est.bytes - 1);
        } catch (const tandem::error& e) {
            why = e.what();
        }
        CHECK(why.find(path + " needs") != std::string::npos);
        CHECK(why.find("of them the experts") != std::string::npos);
        CHECK(why.find("available (MemAvailable)") != std::string::npos);
    }
}
