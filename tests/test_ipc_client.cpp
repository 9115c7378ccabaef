// The client library: SSE parsing, and requests over a Unix socket to a fake daemon.
#include "ipc/client.hpp"

#include "fake_daemon.hpp"
#include "test_util.hpp"
#include "tests/sse_events.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>

using namespace tandem;
using namespace std::chrono_literals;

TEST_CASE("sse_parser: events split anywhere, CRLF/CR/LF, comments, multi-line data") {
    const std::string wire = ": hello\n\ndata: {\"a\":1}\n\ndata:no-space\r\n\r\nevent: x\nid: 3\ndata: one\ndata: two\r\r"
                             "data: [DONE]\n\n";
    const std::vector<std::string> want{"{\"a\":1}", "no-space", "one\ntwo", "[DONE]"};
    for (size_t piece : {1, 2, 3, 7, 1000}) {
        INFO(piece);
        CHECK(tandem::test::sse_events(wire, piece) == want);
    }
    // A callback returning false stops the parse.
    ipc::sse_parser p;
    int n = 0;
    CHECK_FALSE(p.feed("data: a\n\ndata: b\n\n", [&](std::string_view) { return ++n < 1; }));
    CHECK(n == 1);
    // An event without its blank line is held back.
    CHECK(tandem::test::sse_events("data: partial\n", 1).empty());
}

TEST_CASE("default_socket_path: flag, $TANDEM_SOCKET, $XDG_RUNTIME_DIR, /run") {
    test::scratch_dir dir("sockpath");
    CHECK(ipc::default_socket_path("/x.sock") == "/x.sock");
    ::setenv("TANDEM_SOCKET", "/y.sock", 1);
    CHECK(ipc::default_socket_path() == "/y.sock");
    ::unsetenv("TANDEM_SOCKET");
    const char* old = std::getenv("XDG_RUNTIME_DIR");
    const std::string saved = old ? old : "";
    ::setenv("XDG_RUNTIME_DIR", dir.path.c_str(), 1);
    CHECK(ipc::default_socket_path() == dir.file("tandem/tandem.sock"));
    ::unsetenv("XDG_RUNTIME_DIR");
    CHECK(ipc::default_socket_path() == "/run/tandem/tandem.sock");
    if (old) ::setenv("XDG_RUNTIME_DIR", saved.c_str(), 1);
}

TEST_CASE("client: GET and POST against a fake daemon; error statuses are values") {
    test::scratch_dir dir("ipc");
    test::fake_daemon d(dir.file("d.sock"));
    d.route("GET /health", [](const auto&, auto& s) { test::fake::reply_json(s, 200, R"({"status":"ok"})"); });
    d.route("POST /v1/completions", [](const auto& r, auto& s) {
        test::fake::reply_json(s, 429, R"({"error":{"message":"busy"}})", "Retry-After: 3\r\n");
        (void)r;
    });
    ipc::client c(d.path());
    auto h = c.get("/health");
    INFO(h.net_error);
    CHECK(h.ok());
    CHECK(h.status == 200);
    CHECK(h.body == R"({"status":"ok"})");
    CHECK(h.content_type == "application/json");

    auto p = c.post("/v1/completions", R"({"prompt":"x"})");
    CHECK(p.reached());
    CHECK_FALSE(p.ok());
    CHECK(p.status == 429);
    CHECK(p.retry_after == "3");
    auto nf = c.get("/nowhere");
    CHECK(nf.status == 404);

    const auto reqs = d.requests();
    REQUIRE(reqs.size() == 3);
    CHECK(reqs[1].method == "POST");
    CHECK(reqs[1].body == R"({"prompt":"x"})");
    CHECK(reqs[1].content_type == "application/json");
}

