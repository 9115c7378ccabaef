// tandemd end to end, its life and load: concurrent streams, disconnects, malformed input,
// keep-alive, draining on SIGTERM, loading, socket activation, limits and slow clients.
#include "server_fixtures.hpp"

using namespace tandem;
using namespace tandem::test;

TEST_CASE("16 concurrent streams all complete, each equal to its solo output at temperature 0") {
    const auto& s = shared_socket();
    const char* starts[] = {"Once upon a time", "The cat", "One day", "Tom and Sue", "A little bird", "The sun",
                            "Lily saw", "There was a", "Ben had a", "In the park", "The dog", "Mom said",
                            "A big red", "They went", "She was", "He liked"};
    const int n = 16;
    std::vector<std::string> solo(n), together(n);
    for (int i = 0; i < n; ++i) {
        auto r = post(s, "/v1/completions", {{"prompt", starts[i]}, {"max_tokens", 48}, {"temperature", 0}});
        REQUIRE(r.status == 200);
        solo[size_t(i)] = r.j()["choices"][0]["text"];
    }
    const double steps0 = metric(request(s, "GET", "/metrics").body, "tandem_engine_steps_total");
    std::vector<std::thread> threads;
    std::vector<int> status(n);
    std::vector<char> complete(n); // not vector<bool>: its elements share words, written from other threads
    std::latch all_connected(n); // send together, so they overlap even on a busy machine
    for (int i = 0; i < n; ++i)
        threads.emplace_back([&, i] {
            const int fd = connect_unix(s);
            all_connected.arrive_and_wait();
            send_all(fd, make_request("POST", "/v1/completions",
                                      json{{"prompt", starts[i]}, {"max_tokens", 48}, {"temperature", 0},
                                           {"stream", true}}.dump()));
            const auto r = parse_response(read_until_eof(fd));
            ::close(fd);
            status[size_t(i)] = r.status;
            bool done = false, ok = false;
            auto ev = sse_events(r.body, &done, &ok);
            complete[size_t(i)] = done && ok;
            together[size_t(i)] = stream_text(ev, false);
        });
    for (auto& t : threads) t.join();
    const double steps1 = metric(request(s, "GET", "/metrics").body, "tandem_engine_steps_total");
    int n_tokens = 0;
    for (int i = 0; i < n; ++i) {
        CHECK(status[size_t(i)] == 200);
        CHECK(complete[size_t(i)]);
        CHECK_MESSAGE(together[size_t(i)] == solo[size_t(i)], "stream ", i);
        n_tokens += 48;
    }
    // batched: far fewer steps than tokens
    CHECK(steps1 - steps0 < n_tokens / 2);
}

