// The `tandem` binary as the daemon's client, against a fake daemon: requests, streaming, exit codes.
#include "fake_daemon.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>

#include <sys/wait.h>

using namespace tandem;
using json = nlohmann::json;
using test::fake_daemon;

namespace {

using result = test::run_result;
using test::run_tandem;

// Runs a shell command line on a pseudo-terminal (script(1)); out is what the terminal showed.
result run_tandem_in_pty(const std::string& command_line) {
    static test::scratch_dir dir("cli-client-pty");
    const std::string out = dir.file("out");
    const std::string cmd = "script -qec " + test::shell_quote(command_line) + " /dev/null </dev/null >" + test::shell_quote(out) + " 2>&1";
    const int st = std::system(cmd.c_str());
    result r;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = test::read_text(out);
    return r;
}

std::string chat_chunk(const std::string& text) {
    return json{{"object", "chat.completion.chunk"}, {"choices", {{{"index", 0}, {"delta", {{"content", text}}}}}}}.dump();
}

std::string completion_chunk(const std::string& text) {
    return json{{"object", "text_completion"}, {"choices", {{{"index", 0}, {"text", text}}}}}.dump();
}

// A daemon that streams "Once upon a time." in pieces for both endpoints.
void serve_story(fake_daemon& d) {
    d.route("POST /v1/chat/completions", [](const test::fake::request& r, test::fake::socket& s) {
        if (!json::parse(r.body).value("stream", false)) {
            test::fake::reply_json(s, 200, json{{"object", "chat.completion"},
                                                {"choices", {{{"index", 0}, {"message", {{"role", "assistant"}, {"content", "Whole."}}}}}}}
                                                   .dump());
            return;
        }
        test::fake::reply_sse(s,
                              {json{{"choices", {{{"index", 0}, {"delta", {{"role", "assistant"}}}}}}}.dump(),
                               chat_chunk("Once"), chat_chunk(" upon"), chat_chunk(" a time."),
                               json{{"choices", json::array()}, {"usage", {{"prompt_tokens", 5}, {"completion_tokens", 4}}}}.dump(),
                               "[DONE]"},
                              true);
    });
    d.route("POST /v1/completions", [](const test::fake::request&, test::fake::socket& s) {
        test::fake::reply_sse(s, {completion_chunk(" there"), completion_chunk(" was"), "[DONE]"}, false);
    });
}

} // namespace

TEST_CASE("tandem \"prompt\": a streamed chat turn; the request carries the flags") {
    test::scratch_dir dir("cli-client");
    fake_daemon d(dir.file("d.sock"));
    serve_story(d);
    auto r = run_tandem({"--socket", d.path(), "--temp", "0.5", "--top-p", "0.9", "--top-k", "20", "--seed", "3",
                         "-n", "7", "--stop", "END", "--stop", "\\n\\n", "--stop", "a\\tb\\\\n\\q", "--system",
                         "Be brief.", "Tell", "me", "a", "story"});
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK(r.out == "Once upon a time.\n");
    CHECK(r.err.empty()); // no spinner and no colour without a terminal
    const auto reqs = d.requests();
    REQUIRE(reqs.size() == 1);
    CHECK(reqs[0].target == "/v1/chat/completions");
    CHECK(reqs[0].content_type == "application/json");
    const json j = json::parse(reqs[0].body);
    CHECK(j["messages"] == json::array({{{"role", "system"}, {"content", "Be brief."}},
                                        {{"role", "user"}, {"content", "Tell me a story"}}}));
    CHECK(j["stream"] == true);
    CHECK(j["stream_options"]["include_usage"] == true);
    CHECK(j["temperature"] == 0.5);
    CHECK(j["top_p"] == 0.9);
    CHECK(j["top_k"] == 20);
    CHECK(j["seed"] == 3);
    CHECK(j["max_tokens"] == 7);
    CHECK(j["stop"] == json::array({"END", "\n\n", "a\tb\\n\\q"})); // --stop's escapes, others kept
    CHECK_FALSE(j.contains("model")); // the daemon's own model unless --model
}

