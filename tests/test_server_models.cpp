// Several models in one tandemd, and upstreams (issue 46): two models serving interleaved
// requests, an idle unload and a reload, the memory budget forcing an eviction, a request for a
// model that is not there; a second tandemd on a TCP port as the upstream, a stream and a
// cancel forwarded, and overflow taking over when the local queue is full.
#include "daemon_client.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <fstream>
#include <mutex>

using namespace tandem::test;

namespace {

scratch_dir& scratch() {
    static scratch_dir d("models");
    return d;
}


std::string tiny() { return model_path("TinyStories-656K-Q8_0.gguf"); }

// A daemon from a config file's text (its socket and KV pool in the scratch directory).
void start_with(daemon_process& d, const std::string& name, const std::string& conf,
                const std::vector<std::string>& env = {}) {
    d.sock = scratch().file(name + ".sock");
    const std::string path = scratch().file(name + ".conf");
    std::ofstream(path) << "socket = " << d.sock << "\nkv_pool = " << d.sock << ".kv\nthreads = 1\nlog_level = warn\n"
                        << conf;
    d.spawn({"--config", path}, env);
}

json completion(const std::string& sock, const std::string& model, const std::string& prompt, int n = 8) {
    json body = {{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}};
    if (!model.empty()) body["model"] = model; // (none: the default)
    const auto r = post(sock, "/v1/completions", body);
    REQUIRE(r.status == 200);
    return r.j();
}

json model_status(const std::string& sock, const std::string& id) {
    const json st = request(sock, "GET", "/v1/tandem/status").j();
    for (const json& m : st["models"]["models"])
        if (m["id"] == id) return m;
    return json();
}

// Polls until the model is in `state` (or a few seconds passed).
bool wait_state(const std::string& sock, const std::string& id, const std::string& state, double seconds = 8) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
        if (model_status(sock, id)["state"] == state) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
}

// Sends a request and reads until its first SSE event arrived (tokens are flowing); the fd.
int stream_started(const std::string& sock, const std::string& target, const json& body) {
    const int fd = connect_unix(sock);
    REQUIRE(fd >= 0);
    send_all(fd, make_request("POST", target, body.dump()));
    std::string got;
    char buf[4096];
    while (got.find("data: ") == std::string::npos) {
        pollfd p{fd, POLLIN, 0};
        REQUIRE(::poll(&p, 1, 10000) == 1);
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        REQUIRE(n > 0);
        got.append(buf, size_t(n));
    }
    return fd;
}

} // namespace

