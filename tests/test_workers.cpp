// The worker split end to end: tandemd with a prefill and a decode worker process sharing
// the KV pool; hand-off, crashes, restarts with a warm prefix cache, pool exhaustion; and the
// batch contract through one worker process. (GPU placements: test_workers_gpu.)
#include "worker_fixtures.hpp"

using namespace tandem;
using namespace tandem::test;

TEST_CASE("workers: through a worker process, 5 tokens with logits for all 5 in one step equal 5 one-token steps") {
    const load_options lo; // the daemon's: INT8 weights, F16 K/V
    model_bundle b = load_model(model_path("stories260K.gguf"), lo);
    const uint64_t fp = model_fingerprint(*b.file, lo.weights, lo.kv);
    const int32_t n_pages = 32, n_vocab = b.mdl->config().n_vocab;
    for (int32_t ps : {16, 3}) {
        INFO("page size ", ps);
        const kv_layout layout = b.mdl->make_kv_layout(ps);
        const std::string path = scratch().file("multi" + std::to_string(ps) + ".kv");
        auto pool = ipc::kv_pool::create_or_adopt(path, {fp, layout, n_pages});
        // The supervisor's view of the pool: its block pool hands out the pages.
        paged_kv pages(layout, n_pages, pool->pages());
        auto ex = start_decode_worker(decode_spec(path, fp, lo, ps, n_pages, n_vocab, 6)); // 6: the 6-token step's rows
        executor_runner r(*ex, pages, n_vocab);
        check_multi_token_step(r, *b.mdl, pages, 1e-9);
        ex->shutdown();
    }
}

TEST_CASE("workers: a worker that corrupts its command ring is restarted and the batch retried") {
    // The worker writes the ring's read position; a broken one made every push fail, each
    // batch an error, and the worker was never restarted.
    const load_options lo;
    model_bundle b = load_model(model_path("stories260K.gguf"), lo);
    const uint64_t fp = model_fingerprint(*b.file, lo.weights, lo.kv);
    const int32_t n_pages = 8, n_vocab = b.mdl->config().n_vocab;
    const kv_layout layout = b.mdl->make_kv_layout(16);
    const std::string path = scratch().file("corrupt-ring.kv");
    auto pool = ipc::kv_pool::create_or_adopt(path, {fp, layout, n_pages});
    paged_kv pages(layout, n_pages, pool->pages());
    auto ex = start_decode_worker(decode_spec(path, fp, lo, 16, n_pages, n_vocab, 1));
    executor_runner r(*ex, pages, n_vocab);
    const std::vector<token_id> prompt{1, 403, 407, 136, 261};
    sequence_kv seq = pages.sequence();
    REQUIRE(seq.reserve(int32_t(prompt.size())));
    std::vector<float> before(size_t(n_vocab), 0.f), after(size_t(n_vocab), 0.f);
    r.forward(one_sequence(prompt, 0, seq.block_table()), pages, before.data());

    command_ring_of_channel()->head.store(3); // not a record boundary: the supervisor's next push sees it
    batch wire = one_sequence(prompt, 0, seq.block_table());
    for (int32_t p : wire.tables) wire.generations.push_back(pages.pages.generation(p));
    REQUIRE(ex->ready());
    ex->start(wire);
    std::optional<executor::outcome> out;
    REQUIRE(poll_until(*ex, [&](const auto& o) { return (out = o).has_value(); }));
    CHECK_FALSE(out->ok);
    CHECK(out->crashed); // the engine retries the batch
    CHECK_MESSAGE(out->error.find("command ring") != std::string::npos, out->error);
    REQUIRE(poll_until(*ex, [&](const auto&) { return ex->ready() || !ex->failure().empty(); }));
    CHECK(ex->n_restarts() == 1);
    r.forward(one_sequence(prompt, 0, seq.block_table()), pages, after.data()); // the retry, on the new worker
    CHECK(after == before);
    ex->shutdown();
}

TEST_CASE("workers: a worker that never becomes ready (hung while loading) is given up after worker_timeout_s") {
    // Its model is a FIFO nobody writes: opening it blocks for good. The heartbeat is set far
    // off, so only the start's deadline can notice.
    const std::string fifo = scratch().file("model.fifo");
    std::filesystem::remove(fifo);
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    daemon::worker_spec s;
    s.role = "decode";
    s.exe = default_tandemd();
    s.model = fifo;
    s.pool = scratch().file("never.kv");
    s.n_pages = 8;
    s.max_rows = 1;
    s.n_vocab = 512;
    s.timeout_s = 2;
    s.heartbeat_s = 600;
    auto ex = daemon::make_worker_executor(s, work_kind::decode);
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(poll_until(*ex, [&](const auto&) { return ex->ready() || !ex->failure().empty(); }));
    CHECK_FALSE(ex->ready());
    CHECK_MESSAGE(ex->failure().find("not ready within 2 s") != std::string::npos, ex->failure());
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
    ex->shutdown();
}