TEST_CASE("tandem bench --serve: throughput, TTFT, inter-token latency and KV waste per level, prefix TTFT") {
    const auto& s = shared_socket();
    // --kv-interval-ms 1: these levels last milliseconds; the default 20 ms would see nothing.
    const auto r = run_tandem({"bench", "--serve", "--socket", s, "--concurrency", "1,2", "--requests", "2",
                               "--max-tokens", "4", "--shared-prefix", "64", "--kv-interval-ms", "1", "--json"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const json j = json::parse(r.out);
    CHECK(j["model"] == "stories260K");
    CHECK(j["prompt_tokens"] == 128);
    CHECK(j["max_tokens"] == 4);
    REQUIRE(j["levels"].size() == 2);
    for (int li = 0; li < 2; ++li) {
        const json& l = j["levels"][size_t(li)];
        CAPTURE(l.dump());
        CHECK(l["concurrency"] == li + 1);
        CHECK(l["requests"] == 2);
        CHECK(l["errors"] == 0);
        CHECK(l["generated_tokens"] == 8); // ignore_eos: exactly max_tokens each
        CHECK(l["tok_s"].get<double>() > 0);
        CHECK(l["wall_s"].get<double>() > 0);
        for (const char* k : {"ttft_ms", "itl_ms"}) {
            const json& lat = l[k];
            REQUIRE(lat["p50"].is_number());
            CHECK(lat["p50"].get<double>() >= 0);
            CHECK(lat["p99"].get<double>() >= lat["p50"].get<double>());
        }
        CHECK(l["ttft_ms"]["n"] == 2);
        CHECK(l["itl_ms"]["n"] == 6); // 3 gaps per 4-token stream
        // a sample sees the pages of a running request: pages are taken as positions are
        // computed, so at least the prompt's ceil(128 / 16) = 8 once it is prefilled (a 9th
        // only from the first decode step on, which a sample may miss)
        REQUIRE(l["kv_samples"].get<int>() > 0);
        CHECK(l["kv_pages_used_max"].get<int>() >= 8);
        const double w = l["kv_waste"].get<double>();
        CHECK(w >= 0);
        CHECK(w <= 1);
        CHECK(l["kv_waste_max"].get<double>() >= w);
    }
    const json& p = j["prefix"];
    CHECK(p["prefix_tokens"] == 64);
    CHECK(p["cold_ttft_ms"].get<double>() > 0);
    CHECK(p["warm_ttft_ms"].get<double>() > 0);
    CHECK(p["warm_hit_tokens"].get<int64_t>() >= 0);

    // the table form, and usage errors
    const auto t = run_tandem({"bench", "--serve", "--socket", s, "--concurrency", "1", "--requests", "1",
                               "--max-tokens", "2", "--shared-prefix", "0"});
    CHECK(t.rc == 0);
    CHECK(t.out.find("concurrency") != std::string::npos);
    CHECK(run_tandem({"bench", "--concurrency", "2"}).rc == 2); // serve flags need --serve
    CHECK(run_tandem({"bench", "--serve", "--socket", s, "--requests", "1", "--duration", "1"}).rc == 2);
    CHECK(run_tandem({"bench", "--serve", "--socket", scratch().file("nobody.sock")}).rc == 3);
}

TEST_CASE("a client that disconnects cancels its request: compute stops and pages are freed") {
    const auto& s = shared_socket();
    const int fd = connect_unix(s);
    REQUIRE(fd >= 0);
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"ignore_eos", true}, {"n", 4},
                       {"temperature", 0}, {"stream", true}};
    // (the shared daemon's counter holds what earlier tests generated)
    const double gen_before = metric(request(s, "GET", "/metrics").body, "tandem_engine_generated_tokens_total");
    send_all(fd, make_request("POST", "/v1/completions", body.dump()));
    const auto cancelled = [&] {
        return metric(request(s, "GET", "/metrics").body, "tandem_generations_finished_total{reason=\"cancelled\"}");
    };
    const double cancelled0 = std::max(0.0, cancelled());
    std::string got;
    char buf[4096];
    while (got.find("data: ") == std::string::npos) { // tokens are flowing
        pollfd p{fd, POLLIN, 0};
        REQUIRE(::poll(&p, 1, 10000) == 1);
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        REQUIRE(n > 0);
        got.append(buf, size_t(n));
    }
    ::close(fd);

    // the session notices at once and cancels all 4 choices; the engine drops them at the next step
    for (int i = 0; i < 500 && cancelled() < cancelled0 + 4; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(cancelled() == cancelled0 + 4);
    auto m = request(s, "GET", "/metrics").body;
    for (int i = 0; i < 200 && (metric(m, "tandem_requests_running") != 0 || metric(m, "tandem_kv_pages_used") != 0); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        m = request(s, "GET", "/metrics").body;
    }
    CHECK(metric(m, "tandem_requests_running") == 0);
    CHECK(metric(m, "tandem_kv_pages_used") == 0);
    const double gen0 = metric(m, "tandem_engine_generated_tokens_total");
    CHECK(gen0 - gen_before < 4000); // far from the 8000 asked for
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const double gen1 = metric(request(s, "GET", "/metrics").body, "tandem_engine_generated_tokens_total");
    CHECK(gen1 == gen0); // nothing is computed for it any more

    // a plain (non-streaming) request is cancelled too, as soon as the client hangs up
    const int fd2 = connect_unix(s);
    send_all(fd2, make_request("POST", "/v1/completions", json{{"prompt", "The cat"}, {"max_tokens", 2000},
                                                               {"ignore_eos", true}, {"n", 4}}.dump()));
    for (int i = 0; i < 500 && metric(request(s, "GET", "/metrics").body, "tandem_requests_running") == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10)); // until it runs
    ::close(fd2);
    for (int i = 0; i < 200 && metric(request(s, "GET", "/metrics").body, "tandem_requests_running") != 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    m = request(s, "GET", "/metrics").body;
    CHECK(metric(m, "tandem_requests_running") == 0);
    CHECK(metric(m, "tandem_kv_pages_used") == 0);
    CHECK(cancelled() == cancelled0 + 8);
}

TEST_CASE("malformed input gets the right error while the daemon keeps serving") {
    const auto& s = shared_socket();
    auto expect = [&](const std::string& target, const std::string& body, int status, const char* what) {
        auto r = request(s, "POST", target, body);
        CHECK_MESSAGE(r.status == status, what, ": ", r.body);
        if (r.status >= 400) {
            const json j = r.j();
            CHECK_MESSAGE((j.contains("error") && j["error"].contains("message") && j["error"].contains("type")),
                          what);
        }
    };
    expect("/v1/completions", "{\"prompt\": \"x\", ", 400, "truncated JSON");
    expect("/v1/completions", "not json", 400, "not JSON");
    expect("/v1/completions", "[1,2]", 400, "not an object");
    expect("/v1/completions", R"({"max_tokens": 5})", 400, "no prompt");
    expect("/v1/completions", R"({"prompt": 5})", 400, "prompt of the wrong type");
    expect("/v1/completions", R"({"prompt": [1, 99999]})", 400, "token id out of range");
    expect("/v1/completions", R"({"prompt": "x", "temperature": "hot"})", 400, "temperature a string");
    expect("/v1/completions", R"({"prompt": "x", "temperature": 7})", 400, "temperature out of range");
    expect("/v1/completions", R"({"prompt": "x", "max_tokens": "10"})", 400, "max_tokens a string");
    expect("/v1/completions", R"({"prompt": "x", "max_tokens": -1})", 400, "negative max_tokens");
    expect("/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "zero max_tokens");
    expect("/v1/completions", R"({"prompt": "x", "max_tokens": 1e30})", 400, "huge float max_tokens");
    expect("/v1/completions", R"({"prompt": "x", "max_tokens": 99999999999999999999})", 400, "huge max_tokens");
    expect("/v1/completions", R"({"prompt": "x", "max_tokens": 1000000})", 400, "max_tokens over the limit");
    expect("/v1/completions", R"({"prompt": "x", "stream": "yes"})", 400, "stream a string");
    expect("/v1/completions", R"({"prompt": "x", "stop": [1]})", 400, "stop of numbers");
    expect("/v1/completions", R"({"prompt": "x", "logit_bias": {"abc": 1}})", 400, "logit_bias key");
    expect("/v1/completions", R"({"prompt": "x", "n": 1000})", 400, "n too large");
    expect("/v1/completions", R"({"prompt": "x", "logprobs": 50})", 400, "logprobs too large");
    expect("/v1/completions", R"({"prompt": "x", "model": "gpt-4"})", 404, "unknown model");
    expect("/v1/completions", "{\"prompt\": \"\xff\xfe bad utf-8\"}", 400, "invalid UTF-8");
    expect("/v1/chat/completions", R"({"messages": "hi"})", 400, "messages a string");
    expect("/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})", 400, "unknown role");
    expect("/v1/chat/completions", R"({"messages": [{"role": "user", "content": 5}]})", 400, "content a number");
    expect("/v1/nope", "{}", 404, "unknown route");
    expect("/tokenize", R"({"content": 5})", 400, "tokenize content a number");
    expect("/detokenize", R"({"tokens": [-1]})", 400, "detokenize bad id");
    CHECK(request(s, "GET", "/v1/completions").status == 405);

    // oversized body: 413 before the body is read
    auto big = request(s, "POST", "/v1/completions",
                       json{{"prompt", std::string(100000, 'a')}}.dump());
    CHECK(big.status == 413);
    CHECK(big.j()["error"]["code"] == "request_too_large");

    // garbage instead of HTTP
    {
        const int fd = connect_unix(s);
        send_all(fd, "\x01\x02 nonsense\r\n\r\n");
        const auto r = parse_response(read_until_eof(fd, 5000));
        ::close(fd);
        CHECK(r.status == 400);
    }

    // slowloris: a request that never completes is dropped after request_timeout_s (1 s here)
    {
        const int fd = connect_unix(s);
        send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le");
        const auto t0 = std::chrono::steady_clock::now();
        const std::string rest = read_until_eof(fd, 10000);
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ::close(fd);
        CHECK(rest.empty());
        CHECK(waited < 5);
        CHECK(waited > 0.5);
    }
    // and a stalled body too
    {
        const int fd = connect_unix(s);
        send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro");
        const auto t0 = std::chrono::steady_clock::now();
        read_until_eof(fd, 10000);
        ::close(fd);
        CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 5);
    }

    // still serving
    CHECK(request(s, "GET", "/health").status == 200);
    auto ok = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 5}, {"temperature", 0}});
    CHECK(ok.status == 200);
    CHECK(ok.j()["choices"][0]["text"] == offline_text("Once upon a time", 5));
}

