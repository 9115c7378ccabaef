// Beam search: the engine's search equals a readable reference search over the reference
// forward (ids and scores), width 1 is greedy, a hand-built bigram model where greedy is not
// the best sequence, the same beams alone and in a busy batch, stop strings, cancellation,
// pages released; prompt scoring; cumulative logprobs of sampled sequences.
#include "engine_fixtures.hpp"
#include "cpu/thread_pool.hpp"
#include "runtime/engine.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "runtime/reference_forward.hpp"
#include "runtime/synth.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <thread>

using namespace tandem;
using tandem::test::collector;
using tandem::test::greedy;

namespace {

// ---- The reference: beam search as Hugging Face describes it, one readable step at a time.

// log-softmax of the logits after `prompt` + `tokens`: the reference forward from position 0.
std::vector<double> next_logprobs(const model& m, const std::vector<token_id>& prompt,
                                  const std::vector<token_id>& tokens, token_id biased, float bias) {
    std::vector<token_id> all = prompt;
    all.insert(all.end(), tokens.begin(), tokens.end());
    reference_forward f(m.config(), m.weights(), int32_t(all.size()));
    std::vector<float> logits;
    for (size_t pos = 0; pos < all.size(); ++pos) logits = f.forward(all[pos], int32_t(pos));
    if (biased >= 0) logits[size_t(biased)] += bias;
    double mx = -std::numeric_limits<double>::infinity();
    for (float x : logits) mx = std::max(mx, double(x));
    double z = 0;
    for (float x : logits) z += std::exp(double(x) - mx);
    std::vector<double> lp(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) lp[i] = double(logits[i]) - mx - std::log(z);
    return lp;
}

struct ref_beam {
    std::vector<token_id> tokens;
    double sum = 0;
};

struct ref_finished {
    std::vector<token_id> tokens;     // without the EOS
    token_id eos = -1;
    double sum = 0, score = 0;
};

struct ref_options {
    int width = 1, n = 1, max_tokens = 16;
    double length_penalty = 1;
    beam_params::stopping stopping = beam_params::stopping::heuristic;
    token_id eos = -1;                // -1: no end token (ignore_eos)
    float eos_bias = 0;               // added to EOS's logit (a logit_bias), so that beams end
};

double ref_score(double sum, size_t length, double lp) { return sum / std::pow(double(std::max<size_t>(length, 1)), lp); }

std::vector<ref_finished> reference_beam_search(const model& m, const std::vector<token_id>& prompt,
                                                const ref_options& o) {
    std::vector<ref_beam> beams{ref_beam{}};
    std::vector<ref_finished> done;   // the best `width` finished beams, best first
    auto add_done = [&](ref_finished f) {
        f.score = ref_score(f.sum, f.tokens.size(), o.length_penalty);
        done.push_back(f);
        std::stable_sort(done.begin(), done.end(), [](auto& a, auto& b) { return a.score > b.score; });
        if (int(done.size()) > o.width) done.pop_back();
    };
    for (int length = 1;; ++length) {
        // Each beam's 2 * width likeliest tokens (the lower id first on ties), as (sum, beam, token).
        struct cand {
            double sum;
            int beam;
            token_id t;
        };
        std::vector<cand> cands;
        for (int b = 0; b < int(beams.size()); ++b) {
            const std::vector<double> lp = next_logprobs(m, prompt, beams[size_t(b)].tokens, o.eos, o.eos_bias);
            std::vector<token_id> ids(lp.size());
            for (size_t i = 0; i < ids.size(); ++i) ids[i] = token_id(i);
            std::stable_sort(ids.begin(), ids.end(), [&](token_id a, token_id c) { return lp[size_t(a)] > lp[size_t(c)]; });
            for (int j = 0; j < 2 * o.width; ++j)
                cands.push_back({beams[size_t(b)].sum + lp[size_t(ids[size_t(j)])], b, ids[size_t(j)]});
        }
        std::stable_sort(cands.begin(), cands.end(), [](const cand& a, const cand& b) { return a.sum > b.sum; });
        std::vector<ref_beam> next;
        for (int rank = 0; rank < int(cands.size()) && int(next.size()) < o.width; ++rank) {
            const cand& c = cands[size_t(rank)];
            const ref_beam& parent = beams[size_t(c.beam)];
            if (c.t == o.eos) { // an ending among the best `width` finishes a beam
                if (rank < o.width) add_done({parent.tokens, c.t, c.sum});
                continue;
            }
            ref_beam b = parent;
            b.tokens.push_back(c.t);
            b.sum = c.sum;
            next.push_back(b);
        }
        beams = next;
        if (beams.empty()) break;
        if (length == o.max_tokens) {
            for (const ref_beam& b : beams) add_done({b.tokens, -1, b.sum});
            break;
        }
        if (int(done.size()) == o.width) {
            const double worst = done.back().score;
            const int at = o.stopping == beam_params::stopping::never && o.length_penalty > 0 ? o.max_tokens : length;
            if (o.stopping == beam_params::stopping::early ||
                worst >= ref_score(beams[0].sum, size_t(at), o.length_penalty))
                break;
        }
    }
    done.resize(std::min(done.size(), size_t(o.n)));
    return done;
}

// ---- The engine's search.

engine_request beam_request(const tokenizer& tok, const std::string& prompt, const ref_options& o) {
    engine_request r;
    r.prompt = tok.encode(prompt, true, false);
    r.max_tokens = o.max_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = o.eos < 0;
    r.n = o.n;
    r.beam.width = o.width;
    r.beam.length_penalty = float(o.length_penalty);
    r.beam.early_stopping = o.stopping;
    if (o.eos_bias != 0) r.sampling.logit_bias = {{o.eos, o.eos_bias}};
    return r;
}

struct engine_beams {
    std::vector<std::vector<token_id>> tokens; // [rank], the EOS not included
    std::vector<token_id> eos;
    std::vector<double> scores, sums;
    std::vector<std::string> finishes;
    std::string text0;
};

engine_beams read(collector& c, int n) {
    engine_beams e;
    e.tokens = c.by_seq;
    e.tokens.resize(size_t(n));
    e.eos = c.final_tokens;
    e.scores = c.scores;
    e.sums = c.sums;
    e.finishes = c.finishes;
    return e;
}

engine_beams run_beams(engine& eng, const engine_request& req) {
    collector c;
    c.n_seqs = req.n;
    REQUIRE(eng.submit(req, c.sink()).status == submit_status::ok);
    REQUIRE(c.wait(120));
    return read(c, req.n);
}

void check_equal(const engine_beams& e, const std::vector<ref_finished>& ref) {
    REQUIRE(e.tokens.size() == ref.size());
    for (size_t k = 0; k < ref.size(); ++k) {
        CAPTURE(k);
        CHECK(e.tokens[k] == ref[k].tokens);
        CHECK(e.eos[k] == ref[k].eos);
        CHECK(e.scores[k] == doctest::Approx(ref[k].score).epsilon(1e-4));
        CHECK(e.sums[k] == doctest::Approx(ref[k].sum).epsilon(1e-4));
    }
}

model_bundle& stories_f32() {
    static model_bundle b = load_model(test::model_path("stories260K.gguf"), {weight_format::f32, kv_dtype::f32, 0});
    return b;
}

engine_options beam_engine_options(int32_t max_running) {
    engine_options o;
    o.sched.max_running = max_running;
    o.sched.page_size = 8;
    o.sched.prefix_cache = false;
    return o;
}

} // namespace

