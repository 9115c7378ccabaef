// The engine service: continuous batching equals solo runs, cancellation frees pages, limits are values.
#include "cpu/thread_pool.hpp"
#include "runtime/engine.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "runtime/kv_cache.hpp"
#include "runtime/reference_forward.hpp"
#include "runtime/runner.hpp"
#include "runtime/scheduler.hpp"
#include "runtime/synth.hpp"
#include "engine_fixtures.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <limits>
#include <random>
#include <set>
#include <thread>
#include <utility>

using namespace tandem;
using tandem::test::collector;
using tandem::test::greedy;
using tandem::test::stories;



namespace {

// One thread, a batch of four sequences, with or without the prefix cache.
engine_options four_seqs(bool prefix_cache) {
    engine_options o;
    o.n_threads = 1;
    o.sched.max_running = 4;
    o.sched.prefix_cache = prefix_cache;
    return o;
}

} // namespace

TEST_CASE("engine: requests joining and leaving a running batch each equal their solo output") {
    model_bundle& b = stories();
    const std::vector<std::string> prompts = {"Once upon a time", "The cat sat", "One day, Tom", "Lily and Ben",
                                              "A bird", "The sun was hot and"};
    const std::vector<int32_t> lens = {60, 17, 33, 80, 5, 41};
    // solo: the offline loop
    cpu::thread_pool pool(1);
    std::vector<std::string> solo;
    for (size_t i = 0; i < prompts.size(); ++i) {
        generate_params p;
        p.request.max_tokens = lens[i];
        p.request.sampling.temperature = 0;
        p.request.ignore_eos = true;
        solo.push_back(generate(exec_ctx{backend::cpu, &pool}, *b.mdl, *b.tok, greedy(prompts[i], 1).prompt, p).text);
    }
    engine_options o;
    o.n_threads = 1;
    o.sched.max_running = 4;    // fewer than requests: some wait, then join as others leave
    o.sched.step_tokens = 8;    // prompts are prefilled in chunks alongside decodes
    auto eng = make_local_engine(*b.mdl, *b.tok, o);
    std::vector<collector> cs(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
        REQUIRE(eng->submit(greedy(prompts[i], lens[i]), cs[i].sink()).status == submit_status::ok);
        if (i == 2) REQUIRE(cs[0].wait_tokens(3)); // later ones join mid-run
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
        REQUIRE(cs[i].wait());
        CHECK(cs[i].finish == "length");
        CHECK(cs[i].n_generated == lens[i]);
        CHECK_MESSAGE(cs[i].text == solo[i], "request ", i);
    }
    const engine_stats s = eng->stats();
    CHECK(s.n_running == 0);
    CHECK(s.n_pages_used == 0);
    CHECK(s.n_prefix_hits == 0);
    eng->stop();
}