TEST_CASE("tandem --raw: a completion; the prompt from stdin; $TANDEM_SOCKET") {
    test::scratch_dir dir("cli-client-raw");
    fake_daemon d(dir.file("d.sock"));
    serve_story(d);
    auto r = run_tandem({"--raw"}, "Once upon a time", "TANDEM_SOCKET=" + test::shell_quote(d.path()));
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK(r.out == " there was\n");
    const auto reqs = d.requests();
    REQUIRE(reqs.size() == 1);
    CHECK(reqs[0].target == "/v1/completions");
    const json j = json::parse(reqs[0].body);
    CHECK(j["prompt"] == "Once upon a time");
    CHECK_FALSE(j.contains("temperature")); // the daemon's defaults unless given
    CHECK_FALSE(j.contains("messages"));
}

TEST_CASE("tandem --json: one non-streamed request, the response printed as it is") {
    test::scratch_dir dir("cli-client-json");
    fake_daemon d(dir.file("d.sock"));
    serve_story(d);
    auto r = run_tandem({"--socket", d.path(), "--json", "--model", "m1", "hi"});
    CHECK(r.rc == 0);
    CHECK(json::parse(r.out)["choices"][0]["message"]["content"] == "Whole.");
    const json j = json::parse(d.requests().at(0).body);
    CHECK(j["stream"] == false);
    CHECK(j["model"] == "m1");
}

TEST_CASE("no daemon: exit 3 and how to start one on that socket") {
    test::scratch_dir dir("cli-client-none");
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"--socket", dir.file("none.sock"), "hello"},
          std::vector<std::string>{"status", "--socket", dir.file("none.sock")},
          std::vector<std::string>{"status", "--watch", "--socket", dir.file("none.sock")},
          std::vector<std::string>{"chat", "--socket", dir.file("none.sock")}}) {
        auto r = run_tandem(args, "hi\n");
        INFO(args[0], ": ", r.err);
        CHECK(r.rc == 3);
        CHECK(r.err.find("no daemon is listening on " + dir.file("none.sock")) != std::string::npos);
        // No service listens on a socket given by --socket: start one there by hand.
        CHECK(r.err.find("systemctl") == std::string::npos);
        CHECK(r.err.find("tandemd --model PATH --socket " + dir.file("none.sock")) != std::string::npos);
    }
    // The default socket of a user session is the user unit's: that one is worth starting.
    if (std::filesystem::exists("/run/tandem/tandem.sock")) {
        MESSAGE("skipped: a system tandemd's socket is here, the default socket is not the user's");
        return;
    }
    auto u = run_tandem({"hello"}, "", "env -u TANDEM_SOCKET XDG_RUNTIME_DIR=" + test::shell_quote(dir.path.string()));
    INFO(u.err);
    CHECK(u.rc == 3);
    CHECK(u.err.find("no daemon is listening on " + dir.file("tandem/tandem.sock")) != std::string::npos);
    CHECK(u.err.find("systemctl --user start tandemd") != std::string::npos);
    CHECK(u.err.find("tandemd --model PATH\n") != std::string::npos); // its own default socket: no --socket
}

