// Embeddings through the engine: the prompt's final hidden states pooled (mean, cls, last) and
// L2-normalised equal the reference forward's, and do not depend on the batch they ran in
// (chunked, beside generations, preempted, after a prefix-cache hit).
#include "engine_fixtures.hpp"
#include "runtime/engine.hpp"
#include "runtime/generate.hpp"
#include "runtime/reference_forward.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

using namespace tandem;
using tandem::test::collector;
using tandem::test::greedy;
using tandem::test::stories;

namespace {

const std::string story =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
    "friends. One day, she saw a big red ball under a tree. She ran to get it, but a dog got there first.";

engine_request embed_request(const std::string& text, pooling_type how) {
    engine_request r;
    r.prompt = stories().tok->encode(text, true, false);
    r.embed = how;
    return r;
}

// The reference: each position's hidden state from the reference forward, pooled and normalised.
std::vector<double> reference_embedding(const std::vector<token_id>& toks, pooling_type how) {
    const model& m = *stories().mdl;
    reference_forward f(m.config(), m.weights(), int32_t(toks.size()));
    std::vector<double> v(size_t(m.config().n_embd), 0.0);
    for (size_t pos = 0; pos < toks.size(); ++pos) {
        f.forward(toks[pos], int32_t(pos));
        const bool take = how == pooling_type::mean || (how == pooling_type::cls && pos == 0) ||
                          (how == pooling_type::last && pos + 1 == toks.size());
        if (take)
            for (size_t j = 0; j < v.size(); ++j) v[j] += f.hidden()[j];
    }
    double norm = 0;
    for (double x : v) norm += x * x;
    for (double& x : v) x /= std::sqrt(norm);
    return v;
}

std::vector<float> embed_alone(engine& eng, const std::string& text, pooling_type how) {
    collector c;
    REQUIRE(eng.submit(embed_request(text, how), c.sink()).status == submit_status::ok);
    REQUIRE(c.wait());
    REQUIRE(c.finish == "stop");
    CHECK(c.n_generated == 0);
    CHECK(c.ids.empty());
    return c.embedding;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double(a[i]) - double(b[i])));
    return d;
}

} // namespace

TEST_CASE("engine: an embedding is the prompt's pooled reference hidden states, L2-normalised") {
    engine_options o;
    o.n_threads = 2;
    o.sched.step_tokens = 16; // the prompt in chunks: mean pooling sums one row a chunk
    auto eng = make_local_engine(*stories().mdl, *stories().tok, o);
    for (pooling_type how : {pooling_type::mean, pooling_type::cls, pooling_type::last}) {
        const auto toks = stories().tok->encode(story, true, false);
        REQUIRE(toks.size() > 40);
        const std::vector<float> got = embed_alone(*eng, story, how);
        const std::vector<double> want = reference_embedding(toks, how);
        REQUIRE(got.size() == want.size());
        double dot = 0, norm = 0, diff = 0;
        for (size_t j = 0; j < got.size(); ++j) {
            dot += double(got[j]) * want[j];
            norm += double(got[j]) * got[j];
            diff = std::max(diff, std::abs(double(got[j]) - want[j]));
        }
        INFO("pooling ", int(how), ": cosine ", dot, ", max |diff| ", diff);
        CHECK(std::abs(norm - 1) < 1e-5);
        // INT8 weights and activations against the reference's FP32 activations
        CHECK(dot > 0.999);
        CHECK(diff < 0.02);
    }
    // different texts embed differently; a text embeds the same every time
    const auto a = embed_alone(*eng, story, pooling_type::mean);
    CHECK(max_diff(a, embed_alone(*eng, story, pooling_type::mean)) == 0.0);
    CHECK(max_diff(a, embed_alone(*eng, "The cat sat on the mat.", pooling_type::mean)) > 0.01);
    CHECK(eng->stats().n_pages_used == 0);
    eng->stop();
}

TEST_CASE("engine: an embedding is the same alone, beside generations, preempted and after a prefix-cache hit") {
    model_bundle& b = stories();
    engine_options base;
    base.n_threads = 1;
    base.sched.max_running = 4;
    std::vector<float> alone;
    {
        auto eng = make_local_engine(*b.mdl, *b.tok, base);
        alone = embed_alone(*eng, story, pooling_type::mean);
        eng->stop();
    }
    const int32_t n_story = int32_t(b.tok->encode(story, true, false).size());
    for (int32_t step_tokens : {8, 512})
        for (int32_t n_pages : {0, 12}) {
            CAPTURE(step_tokens);
            CAPTURE(n_pages);
            engine_options o = base;
            o.sched.step_tokens = step_tokens;
            o.n_ctx = 160;
            o.sched.n_pages = n_pages; // 12 pages of 16: the generations preempt one another and the embedding
            auto eng = make_local_engine(*b.mdl, *b.tok, o);
            // the story's pages in the prefix cache first: mean pooling computes them again
            collector primer;
            REQUIRE(eng->submit(greedy(story, 4), primer.sink()).status == submit_status::ok);
            REQUIRE(primer.wait());
            std::vector<collector> gens(3);
            for (size_t i = 0; i < gens.size(); ++i)
                REQUIRE(eng->submit(greedy(story + " The end" + std::string(i, '!'), 60), gens[i].sink()).status ==
                        submit_status::ok);
            collector e, last;
            REQUIRE(eng->submit(embed_request(story, pooling_type::mean), e.sink()).status == submit_status::ok);
            REQUIRE(eng->submit(embed_request(story, pooling_type::last), last.sink()).status == submit_status::ok);
            for (auto& g : gens) REQUIRE(g.wait());
            REQUIRE(e.wait());
            REQUIRE(last.wait());
            CHECK(e.finish == "stop");
            CHECK(e.n_cached == 0);
            CHECK(last.n_cached > 0);         // last pooling may reuse the cached prefix
            CHECK(last.n_cached < n_story);
            CHECK(max_diff(e.embedding, alone) < 1e-5);
            const engine_stats st = eng->stats();
            if (n_pages > 0) CHECK(st.n_preemptions > 0);
            CHECK(st.n_pages_used == 0);
            eng->stop();
        }

    // The embedding itself preempted half-way: a generation that arrived first needs its pages
    // (two tokens a step: the embedding's prompt takes longer than the generation's pages last).
    engine_options o = base;
    o.sched.step_tokens = 2;
    o.n_ctx = 96;
    o.sched.n_pages = 6;
    // The preemption needs the embedding in before the generation ends (88 steps): a thread
    // descheduled that long on a loaded machine misses it, so the pair runs again (fresh engine)
    // until one was preempted; every run's results are checked.
    bool preempted = false;
    for (int attempt = 0; attempt < 5 && !preempted; ++attempt) {
        auto eng = make_local_engine(*b.mdl, *b.tok, o);
        collector g, e;
        REQUIRE(eng->submit(greedy("Once upon a time", 88), g.sink()).status == submit_status::ok);
        REQUIRE(eng->submit(embed_request(story, pooling_type::mean), e.sink()).status == submit_status::ok);
        REQUIRE(g.wait());
        REQUIRE(e.wait());
        CHECK(g.finish == "length");
        CHECK(e.finish == "stop");
        CHECK(max_diff(e.embedding, alone) < 1e-5);
        preempted = eng->stats().n_preemptions > 0;
        eng->stop();
    }
    CHECK(preempted);
}