TEST_CASE("workers: a worker that cannot be started is a failure the executor reports, not an exception") {
    // A channel the supervisor cannot make (no logits rows) fails every start, as a failed
    // fork or memfd would: poll() runs on the engine thread and must not throw.
    daemon::worker_spec s;
    s.role = "decode";
    s.exe = default_tandemd();
    s.model = model_path("stories260K.gguf");
    s.max_rows = 0;
    s.n_vocab = 512;
    auto ex = daemon::make_worker_executor(s, work_kind::decode);
    std::optional<executor::outcome> out;
    REQUIRE_NOTHROW(out = ex->poll());
    CHECK_FALSE(out.has_value());
    CHECK_FALSE(ex->ready());
    CHECK_FALSE(ex->up());
    CHECK(ex->failure().find("could not be started") != std::string::npos);
    CHECK(ex->failure().find("decode") != std::string::npos);
    REQUIRE_NOTHROW(out = ex->poll()); // and stays failed, quietly
    CHECK(ex->n_restarts() == 0);
}

TEST_CASE("workers: two worker processes share the pool; outputs equal the offline loop") {
    daemon_process d;
    d.start(scratch().file("a.sock"));
    REQUIRE(d.wait_ready());
    const pid_t pre = worker_pid(d.pid, "prefill"), dec = worker_pid(d.pid, "decode");
    CHECK(pre > 0);
    CHECK(dec > 0);
    CHECK(pre != dec);
    const json st = status(d.sock);
    CHECK(st["placement"]["prefill"] == "cpu");
    CHECK(st["placement"]["decode"] == "cpu");
    CHECK(st["placement"]["workers"] == true);
    // the priority field is checked like every other
    CHECK(post(d.sock, "/v1/completions", {{"prompt", "x"}, {"priority", "high"}}).status == 400);
    CHECK(post(d.sock, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}, {"priority", 7}}).status == 200);

    const json one = completion(d.sock, prompts[0], 60);
    REQUIRE(one.contains("choices"));
    CHECK(one["choices"][0]["text"] == offline_text(prompts[0], 60));
    // concurrent streams: each equals its solo output
    auto fs = stream_all(d.sock, prompts.size(), growing);
    check_equal_offline(fs, growing);
    CHECK(wait_for([&] { return status(d.sock)["kv_pages_used"] == 0; }, 5));

    // n = 4: the prefill worker computes the prompt once; the group forks from its pages and
    // the decode worker runs all four (greedy: each equals the offline text).
    auto engine_metric = [&](const char* name) { return metric(request(d.sock, "GET", "/metrics").body, name); };
    const double prompt0 = engine_metric("tandem_engine_prompt_tokens_total");
    const double hits0 = engine_metric("tandem_prefix_cache_hits_total");
    const std::string group_prompt = "Tom had a red ball. He liked to throw it high and";
    auto g = post(d.sock, "/v1/completions", {{"prompt", group_prompt}, {"max_tokens", 25}, {"temperature", 0},
                                              {"ignore_eos", true}, {"n", 4}});
    REQUIRE(g.status == 200);
    const json gj = g.j();
    REQUIRE(gj["choices"].size() == 4);
    for (const auto& c : gj["choices"]) CHECK(c["text"] == offline_text(group_prompt, 25));
    const int n_prompt = gj["usage"]["prompt_tokens"].get<int>();
    CHECK(engine_metric("tandem_engine_prompt_tokens_total") - prompt0 == n_prompt); // once, not four times
    CHECK(engine_metric("tandem_prefix_cache_hits_total") - hits0 == 0);
    CHECK(gj["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
    CHECK(wait_for([&] { return status(d.sock)["kv_pages_used"] == 0; }, 5));
    // The same long prompt again: its full pages come from the prefix cache, and usage says how many.
    const std::string long_prompt = "The old lighthouse keeper climbed the stairs every night to light the lamp, and "
                                    "every morning he wrote in his book what ships he had seen pass by the rocks.";
    auto ask = [&] {
        return post(d.sock, "/v1/completions", {{"prompt", long_prompt}, {"max_tokens", 3}, {"temperature", 0}}).j();
    };
    const json cold = ask();
    const double hits1 = engine_metric("tandem_prefix_cache_hits_total");
    const json warm = ask();
    CHECK(cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
    const int cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
    CHECK(cached > 0);
    CHECK(cached < warm["usage"]["prompt_tokens"].get<int>());
    CHECK(cached == engine_metric("tandem_prefix_cache_hits_total") - hits1);
    CHECK(warm["choices"][0]["text"] == cold["choices"][0]["text"]);
    CHECK(wait_for([&] { return status(d.sock)["kv_pages_used"] == 0; }, 5));
    CHECK(d.stop() == 0);
    CHECK_FALSE(alive(pre));
    CHECK_FALSE(alive(dec));
}

TEST_CASE("workers: kill -9 of a worker mid-batch; its requests resume, pages return, the worker restarts") {
    daemon_process d;
    // Prefill chunks of 32 tokens: a long prompt is several prefill batches.
    d.start(scratch().file("k.sock"), {"--set", "step_tokens=32"});
    REQUIRE(d.wait_ready());
    int restarts = 0;
    for (const std::string role : {"decode", "prefill"}) {
        kill_mid_batch(d, role, 1000);
        CHECK(status(d.sock)["worker_restarts"] == ++restarts);
    }
    // and it still serves
    CHECK(completion(d.sock, prompts[5], 20)["choices"][0]["text"] == offline_text(prompts[5], 20));
    CHECK(d.stop() == 0);
}

TEST_CASE("workers: a hung worker (SIGSTOP) is killed after worker_timeout_s and its batch retried") {
    daemon_process d;
    d.start(scratch().file("h.sock"), {"--set", "worker_timeout_s=1"});
    REQUIRE(d.wait_ready());
    const pid_t victim = worker_pid(d.pid, "decode");
    REQUIRE(victim > 0);
    std::vector<std::future<streamed>> fs = streaming(d, 2, 800, 30);
    REQUIRE(::kill(victim, SIGSTOP) == 0);
    CHECK(wait_for([&] { const pid_t p = worker_pid(d.pid, "decode"); return p > 0 && p != victim; }, 4));
    check_equal_offline(fs, [](size_t) { return 800; });
    CHECK(status(d.sock)["worker_restarts"] == 1);
    CHECK_FALSE(alive(victim));
    CHECK(d.stop() == 0);
}

TEST_CASE("workers: a stopped worker (SIGSTOP) is found by its heartbeat within 10 s with the default settings") {
    daemon_process d;
    d.start(scratch().file("hb.sock")); // worker_timeout_s stays 300: only the heartbeat can find it
    REQUIRE(d.wait_ready());
    // mid-stream: the decode worker, its batch in flight
    const pid_t victim = worker_pid(d.pid, "decode");
    REQUIRE(victim > 0);
    std::vector<std::future<streamed>> fs = streaming(d, 2, 800, 30);
    REQUIRE(::kill(victim, SIGSTOP) == 0);
    auto t0 = std::chrono::steady_clock::now();
    CHECK(wait_for([&] { const pid_t p = worker_pid(d.pid, "decode"); return p > 0 && p != victim; }, 10));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
    check_equal_offline(fs, [](size_t) { return 800; });
    CHECK_FALSE(alive(victim));
    // idle: the prefill worker, no batch in flight
    const pid_t idle = worker_pid(d.pid, "prefill");
    REQUIRE(idle > 0);
    REQUIRE(::kill(idle, SIGSTOP) == 0);
    t0 = std::chrono::steady_clock::now();
    CHECK(wait_for([&] { const pid_t p = worker_pid(d.pid, "prefill"); return p > 0 && p != idle; }, 10));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
    CHECK(status(d.sock)["worker_restarts"] == 2);
    CHECK(completion(d.sock, prompts[3], 20)["choices"][0]["text"] == offline_text(prompts[3], 20));
    CHECK(d.stop() == 0);
}

TEST_CASE("workers: after the daemon's binary is replaced on disk (a package upgrade), a killed worker still restarts") {
    // tandemd from a copy, which is then replaced by another file, as dpkg does (rename over it)
    const std::string exe = scratch().file("tandemd-copy"), next = scratch().file("tandemd-next");
    std::filesystem::copy_file(default_tandemd(), exe, std::filesystem::copy_options::overwrite_existing);
    daemon_process d;
    d.sock = scratch().file("up.sock");
    d.spawn({"--model", model_path("stories260K.gguf"), "--socket", d.sock, "--threads", "1", "--log", "warn", "--set",
             "kv_pool=" + d.sock + ".kv"},
            {}, exe);
    REQUIRE(d.wait_ready());
    std::ofstream(next) << "#!/bin/sh\nexit 3\n"; // not the program: a worker run from it would fail
    std::filesystem::rename(next, exe);
    const pid_t victim = worker_pid(d.pid, "decode");
    REQUIRE(victim > 0);
    REQUIRE(::kill(victim, SIGKILL) == 0);
    CHECK(wait_for([&] { const pid_t p = worker_pid(d.pid, "decode"); return p > 0 && p != victim; }, 10));
    CHECK(completion(d.sock, prompts[1], 20)["choices"][0]["text"] == offline_text(prompts[1], 20));
    CHECK(status(d.sock)["worker_restarts"] == 1);
    CHECK(d.stop() == 0);
}

// tandemd serving a copy of stories260K (which the test may change on disk), its log kept.
void start_on_copy(daemon_process& d, const std::string& name) {
    const std::string model = scratch().file(name + ".gguf");
    std::filesystem::copy_file(model_path("stories260K.gguf"), model, std::filesystem::copy_options::overwrite_existing);
    // ours to rewrite: the shared models are read-only, which root ignores and a user does not
    std::filesystem::permissions(model, std::filesystem::perms::owner_write, std::filesystem::perm_options::add);
    d.sock = scratch().file(name + ".sock");
    d.log = scratch().file(name + ".log");
    d.spawn({"--model", model, "--socket", d.sock, "--threads", "1", "--log", "warn", "--set", "kv_pool=" + d.sock + ".kv"});
}

TEST_CASE("workers: with the model renamed over and the pool file removed on disk, killed workers restart from the files the daemon started with") {
    daemon_process d;
    start_on_copy(d, "moved");
    REQUIRE(d.wait_ready());
    const std::string model = scratch().file("moved.gguf"), other = scratch().file("moved-next.gguf");
    // another model in its place, as a download tool or a package upgrade leaves it
    std::filesystem::copy_file(model_path("llama-2-tiny-random.gguf"), other, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::rename(other, model);
    REQUIRE(::unlink((d.sock + ".kv").c_str()) == 0);
    for (const std::string role : {"decode", "prefill"}) {
        CAPTURE(role);
        const pid_t victim = worker_pid(d.pid, role);
        REQUIRE(victim > 0);
        REQUIRE(::kill(victim, SIGKILL) == 0);
        CHECK(wait_for([&] { const pid_t p = worker_pid(d.pid, role); return p > 0 && p != victim; }, 10));
    }
    // the model it loaded, on the pool it made (before: a restart loaded the new file and
    // failed its fingerprint, or found no pool)
    CHECK(completion(d.sock, prompts[2], 20)["choices"][0]["text"] == offline_text(prompts[2], 20));
    CHECK(status(d.sock)["worker_restarts"] == 2);
    CHECK(d.stop() == 0);
    CHECK(!std::filesystem::exists(d.sock + ".kv")); // and it did not remove a file that is not its own
}

TEST_CASE("workers: a model file rewritten in place or a pool file truncated under the daemon: its requests end with an error that says so, tandemd exits 1 (no SIGBUS)") {
    for (const std::string what : {"model", "pool"}) {
        CAPTURE(what);
        daemon_process d;
        start_on_copy(d, "changed-" + what);
        REQUIRE(d.wait_ready());
        CHECK(completion(d.sock, prompts[0], 8)["choices"][0]["text"] == offline_text(prompts[0], 8));
        const std::string file = what == "model" ? scratch().file("changed-model.gguf") : d.sock + ".kv";
        REQUIRE(::truncate(file.c_str(), 4096) == 0);
        // The pool's pages are gone: the next batch faults its worker. The model's weights are
        // in the workers' memory: the fault shows when one has to load them again.
        if (what == "model") REQUIRE(::kill(worker_pid(d.pid, "decode"), SIGKILL) == 0);
        const auto r = post(d.sock, "/v1/completions", {{"prompt", prompts[1]}, {"max_tokens", 30}, {"temperature", 0}});
        CHECK(r.status >= 500);
        CHECK_MESSAGE(r.body.find(what == "model" ? "changed on disk" : "was truncated") != std::string::npos, r.body);
        CHECK(d.wait_exit(30) == 1); // for its service manager to start it anew (Restart=on-failure)
        CHECK(read_text(d.log).find("restart tandemd") != std::string::npos);
    }
}

TEST_CASE("local: a model file rewritten in place under a daemon without workers: it serves on from its own copy") {
    // Every weight, a `tandem quantize` file's INT8 rows included, is copied out of the mapping
    // at load and its pages given back, so nothing reads the file afterwards: no SIGBUS, and
    // nothing to load again (the workers' case above).
    for (const bool quantized : {false, true}) {
        CAPTURE(quantized);
        const std::string model = scratch().file("local-changed.gguf");
        std::filesystem::remove(model);
        if (quantized) {
            cpu::thread_pool pool(1);
            quantize_gguf(model_path("stories260K.gguf"), model, pool);
        } else {
            std::filesystem::copy_file(model_path("stories260K.gguf"), model);
            std::filesystem::permissions(model, std::filesystem::perms::owner_write, std::filesystem::perm_options::add);
        }
        daemon_process d;
        d.sock = scratch().file("local-changed.sock");
        d.log = scratch().file("local-changed.log");
        d.spawn({"--model", model, "--socket", d.sock, "--threads", "1", "--log", "warn", "--set", "placement=local"});
        REQUIRE(d.wait_ready());
        CHECK(completion(d.sock, prompts[0], 8)["choices"][0]["text"] == offline_text(prompts[0], 8));
        REQUIRE(::truncate(model.c_str(), 4096) == 0);
        for (int i = 1; i < 3; ++i)
            CHECK(completion(d.sock, prompts[i], 20)["choices"][0]["text"] == offline_text(prompts[i], 20));
        CHECK(d.stop() == 0);
    }
}

TEST_CASE("workers: logs that cannot be written (the disk full: stderr on /dev/full) change nothing: served, restarted, a clean exit") {
    daemon_process d;
    d.log = "/dev/full"; // every write fails with ENOSPC, the daemon's and its workers'
    d.sock = scratch().file("full.sock");
    d.spawn({"--model", model_path("stories260K.gguf"), "--socket", d.sock, "--threads", "1", "--log", "debug", // a line at every step
             "--set", "kv_pool=" + d.sock + ".kv"});
    REQUIRE(d.wait_ready());
    CHECK(completion(d.sock, prompts[4], 20)["choices"][0]["text"] == offline_text(prompts[4], 20));
    const pid_t victim = worker_pid(d.pid, "decode");
    REQUIRE(victim > 0);
    REQUIRE(::kill(victim, SIGKILL) == 0); // its warning cannot be written either
    CHECK(wait_for([&] { const pid_t p = worker_pid(d.pid, "decode"); return p > 0 && p != victim; }, 10));
    const auto s = stream(d.sock, prompts[6], 30);
    CHECK(s.done);
    CHECK(s.text == offline_text(prompts[6], 30));
    CHECK(d.stop() == 0);
}

TEST_CASE("workers: when the supervisor dies, its workers exit; a new daemon on its socket adopts its pool") {
    const std::string prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
                               "park with her friends. One day, she saw a big red ball under a tree.";
    const std::string expect = offline_text(prompt, 20);
    daemon_process d;
    d.start(scratch().file("s.sock"));
    REQUIRE(d.wait_ready());
    CHECK(completion(d.sock, prompt, 20)["choices"][0]["text"] == expect);
    const pid_t pre = worker_pid(d.pid, "prefill"), dec = worker_pid(d.pid, "decode");
    REQUIRE(pre > 0);
    REQUIRE(dec > 0);
    ::kill(d.pid, SIGKILL);
    ::waitpid(d.pid, nullptr, 0);
    d.pid = -1;
    CHECK(wait_for([&] { return !alive(pre) && !alive(dec); }, 2));
    // Its socket file and pool are left behind: the next daemon takes both over.
    daemon_process next;
    next.start(d.sock);
    REQUIRE(next.wait_ready());
    CHECK(completion(next.sock, prompt, 20)["choices"][0]["text"] == expect);
    CHECK(metric(request(next.sock, "GET", "/metrics").body, "tandem_prefix_cache_hits_total") >= 32);
    CHECK(next.stop() == 0);
}

TEST_CASE("workers: the prefix cache is warm after a restart; a mismatched or damaged pool is rebuilt") {
    const std::string sock = scratch().file("r.sock");
    const std::string pool = sock + ".kv";
    std::string prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
                         "with her friends. One day, she saw a big red ball under a tree. She wanted it so much.";
    const std::string expect = offline_text(prompt, 30);
    std::filesystem::remove(pool); // each subcase starts cold
    const std::vector<std::string> keep = {"--set", "kv_pool_persist=true"}; // off by default
    auto hits = [&](const std::string& s) { return metric(request(s, "GET", "/metrics").body, "tandem_prefix_cache_hits_total"); };
    {
        daemon_process d;
        d.start(sock, keep);
        REQUIRE(d.wait_ready());
        CHECK(completion(d.sock, prompt, 30)["choices"][0]["text"] == expect);
        CHECK(hits(d.sock) == 0);
        CHECK(d.stop() == 0);
    }
    REQUIRE(std::filesystem::exists(pool));
    {
        daemon_process d;
        d.start(sock, keep);
        REQUIRE(d.wait_ready());
        CHECK(completion(d.sock, prompt, 30)["choices"][0]["text"] == expect);
        CHECK(hits(d.sock) >= 32); // whole pages of the prompt came from the last run
        CHECK(d.stop() == 0);
    }
    SUBCASE("a damaged header") {
        std::fstream f(pool, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(16);
        f.write("garbage!", 8);
    }
    SUBCASE("another page size") {
        daemon_process d;
        d.start(sock, {"--set", "kv_pool_persist=true", "--set", "page_size=8"});
        REQUIRE(d.wait_ready());
        CHECK(hits(d.sock) == 0);
        CHECK(d.stop() == 0);
    }
    daemon_process d;
    d.start(sock, keep);
    REQUIRE(d.wait_ready());
    CHECK(completion(d.sock, prompt, 30)["choices"][0]["text"] == expect);
    CHECK(hits(d.sock) == 0); // nothing trusted from a pool that does not match
    CHECK(d.stop() == 0);
}

TEST_CASE("workers: a pool smaller than the load preempts, and every request still completes") {
    daemon_process d;
    // 24 pages of 16 tokens: six requests of ~110 positions need ~48
    d.start(scratch().file("p.sock"), {"--set", "kv_pages=24", "--set", "n_ctx=256", "--set", "kv_pool_persist=false"});
    REQUIRE(d.wait_ready());
    const tokens_of n100 = [](size_t) { return 100; };
    auto fs = stream_all(d.sock, 6, n100);
    check_equal_offline(fs, n100);
    const json st = status(d.sock);
    CHECK(st["kv_pages_used"] == 0);
    if (st.contains("preemptions")) CHECK(st["preemptions"].get<int>() > 0);
    CHECK(d.stop() == 0);
    CHECK_FALSE(std::filesystem::exists(d.sock + ".kv")); // kv_pool_persist=false removes it
}

TEST_CASE("workers: a burst beyond the pool and the queue: preemptions and 429s with Retry-After, no deadlock, every page back") {
    daemon_process d;
    // 24 pages of 16 tokens for 8 running requests of ~110 positions (they need ~56), 4 waiting
    d.start(scratch().file("burst.sock"), {"--set", "kv_pages=24", "--set", "n_ctx=256", "--set", "max_running=8",
                                           "--set", "max_waiting=4"});
    REQUIRE(d.wait_ready());
    struct answer {
        http_response r;
        streamed s;
    };
    std::vector<std::future<answer>> fs;
    for (size_t i = 0; i < 24; ++i)
        fs.push_back(std::async(std::launch::async, [&d, i] {
            answer a;
            a.r = post(d.sock, "/v1/completions",
                       {{"prompt", prompts[i % prompts.size()]}, {"max_tokens", 100}, {"temperature", 0},
                        {"ignore_eos", true}, {"stream", true}});
            for (const auto& e : sse_events(a.r.body, &a.s.done))
                if (e.contains("choices") && !e["choices"].empty()) {
                    a.s.text += e["choices"][0]["text"].get<std::string>();
                    if (!e["choices"][0]["finish_reason"].is_null()) a.s.finish = e["choices"][0]["finish_reason"];
                }
            return a;
        }));
    int served = 0, refused = 0;
    for (size_t i = 0; i < fs.size(); ++i) {
        CAPTURE(i);
        const answer a = fs[i].get();
        if (a.r.status == 429) {
            ++refused;
            CHECK(a.r.headers.count("retry-after") == 1);
            continue;
        }
        REQUIRE(a.r.status == 200);
        ++served;
        CHECK(a.s.done);
        CHECK(a.s.finish == "length");
        CHECK(a.s.text == offline_text(prompts[i % prompts.size()], 100));
    }
    MESSAGE(served, " served, ", refused, " refused");
    CHECK(served >= 12); // the running and the waiting at least
    CHECK(refused >= 1);
    const json st = status(d.sock);
    REQUIRE(st.contains("preemptions"));
    CHECK(st["preemptions"].get<int>() > 0);
    CHECK(wait_for([&] { const json s = status(d.sock); return s["kv_pages_used"] == 0 && s["running"] == 0 && s["waiting"] == 0; }, 5));
    CHECK(completion(d.sock, prompts[3], 20)["choices"][0]["text"] == offline_text(prompts[3], 20)); // and it serves on
    CHECK(d.stop() == 0);
}

TEST_CASE("workers: beam search through the workers equals the offline search, across a killed decode worker and preemption") {
    // Four beams of 80 tokens and four streams beside them do not fit this 24-page pool, so
    // sequences are preempted and recomputed (beams among them, forking from preempted ones);
    // a decode worker killed mid-search costs a retry.
    daemon_process d;
    d.start(scratch().file("b.sock"), {"--set", "kv_pages=24", "--set", "n_ctx=256", "--set", "kv_pool_persist=false"});
    REQUIRE(d.wait_ready());
    const int n = 80;
    const auto beams = [&](const std::string& prompt) {
        return post(d.sock, "/v1/completions", {{"prompt", prompt}, {"max_tokens", n}, {"use_beam_search", true},
                                                {"n", 4}, {"ignore_eos", true}});
    };
    for (bool kill : {false, true}) {
        CAPTURE(kill);
        const double generated0 = generated_tokens(d);
        auto search = std::async(std::launch::async, [&] { return beams(prompts[0]); });
        std::vector<std::future<streamed>> others;
        for (size_t i = 1; i < 5; ++i) // (these alone need 28 pages)
            others.push_back(std::async(std::launch::async, [&, i] { return stream(d.sock, prompts[i], 100); }));
        if (kill) { // mid-search: once the beams have grown a few tokens
            REQUIRE(wait_for([&] { return generated_tokens(d) >= generated0 + 40; }, 10));
            REQUIRE(::kill(worker_pid(d.pid, "decode"), SIGKILL) == 0);
        }
        const auto r = search.get();
        REQUIRE(r.status == 200);
        const generate_result want = offline(prompts[0], n, 4);
        const json ch = r.j()["choices"];
        REQUIRE(ch.size() == 4);
        for (size_t k = 0; k < 4; ++k) {
            CHECK_MESSAGE(ch[k]["text"] == want.beams[k].text, "beam ", k);
            CHECK(ch[k]["score"].get<double>() == doctest::Approx(want.beams[k].score));
        }
        for (size_t i = 0; i < others.size(); ++i) CHECK(others[i].get().text == offline_text(prompts[i + 1], 100));
        CHECK(wait_for([&] { return status(d.sock)["kv_pages_used"] == 0; }, 5));
    }
    const json st = status(d.sock);
    if (st.contains("preemptions")) CHECK(st["preemptions"].get<int>() > 0);
    CHECK(st["worker_restarts"] == 1);
    CHECK(d.stop() == 0);
}

TEST_CASE("workers: draft_tokens = 4 verifies prompt-lookup drafts in the decode worker; outputs equal the offline loop") {
    daemon_process d;
    d.start(scratch().file("spec.sock"), {"--set", "draft_tokens=4", "--set", "draft_cost=0.05"});
    REQUIRE(d.wait_ready());
    auto spec_metric = [&](const char* name) { return metric(request(d.sock, "GET", "/metrics").body, name); };
    // A passage the continuation may copy, and the usual prompts, alone and at once.
    const std::string copy = "Lily saw a big red ball. She wanted to play with the ball. Lily saw a big red ball. She";
    const json one = completion(d.sock, copy, 40);
    REQUIRE(one.contains("choices"));
    CHECK(one["choices"][0]["text"] == offline_text(copy, 40));
    auto fs = stream_all(d.sock, 4, short_growing);
    check_equal_offline(fs, short_growing);
    const double drafted = spec_metric("tandem_speculative_draft_tokens_total"),
                 accepted = spec_metric("tandem_speculative_accepted_tokens_total");
    MESSAGE(accepted, " of ", drafted, " drafts accepted");
    CHECK(drafted > 0);
    CHECK(accepted > 0);
    CHECK(accepted <= drafted);
    // Per request: "off" drafts nothing, fewer drafts give the same text, the rest is a 400.
    auto with = [&](const json& spec) {
        return post(d.sock, "/v1/completions", {{"prompt", copy}, {"max_tokens", 40}, {"temperature", 0},
                                                {"ignore_eos", true}, {"speculative", spec}});
    };
    const auto off = with({{"method", "off"}});
    REQUIRE(off.status == 200);
    CHECK(off.j()["choices"][0]["text"] == offline_text(copy, 40));
    CHECK(spec_metric("tandem_speculative_draft_tokens_total") == drafted);
    const auto two = with({{"method", "ngram"}, {"num_tokens", 2}});
    REQUIRE(two.status == 200);
    CHECK(two.j()["choices"][0]["text"] == offline_text(copy, 40));
    CHECK(spec_metric("tandem_speculative_draft_tokens_total") > drafted);
    for (const json& bad : {json{{"method", "draft"}}, json{{"method", "medusa"}}, json{{"num_tokens", 5}},
                            json{{"num_tokens", 0}}, json{{"method", "ngram"}, {"window", 3}}, json("ngram"),
                            json{{"method", "off"}, {"num_tokens", 2}}}) {
        const auto r = with(bad);
        INFO(bad.dump(), " -> ", r.body);
        CHECK(r.status == 400);
    }
    CHECK(wait_for([&] { return status(d.sock)["kv_pages_used"] == 0; }, 5));
    CHECK(d.stop() == 0);
}

TEST_CASE("workers: draft_model drafts next to the decode worker; outputs equal the offline loop, usage counts the drafts") {
    // The model drafts for itself: its greedy drafts are its own tokens, so all are accepted.
    daemon_process d;
    d.start(scratch().file("draft.sock"), {"--set", "draft_model=" + model_path("stories260K.gguf"), "--set", "draft_cost=0.05"});
    REQUIRE(d.wait_ready());
    const std::string copy = "Lily saw a big red ball. She wanted to play with the ball. Lily saw a big red ball. She";
    const json one = completion(d.sock, copy, 40);
    REQUIRE(one.contains("choices"));
    CHECK(one["choices"][0]["text"] == offline_text(copy, 40));
    const json details = one["usage"]["completion_tokens_details"];
    CHECK(details["accepted_prediction_tokens"].get<int>() > 0);
    CHECK(details["rejected_prediction_tokens"] == 0);
    auto fs = stream_all(d.sock, 4, short_growing);
    check_equal_offline(fs, short_growing);
    const json spec = status(d.sock)["speculative"];
    CHECK(spec["method"] == "draft");
    CHECK(spec["draft_tokens"] == 4); // draft_tokens unset: 4 with a draft model
    CHECK(spec["draft_device"].get<std::string>().find("cpu") != std::string::npos);
    CHECK(spec["accepted_tokens"].get<int>() > 0);
    const std::string m = request(d.sock, "GET", "/metrics").body;
    CHECK(metric(m, "tandem_speculative_drafts_total") > 0);
    CHECK(m.find("tandem_speculative_accepted_tokens_per_position_total{position=\"3\"}") != std::string::npos);
    // The decode worker killed mid-stream: the lost steps, drafts and all, run again; the same text.
    const pid_t victim = worker_pid(d.pid, "decode");
    REQUIRE(victim > 0);
    std::vector<std::future<streamed>> ks = streaming(d, 4, 1000, 50);
    REQUIRE(::kill(victim, SIGKILL) == 0);
    for (size_t i = 0; i < ks.size(); ++i) {
        const streamed s = ks[i].get();
        CHECK_MESSAGE(s.finish == "length", "request ", i);
        CHECK_MESSAGE(s.text == offline_text(prompts[i], 1000), "request ", i);
    }
    CHECK(status(d.sock)["worker_restarts"] == 1);
    // A request may take prompt lookup instead, or fewer drafts; "off" reports no drafts.
    for (const json& method : {json{{"method", "ngram"}}, json{{"method", "draft"}, {"num_tokens", 2}}, json{{"method", "off"}}}) {
        const auto r = post(d.sock, "/v1/completions", {{"prompt", copy}, {"max_tokens", 40}, {"temperature", 0},
                                                        {"ignore_eos", true}, {"speculative", method}});
        INFO(method.dump(), " -> ", r.body);
        REQUIRE(r.status == 200);
        CHECK(r.j()["choices"][0]["text"] == offline_text(copy, 40));
        CHECK(r.j()["usage"].contains("completion_tokens_details") == (method["method"] != "off"));
    }
    CHECK(wait_for([&] { return status(d.sock)["kv_pages_used"] == 0; }, 5));
    CHECK(d.stop() == 0);
    // A draft model of another vocabulary: the daemon does not start (exit 1, the reason logged).
    daemon_process bad;
    bad.start(scratch().file("draft-bad.sock"), {"--set", "draft_model=" + model_path("llama-2-tiny-random.gguf")});
    int rc = -1;
    CHECK_FALSE(ready_or_exit(bad, rc));
    CHECK(rc == 1);
}

TEST_CASE("workers: a windowed model through the worker split releases pages behind the window in the shared pool") {
    const std::string text = windowed_run("swa", {});
    // The in-process engine's greedy text (the same scheduler and kernels, one process).
    model_bundle b = load_model(windowed_model_path());
    cpu::thread_pool pool(1);
    generate_params gp;
    gp.request.max_tokens = 96;
    gp.request.sampling.temperature = 0;
    gp.request.ignore_eos = true;
    const generate_result want =
        generate(exec_ctx{backend::cpu, &pool}, *b.mdl, *b.tok, b.tok->encode(windowed_prompt, true, false), gp);
    CHECK(text == want.text);
}