TEST_CASE("errors from the daemon: 4 rejected, 5 busy, 1 for a broken stream; 2 for usage") {
    test::scratch_dir dir("cli-client-err");
    fake_daemon d(dir.file("d.sock"));
    d.route("POST /v1/chat/completions", [](const auto&, auto& s) {
        test::fake::reply_json(s, 400, R"({"error":{"message":"max_tokens must be positive","type":"invalid_request_error"}})");
    });
    auto bad = run_tandem({"--socket", d.path(), "hi"});
    CHECK(bad.rc == 4);
    CHECK(bad.err.find("HTTP 400") != std::string::npos);
    CHECK(bad.err.find("max_tokens must be positive") != std::string::npos);

    d.route("POST /v1/chat/completions", [](const auto&, auto& s) {
        test::fake::reply_json(s, 503, R"({"error":{"message":"model is loading"}})", "Retry-After: 2\r\n");
    });
    auto busy = run_tandem({"--socket", d.path(), "--wait", "0", "hi"}); // no waiting for it
    CHECK(busy.rc == 5);
    CHECK(busy.err.find("model is loading") != std::string::npos);
    CHECK(busy.err.find("retry after 2 s") != std::string::npos);

    // 401/403: this user may not use the daemon, as with a socket it may not open (README: 3).
    d.route("POST /v1/chat/completions", [](const auto&, auto& s) {
        test::fake::reply_json(s, 403, R"({"error":{"message":"this user is not allowed to use tandemd"}})");
    });
    auto denied = run_tandem({"--socket", d.path(), "hi"});
    CHECK(denied.rc == 3);
    CHECK(denied.err.find("does not let this user in (HTTP 403): this user is not allowed") != std::string::npos);

    d.route("POST /v1/chat/completions", [](const auto&, auto& s) {
        test::fake::reply_sse(s, {chat_chunk("par"), R"({"error":{"message":"engine failed"}})"}, true);
    });
    auto broken = run_tandem({"--socket", d.path(), "hi"});
    CHECK(broken.rc == 1);
    CHECK(broken.out == "par\n");
    CHECK(broken.err.find("engine failed") != std::string::npos);

    d.route("POST /v1/chat/completions", [](const auto&, auto& s) { test::fake::reply_sse(s, {chat_chunk("cut")}, false); });
    auto cut = run_tandem({"--socket", d.path(), "hi"});
    CHECK(cut.rc == 1);
    CHECK(cut.err.find("ended the stream early") != std::string::npos);

    CHECK(run_tandem({"--socket", d.path()}).rc == 2);                                 // no prompt at all
    CHECK(run_tandem({"--socket", d.path(), "--raw", "--system", "x", "hi"}).rc == 2); // system needs chat
    CHECK(run_tandem({"--socket", d.path(), "--raw", "--chat", "hi"}).rc == 2);
    CHECK(run_tandem({"--socket", d.path(), "--temp", "abc", "hi"}).rc == 2);
}

TEST_CASE("tandem chat: history, /system, /reset, /help, /quit") {
    test::scratch_dir dir("cli-client-chat");
    fake_daemon d(dir.file("d.sock"));
    int turn = 0;
    d.route("POST /v1/chat/completions", [&](const auto&, auto& s) {
        ++turn;
        test::fake::reply_sse(s, {chat_chunk("reply " + std::to_string(turn)), "[DONE]"}, true);
    });
    auto r = run_tandem({"chat", "--socket", d.path(), "--temp", "0"},
                        "Hi\n/help\nAnd?\n/system Be kind.\nThird\n/reset\nFresh\n/bogus\n/quit\nnever sent\n");
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK(r.out.find("reply 1\n") != std::string::npos);
    CHECK(r.out.find("reply 4\n") != std::string::npos);
    // /help and /reset say the same: the conversation goes, the system prompt stays (as sent below).
    CHECK(r.out.find("/reset forgets the conversation but keeps the system prompt") != std::string::npos);
    CHECK(r.out.find("(conversation forgotten; the system prompt stays") != std::string::npos);
    CHECK(r.out.find("unknown command /bogus") != std::string::npos);
    const auto reqs = d.requests();
    REQUIRE(reqs.size() == 4);
    auto msgs = [&](size_t i) { return json::parse(reqs[i].body)["messages"]; };
    auto m = [](const char* role, const char* content) { return json{{"role", role}, {"content", content}}; };
    CHECK(msgs(0) == json::array({m("user", "Hi")}));
    CHECK(msgs(1) == json::array({m("user", "Hi"), m("assistant", "reply 1"), m("user", "And?")}));
    CHECK(msgs(2) == json::array({m("system", "Be kind."), m("user", "Hi"), m("assistant", "reply 1"), m("user", "And?"),
                                  m("assistant", "reply 2"), m("user", "Third")}));
    CHECK(msgs(3) == json::array({m("system", "Be kind."), m("user", "Fresh")}));
    CHECK(json::parse(reqs[0].body)["temperature"] == 0);

    // A failed turn leaves no trace in the history, and the chat goes on.
    fake_daemon e(dir.file("e.sock"));
    int n = 0;
    e.route("POST /v1/chat/completions", [&](const auto&, auto& s) {
        if (++n == 1)
            test::fake::reply_json(s, 400, R"({"error":{"message":"too long"}})");
        else
            test::fake::reply_sse(s, {chat_chunk("ok"), "[DONE]"}, true);
    });
    auto f = run_tandem({"chat", "--socket", e.path()}, "first\nsecond\n");
    CHECK(f.rc == 0);
    CHECK(f.err.find("too long") != std::string::npos);
    CHECK(json::parse(e.requests().at(1).body)["messages"] == json::array({m("user", "second")}));
}