TEST_CASE("engine: cancel stops a request and frees its pages; limits come back as values") {
    model_bundle& b = stories();
    engine_options o;
    o.n_threads = 1;
    o.sched.max_running = 1;
    o.max_waiting = 1;
    o.n_ctx = 512;
    o.sched.n_pages = 40; // 640 tokens
    auto eng = make_local_engine(*b.mdl, *b.tok, o);

    collector long_run, queued, refused;
    const submit_result a = eng->submit(greedy("Once upon a time", 400), long_run.sink());
    REQUIRE(a.status == submit_status::ok);
    for (int i = 0; i < 1000 && eng->stats().n_running == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // one waits (the batch holds one), the next is over capacity
    REQUIRE(eng->submit(greedy("The cat", 4), queued.sink()).status == submit_status::ok);
    CHECK(eng->submit(greedy("The dog", 4), refused.sink()).status == submit_status::queue_full);
    // a request that can never fit the context or the pool
    engine_request huge = greedy("x", 1);
    huge.prompt.assign(512, 1); // the whole context: no room for a token
    CHECK(eng->submit(huge, refused.sink()).status == submit_status::too_long);

    eng->cancel(a.id);
    REQUIRE(long_run.wait());
    CHECK(long_run.finish == "cancelled");
    CHECK(long_run.n_generated < 400);
    REQUIRE(queued.wait()); // it ran once the first left
    CHECK(queued.finish == "length");
    const engine_stats s = eng->stats();
    CHECK(s.n_pages_used == 0);
    CHECK(s.n_pages_total == 40);
    eng->cancel(12345); // unknown: ignored
    eng->stop();
    CHECK(eng->submit(greedy("x", 1), refused.sink()).status == submit_status::stopped);
}

TEST_CASE("engine: stop cancels what is queued or running") {
    model_bundle& b = stories();
    engine_options o;
    o.n_threads = 1;
    auto eng = make_local_engine(*b.mdl, *b.tok, o);
    collector c;
    REQUIRE(eng->submit(greedy("Once upon a time", 2000), c.sink()).status == submit_status::ok);
    eng->stop();
    REQUIRE(c.wait(1));
    CHECK(c.finish == "cancelled");
}

TEST_CASE("engine: prefix-cache hits and preemption leave greedy outputs unchanged") {
    model_bundle& b = stories();
    // A long shared start (several full pages), different endings.
    const std::string shared =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
        "friends. One day, she saw a big red ball under a tree.";
    const std::vector<std::string> endings = {" She", " Her mom said", " The ball", " Lily ran to"};
    auto run_all = [&](engine_options o, engine_stats* st) {
        auto eng = make_local_engine(*b.mdl, *b.tok, o);
        std::vector<std::string> out;
        // first one alone (fills the cache), then the rest together
        for (size_t i = 0; i < endings.size(); ++i) {
            std::vector<collector> cs(i == 0 ? 1 : endings.size() - 1);
            const size_t first = i == 0 ? 0 : 1;
            for (size_t j = 0; j < cs.size(); ++j)
                REQUIRE(eng->submit(greedy(shared + endings[first + j], 40), cs[j].sink()).status == submit_status::ok);
            for (auto& c : cs) {
                REQUIRE(c.wait());
                CHECK(c.finish == "length");
                out.push_back(c.text);
            }
            if (i == 1) break;
        }
        *st = eng->stats();
        eng->stop();
        return out;
    };
    const engine_options base = four_seqs(true), no_cache = four_seqs(false);
    engine_stats s_ref, s_cache, s_tight;
    const auto ref = run_all(no_cache, &s_ref);
    CHECK(s_ref.n_prefix_hits == 0);
    const auto cached = run_all(base, &s_cache);
    CHECK(cached == ref);
    const int32_t n_shared_tokens = int32_t(b.tok->encode(shared, true, false).size());
    CHECK(s_cache.n_prefix_hits >= uint64_t(3 * (n_shared_tokens / 16) * 16 - 3 * 16));
    CHECK(s_cache.n_pages_used == 0);
    CHECK(s_cache.n_pages_cached > 0);
    // A pool too small for three at once: sequences are preempted and recomputed.
    engine_options tight = base;
    tight.n_ctx = 128;
    tight.sched.n_pages = 9; // 144 positions; three requests of ~85 need ~16 pages
    const auto squeezed = run_all(tight, &s_tight);
    CHECK(squeezed == ref);
    CHECK(s_tight.n_preemptions > 0);
    CHECK(s_tight.n_pages_used == 0);
}

TEST_CASE("engine: n = 4 computes the prompt once, forks it, and each sequence equals a solo run with its seed") {
    model_bundle& b = stories();
    engine_options o;
    o.n_threads = 1;
    o.sched.max_running = 2; // the group of four runs beyond it (a request's group stays whole)
    o.sched.step_tokens = 16;
    auto eng = make_local_engine(*b.mdl, *b.tok, o);
    engine_request req = greedy("Once upon a time, there was a little girl named Lily. She", 24);
    req.n = 4;
    req.sampling.temperature = 0.9f;
    req.sampling.top_k = 40;
    req.sampling.seed = 100;
    const int32_t n_prompt = int32_t(req.prompt.size());
    REQUIRE(n_prompt > 16); // more than one page: full pages stay shared, the last one is copied

    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::vector<token_id>> ids(4);
    std::vector<std::string> text(4);
    int n_done = 0;
    REQUIRE(eng->submit(req, [&](engine_event&& ev) {
                std::lock_guard lock(mu);
                REQUIRE(ev.index >= 0);
                REQUIRE(ev.index < 4);
                text[size_t(ev.index)] += ev.text;
                if (ev.done) {
                    CHECK(ev.n_generated == 24);
                    ++n_done;
                    cv.notify_all();
                } else {
                    ids[size_t(ev.index)].push_back(ev.id);
                }
            }).status == submit_status::ok);
    {
        std::unique_lock lock(mu);
        REQUIRE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return n_done == 4; }));
    }
    const engine_stats s = eng->stats();
    CHECK(s.n_prompt_tokens == uint64_t(n_prompt)); // once, not four times
    CHECK(s.n_prefix_hits == 0);                     // the others never looked it up
    CHECK(s.n_generated_tokens == 4 * 24);
    CHECK(s.n_pages_used == 0);
    eng->stop();

    // Each sequence is what one request with seed 100 + i samples alone.
    cpu::thread_pool pool(1);
    std::set<std::vector<token_id>> distinct;
    for (int i = 0; i < 4; ++i) {
        generate_params p;
        p.request.max_tokens = 24;
        p.request.ignore_eos = true;
        p.request.sampling = req.sampling;
        p.request.sampling.seed = 100 + uint64_t(i);
        const auto solo = generate(exec_ctx{backend::cpu, &pool}, *b.mdl, *b.tok, req.prompt, p);
        CHECK_MESSAGE(ids[size_t(i)] == solo.tokens, "sequence ", i);
        CHECK(text[size_t(i)] == solo.text);
        distinct.insert(ids[size_t(i)]);
    }
    CHECK(distinct.size() > 1); // they did sample differently
}