TEST_CASE("beam search equals the reference search: stories260K, F32, widths 1, 2, 4, 8") {
    model_bundle& b = stories_f32();
    auto eng = make_local_engine(*b.mdl, *b.tok, beam_engine_options(8));
    const token_id eos = b.tok->eos();
    int n_ended_by_eos = 0, n_beams = 0, n_cases = 0;
    for (const std::string prompt : {"Once upon a time", "The little dog", "Lily and Ben went to the park. They"}) {
        for (int width : {1, 2, 4, 8}) {
            CAPTURE(prompt);
            CAPTURE(width);
            ref_options o;
            o.width = width;
            o.n = width;
            o.max_tokens = 24;
            o.eos = eos;
            o.eos_bias = 22;
            const auto ref = reference_beam_search(*b.mdl, b.tok->encode(prompt, true, false), o);
            check_equal(run_beams(*eng, beam_request(*b.tok, prompt, o)), ref);
            for (const auto& f : ref) n_ended_by_eos += f.eos >= 0;
            n_beams += int(ref.size());
            ++n_cases;
        }
    }
    CHECK(n_cases == 12);
    // The cases exercise both endings: EOS within the search, and max_tokens. (stories260K's
    // stories are separated by BOS, so EOS is all but impossible without the bias.)
    CHECK(n_ended_by_eos > 0);
    CHECK(n_ended_by_eos < n_beams);
}