// The metrics of a daemon that has served 15 requests (tandemd's exposition, TYPE lines and all).
const char* const status_metrics =
    "# HELP tandem_requests_total Requests served.\n# TYPE tandem_requests_total counter\n"
    "tandem_requests_total{route=\"chat\",status=\"200\"} 10\ntandem_requests_total{route=\"completions\",status=\"200\"} 5\n"
    "# TYPE tandem_requests_running gauge\ntandem_requests_running 2\ntandem_requests_waiting 1\n"
    "tandem_prompt_tokens_total 300\ntandem_generation_tokens_total 1200\n"
    "# TYPE tandem_time_to_first_token_seconds histogram\n"
    "tandem_time_to_first_token_seconds_bucket{le=\"0.05\"} 5\n"
    "tandem_time_to_first_token_seconds_bucket{le=\"0.1\"} 15\n"
    "tandem_time_to_first_token_seconds_bucket{le=\"+Inf\"} 15\n"
    "tandem_time_to_first_token_seconds_sum 0.75\ntandem_time_to_first_token_seconds_count 15\n"
    // no TYPE line: a histogram all the same, by its _bucket{le} series
    "tandem_inter_token_latency_seconds_bucket{le=\"0.001\"} 0\n"
    "tandem_inter_token_latency_seconds_bucket{le=\"0.01\"} 1200\n"
    "tandem_inter_token_latency_seconds_bucket{le=\"+Inf\"} 1200\n"
    "tandem_inter_token_latency_seconds_sum 6\ntandem_inter_token_latency_seconds_count 1200\n"
    "tandem_kv_pages_used 64\ntandem_kv_pages_total 256\ntandem_kv_pages_cached 10\ntandem_prefix_cache_hits_total 112\n"
    "tandem_kv_device_upload_bytes_total 1048576\ntandem_kv_device_kept_bytes_total 52428800\n";