TEST_CASE("keep-alive: several requests on one connection") {
    const auto& s = shared_socket();
    const int fd = connect_unix(s);
    REQUIRE(fd >= 0);
    std::string reqs = make_request("GET", "/health", "", false) +
                       make_request("POST", "/tokenize", R"({"content":"hi"})", false) +
                       make_request("GET", "/health", "", true);
    send_all(fd, reqs);
    const std::string raw = read_until_eof(fd, 5000);
    ::close(fd);
    size_t n = 0;
    for (size_t pos = 0; (pos = raw.find("HTTP/1.1 200", pos)) != std::string::npos; ++pos) ++n;
    CHECK(n == 3);
}

TEST_CASE("Expect: 100-continue gets an interim 100 before the body is sent") {
    const auto& s = shared_socket();
    const int fd = connect_unix(s);
    REQUIRE(fd >= 0);
    const std::string body = json{{"content", "Once upon a time"}}.dump();
    send_all(fd, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
                 "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n");
    char buf[256];
    pollfd p{fd, POLLIN, 0};
    REQUIRE(::poll(&p, 1, 5000) == 1);
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    REQUIRE(n > 0);
    CHECK(std::string(buf, size_t(n)).rfind("HTTP/1.1 100 Continue\r\n\r\n", 0) == 0);
    send_all(fd, body);
    const auto r = parse_response(read_until_eof(fd, 5000));
    ::close(fd);
    CHECK(r.status == 200);
    CHECK(r.j()["count"].get<int>() > 0);
}

