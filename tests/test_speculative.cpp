// Speculative decoding: prompt lookup and the draft model give plain decoding's greedy tokens
// (and its seeded sampled tokens with prompt lookup), alone and in batches; sampled drafts
// keep plain decoding's distribution (chi-square); the adaptive policy; the vocabulary check.
#include "engine_fixtures.hpp"
#include "runtime/draft_model.hpp"
#include "runtime/prompt_lookup.hpp"
#include "runtime/speculation.hpp"
#include "runtime/engine.hpp"
#include "runtime/error.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "runtime/synth.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>

using namespace tandem;
using tandem::test::collector;
using tandem::test::greedy;
using tandem::test::stories;

// What a draft costs on a large model at a small batch: stories260K's steps are so small that
// the measured cost turns speculation down, and these tests are about its mechanics.
constexpr double cheap_drafts = 0.05;

TEST_CASE("ngram_draft: the longest recurring suffix, its latest occurrence, what followed it") {
    const std::vector<token_id> t{5, 6, 7, 8, 9, 6, 7, 1, 2, 6, 7};
    // The suffix 6 7 recurs at 5 (then 1 2 6 7) and at 1 (then 8 9); the latest wins.
    CHECK(ngram_draft(t, 3) == std::vector<token_id>{1, 2, 6});
    CHECK(ngram_draft(t, 10) == std::vector<token_id>{1, 2, 6, 7}); // up to the end of the sequence
    CHECK(ngram_draft(t, 0).empty());
    // The longest suffix first: 9 6 7 ... no; 2 6 7 does not recur, 6 7 does (n = 2 beats n = 1's 7).
    const std::vector<token_id> u{1, 7, 3, 6, 7, 4, 6, 7};
    CHECK(ngram_draft(u, 2) == std::vector<token_id>{4, 6});
    CHECK(ngram_draft(u, 2, 3, 3).empty()); // only 3-grams: 4 6 7 never came before
    CHECK(ngram_draft(std::vector<token_id>{4, 4, 4}, 5) == std::vector<token_id>{4}); // a run overlaps itself
    CHECK(ngram_draft(std::vector<token_id>{1, 2, 3}, 4).empty());
    CHECK(ngram_draft(std::vector<token_id>{1}, 4).empty());
}

namespace {

// Runs each request on one engine at once and returns every request's tokens and the stats.
std::pair<std::vector<std::vector<token_id>>, engine_stats> run_all(const engine_options& o,
                                                                     const std::vector<engine_request>& reqs) {
    model_bundle& b = stories();
    auto eng = make_local_engine(*b.mdl, *b.tok, o);
    std::vector<collector> cs(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) REQUIRE(eng->submit(reqs[i], cs[i].sink()).status == submit_status::ok);
    std::vector<std::vector<token_id>> out;
    for (auto& c : cs) {
        REQUIRE(c.wait());
        out.push_back(c.ids);
    }
    const engine_stats st = eng->stats();
    eng->stop();
    return {out, st};
}

} // namespace