TEST_CASE("tandem status: model, placement, load and a metrics summary") {
    test::scratch_dir dir("cli-client-status");
    fake_daemon d(dir.file("d.sock"));
    d.route("GET /health", [](const auto&, auto& s) {
        test::fake::reply_json(s, 200, R"({"status":"ok","placement":{"prefill":"gpu","decode":"cpu"}})");
    });
    d.route("GET /v1/models", [](const auto&, auto& s) {
        test::fake::reply_json(s, 200, R"({"object":"list","data":[{"id":"stories260K","object":"model","owned_by":"tandem"}]})");
    });
    d.route("GET /metrics", [](const auto&, auto& s) { test::fake::reply(s, 200, "text/plain; version=0.0.4", status_metrics); });
    auto r = run_tandem({"status", "--socket", d.path()});
    INFO(r.out);
    CHECK(r.rc == 0);
    CHECK(r.out.find("tandemd on " + d.path()) != std::string::npos);
    CHECK(r.out.find("ok (HTTP 200)") != std::string::npos);
    CHECK(r.out.find("stories260K") != std::string::npos);
    CHECK(r.out.find("prefill=gpu decode=cpu") != std::string::npos);
    CHECK(r.out.find("2 running, 1 waiting, 15 served") != std::string::npos);
    CHECK(r.out.find("300 prompt, 1200 generated") != std::string::npos);
    // Percentiles from the buckets (p50: 7.5 of 15 lies a quarter into (0.05, 0.1]), the mean exact.
    CHECK(r.out.find("first token  p50 62.5 ms, p99 99.2 ms, mean 50.0 ms (15)") != std::string::npos);
    CHECK(r.out.find("per token    p50 5.5 ms, p99 9.9 ms, mean 5.0 ms (1200)") != std::string::npos);
    CHECK(r.out.find("64/256 pages used (25%), 10 cached") != std::string::npos);
    CHECK(r.out.find("prefix hits  112 tokens") != std::string::npos);
    CHECK(r.out.find("1.0 MiB uploaded, 50.0 MiB kept on the device") != std::string::npos);
    CHECK(r.out.find("\033[") == std::string::npos); // no colour into a file

    auto j = run_tandem({"status", "--socket", d.path(), "--json"});
    CHECK(j.rc == 0);
    const json s = json::parse(j.out);
    CHECK(s["ready"] == true);
    CHECK(s["models"]["data"][0]["id"] == "stories260K");
    CHECK(s["health"]["placement"]["prefill"] == "gpu");
    const json& m = s["metrics"];
    CHECK(m["tandem_prompt_tokens_total"] == 300);
    // Labelled counters stay one number per label set.
    CHECK(m["tandem_requests_total"] ==
          json::array({{{"labels", {{"route", "chat"}, {"status", "200"}}}, {"value", 10}},
                       {{"labels", {{"route", "completions"}, {"status", "200"}}}, {"value", 5}}}));
    // A histogram is summarised, not its buckets summed across `le`.
    const json& ttft = m["tandem_time_to_first_token_seconds"];
    CHECK(ttft["count"] == 15);
    CHECK(ttft["sum"] == 0.75);
    CHECK(ttft["mean"].get<double>() == doctest::Approx(0.05));
    CHECK(ttft["p50"].get<double>() == doctest::Approx(0.0625));
    CHECK(ttft["p99"].get<double>() == doctest::Approx(0.09925));
    CHECK(m["tandem_inter_token_latency_seconds"]["p50"].get<double>() == doctest::Approx(0.0055));
    CHECK_FALSE(m.contains("tandem_time_to_first_token_seconds_bucket"));

    // tandemd's /v1/tandem/status extension and the model card's meta, when the daemon has them.
    d.route("GET /v1/tandem/status", [](const auto&, auto& s) {
        test::fake::reply_json(s, 200, R"({"status":"ready","uptime_s":300,"threads":8,
                                           "placement":{"policy":"auto","prefill":"cpu","decode":"cpu"}})");
    });
    d.route("GET /v1/models", [](const auto&, auto& s) {
        test::fake::reply_json(s, 200, R"({"object":"list","data":[{"id":"stories260K","object":"model",
                                           "meta":{"path":"/m/stories260K.gguf","arch":"llama","n_ctx":2048}}]})");
    });
    auto x = run_tandem({"status", "--socket", d.path()});
    CHECK(x.rc == 0);
    CHECK(x.out.find("stories260K (arch llama, n_ctx 2048, path /m/stories260K.gguf)") != std::string::npos);
    CHECK(x.out.find("prefill=cpu decode=cpu (policy auto)") != std::string::npos);
    CHECK(x.out.find("threads      8") != std::string::npos);
    CHECK(x.out.find("uptime       5 min") != std::string::npos);
    CHECK(json::parse(run_tandem({"status", "--socket", d.path(), "--json"}).out)["status"]["threads"] == 8);

    // Still loading: 503 on /health, exit 5.
    d.route("GET /health", [](const auto&, auto& s) { test::fake::reply_json(s, 503, R"({"status":"loading"})"); });
    auto l = run_tandem({"status", "--socket", d.path()});
    CHECK(l.rc == 5);
    CHECK(l.out.find("loading (HTTP 503)") != std::string::npos);

    // Not allowed (allowed_users): exit 3 and why, not "busy" (5).
    d.route("GET /health", [](const auto&, auto& s) {
        test::fake::reply_json(s, 403, R"({"error":{"message":"this user is not allowed to use tandemd"}})");
    });
    auto denied = run_tandem({"status", "--socket", d.path()});
    CHECK(denied.rc == 3);
    CHECK(denied.err.find("does not let this user in (HTTP 403)") != std::string::npos);
}