TEST_CASE("two models in one daemon: interleaved requests, 404 naming the models, idle unload and reload") {
    daemon_process d;
    start_with(d, "two",
               "model = " + model_path("stories260K.gguf") + "\n[model tiny]\npath = " + tiny() +
                   "\nn_ctx = 256\nkeep_alive = 1\nkv_pool_persist = true\n");
    REQUIRE(d.wait_ready());
    // the default is loaded at start; the other is listed, not loaded
    json models = request(d.sock, "GET", "/v1/models").j()["data"];
    REQUIRE(models.size() == 2);
    CHECK(models[0]["id"] == "stories260K");
    CHECK(models[0]["loaded"] == true);
    CHECK(models[0]["memory_bytes"].get<int64_t>() > 0);
    CHECK(models[1]["id"] == "tiny");
    CHECK(models[1]["loaded"] == false);

    // a model not there: 404 model_not_found naming what there is
    auto nf = post(d.sock, "/v1/chat/completions", {{"model", "nope"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}});
    CHECK(nf.status == 404);
    CHECK(nf.j()["error"]["code"] == "model_not_found");
    const std::string msg = nf.j()["error"]["message"];
    CHECK(msg.find("stories260K") != std::string::npos);
    CHECK(msg.find("tiny") != std::string::npos);
    CHECK(post(d.sock, "/api/chat", {{"model", "nope"}, {"messages", json::array()}}).status == 404);

    // the first request for tiny loads it (and waits); each model answers as itself
    const std::string want_tiny = completion(d.sock, "tiny", "Once upon a time")["choices"][0]["text"];
    const std::string want_default = completion(d.sock, "stories260K", "Once upon a time")["choices"][0]["text"];
    CHECK(want_tiny != want_default);
    CHECK(model_status(d.sock, "tiny")["state"] == "loaded");

    // interleaved: four clients, each alternating the two models (Ollama's name for one)
    std::mutex mu;
    std::vector<std::string> wrong;
    std::vector<std::thread> clients;
    for (int c = 0; c < 4; ++c)
        clients.emplace_back([&, c] {
            for (int i = 0; i < 4; ++i) {
                const bool tiny = (c + i) % 2 == 0;
                const std::string name = tiny ? "tiny" : "stories260K:latest";
                const auto r = post(d.sock, "/v1/completions",
                                    {{"model", name}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}});
                const std::string text = r.status == 200 ? r.j()["choices"][0]["text"].get<std::string>() : "";
                if (text != (tiny ? want_tiny : want_default)) {
                    std::lock_guard lock(mu);
                    wrong.push_back(name + ": " + std::to_string(r.status) + " " + r.body);
                }
            }
        });
    for (auto& t : clients) t.join();
    CHECK(wrong.empty());
    if (!wrong.empty()) MESSAGE(wrong.front());
    const std::string metrics = request(d.sock, "GET", "/metrics").body;
    CHECK(metric(metrics, "tandem_model_loaded{model=\"tiny\"}") == 1);
    CHECK(metric(metrics, "tandem_model_loaded{model=\"stories260K\"}") == 1);

    // idle for its keep_alive (1 s): unloaded; the default stays; the next request loads it
    // again, its prefix cache kept in its pool file (kv_pool_persist)
    const std::string story = "Once upon a time there was a little girl named Lily. She loved to play outside in the park with her friends every day after school.";
    completion(d.sock, "tiny", story, 2);
    CHECK(wait_state(d.sock, "tiny", "unloaded"));
    CHECK(model_status(d.sock, "stories260K")["state"] == "loaded");
    CHECK(completion(d.sock, "tiny", story, 2)["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16);
    CHECK(completion(d.sock, "tiny", "Once upon a time")["choices"][0]["text"] == want_tiny);
    CHECK(model_status(d.sock, "tiny")["loads"] >= 2); // (more if it went idle in between)

    // Ollama's keep_alive 0: unloaded as soon as the request ends
    const auto og = post(d.sock, "/api/generate",
                         {{"model", "tiny"}, {"prompt", "Once"}, {"stream", false}, {"keep_alive", 0}, {"options", {{"num_predict", 2}}}});
    CHECK(og.status == 200);
    CHECK(wait_state(d.sock, "tiny", "unloaded", 3));

    // the routes for programs that manage models themselves
    const auto ld = post(d.sock, "/v1/tandem/models/tiny/load", json::object());
    CHECK(ld.status == 200);
    CHECK(ld.j()["loaded"] == true);
    CHECK(post(d.sock, "/v1/tandem/models/tiny/unload", json::object()).status == 200);
    CHECK(wait_state(d.sock, "tiny", "unloaded", 3));
    CHECK(post(d.sock, "/v1/tandem/models/nope/load", json::object()).status == 404);
    CHECK(d.stop() == 0);
}

TEST_CASE("the memory budget: loading one model evicts the least recently used idle one") {
    daemon_process d;
    // stories260K with its 2048-page pool is about 23 MiB, tiny with n_ctx 256 about 5: not both in 26
    start_with(d, "budget",
               "model = " + model_path("stories260K.gguf") + "\nmemory_budget_mb = 26\n[model tiny]\npath = " +
                   tiny() + "\nn_ctx = 256\n");
    REQUIRE(d.wait_ready());
    const std::string want_default = completion(d.sock, "", "Once upon a time")["choices"][0]["text"];
    completion(d.sock, "tiny", "Once upon a time");
    CHECK(wait_state(d.sock, "stories260K", "unloaded"));
    CHECK(model_status(d.sock, "tiny")["state"] == "loaded");
    // and back: the default comes in again (the same text), tiny goes
    CHECK(completion(d.sock, "stories260K", "Once upon a time")["choices"][0]["text"] == want_default);
    CHECK(wait_state(d.sock, "tiny", "unloaded"));
    CHECK(model_status(d.sock, "stories260K")["loads"] == 2);
    CHECK(model_status(d.sock, "tiny")["unloads"] == 1);
    const json st = request(d.sock, "GET", "/v1/tandem/status").j()["models"];
    CHECK(st["memory_bytes"].get<int64_t>() <= int64_t(26) << 20);
    CHECK(d.stop() == 0);
}

TEST_CASE("a model busy with requests is never evicted; a load longer than load_wait_s is a 503 with Retry-After") {
    daemon_process d;
    start_with(d, "busy",
               "model = " + model_path("stories260K.gguf") + "\nmodels_max = 1\nload_wait_s = 0.5\n[model tiny]\npath = " +
                   tiny() + "\nn_ctx = 256\n",
               {"TANDEMD_TEST_LOAD_DELAY_MS=1000"}); // every load takes a second more
    REQUIRE(d.wait_ready());
    // the default streams to a client that reads nothing: its reply fills the socket, so the
    // request holds the model however fast the tokens come; no room for tiny (models_max 1)
    const int busy = connect_unix(d.sock);
    REQUIRE(busy >= 0);
    send_all(busy, make_request("POST", "/v1/completions",
                                json{{"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"ignore_eos", true}, {"n", 8},
                                     {"temperature", 0}, {"stream", true}}.dump()));
    for (int i = 0; i < 500 && model_status(d.sock, "stories260K")["requests_active"] != 1; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE(model_status(d.sock, "stories260K")["requests_active"] == 1);
    auto r = post(d.sock, "/v1/completions", {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 2}});
    CHECK(r.status == 503);
    CHECK(r.j()["error"]["code"] == "model_loading");
    CHECK(r.headers.count("retry-after") == 1);
    CHECK(model_status(d.sock, "stories260K")["state"] == "loaded");
    CHECK(model_status(d.sock, "tiny")["state"] == "unloaded");
    ::close(busy);
    for (int i = 0; i < 300 && model_status(d.sock, "stories260K")["requests_active"] != 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    // now the default goes, and tiny loads, but for longer than the request waits: 503 again
    r = post(d.sock, "/v1/completions", {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 2}});
    CHECK(r.status == 503);
    CHECK(r.headers.count("retry-after") == 1);
    // the load goes on; once it is in, tiny answers, and the default is out
    CHECK(wait_state(d.sock, "tiny", "loaded"));
    CHECK(post(d.sock, "/v1/completions", {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 2}}).status == 200);
    CHECK(model_status(d.sock, "stories260K")["state"] == "unloaded");
    CHECK(d.stop() == 0);
}

TEST_CASE("an upstream: a second tandemd on TCP serves forwarded requests, streams, cancels and overflow") {
    const int port = free_port();
    daemon_process up; // the "cluster": serves `remote` and `local` (the name overflow forwards)
    start_with(up, "upstream",
               "model = remote\nlisten_tcp = 127.0.0.1:" + std::to_string(port) + "\n[model remote]\npath = " +
                   model_path("stories260K.gguf") + "\n[model local]\npath = " + tiny() +
                   "\nn_ctx = 256\n");
    REQUIRE(up.wait_ready());
    const std::string key = scratch().file("up.key");
    std::ofstream(key) << "not-checked-by-a-loopback-listener\n";
    daemon_process d;
    start_with(d, "edge",
               "model = local\n[model local]\npath = " + model_path("stories260K.gguf") +
                   "\nmax_running = 4\nmax_waiting = 0\noverflow = cluster\n[upstream cluster]\nbase_url = http://127.0.0.1:" +
                   std::to_string(port) + "/v1\napi_key_file = " + key + "\nmodels = remote\ntimeout_s = 20\n");
    REQUIRE(d.wait_ready());
    const json listed = request(d.sock, "GET", "/v1/models").j()["data"];
    REQUIRE(listed.size() == 2);
    CHECK(listed[1]["id"] == "remote");
    CHECK(listed[1]["upstream"] == "cluster");

    // forwarded whole: the upstream's own answer
    const json direct = completion(up.sock, "remote", "Once upon a time");
    const json via = completion(d.sock, "remote", "Once upon a time");
    CHECK(via["model"] == "remote");
    CHECK(via["choices"][0]["text"] == direct["choices"][0]["text"]);

    // a stream passed through, event by event
    const json chat = {{"model", "remote"}, {"messages", {{{"role", "user"}, {"content", "Tell me a story"}}}},
                       {"max_tokens", 12}, {"temperature", 0}, {"stream", true}};
    const auto s1 = post(up.sock, "/v1/chat/completions", chat), s2 = post(d.sock, "/v1/chat/completions", chat);
    CHECK(s2.status == 200);
    CHECK(s2.headers.at("content-type").find("text/event-stream") == 0);
    bool done = false, ok = false;
    const auto ev = sse_events(s2.body, &done, &ok);
    CHECK(done);
    CHECK(ok);
    std::string t1, t2;
    for (const json& e : sse_events(s1.body)) t1 += e["choices"][0]["delta"].value("content", "");
    for (const json& e : ev) t2 += e["choices"][0]["delta"].value("content", "");
    CHECK(!t2.empty());
    CHECK(t1 == t2);

    // what an upstream cannot do is a 400 by name; errors come back mapped
    auto g = post(d.sock, "/v1/chat/completions",
                  {{"model", "remote"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"documents", json::array()}});
    CHECK(g.status == 400);
    CHECK(g.j()["error"]["param"] == "documents");
    CHECK(post(d.sock, "/v1/messages", {{"model", "remote"}, {"max_tokens", 4}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}})
              .status == 400);
    CHECK(post(d.sock, "/v1/completions", {{"model", "remote"}, {"prompt", "x"}, {"max_tokens", 999999}}).status == 400);

    // a client that hangs up cancels the forwarded request upstream
    const auto cancelled = [&] {
        return std::max(0.0, metric(request(up.sock, "GET", "/metrics").body,
                                    "tandem_generations_finished_total{reason=\"cancelled\"}"));
    };
    const double c0 = cancelled();
    const int fd = stream_started(d.sock, "/v1/completions",
                                  {{"model", "remote"}, {"prompt", "Once upon a time"}, {"max_tokens", 2000},
                                   {"ignore_eos", true}, {"n", 4}, {"temperature", 0}, {"stream", true}});
    ::close(fd);
    for (int i = 0; i < 500 && cancelled() < c0 + 4; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(cancelled() == c0 + 4);

    // overflow: with the local model's four sequences running and no room to wait, the next
    // request goes to the upstream (whose `local` is another model: its text tells)
    const std::string upstream_local = completion(up.sock, "local", "Once upon a time")["choices"][0]["text"];
    const std::string here = completion(d.sock, "local", "Once upon a time")["choices"][0]["text"];
    CHECK(upstream_local != here);
    const int busy = stream_started(d.sock, "/v1/completions",
                                    {{"model", "local"}, {"prompt", "Once upon a time"}, {"max_tokens", 2000},
                                     {"ignore_eos", true}, {"n", 4}, {"temperature", 0}, {"stream", true}});
    // (its first event can come before all four sequences are admitted)
    for (int i = 0; i < 500 && model_status(d.sock, "local")["running"] != 4; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE(model_status(d.sock, "local")["running"] == 4);
    const json over = completion(d.sock, "local", "Once upon a time");
    CHECK(over["choices"][0]["text"] == upstream_local);
    const std::string em = request(d.sock, "GET", "/metrics").body;
    CHECK(metric(em, "tandem_upstream_requests_total{upstream=\"cluster\",overflow=\"true\"}") == 1);
    CHECK(metric(em, "tandem_upstream_requests_total{upstream=\"cluster\",overflow=\"false\"}") >= 3);
    ::close(busy);
    // and once the local queue has room again, it is served here
    for (int i = 0; i < 200 && model_status(d.sock, "local")["running"] != 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(completion(d.sock, "local", "Once upon a time")["choices"][0]["text"] == here);

    // the upstream gone: 502 naming it
    CHECK(up.stop() == 0);
    const auto gone = post(d.sock, "/v1/completions", {{"model", "remote"}, {"prompt", "x"}, {"max_tokens", 2}});
    CHECK(gone.status == 502);
    CHECK(gone.j()["error"]["code"] == "upstream_unreachable");
    CHECK(d.stop() == 0);
}

TEST_CASE("an upstream that does not answer: 504 upstream_timeout after its timeout_s") {
    // a listener that never accepts: the connection is made (the kernel's backlog), no byte comes
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in in{};
    in.sin_family = AF_INET;
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&in), sizeof in) == 0);
    REQUIRE(::listen(s, 8) == 0);
    socklen_t len = sizeof in;
    ::getsockname(s, reinterpret_cast<sockaddr*>(&in), &len);
    daemon_process d;
    start_with(d, "silent",
               "model = " + model_path("stories260K.gguf") + "\n[upstream mute]\nbase_url = http://127.0.0.1:" +
                   std::to_string(ntohs(in.sin_port)) + "\nmodels = quiet\ntimeout_s = 1\n");
    REQUIRE(d.wait_ready());
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = post(d.sock, "/v1/chat/completions",
                        {{"model", "quiet"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"stream", true}});
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(r.status == 504);
    CHECK(r.j()["error"]["code"] == "upstream_timeout");
    CHECK(waited >= 0.9);
    CHECK(waited < 10);
    CHECK(d.stop() == 0);
    ::close(s);
}