TEST_CASE("engine: prompt-lookup speculation gives plain decoding's tokens, greedy and seeded sampling, alone and batched") {
    // A copy-heavy prompt (the continuation repeats a passage), story openings, and one that repeats nothing.
    const std::vector<std::string> prompts = {
        "Lily saw a big red ball. She wanted to play with the ball. Lily saw a big red ball. She wanted",
        "Once upon a time", "The cat sat on the mat and the dog sat on the", "Tom had a toy car"};
    std::vector<engine_request> greedy_reqs, sampled_reqs;
    for (size_t i = 0; i < prompts.size(); ++i) {
        greedy_reqs.push_back(greedy(prompts[i], 40));
        engine_request s = greedy(prompts[i], 40);
        s.sampling.temperature = 1.0f;
        s.sampling.seed = 100 + i;
        sampled_reqs.push_back(s);
    }
    engine_options plain_opts, spec_opts;
    spec_opts.max_draft_tokens = 4;
    spec_opts.draft_cost = cheap_drafts;
    for (const auto* reqs : {&greedy_reqs, &sampled_reqs}) {
        auto spec = *reqs;
        for (auto& r : spec) r.draft_tokens = 4;
        const auto [want, plain_st] = run_all(plain_opts, *reqs);
        // Batched: all at once; alone: each on its own engine.
        const auto [got, st] = run_all(spec_opts, spec);
        for (size_t i = 0; i < prompts.size(); ++i) {
            INFO("prompt ", i, " temperature ", (*reqs)[i].sampling.temperature);
            CHECK(got[i] == want[i]);
            const auto [alone, alone_st] = run_all(spec_opts, {spec[i]});
            CHECK(alone[0] == want[i]);
            if (i == 0 && (*reqs)[i].sampling.temperature == 0) { // the copy-heavy prompt, greedy: accepted drafts save steps
                const uint64_t plain_steps = run_all(plain_opts, {(*reqs)[i]}).second.n_steps;
                MESSAGE("copy-heavy prompt, greedy: ",
                        alone_st.n_accepted_tokens, " of ", alone_st.n_draft_tokens, " drafts accepted, ",
                        alone_st.n_steps, " steps against ", plain_steps);
                CHECK(alone_st.n_accepted_tokens > 0);
                CHECK(alone_st.n_steps < plain_steps);
            }
        }
        CHECK(plain_st.n_draft_tokens == 0);
        CHECK(st.n_draft_tokens > 0);
        CHECK(st.n_accepted_tokens <= st.n_draft_tokens);
    }
    // A request that says nothing takes the engine's setting (the daemon's draft_tokens); 0 is off.
    engine_request unset = greedy(prompts[0], 20), off = unset;
    off.draft_tokens = 0;
    const auto [by_default, default_st] = run_all(spec_opts, {unset});
    CHECK(default_st.n_draft_tokens > 0);
    const auto [switched_off, off_st] = run_all(spec_opts, {off});
    CHECK(off_st.n_draft_tokens == 0);
    CHECK(by_default == switched_off);
}

namespace {

// Allows only the token after the last accepted one: 100, 101, 102, ... (no token repeats).
struct ascending_processor final : logits_processor {
    token_id next = 100;
    std::string_view name() const override { return "ascending"; }
    void apply(std::span<float> logits, std::span<const token_id>) override {
        for (size_t i = 0; i < logits.size(); ++i)
            if (token_id(i) != next) logits[i] = -std::numeric_limits<float>::infinity();
    }
    void accept(token_id t) override { next = t + 1; }
    std::unique_ptr<logits_processor> clone() const override { return std::make_unique<ascending_processor>(*this); }
};

} // namespace

TEST_CASE("engine: drafts that always fail are proposed less and less, and the output stays plain decoding's") {
    // Every token the output will hold follows in the prompt with a 7 after it, so each lookup
    // drafts a 7 first, which the output never has: every draft is rejected.
    engine_request req = greedy("", 60);
    req.prompt = {1};
    for (token_id t = 100; t < 170; ++t) req.prompt.insert(req.prompt.end(), {t, 7});
    req.make_processor = [] { return std::make_unique<ascending_processor>(); };
    req.draft_tokens = 4;
    engine_options o;
    o.max_draft_tokens = 4;
    o.draft_cost = cheap_drafts;
    const auto [out, st] = run_all(o, {req});
    std::vector<token_id> want(60);
    std::iota(want.begin(), want.end(), 100);
    CHECK(out[0] == want);
    CHECK(st.n_accepted_tokens == 0);
    // Two drafts (what a rate of 0.4 is worth), then one after pauses of 4, 8, 16 and 32
    // tokens: far fewer than the 4 a token (236) a fixed length would compute.
    MESSAGE(st.n_draft_tokens, " drafts for 60 tokens");
    CHECK(st.n_draft_tokens > 0);
    CHECK(st.n_draft_tokens <= 6);
}