TEST_CASE("a daemon still loading (503 + Retry-After) is waited for, up to --wait") {
    test::scratch_dir dir("cli-client-wait");
    fake_daemon d(dir.file("d.sock"));
    std::atomic<int> calls{0};
    auto loading_then_story = [&](int n_loading) {
        calls = 0;
        d.route("POST /v1/chat/completions", [&, n_loading](const test::fake::request& r, test::fake::socket& s) {
            if (++calls <= n_loading) {
                test::fake::reply_json(s, 503, R"({"error":{"message":"the model is loading"}})", "Retry-After: 1\r\n");
                return;
            }
            if (!json::parse(r.body).value("stream", false))
                test::fake::reply_json(s, 200, json{{"choices", {{{"index", 0}, {"message", {{"content", "Whole."}}}}}}}.dump());
            else
                test::fake::reply_sse(s, {chat_chunk("Once upon a time."), "[DONE]"}, true);
        });
    };
    using clock = std::chrono::steady_clock;

    loading_then_story(2);
    auto t0 = clock::now();
    auto r = run_tandem({"--socket", d.path(), "hi"});
    const double waited = std::chrono::duration<double>(clock::now() - t0).count();
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK(r.out == "Once upon a time.\n");
    CHECK(calls == 3);
    CHECK(waited >= 1.9); // as Retry-After asked, twice
    CHECK(r.err.find("waiting up to 60 s for it (--wait)") != std::string::npos); // said once, on stderr
    CHECK(r.err.find("waiting up to", r.err.find("waiting up to") + 1) == std::string::npos);

    loading_then_story(1); // --json and chat wait the same way
    auto j = run_tandem({"--socket", d.path(), "--json", "hi"});
    CHECK(j.rc == 0);
    CHECK(json::parse(j.out)["choices"][0]["message"]["content"] == "Whole.");
    loading_then_story(1);
    auto c = run_tandem({"chat", "--socket", d.path()}, "hi\n");
    CHECK(c.rc == 0);
    CHECK(c.out.find("Once upon a time.") != std::string::npos);

    // Never ready: gives up when the next wait would pass --wait, with exit 5.
    loading_then_story(1000);
    t0 = clock::now();
    auto g = run_tandem({"--socket", d.path(), "--wait", "1.5", "hi"});
    CHECK(g.rc == 5);
    CHECK(calls == 2);
    CHECK(std::chrono::duration<double>(clock::now() - t0).count() < 5);
    CHECK(g.err.find("the model is loading") != std::string::npos);
    CHECK(g.err.find("gave up after waiting 1") != std::string::npos);

    // No Retry-After: nothing says when to come back, so no waiting.
    d.route("POST /v1/chat/completions", [&](const auto&, auto& s) {
        ++calls;
        test::fake::reply_json(s, 503, R"({"error":{"message":"overloaded"}})");
    });
    calls = 0;
    CHECK(run_tandem({"--socket", d.path(), "hi"}).rc == 5);
    CHECK(calls == 1);
}