namespace {

// Allows one token only: the one after the last accepted (cycling through a few ids), and
// records what it was told.
struct forcing_processor final : logits_processor {
    std::shared_ptr<std::vector<token_id>> accepted;
    token_id next = 10;
    explicit forcing_processor(std::shared_ptr<std::vector<token_id>> a) : accepted(std::move(a)) {}
    std::string_view name() const override { return "forcing"; }
    void apply(std::span<float> logits, std::span<const token_id>) override {
        for (size_t i = 0; i < logits.size(); ++i)
            if (token_id(i) != next) logits[i] = -std::numeric_limits<float>::infinity();
    }
    void accept(token_id t) override {
        accepted->push_back(t);
        next = 10 + (t - 9) % 7;
    }
    std::unique_ptr<logits_processor> clone() const override { return std::make_unique<forcing_processor>(*this); }
};

} // namespace

TEST_CASE("engine: a request's logits processor masks every step of each sequence and is told what it accepted") {
    model_bundle& b = stories();
    auto eng = make_local_engine(*b.mdl, *b.tok, engine_options{});
    std::vector<std::shared_ptr<std::vector<token_id>>> told;
    engine_request req = greedy("Once upon a time", 12);
    req.n = 2;
    req.sampling.temperature = 0.8f; // sampling from the one allowed token is that token
    req.make_processor = [&] {
        told.push_back(std::make_shared<std::vector<token_id>>());
        return std::make_unique<forcing_processor>(told.back());
    };
    std::mutex mu;
    std::vector<std::vector<token_id>> ids(2);
    collector done;
    auto sink = done.sink();
    int n_done = 0;
    REQUIRE(eng->submit(req, [&](engine_event&& ev) {
                std::lock_guard lock(mu);
                if (!ev.done) ids[size_t(ev.index)].push_back(ev.id);
                else if (++n_done == 2) sink(std::move(ev));
            }).status == submit_status::ok);
    REQUIRE(done.wait());
    eng->stop();
    REQUIRE(told.size() == 2);
    std::vector<token_id> want;
    for (token_id t = 10; want.size() < 12; t = 10 + (t - 9) % 7) want.push_back(t);
    for (int i = 0; i < 2; ++i) {
        CHECK(ids[size_t(i)] == want);
        CHECK(*told[size_t(i)] == want); // each sequence's own processor, told each token once
    }
}

namespace {

// Records what it is shown per sequence, tags each token event, and ends sequence 1 after
// its third token.
struct recording_observer final : output_observer {
    std::vector<std::vector<token_id>> seen{2};
    std::vector<std::string> done_reasons{2};
    bool on_token(engine_event& ev) override {
        seen[size_t(ev.index)].push_back(ev.id);
        ev.text = "<" + ev.text + ">";
        return !(ev.index == 1 && seen[1].size() == 3);
    }
    void on_done(engine_event& ev) override { done_reasons[size_t(ev.index)] = ev.finish_reason; }
};

} // namespace