namespace {

// A random one-layer model with stories260K's vocabulary: drafts that mostly fail.
model_bundle& random_draft() {
    static test::scratch_dir dir("draft-model");
    static model_bundle b = [] {
        synth_params p = synth_preset("tiny");
        p.n_layer = 1;
        p.n_embd = 32;
        p.n_head = 2;
        p.n_head_kv = 1;
        p.n_ff = 64;
        p.n_ctx = 512;
        p.seed = 5;
        p.vocab_from = test::model_path("stories260K.gguf");
        synth_write(p, dir.file("draft.gguf"));
        return load_draft_model(dir.file("draft.gguf"), *stories().tok, {});
    }();
    return b;
}

// stories260K with every weight scaled by a seeded 1 + noise * u, u uniform in [-1, 1): a
// draft model whose tokens agree with the model's often, but not always.
model_bundle& perturbed_draft() {
    constexpr float noise = 0.2f;
    static test::scratch_dir dir("draft-perturbed");
    static model_bundle b = [] {
        const gguf::file src = gguf::file::open(test::model_path("stories260K.gguf"));
        gguf::writer w;
        for (const auto& kv : src.metadata()) w.set(kv.key, kv.val);
        rng r(7);
        std::vector<std::vector<float>> copies;
        for (const auto& t : src.tensors()) {
            REQUIRE(t.type == dtype::f32);
            auto& x = copies.emplace_back(size_t(t.n_elements()));
            std::memcpy(x.data(), t.data, x.size() * sizeof(float));
            for (float& v : x) v *= 1.0f + noise * float(r.uniform() * 2.0 - 1.0);
            w.add_tensor(t.name, dtype::f32, t.ne,
                         std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(x.data()), x.size() * sizeof(float)));
        }
        w.write(dir.file("perturbed.gguf"));
        return load_draft_model(dir.file("perturbed.gguf"), *stories().tok, {});
    }();
    return b;
}

} // namespace

TEST_CASE("draft model: greedy output is plain decoding's, alone and batched, with penalties and stop strings") {
    const std::vector<std::string> prompts = {"Once upon a time", "The cat sat on the mat and the dog sat on the",
                                              "Tom had a toy car", "Lily saw a big red ball. She wanted"};
    std::vector<engine_request> reqs;
    for (const auto& p : prompts) reqs.push_back(greedy(p, 40));
    reqs[1].sampling.repetition_penalty = 1.3f;
    reqs[1].sampling.frequency_penalty = 0.5f;
    reqs[2].stop = {" the"};
    reqs[2].ignore_eos = false;
    engine_options plain;
    const auto [want, plain_st] = run_all(plain, reqs);
    for (model_bundle* draft : {&random_draft(), &perturbed_draft(), &stories()}) {
        const bool self = draft == &stories();
        const std::string name = self ? "self-draft" : draft == &random_draft() ? "random draft" : "perturbed draft";
        INFO(name);
        engine_options o;
        o.max_draft_tokens = 4;
        o.draft_cost = cheap_drafts;
        o.draft_model = draft->mdl.get();
        const auto [got, st] = run_all(o, reqs);
        for (size_t i = 0; i < reqs.size(); ++i) {
            INFO("prompt ", i);
            CHECK(got[i] == want[i]);
            const auto [alone, alone_st] = run_all(o, {reqs[i]});
            CHECK(alone[0] == want[i]);
            // Its greedy drafts are the model's own tokens (no penalties or stop strings here): every one stands.
            if (self && (i == 0 || i == 3)) CHECK(alone_st.n_accepted_tokens == alone_st.n_draft_tokens);
        }
        MESSAGE(name, ": ", st.n_accepted_tokens, " of ", st.n_draft_tokens,
                " drafts accepted in ", st.n_drafts, " verifications, ", st.n_steps, " steps against ", plain_st.n_steps);
        CHECK(st.n_draft_tokens > 0);
        CHECK(st.n_drafts > 0);
        CHECK(st.draft_device.find("cpu") != std::string::npos);
        uint64_t by_position = 0;
        for (uint64_t n : st.n_accepted_at) by_position += n;
        CHECK(by_position == st.n_accepted_tokens);
        CHECK(st.n_accepted_tokens < st.n_draft_tokens); // the penalties are the target's alone
        if (draft != &random_draft()) CHECK(st.n_steps < plain_st.n_steps);
    }
    // The done event counts the sequence's drafts.
    engine_options o;
    o.max_draft_tokens = 4;
    o.draft_cost = cheap_drafts;
    o.draft_model = stories().mdl.get();
    auto eng = make_local_engine(*stories().mdl, *stories().tok, o);
    collector c;
    REQUIRE(eng->submit(reqs[0], c.sink()).status == submit_status::ok);
    REQUIRE(c.wait());
    CHECK(c.n_draft_tokens > 0);
    CHECK(c.n_accepted_tokens == c.n_draft_tokens);
    CHECK(uint64_t(c.n_draft_tokens) == eng->stats().n_draft_tokens);
    // A request may ask for prompt lookup instead: the engine's draft model stays idle.
    engine_request lookup = greedy("Lily saw a ball. Lily saw a ball. Lily saw", 20);
    lookup.drafts = draft_source::ngram;
    collector l;
    REQUIRE(eng->submit(lookup, l.sink()).status == submit_status::ok);
    REQUIRE(l.wait());
    CHECK(l.n_draft_tokens > 0);
    eng->stop();
}