TEST_CASE("tandem status --watch and tandem top: one block a sample off a terminal") {
    test::scratch_dir dir("cli-client-watch");
    fake_daemon d(dir.file("d.sock"));
    d.route("GET /health", [](const auto&, auto& s) { test::fake::reply_json(s, 200, R"({"status":"ok"})"); });
    d.route("GET /v1/tandem/status", [](const auto&, auto& s) {
        test::fake::reply_json(s, 200, R"({"status":"ready","placement":{"policy":"auto","prefill":"cpu","decode":"cpu","workers":true}})");
    });
    // Each sample the engine has generated 500 more tokens and answered 10 more first tokens.
    std::atomic<int> sample{0};
    d.route("GET /metrics", [&](const auto&, auto& s) {
        const int n = ++sample;
        const std::string body =
            "tandem_requests_running 3\ntandem_requests_waiting 0\n"
            "tandem_engine_generated_tokens_total " + std::to_string(500 * n) + "\n"
            "tandem_engine_prompt_tokens_total " + std::to_string(100 * n) + "\n"
            "# TYPE tandem_time_to_first_token_seconds histogram\n"
            "tandem_time_to_first_token_seconds_bucket{le=\"0.1\"} " + std::to_string(10 * n) + "\n"
            "tandem_time_to_first_token_seconds_bucket{le=\"+Inf\"} " + std::to_string(10 * n) + "\n"
            "tandem_time_to_first_token_seconds_sum 1\ntandem_time_to_first_token_seconds_count " + std::to_string(10 * n) + "\n"
            "tandem_inter_token_latency_seconds_bucket{le=\"0.01\"} 0\ntandem_inter_token_latency_seconds_bucket{le=\"+Inf\"} 0\n"
            "tandem_inter_token_latency_seconds_sum 0\ntandem_inter_token_latency_seconds_count 0\n"
            "tandem_kv_pages_used 12\ntandem_kv_pages_cached 4\ntandem_kv_pages_total 64\n"
            "tandem_prefix_cache_hits_total " + std::to_string(16 * n) + "\ntandem_worker_restarts_total 1\n";
        test::fake::reply(s, 200, "text/plain; version=0.0.4", body);
    });
    auto r = run_tandem({"status", "--watch", "--interval", "0.3", "--count", "2", "--socket", d.path()});
    INFO(r.out);
    CHECK(r.rc == 0);
    CHECK(sample == 2);
    const size_t second = r.out.find("tandemd on " + d.path(), 1);
    REQUIRE(r.out.starts_with("tandemd on " + d.path()));
    REQUIRE(second != std::string::npos);
    CHECK(r.out.find("tandemd on ", second + 1) == std::string::npos); // two blocks, no more
    const std::string first_block = r.out.substr(0, second), second_block = r.out.substr(second);
    for (const std::string& b : {first_block, second_block}) {
        CHECK(b.find("requests     3 running, 0 waiting") != std::string::npos);
        CHECK(b.find("tokens/s") != std::string::npos);
        CHECK(b.find("first token  p50 50.0 ms, p99 99.0 ms") != std::string::npos);
        CHECK(b.find("per token    - (none") != std::string::npos);
        CHECK(b.find("kv pages     12 used, 4 cached, 64 total") != std::string::npos);
        CHECK(b.find("workers      prefill=cpu decode=cpu (policy auto), worker processes, 1 restarts") != std::string::npos);
    }
    CHECK(first_block.find("(since start, 10)") != std::string::npos);
    CHECK(first_block.find("prefix hits  16 tokens\n") != std::string::npos);
    // The second block's rates and latencies are over the time between the samples.
    CHECK(second_block.find("prefix hits  32 tokens (+16)") != std::string::npos);
    CHECK(second_block.find("(last 0.3") != std::string::npos);
    const size_t rate_at = second_block.find("tokens/s     ");
    REQUIRE(rate_at != std::string::npos);
    const double rate = std::stod(second_block.substr(rate_at + 13));
    CHECK(rate > 500 / 1.0); // 500 tokens in about 0.3 s (the run's own timing: a wide margin)
    CHECK(rate < 500 / 0.25);
    CHECK(second_block.find(" generated, ") != std::string::npos);
    CHECK(r.out.find("\033[") == std::string::npos); // no clearing the screen into a file

    sample = 0;
    auto top = run_tandem({"top", "--interval", "0.1", "--count", "1", "--socket", d.path()});
    CHECK(top.rc == 0);
    CHECK(top.out.find("kv pages     12 used") != std::string::npos);
    auto lines = run_tandem({"status", "--watch", "--json", "--interval", "0.1", "--count", "2", "--socket", d.path()});
    CHECK(lines.rc == 0);
    std::istringstream in(lines.out);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        CHECK(json::parse(line)["metrics"]["tandem_kv_pages_used"] == 12);
        ++n;
    }
    CHECK(n == 2);

    // Ctrl-C ends the view with exit code 0.
    const std::string tandem = test::binary_dir() + "/daemon/tandem";
    const std::string rc_file = dir.file("rc");
    const std::string cmd = tandem + " status --watch --interval 0.1 --socket " + test::shell_quote(d.path()) +
                            " >/dev/null & p=$!; sleep 0.5; kill -INT $p; wait $p; echo $? >" + test::shell_quote(rc_file);
    REQUIRE(std::system(("sh -c " + test::shell_quote(cmd)).c_str()) == 0);
    CHECK(test::read_text(rc_file) == "0\n");
}