TEST_CASE("engine: a request's output observer sees each accepted token first, may amend it and end a sequence") {
    model_bundle& b = stories();
    auto eng = make_local_engine(*b.mdl, *b.tok, engine_options{});
    auto obs = std::make_shared<recording_observer>();
    engine_request req = greedy("Once upon a time", 8);
    req.n = 2;
    req.observer = obs;
    std::mutex mu;
    std::vector<std::vector<token_id>> ids(2);
    std::vector<std::string> texts(2), finish(2);
    collector done;
    auto sink = done.sink();
    int n_done = 0;
    REQUIRE(eng->submit(req, [&](engine_event&& ev) {
                std::lock_guard lock(mu);
                const size_t i = size_t(ev.index);
                if (!ev.done) {
                    ids[i].push_back(ev.id);
                    texts[i] += ev.text;
                    return;
                }
                finish[i] = ev.finish_reason;
                if (++n_done == 2) sink(std::move(ev));
            }).status == submit_status::ok);
    REQUIRE(done.wait());
    eng->stop();
    CHECK(ids[0].size() == 8);
    CHECK(ids[1].size() == 3);
    CHECK(obs->seen == ids); // every token the sink got, in order, the observer saw first
    CHECK(std::vector<token_id>(ids[0].begin(), ids[0].begin() + 3) == ids[1]); // greedy: the same start
    CHECK(finish == std::vector<std::string>{"length", "stop"});
    CHECK(obs->done_reasons == finish);
    CHECK(std::count(texts[1].begin(), texts[1].end(), '<') == 3); // its amendments reached the sink
}

// ---- failure paths, with an executor that fails on a script ----------------------------------

namespace {

// Runs batches on a CPU runner like the in-process executor, except those the script marks:
// 'c' a crashed worker (the batch may be retried), 'f' a failed step. Batches count from 1.
class scripted_executor final : public executor {
public:
    scripted_executor(model& mdl, kv_cache& kv, std::string script, std::string failure = {})
        : runner_(make_cpu_runner(mdl, 1)), kv_(kv), n_vocab_(mdl.config().n_vocab), script_(std::move(script)),
          failure_(std::move(failure)) {}
    std::string name() const override { return "scripted"; }
    work_kind kind() const override { return work_kind::both; }
    bool ready() override { return failure_.empty() && !result_; }
    bool up() const override { return failure_.empty(); }
    std::string failure() const override { return failure_; }
    void start(const batch& b) override {
        const char what = n_batches_ < script_.size() ? script_[n_batches_] : 'o';
        ++n_batches_;
        if (what == 'c') {
            result_ = outcome{false, true, "scripted crash"};
            return;
        }
        if (what == 'f') {
            for (const uint64_t sid : b.seq_id) failed_ids_.push_back(request_of(sid));
            result_ = outcome{false, false, "scripted failure"};
            return;
        }
        logits_.resize(size_t(b.n_logits()) * size_t(n_vocab_));
        runner_->forward(b, kv_, logits_.data());
        result_ = outcome{};
    }
    std::optional<outcome> poll() override { return std::exchange(result_, std::nullopt); }
    std::span<const float> logits(int32_t row) override {
        return std::span<const float>(logits_).subspan(size_t(row) * size_t(n_vocab_), size_t(n_vocab_));
    }
    std::vector<int> wait_fds() override { return {}; }
    size_t n_batches() const { return n_batches_; }
    // The requests of the batches that failed ('f'); read after the engine is idle.
    const std::vector<uint64_t>& failed_ids() const { return failed_ids_; }

private:
    std::unique_ptr<runner> runner_;
    kv_cache& kv_;
    int32_t n_vocab_;
    std::string script_, failure_;
    size_t n_batches_ = 0;
    std::optional<outcome> result_;
    std::vector<float> logits_;
    std::vector<uint64_t> failed_ids_;
};

struct scripted_engine {
    engine_options o;
    kv_cache kv;
    std::unique_ptr<page_store> store;
    scripted_executor* ex = nullptr;
    std::unique_ptr<engine> eng;

    explicit scripted_engine(const std::string& script, int32_t max_running = 8, const std::string& failure = {})
        : o(options(max_running)), kv(stories().mdl->make_kv_layout(o.sched.page_size), o.sched.n_pages), store(make_local_store(kv)) {
        engine_parts parts;
        auto e = std::make_unique<scripted_executor>(*stories().mdl, kv, script, failure);
        ex = e.get();
        parts.executors.push_back(std::move(e));
        parts.store = store.get();
        eng = make_engine(stories().mdl->config(), *stories().tok, o, std::move(parts));
    }
    ~scripted_engine() { eng->stop(); }
    static engine_options options(int32_t max_running) {
        engine_options o;
        o.n_ctx = 256;
        o.sched.n_pages = 96;
        o.sched.max_running = max_running;
        o.sched.step_tokens = 8; // prompts in several chunks
        return o;
    }
};

std::string solo_text(const std::string& prompt, int32_t n) {
    cpu::thread_pool pool(1);
    generate_params p;
    p.request.max_tokens = n;
    p.request.sampling.temperature = 0;
    p.request.ignore_eos = true;
    return generate(exec_ctx{backend::cpu, &pool}, *stories().mdl, *stories().tok, greedy(prompt, 1).prompt, p).text;
}

const std::vector<std::string> failure_prompts = {"Once upon a time", "The cat sat", "One day, Tom", "Lily and Ben"};

} // namespace