namespace {

// The critical value of chi-square with df degrees of freedom at p = 0.001 (Wilson-Hilferty).
double chi_square_critical(int df) {
    const double z = 3.0902, k = 2.0 / (9.0 * df);
    return df * std::pow(1.0 - k + z * std::sqrt(k), 3.0);
}

// Tokens 1..3 of n seeded samples (temperature 1) of one prompt, counted by (position, token).
std::map<std::pair<int, token_id>, int> first_tokens(engine_options o, draft_source drafts, int n, uint64_t seed0) {
    const std::string prompt = "Lily saw a ball. Lily saw a ball. Lily";
    o.sched.max_running = 64;
    o.max_waiting = n;
    o.max_draft_batch = 64; // drafts in every step of this test, however many run
    auto eng = make_local_engine(*stories().mdl, *stories().tok, o);
    std::vector<collector> cs(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
        engine_request r = greedy(prompt, 4);
        r.sampling.temperature = 1.0f;
        r.sampling.seed = seed0 + uint64_t(i);
        r.drafts = drafts;
        REQUIRE(eng->submit(r, cs[size_t(i)].sink()).status == submit_status::ok);
    }
    std::map<std::pair<int, token_id>, int> counts;
    for (auto& c : cs) {
        REQUIRE(c.wait());
        REQUIRE(c.ids.size() == 4);
        for (int pos = 1; pos < 4; ++pos) ++counts[{pos, c.ids[size_t(pos)]}];
    }
    const engine_stats st = eng->stats();
    MESSAGE(st.n_accepted_tokens, " of ", st.n_draft_tokens, " drafts accepted");
    if (o.max_draft_tokens > 0) CHECK(st.n_accepted_tokens > 0);
    eng->stop();
    return counts;
}

// Two-sample chi-square of equal-size samples over the cells either has (cells with fewer
// than 10 in both together pooled per position), and its degrees of freedom.
std::pair<double, int> homogeneity(const std::map<std::pair<int, token_id>, int>& a,
                                   const std::map<std::pair<int, token_id>, int>& b) {
    std::map<std::pair<int, token_id>, std::pair<int, int>> cells;
    for (const auto& [k, n] : a) cells[k].first += n;
    for (const auto& [k, n] : b) cells[k].second += n;
    std::map<std::pair<int, token_id>, std::pair<int, int>> pooled;
    for (const auto& [k, n] : cells) {
        const bool small = n.first + n.second < 10;
        auto& cell = pooled[{k.first, small ? token_id(-1) : k.second}];
        cell.first += n.first;
        cell.second += n.second;
    }
    double chi2 = 0;
    for (const auto& [k, n] : pooled) {
        const double d = n.first - n.second;
        if (n.first + n.second > 0) chi2 += d * d / (n.first + n.second);
    }
    return {chi2, int(pooled.size()) - 3}; // a distribution per position: one constraint each
}

} // namespace