TEST_CASE("client: streams events as they come, chunked or close-delimited") {
    test::scratch_dir dir("ipc-stream");
    test::fake_daemon d(dir.file("d.sock"));
    const std::vector<std::string> events{R"({"n":1})", R"({"n":2})", R"({"n":3})", "[DONE]"};
    for (bool chunked : {false, true}) {
        d.route("POST /v1/chat/completions", [&](const auto&, auto& s) { test::fake::reply_sse(s, events, chunked); });
        std::vector<std::string> got;
        auto r = ipc::client(d.path()).post_stream("/v1/chat/completions", "{}", [&](std::string_view e) {
            got.emplace_back(e);
            return true;
        });
        INFO(chunked);
        CHECK(r.ok());
        CHECK(r.content_type == "text/event-stream");
        CHECK_FALSE(r.cancelled);
        CHECK(got == events);
        CHECK(d.requests().back().accept == "text/event-stream");
    }
    // A non-stream answer to a stream request arrives whole in body.
    d.route("POST /v1/chat/completions", [](const auto&, auto& s) {
        test::fake::reply_json(s, 400, R"({"error":{"message":"bad"}})");
    });
    int n = 0;
    auto bad = ipc::client(d.path()).post_stream("/v1/chat/completions", "{}", [&](std::string_view) { return ++n, true; });
    CHECK(bad.status == 400);
    CHECK(bad.body == R"({"error":{"message":"bad"}})");
    CHECK(n == 0);
}

TEST_CASE("client: each event reaches the callback when it arrives, not when a read buffer fills") {
    test::scratch_dir dir("ipc-timely");
    test::fake_daemon d(dir.file("d.sock"));
    for (bool chunked : {false, true}) {
        // each event completes 300 ms after the previous one (the fake pauses inside it)
        d.route("POST /v1/completions", [&](const auto&, auto& s) {
            test::fake::reply_sse(s, {R"({"n":1})", R"({"n":2})", "[DONE]"}, chunked, 300ms);
        });
        std::vector<std::chrono::steady_clock::time_point> at;
        auto r = ipc::client(d.path()).post_stream("/v1/completions", "{}", [&](std::string_view) {
            at.push_back(std::chrono::steady_clock::now());
            return true;
        });
        INFO(chunked);
        CHECK(r.ok());
        REQUIRE(at.size() == 3);
        CHECK(at[1] - at[0] >= 150ms); // a client that waited for more bytes would see them together
        CHECK(at[2] - at[1] >= 150ms);
    }
}

TEST_CASE("client: a callback that returns false closes the connection (the daemon sees it)") {
    test::scratch_dir dir("ipc-cancel");
    test::fake_daemon d(dir.file("d.sock"));
    std::atomic<int> finished{-1};
    d.route("POST /v1/completions", [&](const auto&, auto& s) {
        std::vector<std::string> many(2000, R"({"choices":[{"text":"x"}]})");
        finished = test::fake::reply_sse(s, many, true, 1ms) ? 1 : 0;
    });
    int n = 0;
    auto r = ipc::client(d.path()).post_stream("/v1/completions", "{}", [&](std::string_view) { return ++n < 3; });
    CHECK(r.cancelled);
    CHECK(n == 3);
    for (int i = 0; i < 500 && finished < 0; ++i) std::this_thread::sleep_for(10ms);
    CHECK(finished == 0); // the server's writes failed well before 2000 events
}

TEST_CASE("client: no daemon is an outcome, not an exception") {
    test::scratch_dir dir("ipc-none");
    auto missing = ipc::client(dir.file("missing.sock")).get("/health");
    CHECK(missing.net == ipc::transport::no_socket);
    CHECK_FALSE(missing.net_error.empty());
    { test::fake_daemon d(dir.file("stale.sock")); }
    // A socket file nobody listens on (a daemon that died without cleaning up).
    {
        boost::asio::io_context io;
        boost::asio::local::stream_protocol::acceptor a(io);
        a.open();
        a.bind(boost::asio::local::stream_protocol::endpoint(dir.file("stale.sock")));
    }
    auto stale = ipc::client(dir.file("stale.sock")).get("/health");
    CHECK(stale.net == ipc::transport::refused);
    CHECK_FALSE(stale.reached());
}