TEST_CASE("engine failures: a crashed worker's batch is retried; every request equals its solo output") {
    scripted_engine se("oooocoooooooooc"); // two crashes, far apart: each request is hit at most once in a row
    std::vector<collector> cs(failure_prompts.size());
    for (size_t i = 0; i < cs.size(); ++i)
        REQUIRE(se.eng->submit(greedy(failure_prompts[i], 30), cs[i].sink()).status == submit_status::ok);
    for (size_t i = 0; i < cs.size(); ++i) {
        REQUIRE(cs[i].wait());
        CHECK_MESSAGE(cs[i].finish == "length", cs[i].error);
        CHECK_MESSAGE(cs[i].text == solo_text(failure_prompts[i], 30), "request ", i);
    }
    CHECK(se.ex->n_batches() > 15);
    CHECK(se.eng->stats().n_pages_used == 0);
}

TEST_CASE("engine failures: a request in two crashed batches in a row ends with the error; the engine serves on") {
    scripted_engine se("oocc");
    collector a;
    REQUIRE(se.eng->submit(greedy(failure_prompts[0], 30), a.sink()).status == submit_status::ok);
    REQUIRE(a.wait());
    CHECK(a.finish == "error");
    CHECK(a.error == "scripted crash");
    CHECK(se.eng->stats().n_pages_used == 0);
    collector b;
    REQUIRE(se.eng->submit(greedy(failure_prompts[1], 20), b.sink()).status == submit_status::ok);
    REQUIRE(b.wait());
    CHECK(b.finish == "length");
    CHECK(b.text == solo_text(failure_prompts[1], 20));
}

TEST_CASE("engine failures: a failed step ends the requests in its batch, and only those") {
    // Two run at once: the fifth batch holds the first admitted (both of the first two, unless
    // the engine started before the second was submitted); the others wait and then run.
    scripted_engine se("oooof", 2);
    std::vector<collector> cs(failure_prompts.size());
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < cs.size(); ++i) {
        const auto r = se.eng->submit(greedy(failure_prompts[i], 30), cs[i].sink());
        REQUIRE(r.status == submit_status::ok);
        ids.push_back(r.id);
    }
    for (auto& c : cs)
        REQUIRE(c.wait());
    const auto& failed = se.ex->failed_ids();
    REQUIRE(!failed.empty());
    CHECK(failed.size() <= 2);
    for (size_t i = 0; i < cs.size(); ++i) {
        const bool in_failed_batch = std::find(failed.begin(), failed.end(), ids[i]) != failed.end();
        INFO("request ", i);
        if (in_failed_batch) {
            CHECK(cs[i].finish == "error");
            CHECK(cs[i].error == "scripted failure");
            CHECK(i < 2); // admitted first
        } else {
            CHECK(cs[i].finish == "length");
            CHECK(cs[i].text == solo_text(failure_prompts[i], 30));
        }
    }
    CHECK(se.eng->stats().n_pages_used == 0);
}

TEST_CASE("engine failures: an executor that cannot start is the engine's failure, reported by wait_ready") {
    scripted_engine se("", 8, "the scripted worker exited during start-up");
    std::string failure;
    CHECK_FALSE(se.eng->wait_ready(std::chrono::milliseconds(2000), failure));
    CHECK(failure.find("exited during start-up") != std::string::npos);
}