TEST_CASE("beam search: length penalty, early stopping, fewer returned than searched, ignore_eos") {
    model_bundle& b = stories_f32();
    auto eng = make_local_engine(*b.mdl, *b.tok, beam_engine_options(8));
    const std::string prompt = "Once upon a time";
    struct variant {
        double lp;
        beam_params::stopping stopping;
        int width, n;
        bool eos;
    };
    for (const variant v : {variant{0.0, beam_params::stopping::heuristic, 4, 2, true},
                            variant{2.0, beam_params::stopping::never, 3, 3, true},
                            variant{1.0, beam_params::stopping::early, 4, 1, true},
                            variant{-1.0, beam_params::stopping::heuristic, 2, 2, true},
                            variant{1.0, beam_params::stopping::heuristic, 3, 2, false}}) {
        CAPTURE(v.lp);
        CAPTURE(int(v.stopping));
        CAPTURE(v.width);
        ref_options o;
        o.width = v.width;
        o.n = v.n;
        o.max_tokens = 20;
        o.length_penalty = v.lp;
        o.stopping = v.stopping;
        o.eos = v.eos ? b.tok->eos() : -1;
        check_equal(run_beams(*eng, beam_request(*b.tok, prompt, o)), reference_beam_search(*b.mdl, b.tok->encode(prompt, true, false), o));
    }
}

TEST_CASE("beam search of width 1 is greedy decoding") {
    model_bundle& b = stories_f32();
    auto eng = make_local_engine(*b.mdl, *b.tok, beam_engine_options(4));
    for (const std::string prompt : {"Once upon a time", "The cat"}) {
        // Without an end token the single beam is the argmax at every step.
        ref_options o;
        o.max_tokens = 40;
        const engine_beams e = run_beams(*eng, beam_request(*b.tok, prompt, o));
        engine_request g = beam_request(*b.tok, prompt, o);
        g.beam = {};
        collector c;
        REQUIRE(eng->submit(g, c.sink()).status == submit_status::ok);
        REQUIRE(c.wait());
        CHECK(e.tokens[0] == c.ids);
        CHECK(e.finishes[0] == "length");
        // With EOS and early stopping, the first ending is the answer: greedy's, EOS and all.
        o.eos = b.tok->eos();
        o.stopping = beam_params::stopping::early;
        o.max_tokens = 200;
        const engine_beams e2 = run_beams(*eng, beam_request(*b.tok, prompt, o));
        g = beam_request(*b.tok, prompt, o);
        g.beam = {};
        collector c2;
        REQUIRE(eng->submit(g, c2.sink()).status == submit_status::ok);
        REQUIRE(c2.wait());
        CHECK(e2.tokens[0] == c2.ids);
        CHECK(e2.eos[0] == c2.final_tokens[0]);
    }
}

namespace {

// A bigram model built by hand: attention and FFN outputs are zero, so the last hidden state
// is the current token's embedding, one-hot in its own dimension; the output matrix then
// gives the next token's logits from the current token alone (rmsnorm scales the one-hot by
// sqrt(n_embd)). After BOS: A 0.55, B 0.45. After A: X, Y, Z a third each. After B: C 0.95.
// After X, Y, Z, C: EOS. Greedy takes A then X (sum log(0.55/3), score -0.85 over two tokens);
// B C scores log(0.45 * 0.95) / 2 = -0.43.
struct bigram_model {
    std::string path;
    token_id bos = 1, eos = 2, a = 300, b_ = 301, c = 302, x = 303, y = 304, z = 305;