TEST_CASE("SIGTERM drains in-flight requests, then tandemd exits 0; sd_notify messages") {
    // a test NOTIFY_SOCKET: a datagram socket we read
    const std::string notify_path = scratch().file("notify.sock");
    const int nfd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, notify_path.c_str(), sizeof(a.sun_path) - 1);
    REQUIRE(::bind(nfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    // read continuously, as systemd does: a full queue would block the daemon's sd_notify
    std::mutex mu;
    std::string notes;
    std::atomic<bool> reading{true};
    std::thread reader([&] {
        char buf[4096];
        while (reading) {
            pollfd p{nfd, POLLIN, 0};
            if (::poll(&p, 1, 50) != 1) continue;
            const ssize_t n = ::recv(nfd, buf, sizeof buf, 0);
            if (n <= 0) continue;
            std::lock_guard lock(mu);
            notes.append(buf, size_t(n)).push_back('\n');
        }
    });
    auto read_notify = [&](int wait_ms) {
        std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
        std::lock_guard lock(mu);
        return notes;
    };

    daemon_process d;
    d.start(scratch().file("drain.sock"), {}, {"NOTIFY_SOCKET=" + notify_path, "WATCHDOG_USEC=200000"});
    REQUIRE(d.wait_ready());
    std::string msgs = read_notify(500);
    CHECK(msgs.find("READY=1") != std::string::npos);
    CHECK(msgs.find("STATUS=") != std::string::npos);
    CHECK(msgs.find("WATCHDOG=1") != std::string::npos);

    // a long streaming request is in flight when SIGTERM comes
    const int fd = connect_unix(d.sock);
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 600}, {"ignore_eos", true}, {"n", 2},
                       {"temperature", 0}, {"stream", true}};
    send_all(fd, make_request("POST", "/v1/completions", body.dump()));
    pollfd p{fd, POLLIN, 0};
    REQUIRE(::poll(&p, 1, 10000) == 1);
    ::kill(d.pid, SIGTERM);
    check_whole_stream(fd, 0, 600);
    CHECK(d.wait_exit(30) == 0);
    CHECK_FALSE(std::filesystem::exists(d.sock)); // the socket file is removed
    msgs = read_notify(500);
    CHECK(msgs.find("STOPPING=1") != std::string::npos);
    reading = false;
    reader.join();
    ::close(nfd);
}