namespace {

// A tiny synthetic Llama whose every layer attends to the last `window` positions (F32
// weights and KV, so its logits can be held to the reference forward's).
struct windowed_model {
    test::scratch_dir dir{"swa"};
    model_bundle b;
    explicit windowed_model(int32_t window, load_options lo = {weight_format::f32, kv_dtype::f32},
                            const std::string& arch = "llama") {
        synth_params p = synth_preset("tiny");
        p.arch = arch;
        p.sliding_window = window;
        p.n_ctx = 512;
        p.seed = 17;
        const std::string path = dir.file("swa.gguf");
        synth_write(p, path);
        b = load_model(path, lo);
    }
};

std::vector<token_id> random_tokens(int n, int32_t n_vocab, uint32_t seed) {
    std::mt19937 g(seed);
    std::vector<token_id> v(static_cast<size_t>(n));
    for (auto& t : v) t = token_id(3 + g() % uint32_t(n_vocab - 3));
    return v;
}

// The engine-vs-reference tolerance of test_model: float sums in other orders than the
// double-accumulating reference; relative to the logits' scale.
constexpr double logits_rel_tol = 1e-4;

// Runs r alone on a fresh engine to its end (into c) and returns the most KV pages it held at
// once (the pool's high-water mark, which a poll of n_pages_used could miss on a loaded machine).
int peak_pages(engine& eng, const engine_request& r, collector& c) {
    REQUIRE(eng.stats().n_pages_peak == 0);
    REQUIRE(eng.submit(r, c.sink()).status == submit_status::ok);
    REQUIRE(c.wait());
    return eng.stats().n_pages_peak;
}

double rel_diff(const float* got, const std::vector<float>& want) {
    double max_abs = 0, max_diff = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        max_abs = std::max(max_abs, std::abs(double(want[i])));
        max_diff = std::max(max_diff, std::abs(double(got[i]) - want[i]));
    }
    return max_diff / std::max(1.0, max_abs);
}

} // namespace

TEST_CASE("windowed model: steps over released pages give the reference forward's logits; pages stay bounded") {
    // Window 24 over pages of 16 (not a multiple): a 70-token prompt in chunks of 20, then 96
    // tokens (4 windows) one a step, every position's logits against the reference forward
    // (which honours model_config::window_of). The scheduler releases the pages behind the
    // window as it goes: while decoding, a sequence holds the pages of the 24 positions its
    // token reads and writes, at most ceil(23 / 16) + 1 = 3 pages, and reaches that.
    const int32_t window = 24, ps = 16, n_prompt = 70, n_gen = 4 * window;
    windowed_model wm(window);
    model& m = *wm.b.mdl;
    const model_config& cfg = m.config();
    REQUIRE(cfg.kv_window() == window);
    const auto toks = random_tokens(n_prompt + n_gen, cfg.n_vocab, 5);
    reference_forward ref(cfg, m.weights(), n_prompt + n_gen);
    std::vector<std::vector<float>> want;
    for (int32_t i = 0; i < n_prompt + n_gen; ++i) want.push_back(ref.forward(toks[size_t(i)], i));
    const int32_t bound = (window - 1 + ps - 1) / ps + 1;
    cpu::thread_pool pool(2);
    for (backend be : {backend::ref, backend::cpu}) {
        INFO(name_of(be));
        const exec_ctx ctx{be, &pool};
        scheduler_options so;
        so.page_size = ps;
        so.n_pages = 32;
        so.step_tokens = 20;
        so.kv_window = cfg.kv_window();
        scheduler s(so, nullptr);
        kv_cache kv(m.make_kv_layout(ps), so.n_pages);
        std::vector<float> logits;
        auto step = [&](work_kind kind) {
            const batch& b = s.plan(0, kind);
            REQUIRE(b.n_seqs() == 1);
            logits.assign(size_t(b.n_logits()) * size_t(cfg.n_vocab), NAN);
            m.forward(ctx, b, kv, logits.data());
            double worst = 0;
            for (int32_t r = 0; r < b.n_logits(); ++r)
                worst = std::max(worst, rel_diff(&logits[size_t(r) * size_t(cfg.n_vocab)], want[size_t(b.n_past(0) + r)]));
            INFO("positions ", b.n_past(0), "..", b.n_past(0) + b.n_new(0) - 1);
            CHECK(worst <= logits_rel_tol);
            s.complete(0, true);
            return b.n_past(0);
        };
        s.add(1, std::vector<token_id>(toks.begin(), toks.begin() + n_prompt), 0, std::chrono::steady_clock::now());
        s.set_logits_from(1, 0); // every position's row
        s.admit(std::chrono::steady_clock::now());
        while (s.n_computed(1) < n_prompt) step(work_kind::prefill);
        int32_t most = 0;
        for (int32_t i = 0; i < n_gen - 1; ++i) {
            s.append(1, toks[size_t(n_prompt + i)]);
            const batch& b = s.plan(0, work_kind::decode);
            REQUIRE(b.n_seqs() == 1);
            const int32_t used = s.stats().n_pages_used;
            most = std::max(most, used);
            CHECK(used <= bound);
            s.complete(0, false); // lost: planned again below
            step(work_kind::decode);
        }
        CHECK(most == bound);
        s.remove(1);
        CHECK(s.stats().n_pages_used == 0);
    }
}