TEST_CASE("speculative sampling keeps the model's distribution: chi-square at temperature 1, both draft kinds") {
    // Seeded, so deterministic: the same seeds with and without drafts. A rule that kept every
    // draft would give the perturbed draft model's tokens, past the threshold (p = 0.001).
    constexpr int n = 1500;
    const auto plain = first_tokens({}, draft_source::ngram, n, 1000);
    engine_options lookup;
    lookup.max_draft_tokens = 3;
    lookup.draft_cost = cheap_drafts;
    engine_options drafted = lookup;
    drafted.draft_model = perturbed_draft().mdl.get();
    for (const auto& [name, o, kind] : {std::tuple{"prompt lookup", lookup, draft_source::ngram},
                                        std::tuple{"draft model", drafted, draft_source::model}}) {
        // Other seeds for the speculative run: prompt lookup keeps plain decoding's tokens
        // for the same seed, which would make the test pass trivially.
        const auto spec = first_tokens(o, kind, n, 50000);
        const auto [chi2, df] = homogeneity(plain, spec);
        const double limit = chi_square_critical(df);
        MESSAGE(std::string(name), ": chi-square ", chi2, " with ", df, " degrees of freedom (limit ", limit, ")");
        CHECK(df >= 5);
        CHECK(chi2 < limit);
    }
}

TEST_CASE("draft model: a vocabulary that differs is refused at load, saying where") {
    test::scratch_dir dir("draft-vocab");
    synth_params p = synth_preset("tiny"); // its own made-up vocabulary of 512 tokens, as many as stories260K's
    synth_write(p, dir.file("other.gguf"));
    const model_bundle other = load_model(dir.file("other.gguf"));
    const std::string why = draft_vocab_mismatch(*stories().tok, *other.tok);
    CHECK(why.find("token ") == 0);
    CHECK(why.find("in the draft model") != std::string::npos);
    CHECK(draft_vocab_mismatch(*stories().tok, *random_draft().tok).empty());
    try {
        (void)load_draft_model(test::model_path("llama-2-tiny-random.gguf"), *stories().tok, {});
        FAIL("a draft model with another vocabulary loaded");
    } catch (const error& e) {
        CHECK(std::string(e.what()).find("its vocabulary has 32000 tokens, the model's 512") != std::string::npos);
    }
}

TEST_CASE("replayed drafts (the benchmark's upper bound): the output itself is accepted whole, a wrong one changes nothing") {
    engine_request req = greedy("Once upon a time", 40);
    const auto [want, plain_st] = run_all({}, {req});
    engine_options o;
    o.max_draft_tokens = 4;
    o.draft_cost = cheap_drafts;
    req.drafts = draft_source::replay;
    req.replay = want[0];
    const auto [got, st] = run_all(o, {req});
    CHECK(got[0] == want[0]);
    CHECK(st.n_draft_tokens > 0);
    CHECK(st.n_accepted_tokens == st.n_draft_tokens);
    CHECK(st.n_steps <= plain_st.n_steps / 4 + 2);
    for (token_id& t : req.replay) t = (t + 1) % stories().tok->n_vocab();
    const auto [shifted, shifted_st] = run_all(o, {req});
    CHECK(shifted[0] == want[0]);
    CHECK(shifted_st.n_accepted_tokens == 0);
}

namespace {

// One request on its own engine: each sequence's tokens, and the chosen tokens' logprobs.
std::unique_ptr<collector> run_one(const engine_options& o, const engine_request& req) {
    auto eng = make_local_engine(*stories().mdl, *stories().tok, o);
    auto c = std::make_unique<collector>();
    c->n_seqs = req.n;
    REQUIRE(eng->submit(req, c->sink()).status == submit_status::ok);
    REQUIRE(c->wait());
    eng->stop();
    return c;
}

} // namespace