TEST_CASE("while the model loads: /health answers 503 at once, a completion is held until it has loaded; READY=1 after") {
    const std::string notify_path = scratch().file("notify-load.sock");
    const int nfd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, notify_path.c_str(), sizeof(a.sun_path) - 1);
    REQUIRE(::bind(nfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    daemon_process d;
    d.start(scratch().file("loading.sock"), {}, {"NOTIFY_SOCKET=" + notify_path, "TANDEMD_TEST_LOAD_DELAY_MS=1500"});
    http_response h;
    for (int i = 0; i < 200 && h.status == 0; ++i) { // the socket is up before the model
        h = request(d.sock, "GET", "/health");
        if (h.status == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(h.status == 503);
    CHECK(h.j()["status"] == "loading");
    CHECK(h.headers.count("retry-after") == 1);
    char buf[512];
    std::string notes;
    for (ssize_t n; (n = ::recv(nfd, buf, sizeof buf, MSG_DONTWAIT)) > 0;) notes.append(buf, size_t(n));
    CHECK(notes.find("READY=1") == std::string::npos);
    // sent during the load (load_wait_s, 30 s by default): answered once the model is there
    const auto t0 = std::chrono::steady_clock::now();
    std::atomic<bool> answered{false};
    http_response c;
    std::thread client([&] {
        c = post(d.sock, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}});
        answered = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK_FALSE(answered); // held
    // meanwhile /health and the status answer at once, still loading
    const auto th = std::chrono::steady_clock::now();
    CHECK(request(d.sock, "GET", "/health").j()["status"] == "loading");
    CHECK(request(d.sock, "GET", "/v1/tandem/status").j()["status"] == "loading");
    CHECK(std::chrono::steady_clock::now() - th < std::chrono::milliseconds(500));
    client.join();
    CHECK(c.status == 200);
    CHECK(c.j()["choices"][0]["text"] == offline_text("Once upon a time", 8));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
    REQUIRE(d.wait_ready());
    pollfd p{nfd, POLLIN, 0};
    std::string ready;
    while (ready.find("READY=1") == std::string::npos && ::poll(&p, 1, 2000) == 1) {
        const ssize_t n = ::recv(nfd, buf, sizeof buf, 0);
        if (n <= 0) break;
        ready.append(buf, size_t(n));
    }
    CHECK(ready.find("READY=1") != std::string::npos);
    CHECK(d.stop() == 0);
    ::close(nfd);
}

namespace {

// Whether something accepts connections at `sock` within a few seconds.
bool listening(const std::string& sock) {
    for (int i = 0; i < 500; ++i) {
        if (const int fd = connect_unix(sock); fd >= 0) {
            ::close(fd);
            return true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
}

} // namespace

TEST_CASE("a request held for the model gets 503 with Retry-After after load_wait_s") {
    daemon_process d;
    d.start(scratch().file("load-wait.sock"), {"--set", "load_wait_s=0.3"}, {"TANDEMD_TEST_LOAD_DELAY_MS=3000"});
    REQUIRE(listening(d.sock));
    const auto t0 = std::chrono::steady_clock::now();
    auto c = post(d.sock, "/v1/completions", {{"prompt", "x"}});
    const auto waited = std::chrono::steady_clock::now() - t0;
    CHECK(c.status == 503);
    CHECK(c.j()["error"]["code"] == "model_loading");
    CHECK(c.headers.count("retry-after") == 1);
    CHECK(waited >= std::chrono::milliseconds(280));
    CHECK(waited < std::chrono::milliseconds(2500));
    // 0: no wait at all
    daemon_process d0;
    d0.start(scratch().file("load-wait0.sock"), {"--set", "load_wait_s=0"}, {"TANDEMD_TEST_LOAD_DELAY_MS=3000"});
    REQUIRE(listening(d0.sock));
    const auto t1 = std::chrono::steady_clock::now();
    CHECK(post(d0.sock, "/v1/models", {}).status == 405); // POST on a GET route: an error that needs no model
    CHECK(request(d0.sock, "GET", "/v1/models").status == 503);
    CHECK(std::chrono::steady_clock::now() - t1 < std::chrono::milliseconds(1000));
    // SIGTERM while a request is held: it gets its 503 at once, and the daemon exits 0
    http_response held;
    std::thread client([&] { held = post(d0.sock, "/v1/completions", {{"prompt", "x"}}); });
    daemon_process d2;
    d2.start(scratch().file("load-wait2.sock"), {}, {"TANDEMD_TEST_LOAD_DELAY_MS=3000"});
    REQUIRE(listening(d2.sock));
    http_response held2;
    std::thread client2([&] { held2 = post(d2.sock, "/v1/completions", {{"prompt", "x"}}); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto t2 = std::chrono::steady_clock::now();
    ::kill(d2.pid, SIGTERM);
    client2.join();
    CHECK(std::chrono::steady_clock::now() - t2 < std::chrono::milliseconds(2000));
    CHECK(held2.status == 503);
    CHECK(held2.j()["error"]["code"] == "shutting_down");
    CHECK(d2.wait_exit(10) == 0);
    client.join();
    CHECK(held.status == 503); // load_wait_s = 0
    CHECK(d.stop() == 0);
    CHECK(d0.stop() == 0);
}

namespace {

// tandemd under `systemd-socket-activate -l SOCK` (started by the first connection), with the
// default KV pool (no kv_pool key); false when systemd-socket-activate is not installed.
bool spawn_activated(daemon_process& d, const std::string& sock, const std::vector<std::string>& env = {}) {
    if (std::system("command -v systemd-socket-activate >/dev/null 2>&1") != 0) return false;
    d.sock = sock;
    d.spawn({"-l", d.sock, binary_dir() + "/daemon/tandemd", "--model", model_path("stories260K.gguf"), "--threads",
             "1", "--log", "warn"},
            env, "systemd-socket-activate");
    for (int i = 0; i < 500 && !std::filesystem::exists(d.sock); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return std::filesystem::exists(d.sock);
}

} // namespace

TEST_CASE("socket activation: the request that starts tandemd gets 200; daemons on two sockets each have their own KV pool") {
    daemon_process a, b;
    if (!spawn_activated(a, scratch().file("activated-a.sock"))) {
        MESSAGE("systemd-socket-activate not installed: skipped");
        return;
    }
    REQUIRE(spawn_activated(b, scratch().file("activated-b.sock")));
    // the first connection starts tandemd (systemd holds it in the backlog until then), and
    // its request is answered, not refused as "still loading"
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}};
    auto ra = post(a.sock, "/v1/completions", body);
    CHECK(ra.status == 200);
    CHECK(ra.j()["choices"][0]["text"] == offline_text("Once upon a time", 8));
    auto rb = post(b.sock, "/v1/completions", body);
    CHECK(rb.status == 200);
    // the same model, the same user, no kv_pool set: two pools, named by socket (and model)
    const json sa = request(a.sock, "GET", "/v1/tandem/status").j(), sb = request(b.sock, "GET", "/v1/tandem/status").j();
    const std::string pa = sa["kv_pool"]["path"], pb = sb["kv_pool"]["path"];
    CHECK(pa != pb);
    CHECK(std::filesystem::path(pa).filename().string().rfind("tandem-kv-", 0) == 0);
    CHECK(std::filesystem::exists(pa));
    CHECK(std::filesystem::exists(pb));
    CHECK(sa["kv_pool"]["bytes"].get<int64_t>() == int64_t(std::filesystem::file_size(pa)));
    CHECK(sa["kv_pool"]["persist"] == false);
    CHECK(a.stop() == 0);
    CHECK(b.stop() == 0);
    // not kept by default: nothing accumulates in /dev/shm
    CHECK_FALSE(std::filesystem::exists(pa));
    CHECK_FALSE(std::filesystem::exists(pb));
}

TEST_CASE("a start that fails after its KV pool was made leaves no pool file, unless kv_pool_persist") {
    // the default pool goes to $RUNTIME_DIRECTORY: a scratch one here
    const std::string rt = scratch().file("failed-start-rt");
    std::filesystem::create_directories(rt);
    auto pools = [&] { // every file but the socket: whatever its name, a pool file is one
        std::vector<std::string> out;
        for (const auto& e : std::filesystem::directory_iterator(rt))
            if (e.is_regular_file()) out.push_back(e.path().string());
        return out;
    };
    auto start_failing = [&](const std::string& model, std::vector<std::string> extra) {
        daemon_process d;
        std::vector<std::string> args = {"--model", model, "--socket", rt + "/tandem.sock", "--threads", "1", "--log",
                                         "off"};
        args.insert(args.end(), extra.begin(), extra.end());
        d.spawn(args, {"RUNTIME_DIRECTORY=" + rt});
        return d.wait_exit(60);
    };
    // no room for the pool: the file is made, then refused
    CHECK(start_failing(model_path("stories260K.gguf"), {"--set", "kv_cache_mb=16000000"}) == 1);
    CHECK(pools().empty());
    // the workers cannot load the weights (a tensor is missing), after the daemon made the pool
    // from the model's header
    std::string bytes;
    {
        std::ifstream in(model_path("stories260K.gguf"), std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    const auto at = bytes.find("output_norm.weight");
    REQUIRE(at != std::string::npos);
    bytes.replace(at, 18, "output_norm.wxyzzy");
    const std::string broken = scratch().file("no-output-norm.gguf");
    std::ofstream(broken, std::ios::binary) << bytes;
    CHECK(start_failing(broken, {}) == 1);
    CHECK(pools().empty());
    // kv_pool_persist keeps it, as asked
    CHECK(start_failing(broken, {"--set", "kv_pool_persist=true"}) == 1);
    CHECK(pools().size() == 1);
}

TEST_CASE("SIGTERM: while the drain lasts /health says stopping and new requests get 503; the running stream finishes") {
    daemon_process d;
    d.start(scratch().file("stopping.sock"));
    REQUIRE(d.wait_ready());
    // a stream longer than the socket buffers hold: unread, it is still running below
    const int fd = connect_unix(d.sock);
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 1000}, {"ignore_eos", true}, {"n", 4},
                       {"temperature", 0}, {"stream", true}};
    send_all(fd, make_request("POST", "/v1/completions", body.dump()));
    pollfd p{fd, POLLIN, 0};
    REQUIRE(::poll(&p, 1, 10000) == 1);
    ::kill(d.pid, SIGTERM);
    http_response h;
    for (int i = 0; i < 200; ++i) { // 200 until the signal is handled
        h = request(d.sock, "GET", "/health");
        if (h.status != 200) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(h.status == 503);
    CHECK(h.j()["status"] == "stopping");
    CHECK(h.headers.count("retry-after") == 1);
    auto c = post(d.sock, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
    CHECK(c.status == 503);
    CHECK(c.j()["error"]["code"] == "shutting_down");
    CHECK(c.headers.count("retry-after") == 1);
    CHECK(request(d.sock, "GET", "/v1/tandem/status").j()["status"] == "stopping");
    check_whole_stream(fd, 3, 1000);
    CHECK(d.wait_exit(30) == 0);
}

TEST_CASE("a bad config or a missing model fails clearly") {
    daemon_process d;
    d.spawn({"--model", model_path("stories260K.gguf"), "--set", "max_running=zero"});
    CHECK(d.wait_exit(10) == 2);
    const std::string conf = scratch().file("bad.conf");
    {
        std::ofstream f(conf);
        f << "# comment\nthreads = 1\nno_such_key = 3\n";
    }
    daemon_process d2;
    d2.spawn({"--config", conf, "--model", model_path("stories260K.gguf")});
    CHECK(d2.wait_exit(10) == 2);
    daemon_process d3;
    d3.spawn({"--model", scratch().file("missing.gguf"), "--socket", scratch().file("missing.sock"), "--log", "off"});
    CHECK(d3.wait_exit(10) == 1);
}

TEST_CASE("many slow clients: past max_connections a 503, idle ones dropped after request_timeout_s; a reader that stops is dropped and its request cancelled") {
    daemon_process d;
    d.start(scratch().file("slow.sock"), {"--set", "max_connections=8", "--set", "request_timeout_s=1"});
    REQUIRE(d.wait_ready());
    auto running = [&] { return metric(request(d.sock, "GET", "/metrics").body, "tandem_requests_running"); };
    // eight clients that connect and send nothing hold every place
    std::vector<int> idle;
    for (int i = 0; i < 8; ++i) idle.push_back(connect_unix(d.sock));
    for (int fd : idle) REQUIRE(fd >= 0);
    const auto full = request(d.sock, "GET", "/health");
    CHECK(full.status == 503);
    CHECK(full.headers.count("retry-after") == 1);
    CHECK(full.j()["error"]["code"] == "too_many_connections");
    // their read deadline frees the places: each sees its connection closed
    for (int fd : idle) {
        CHECK(read_until_eof(fd, 5000).empty());
        ::close(fd);
    }
    CHECK(request(d.sock, "GET", "/health").status == 200);

    // A client that asks for a long stream and stops reading: once the socket's buffer is full
    // (logprobs make every chunk large) the daemon's writes stall, and after request_timeout_s
    // it drops the connection mid-stream instead of holding it (and the stream) for good.
    const int stuck = connect_unix(d.sock);
    REQUIRE(stuck >= 0);
    send_all(stuck, make_request("POST", "/v1/completions",
                                 json{{"prompt", "Once upon a time"}, {"max_tokens", 1500}, {"ignore_eos", true},
                                      {"logprobs", 5}, {"stream", true}}.dump()));
    // others are served meanwhile
    CHECK(post(d.sock, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 3}, {"temperature", 0}}).status == 200);
    std::this_thread::sleep_for(std::chrono::seconds(3)); // not reading, past the deadline
    const auto t_read = std::chrono::steady_clock::now();
    const std::string got = read_until_eof(stuck, 10000); // what the buffer held, then the close
    ::close(stuck);
    CHECK(std::chrono::steady_clock::now() - t_read < std::chrono::seconds(5)); // closed, not timed out
    MESSAGE(got.size(), " bytes reached the client before it was dropped");
    CHECK(got.size() > 10000);
    CHECK(got.find("[DONE]") == std::string::npos); // cut, not finished
    CHECK(running() == 0);
    CHECK(request(d.sock, "GET", "/v1/tandem/status").j()["kv_pages_used"] == 0);
    CHECK(d.stop() == 0);
}

TEST_CASE("limits: over capacity is 429 with Retry-After; socket mode; TCP listener; peers that are not allowed get 403") {
    CHECK((std::filesystem::status(shared_socket()).permissions() & std::filesystem::perms::all) ==
          std::filesystem::perms(0660));

    const int port = 20000 + int(::getpid() % 20000);
    const public_scratch_dir reachable("limits"); // the 403 check connects as another user
    daemon_process d;
    d.start(reachable.file("limits.sock"), {"--set", "max_running=1", "--set", "max_waiting=0", "--set",
                                            "socket_mode=0666", "--listen-tcp", "127.0.0.1:" + std::to_string(port)});
    REQUIRE(d.wait_ready());

    // the optional loopback TCP listener serves the same API
    {
        const int t = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in in{};
        in.sin_family = AF_INET;
        in.sin_port = htons(uint16_t(port));
        in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::connect(t, reinterpret_cast<sockaddr*>(&in), sizeof in) == 0);
        std::string health = make_request("GET", "/health", "");
        health.replace(health.find("Host: tandem"), 12, "Host: 127.0.0.1:" + std::to_string(port));
        send_all(t, health);
        CHECK(parse_response(read_until_eof(t, 5000)).status == 200);
        ::close(t);
    }
    CHECK((std::filesystem::status(d.sock).permissions() & std::filesystem::perms::all) == std::filesystem::perms(0666));

    // one long request holds the only batch slot
    const int fd = connect_unix(d.sock);
    send_all(fd, make_request("POST", "/v1/completions",
                              json{{"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"ignore_eos", true},
                                   {"stream", true}}.dump()));
    for (int i = 0; i < 500 && metric(request(d.sock, "GET", "/metrics").body, "tandem_requests_running") != 1; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto busy = post(d.sock, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
    CHECK(busy.status == 429);
    CHECK(busy.headers.count("retry-after") == 1);
    CHECK(busy.j()["error"]["code"] == "server_busy");
    ::close(fd);
    for (int i = 0; i < 500 && metric(request(d.sock, "GET", "/metrics").body, "tandem_requests_running") != 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(post(d.sock, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}}).status == 200);

    // SO_PEERCRED: a user that is neither root, the daemon's user, nor allowed gets 403
    if (::geteuid() == 0) {
        const pid_t child = ::fork();
        if (child == 0) {
            if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
            const int c = connect_unix(d.sock);
            if (c < 0) ::_exit(4);
            send_all(c, make_request("GET", "/health", ""));
            const auto r = parse_response(read_until_eof(c, 5000));
            ::_exit(r.status == 403 ? 0 : 1);
        }
        int st = 0;
        ::waitpid(child, &st, 0);
        CHECK(WIFEXITED(st));
        CHECK(WEXITSTATUS(st) == 0);
    } else {
        MESSAGE("not root: the 403 check for another user is skipped");
    }
    CHECK(d.stop() == 0);
}