    bigram_model() {
        path = (std::filesystem::temp_directory_path() / fmt::format("tandem-bigram-{}.gguf", ::getpid())).string();
        synth_params p;
        p.n_layer = 1;
        p.n_embd = 16;
        p.n_head = 2;
        p.n_head_kv = 1;
        p.n_ff = 16;
        const std::string base = path + ".base";
        synth_write(p, base);
        {
            gguf::file f = gguf::file::open(base);
            gguf::writer w;
            for (const auto& kv : f.metadata())
                if (kv.key != "general.alignment") w.set(kv.key, kv.val);
            const int64_t d = p.n_embd, V = p.n_vocab;
            // token -> its dimension; every other token shares the last one (which ends at once)
            std::vector<token_id> states{bos, a, b_, c, x, y, z};
            auto dim_of = [&](token_id t) {
                auto it = std::find(states.begin(), states.end(), t);
                return it == states.end() ? d - 1 : int64_t(it - states.begin());
            };
            std::vector<float> embd(size_t(d * V), 0.0f), out(size_t(d * V), 0.0f);
            for (token_id t = 0; t < V; ++t) embd[size_t(t * d + dim_of(t))] = 1.0f;
            // logits[next] after state s = sqrt(d) * out[next][s]: fill log-probabilities (the
            // rest at -30, which holds their mass under 1e-10)
            const float scale = 1.0f / std::sqrt(float(d));
            auto set_next = [&](token_id s, std::vector<std::pair<token_id, double>> probs) {
                for (token_id v = 0; v < V; ++v) out[size_t(v * d + dim_of(s))] = -30.0f * scale;
                for (auto [v, pr] : probs) out[size_t(v * d + dim_of(s))] = float(std::log(pr)) * scale;
            };
            set_next(bos, {{a, 0.55}, {b_, 0.45}});
            set_next(a, {{x, 1.0 / 3}, {y, 1.0 / 3}, {z, 1.0 / 3}});
            set_next(b_, {{c, 0.95}, {eos, 0.05}});
            for (token_id s : {c, x, y, z, token_id(0)}) set_next(s, {{eos, 1.0}}); // (0: every other token)
            for (const auto& t : f.tensors()) {
                std::vector<uint8_t> bytes(t.data, t.data + t.n_bytes);
                auto fill = [&](const std::vector<float>& v) { std::memcpy(bytes.data(), v.data(), bytes.size()); };
                if (t.name == "token_embd.weight") fill(embd);
                else if (t.name == "output.weight") fill(out);
                else if (t.name == "output_norm.weight") fill(std::vector<float>(size_t(d), 1.0f));
                else if (t.name.ends_with("attn_output.weight") || t.name.ends_with("ffn_down.weight"))
                    std::fill(bytes.begin(), bytes.end(), uint8_t(0));
                w.add_tensor(t.name, t.type, t.ne, bytes);
            }
            w.write(path);
        }
        std::filesystem::remove(base);
    }
    ~bigram_model() { std::filesystem::remove(path); }
};

} // namespace

TEST_CASE("a hand-built model where greedy is not the best sequence: beam search finds the better one") {
    bigram_model bm;
    model_bundle b = load_model(bm.path, {weight_format::f32, kv_dtype::f32, 0});
    REQUIRE(b.tok->eos() == bm.eos);
    auto eng = make_local_engine(*b.mdl, *b.tok, beam_engine_options(4));
    engine_request req;
    req.prompt = {bm.bos};
    req.max_tokens = 8;
    req.sampling.temperature = 0;
    collector g;
    REQUIRE(eng->submit(req, g.sink()).status == submit_status::ok);
    REQUIRE(g.wait());
    CHECK(g.ids == std::vector<token_id>{bm.a, bm.x});
    CHECK(g.final_tokens[0] == bm.eos);
    const double greedy_score = std::log(0.55 / 3) / 2;

    req.beam.width = 2;
    req.n = 2;
    const engine_beams e = run_beams(*eng, req);
    CHECK(e.tokens[0] == std::vector<token_id>{bm.b_, bm.c});
    CHECK(e.eos[0] == bm.eos);
    CHECK(e.scores[0] == doctest::Approx(std::log(0.45 * 0.95) / 2).epsilon(1e-3));
    CHECK(e.scores[0] > greedy_score + 0.3);
    CHECK(e.tokens[1].size() == 2); // the runner-up: A then one of X, Y, Z
    CHECK(e.scores[1] == doctest::Approx(greedy_score).epsilon(1e-3));
    // the reference agrees
    ref_options o;
    o.width = 2;
    o.n = 2;
    o.max_tokens = 8;
    o.eos = bm.eos;
    check_equal(e, reference_beam_search(*b.mdl, req.prompt, o));
}