TEST_CASE("the offline commands are still there next to the prompt form") {
    auto t = run_tandem({"tokenize", "-m", test::model_path("stories260K.gguf"), "Once"});
    CHECK(t.rc == 0);
    CHECK(json::parse(t.out).is_array());
    auto h = run_tandem({"--help"});
    CHECK(h.rc == 0);
    for (const char* sub : {"run", "tokenize", "detokenize", "synth", "chat", "status"})
        CHECK(h.out.find(sub) != std::string::npos);
}

TEST_CASE("on a terminal: a spinner until the first token, colour in messages") {
    if (std::system("command -v script >/dev/null 2>&1") != 0) {
        MESSAGE("skipped: script(1) is not installed, no pseudo-terminal to test with");
        return;
    }
    test::scratch_dir dir("cli-client-tty");
    fake_daemon d(dir.file("d.sock"));
    d.route("POST /v1/chat/completions", [](const auto&, auto& s) {
        std::this_thread::sleep_for(std::chrono::milliseconds(600)); // prefill
        test::fake::reply_sse(s, {chat_chunk("Hi!"), "[DONE]"}, true);
    });
    // script(1) runs the command on a pseudo-terminal: stdout and stderr are both TTYs there.
    const std::string tandem = test::binary_dir() + "/daemon/tandem";
    auto r = run_tandem_in_pty(tandem + " --socket " + test::shell_quote(d.path()) + " hello");
    CHECK(r.rc == 0);
    CHECK(r.out.find("Hi!") != std::string::npos);
    CHECK(r.out.find("\r| ") != std::string::npos); // the spinner's first frame
    CHECK(r.out.find("\r  \r") < r.out.find("Hi!")); // erased before the reply
    auto none = run_tandem_in_pty(tandem + " --socket " + test::shell_quote(dir.file("none.sock")) + " hello");
    CHECK(none.rc == 3);
    CHECK(none.out.find("\033[31mtandem:\033[0m no daemon") != std::string::npos);
    auto plain = run_tandem_in_pty("NO_COLOR=1 " + tandem + " --socket " + test::shell_quote(dir.file("none.sock")) + " hello");
    CHECK(plain.out.find("\033[") == std::string::npos);
}