TEST_CASE("windowed model: prefix-cache hits, preemption and recompute, and n > 1 leave greedy outputs unchanged") {
    windowed_model wm(24, {});
    model_bundle& b = wm.b;
    REQUIRE(b.mdl->config().kv_window() == 24);
    const int32_t n_vocab = b.mdl->config().n_vocab;
    const auto shared = random_tokens(53, n_vocab, 9); // three full pages and more: longer than the window
    auto request = [&](int salt, int32_t n_tok) {
        engine_request r;
        r.prompt = shared;
        const auto tail = random_tokens(3 + salt, n_vocab, uint32_t(100 + salt));
        r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
        r.max_tokens = n_tok;
        r.sampling.temperature = 0;
        r.ignore_eos = true;
        return r;
    };
    auto run_all = [&](engine_options o, engine_stats* st) {
        auto eng = make_local_engine(*b.mdl, *b.tok, o);
        std::vector<std::vector<token_id>> out;
        // the first alone (fills the cache), then the rest together
        for (int round = 0; round < 2; ++round) {
            std::vector<collector> cs(round == 0 ? 1 : 3);
            for (size_t j = 0; j < cs.size(); ++j)
                REQUIRE(eng->submit(request(int(round == 0 ? 0 : j + 1), 60), cs[j].sink()).status == submit_status::ok);
            for (auto& c : cs) {
                REQUIRE(c.wait());
                CHECK(c.finish == "length");
                out.push_back(c.ids);
            }
        }
        *st = eng->stats();
        eng->stop();
        return out;
    };
    const engine_options base = four_seqs(true), no_cache = four_seqs(false);
    engine_stats s_ref, s_cache;
    const auto want = run_all(no_cache, &s_ref);
    CHECK(s_ref.n_prefix_hits == 0);
    CHECK(s_ref.n_pages_used == 0);
    const auto cached = run_all(base, &s_cache);
    CHECK(cached == want);
    CHECK(s_cache.n_prefix_hits >= 3 * 48); // three full pages of the shared prompt, each time
    CHECK(s_cache.n_pages_used == 0);

    // One batch slot: a higher priority takes the slot of a running request, which is preempted
    // (its pages released) and later recomputed from its prompt and what it generated. On a
    // loaded machine the low request can finish its 410 remaining tokens before the high one is
    // in, so the pair runs again (fresh engine, up to five times) until the low one was
    // preempted; every run's outputs are checked.
    engine_options one = base;
    one.sched.max_running = 1;
    const engine_request r_low = request(0, 440); // 56 + 440 positions: within the context of 512
    std::vector<token_id> low_ids;
    bool preempted = false;
    for (int attempt = 0; attempt < 5 && !preempted; ++attempt) {
        auto eng = make_local_engine(*b.mdl, *b.tok, one);
        collector low, high;
        REQUIRE(eng->submit(r_low, low.sink()).status == submit_status::ok);
        REQUIRE(low.wait_tokens(30));
        engine_request r_high = request(2, 60);
        r_high.priority = 5;
        REQUIRE(eng->submit(r_high, high.sink()).status == submit_status::ok);
        REQUIRE(high.wait());
        REQUIRE(low.wait());
        const engine_stats st = eng->stats();
        preempted = st.n_preemptions >= 1;
        CHECK(st.n_pages_used == 0);
        eng->stop();
        CHECK(high.ids == want[2]);
        // The low one's first 60 tokens are the first request's.
        CHECK(std::vector<token_id>(low.ids.begin(), low.ids.begin() + 60) == want[0]);
        low_ids = low.ids;
    }
    CHECK(preempted);
    // The low one's output is what it gives alone.
    auto solo = make_local_engine(*b.mdl, *b.tok, no_cache);
    collector alone;
    REQUIRE(solo->submit(r_low, alone.sink()).status == submit_status::ok);
    REQUIRE(alone.wait());
    CHECK(low_ids == alone.ids);

    // n = 3 forks the prompt's pages (released ones stay released); each sequence equals its solo run.
    engine_request r_n = request(1, 40);
    r_n.n = 3;
    r_n.sampling.temperature = 0.8f;
    r_n.sampling.seed = 7;
    collector group;
    group.n_seqs = 3;
    REQUIRE(solo->submit(r_n, group.sink()).status == submit_status::ok);
    REQUIRE(group.wait());
    for (int k = 0; k < 3; ++k) {
        engine_request one_seq = request(1, 40);
        one_seq.sampling.temperature = 0.8f;
        one_seq.sampling.seed = 7 + k;
        collector c;
        REQUIRE(solo->submit(one_seq, c.sink()).status == submit_status::ok);
        REQUIRE(c.wait());
        CHECK(group.by_seq[size_t(k)] == c.ids);
    }
    CHECK(solo->stats().n_pages_used == 0);

    // The engine itself releases (its scheduler has the model's kv_window): a request of four
    // windows' tokens holds at most ceil(23 / 16) + 1 = 3 pages (7 without the release).
    collector longest;
    engine_request r_long = request(0, 96);
    r_long.prompt.resize(10); // shorter than a page: prefill holds one page, decode at most 3
    solo->stop();
    auto fresh = make_local_engine(*b.mdl, *b.tok, no_cache);
    const int most = peak_pages(*fresh, r_long, longest);
    CHECK(most >= 1);
    CHECK(most <= 3);
    fresh->stop();
}