TEST_CASE("the same beams alone and in a busy batch; pages shared and released") {
    model_bundle& b = stories_f32();
    engine_options eo = beam_engine_options(12);
    auto eng = make_local_engine(*b.mdl, *b.tok, eo);
    ref_options o;
    o.width = 4;
    o.n = 4;
    o.max_tokens = 32;
    o.eos = b.tok->eos();
    const std::string prompt = "Once upon a time, there was a little girl named Lily. She";
    // Alone: the beams share the prompt's pages, and whatever history they have in common.
    collector lone;
    lone.n_seqs = 4;
    const engine_request req = beam_request(*b.tok, prompt, o);
    REQUIRE(eng->submit(req, lone.sink()).status == submit_status::ok);
    int32_t peak_pages = 0;
    do peak_pages = std::max(peak_pages, eng->stats().n_pages_used);
    while (!lone.wait(0.0001));
    const engine_beams alone = read(lone, 4);
    const int32_t n_prompt = int32_t(req.prompt.size()), page = eo.sched.page_size;
    const int32_t unshared = 4 * ((n_prompt + o.max_tokens + page - 1) / page);
    const int32_t shared_bound = n_prompt / page + 4 * ((o.max_tokens + page - 1) / page + 1);
    CAPTURE(peak_pages);
    CHECK(peak_pages > 0);
    CHECK(peak_pages <= shared_bound);
    CHECK(shared_bound < unshared);
    CHECK(eng->stats().n_pages_used == 0);

    // The same request among greedy and sampled requests and another beam search, all at once.
    std::vector<engine_request> others;
    for (int i = 0; i < 4; ++i) {
        engine_request g = greedy("The dog saw a ball number " + std::to_string(i), 40);
        if (i % 2) {
            g.sampling.temperature = 0.8f;
            g.sampling.seed = uint64_t(i);
        }
        others.push_back(g);
    }
    ref_options o2 = o;
    o2.width = 3;
    o2.n = 2;
    others.push_back(beam_request(*b.tok, "The little dog", o2));
    std::vector<collector> cs(others.size());
    collector mine;
    mine.n_seqs = 4;
    cs.back().n_seqs = 2;
    for (size_t i = 0; i < 2; ++i) REQUIRE(eng->submit(others[i], cs[i].sink()).status == submit_status::ok);
    REQUIRE(eng->submit(beam_request(*b.tok, prompt, o), mine.sink()).status == submit_status::ok);
    for (size_t i = 2; i < others.size(); ++i) REQUIRE(eng->submit(others[i], cs[i].sink()).status == submit_status::ok);
    REQUIRE(mine.wait(120));
    for (auto& c : cs) REQUIRE(c.wait());
    const engine_beams busy = read(mine, 4);
    CHECK(busy.tokens == alone.tokens);
    CHECK(busy.eos == alone.eos);
    for (size_t k = 0; k < 4; ++k) CHECK(busy.scores[k] == doctest::Approx(alone.scores[k]).epsilon(1e-6));
    CHECK(eng->stats().n_pages_used == 0); // every beam's pages went back
}