TEST_CASE("speculation with n > 1, logprobs and a grammar mask: plain decoding's tokens and logprobs") {
    engine_options lookup, drafted;
    lookup.max_draft_tokens = 4;
    lookup.draft_cost = cheap_drafts;
    drafted.max_draft_tokens = 4;
    drafted.draft_cost = cheap_drafts;
    drafted.draft_model = perturbed_draft().mdl.get();
    const std::string copy = "Lily saw a big red ball. She wanted to play with the ball. Lily saw a big red ball. She";
    // Three seeded samples with prompt lookup (the same tokens as without), two greedy ones with
    // the draft model; logprobs of each chosen token.
    for (const auto& [o, t] : {std::pair{lookup, 1.0f}, std::pair{drafted, 0.0f}}) {
        const float temperature = t; // a plain variable: INFO captures it
        engine_request req = greedy(copy, 30);
        req.n = temperature > 0 ? 3 : 2;
        req.sampling.temperature = temperature;
        req.sampling.seed = 9;
        req.n_top_logprobs = 0;
        const auto plain_run = run_one({}, req);
        const collector& plain = *plain_run;
        const auto spec_run = run_one(o, req);
        const collector& spec = *spec_run;
        INFO("temperature ", temperature);
        REQUIRE(spec.by_seq.size() == size_t(req.n));
        CHECK(spec.by_seq == plain.by_seq);
        CHECK(spec.n_draft_tokens > 0);
        // Logprobs from rows computed with drafts beside them: the same up to rounding.
        REQUIRE(spec.logprobs.size() == plain.logprobs.size());
        for (size_t k = 0; k < spec.logprobs.size(); ++k) {
            REQUIRE(spec.logprobs[k].size() == plain.logprobs[k].size());
            for (size_t i = 0; i < spec.logprobs[k].size(); ++i)
                CHECK(spec.logprobs[k][i] == doctest::Approx(plain.logprobs[k][i]).epsilon(1e-4));
        }
    }
    // A grammar that allows one token at each step: the draft model's drafts that break it are
    // rejected, greedy and sampled.
    for (float temperature : {0.0f, 1.0f}) {
        engine_request req = greedy("", 40);
        req.prompt = {1, 100, 101, 102};
        req.sampling.temperature = temperature;
        req.sampling.seed = 3;
        req.make_processor = [] { return std::make_unique<ascending_processor>(); };
        const auto spec = run_one(drafted, req);
        std::vector<token_id> want(40);
        std::iota(want.begin(), want.end(), 100);
        CHECK(spec->ids == want);
        CHECK(spec->n_draft_tokens > 0);
    }
}

TEST_CASE("the policy's arithmetic: drafts_worth and step_cost") {
    // Cheap drafts that mostly stand: as many as allowed; costly ones, or ones that fall: none.
    CHECK(drafts_worth(0.9, 0.05, 8) == 8);
    CHECK(drafts_worth(0.9, 0.05, 3) == 3);
    CHECK(drafts_worth(0.44, 0.55, 8) == 0);  // stories260K's copy task: 44% stood, a draft costs half a step
    CHECK(drafts_worth(0.05, 0.05, 8) == 0);  // rarely stands: not worth even a cheap one
    const int32_t mid = drafts_worth(0.6, 0.07, 8);
    CHECK(mid >= 2);
    CHECK(mid < 8);                           // the gain levels off before the cost does
    CHECK(drafts_worth(1.0, 0.0, 0) == 0);
    // t = 10 ms + 1 ms a token: one more token over a step of 4 is 1 / 14.
    step_cost c;
    CHECK(c.relative(4, 0.3) == 0.3); // no steps yet: the prior
    for (int i = 0; i < 40; ++i) c.add(1 + i % 5, 0.010 + 0.001 * (1 + i % 5));
    CHECK(c.relative(4) == doctest::Approx(1.0 / 14.0).epsilon(1e-6));
    step_cost same;
    for (int i = 0; i < 40; ++i) same.add(1, 0.01); // every step one token: no slope to read
    CHECK(same.relative(1, 0.2) == 0.2);
}

TEST_CASE("the measured cost turns speculation down where a step is compute-bound (stories260K)") {
    // stories260K's steps are all overhead: five tokens cost about three times one. With the
    // cost measured, drafts from the model itself (all accepted) are proposed far less than
    // with a large model's cost, and the output is the same.
    engine_request req = greedy("Once upon a time", 200);
    engine_options measured;
    measured.max_draft_tokens = 4;
    measured.draft_model = stories().mdl.get();
    engine_options fixed = measured;
    fixed.draft_cost = cheap_drafts;
    const auto [want, plain_st] = run_all({}, {req});
    const auto [got, st] = run_all(measured, {req});
    const auto [got_fixed, fixed_st] = run_all(fixed, {req});
    MESSAGE("drafts with the measured cost: ", st.n_draft_tokens, ", with a large model's: ", fixed_st.n_draft_tokens);
    CHECK(got == want);
    CHECK(got_fixed == want);
    CHECK(st.n_draft_tokens * 2 < fixed_st.n_draft_tokens);
}