TEST_CASE("windowed model with global layers (Gemma 2's pattern): every page stays") {
    // Gemma 2 windows its even layers only: the odd ones read the whole context, so kv_window()
    // is 0 and the scheduler releases nothing; a 10-token prompt and 64 tokens hold 5 pages.
    windowed_model wm(8, {}, "gemma2");
    model_bundle& b = wm.b;
    REQUIRE(b.mdl->config().sliding_window == 8);
    REQUIRE(b.mdl->config().kv_window() == 0);
    engine_options o;
    o.n_threads = 1;
    auto eng = make_local_engine(*b.mdl, *b.tok, o);
    engine_request r;
    r.prompt = random_tokens(10, b.mdl->config().n_vocab, 3);
    r.max_tokens = 64;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    collector c;
    const int most = peak_pages(*eng, r, c);
    CHECK(c.finish == "length");
    CHECK(most >= 4); // a window of 8 on every layer would keep at most ceil(7 / 16) + 1 = 2
    CHECK(eng->stats().n_pages_used == 0);
    eng->stop();
}

TEST_CASE("windowed model: verify steps with rejected drafts stay within the pages kept; the output is plain decoding's") {
    // Drafts replayed from the plain output with every third one wrong: verify steps of up to
    // 5 tokens, some drafts rejected (truncated back to the sampled token). The released pages
    // lag the window by decode_tokens - 1 = 4 positions, so a rejection never needs a released
    // page; a sequence holds at most ceil((23 + 2 * 4) / 16) + 1 = 3 pages.
    windowed_model wm(24, {});
    model_bundle& b = wm.b;
    engine_request r;
    r.prompt = random_tokens(10, b.mdl->config().n_vocab, 4);
    r.max_tokens = 96;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.draft_tokens = 0;
    engine_options plain;
    plain.n_threads = 1;
    std::vector<token_id> want;
    {
        auto eng = make_local_engine(*b.mdl, *b.tok, plain);
        collector c;
        REQUIRE(eng->submit(r, c.sink()).status == submit_status::ok);
        REQUIRE(c.wait());
        want = c.ids;
        eng->stop();
    }
    engine_options o = plain;
    o.max_draft_tokens = 4;
    o.draft_cost = 0.05;
    r.draft_tokens = 4;
    r.drafts = draft_source::replay;
    r.replay = want;
    for (size_t i = 0; i < r.replay.size(); i += 3) r.replay[i] = (r.replay[i] + 1) % b.mdl->config().n_vocab;
    auto eng = make_local_engine(*b.mdl, *b.tok, o);
    collector c;
    const int most = peak_pages(*eng, r, c);
    CHECK(c.ids == want);
    CHECK(c.n_draft_tokens > 0);
    CHECK(c.n_accepted_tokens > 0);
    CHECK(c.n_accepted_tokens < c.n_draft_tokens);
    CHECK(most <= 3);
    CHECK(eng->stats().n_pages_used == 0);
    eng->stop();
}