TEST_CASE("beam search: stop strings end beams, cancellation ends the request, offline generate returns the beams") {
    model_bundle& b = stories_f32();
    auto eng = make_local_engine(*b.mdl, *b.tok, beam_engine_options(8));
    ref_options o;
    o.width = 3;
    o.n = 3;
    o.max_tokens = 48;
    o.eos = b.tok->eos();
    engine_request req = beam_request(*b.tok, "Once upon a time", o);
    const engine_beams plain = run_beams(*eng, req);
    // A stop string that the best plain beam contains: every returned beam's text stops
    // before any occurrence of it.
    req.stop = {"."};
    collector c;
    c.n_seqs = 3;
    REQUIRE(eng->submit(req, c.sink()).status == submit_status::ok);
    REQUIRE(c.wait());
    CHECK(c.text.find('.') == std::string::npos);
    int n_stopped = 0;
    for (const auto& f : c.finishes) n_stopped += f == "stop";
    CHECK(n_stopped > 0);
    CHECK(c.by_seq[0] != plain.tokens[0]);

    // Cancelled mid-search: each of the n choices ends "cancelled", no page is left.
    engine_request longer = req;
    longer.stop.clear();
    longer.max_tokens = 400;
    longer.ignore_eos = true;
    collector cc;
    cc.n_seqs = 3;
    const submit_result sr = eng->submit(longer, cc.sink());
    REQUIRE(sr.status == submit_status::ok);
    const uint64_t generated0 = eng->stats().n_generated_tokens;
    // mid-search: beams stream nothing until the end, so the engine's count shows the progress
    for (int i = 0; i < 10000 && eng->stats().n_generated_tokens < generated0 + 12; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(eng->stats().n_generated_tokens >= generated0 + 12);
    eng->cancel(sr.id);
    REQUIRE(cc.wait());
    CHECK(cc.finishes == std::vector<std::string>(3, "cancelled"));
    CHECK(eng->stats().n_pages_used == 0);

    // The offline loop: the best beam as the result, every beam with its score.
    generate_params gp;
    gp.request.max_tokens = 48;
    gp.request.sampling.temperature = 0;
    gp.request.beam.width = 3;
    gp.request.n = 3;
    cpu::thread_pool pool(1);
    const generate_result gr = generate(exec_ctx{backend::cpu, &pool}, *b.mdl, *b.tok, req.prompt, gp);
    REQUIRE(gr.beams.size() == 3);
    std::vector<token_id> best = plain.tokens[0];
    if (plain.eos[0] >= 0) best.push_back(plain.eos[0]);
    CHECK(gr.tokens == best);
    CHECK(gr.beams[0].score == doctest::Approx(plain.scores[0]).epsilon(1e-6));
    CHECK(gr.beams[0].score >= gr.beams[1].score);
    CHECK(gr.beams[1].score >= gr.beams[2].score);
}

TEST_CASE("prompt scoring: each prompt token's logprob and top alternatives equal the reference forward's") {
    model_bundle& b = stories_f32();
    engine_options eo = beam_engine_options(4);
    eo.sched.prefix_cache = true;
    eo.sched.step_tokens = 8;              // the prompt is computed in several chunks
    auto eng = make_local_engine(*b.mdl, *b.tok, eo);
    const std::string text = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.";
    engine_request req = greedy(text, 0);
    const auto& prompt = req.prompt;
    REQUIRE(prompt.size() > 2 * size_t(eo.sched.step_tokens));
    // A plain request first, so that the prompt's pages are in the prefix cache: scoring
    // computes them anyway.
    collector warm;
    REQUIRE(eng->submit(greedy(text, 2), warm.sink()).status == submit_status::ok);
    REQUIRE(warm.wait());

    req.score_prompt = true;
    req.n_top_logprobs = 3;
    collector c;
    REQUIRE(eng->submit(req, c.sink()).status == submit_status::ok);
    REQUIRE(c.wait());
    CHECK(c.ids.empty());             // max_tokens 0: the prompt only
    CHECK(c.finish == "length");
    CHECK(c.n_generated == 0);
    REQUIRE(c.prompt.size() == prompt.size());
    CHECK(std::isnan(c.prompt[0].logprob));
    CHECK(c.prompt[0].top.empty());
    for (size_t p = 1; p < prompt.size(); ++p) {
        CAPTURE(p);
        const std::vector<token_id> before(prompt.begin(), prompt.begin() + ptrdiff_t(p));
        const std::vector<double> lp = next_logprobs(*b.mdl, before, {}, -1, 0);
        CHECK(c.prompt[p].id == prompt[p]);
        CHECK(c.prompt[p].logprob == doctest::Approx(lp[size_t(prompt[p])]).epsilon(1e-4));
        REQUIRE(c.prompt[p].top.size() == 3);
        CHECK(c.prompt[p].top[0].id == token_id(std::max_element(lp.begin(), lp.end()) - lp.begin()));
        CHECK(c.prompt[p].top[0].logprob >= c.prompt[p].top[1].logprob);
    }

    // With tokens to generate and n = 2: the scores come first, then each sequence's tokens,
    // greedy's; a sampled sequence's cumulative logprob is the sum of its tokens'.
    req.max_tokens = 6;
    req.n = 2;
    req.n_top_logprobs = 0;
    collector g;
    g.n_seqs = 2;
    REQUIRE(eng->submit(req, g.sink()).status == submit_status::ok);
    REQUIRE(g.wait());
    REQUIRE(g.prompt.size() == prompt.size());
    for (size_t p = 1; p < prompt.size(); ++p) CHECK(g.prompt[p].logprob == doctest::Approx(c.prompt[p].logprob).epsilon(1e-5));
    collector plain;
    REQUIRE(eng->submit(greedy(text, 6), plain.sink()).status == submit_status::ok);
    REQUIRE(plain.wait());
    REQUIRE(g.by_seq.size() == 2);
    for (size_t k = 0; k < 2; ++k) {
        CHECK(g.by_seq[k] == plain.ids);
        double sum = 0;
        for (float x : g.logprobs[k]) sum += x;
        CHECK(g.sums[k] == doctest::Approx(sum).epsilon(1e-5));
        CHECK(g.sums[k] < 0);
    }
    CHECK(eng->stats().n_pages_used == 0);
}
