// tandemd's HTTP and API details over its socket (HTTP/1.0, HEAD, 405 with Allow, half-close,
// OpenAI's field conventions), and the API's response helpers on their own.
#include "daemon/choices.hpp"
#include "daemon_client.hpp"
#include "runtime/gguf.hpp"
#include "runtime/tokenizer.hpp"

#include <doctest/doctest.h>

#include <set>

using namespace tandem;
using namespace tandem::test;

namespace {

const std::string& daemon_socket() {
    static scratch_dir dir("server_http");
    static daemon_process d;
    static const bool started = [] {
        d.start(dir.file("http.sock"), {"--set", "request_timeout_s=5"});
        return d.wait_ready();
    }();
    REQUIRE(started);
    return d.sock;
}

// Sends `raw` on a fresh connection, half-closes it if asked, and reads the reply to EOF.
std::string round_trip(const std::string& sock, const std::string& raw, bool half_close = false) {
    const int fd = connect_unix(sock);
    if (fd < 0) return {};
    send_all(fd, raw);
    if (half_close) ::shutdown(fd, SHUT_WR);
    std::string out = read_until_eof(fd, 20000);
    ::close(fd);
    return out;
}

std::string http10(const std::string& method, const std::string& target, const std::string& body,
                   bool keep_alive = false) {
    std::string s = method + " " + target + " HTTP/1.0\r\n";
    if (!body.empty()) s += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    if (keep_alive) s += "Connection: keep-alive\r\n";
    return s + "\r\n" + body;
}

std::string completion_body(bool stream) {
    return json{{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}, {"stream", stream}}.dump();
}

std::string stream_text(const std::vector<json>& events) {
    std::string s;
    for (const auto& e : events)
        for (const auto& c : e["choices"]) s += c["text"].get<std::string>();
    return s;
}

} // namespace

TEST_CASE("HTTP/1.0: a stream without chunked encoding, ended by closing; keep-alive echoed") {
    const auto& s = daemon_socket();
    const std::string expected = post(s, "/v1/completions", json::parse(completion_body(false))).j()["choices"][0]["text"].get<std::string>();

    const std::string raw = round_trip(s, http10("POST", "/v1/completions", completion_body(true)));
    REQUIRE(raw.rfind("HTTP/1.0 200", 0) == 0);
    http_response r = parse_response(raw);
    CHECK(r.headers["transfer-encoding"].empty()); // (parse_response leaves an empty entry)
    CHECK(r.headers["content-type"] == "text/event-stream");
    bool done = false, ok = false;
    const auto ev = sse_events(r.body, &done, &ok); // the body is the events themselves, no chunk sizes
    CHECK(done);
    CHECK(ok);
    CHECK(stream_text(ev) == expected);

    // a plain reply has a length; Connection: keep-alive is echoed and the connection stays open
    const int fd = connect_unix(s);
    REQUIRE(fd >= 0);
    send_all(fd, http10("GET", "/health", "", true));
    std::string first;
    char buf[4096];
    while (first.find("{\"status\":\"ok\"}") == std::string::npos) {
        pollfd p{fd, POLLIN, 0};
        REQUIRE(::poll(&p, 1, 5000) == 1);
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        REQUIRE(n > 0);
        first.append(buf, size_t(n));
    }
    http_response h = parse_response(first);
    CHECK(first.rfind("HTTP/1.0 200", 0) == 0);
    CHECK(h.headers["connection"] == "keep-alive");
    CHECK(h.headers["content-length"] == "15");
    send_all(fd, http10("POST", "/v1/completions", completion_body(false)));
    http_response second = parse_response(read_until_eof(fd, 20000));
    ::close(fd);
    CHECK(second.status == 200);
    CHECK(second.headers["connection"].empty()); // no keep-alive asked for: closed after it
    CHECK(second.j()["choices"][0]["text"] == expected);
}

TEST_CASE("405 names the allowed methods; HEAD is allowed wherever GET is") {
    const auto& s = daemon_socket();
    auto get_completions = request(s, "GET", "/v1/completions");
    CHECK(get_completions.status == 405);
    CHECK(get_completions.headers["allow"] == "POST");
    auto post_health = request(s, "POST", "/health", "{}");
    CHECK(post_health.status == 405);
    CHECK(post_health.headers["allow"] == "GET, HEAD");

    const std::string raw = round_trip(s, make_request("HEAD", "/health", ""));
    http_response head = parse_response(raw);
    CHECK(head.status == 200);
    CHECK(head.headers["content-length"] == "15"); // {"status":"ok"}
    CHECK(head.body.empty());
    CHECK(request(s, "HEAD", "/v1/models").status == 200);
    CHECK(request(s, "HEAD", "/v1/completions").status == 405);
}

TEST_CASE("a client that half-closes after a complete request still gets the whole reply") {
    const auto& s = daemon_socket();
    const std::string expected = post(s, "/v1/completions", json::parse(completion_body(false))).j()["choices"][0]["text"].get<std::string>();
    for (const bool stream : {false, true}) {
        CAPTURE(stream);
        http_response r =
            parse_response(round_trip(s, make_request("POST", "/v1/completions", completion_body(stream)), true));
        REQUIRE(r.status == 200);
        if (stream) {
            bool done = false;
            CHECK(stream_text(sse_events(r.body, &done)) == expected);
            CHECK(done);
        } else {
            CHECK(r.j()["choices"][0]["text"] == expected);
        }
    }
    // and the daemon counted no cancellation for them
    const auto m = request(s, "GET", "/metrics").body;
    CHECK(metric(m, "tandem_generations_finished_total{reason=\"cancelled\"}") <= 0);
}

TEST_CASE("completions logprobs: text_offset counts characters, not bytes") {
    const tokenizer tok = tokenizer::from_gguf(gguf::file::open(model_path("stories260K.gguf")));
    daemon::choice_state c;
    c.text = "Caf\xC3\xA9 au "; // 9 bytes, 8 characters
    engine_event ev;
    ev.id = tok.encode("lait", false, false).at(0);
    const json first = daemon::add_logprobs(c, ev, false, tok);
    CHECK(first["text_offset"] == json::array({8}));
    c.text += "lait \xE2\x80\x94 "; // 4 + 1 + 3 + 1 bytes, 7 characters
    daemon::add_logprobs(c, ev, false, tok);
    CHECK(c.lp_offsets == daemon::json::array({8, 15}));
}

TEST_CASE("OpenAI's conventions: stable created, usage null before the last chunk, integral floats, the tool role") {
    const auto& s = daemon_socket();
    // /v1/models "created" is the same on every call (it drifted by a second with the clock)
    std::set<int64_t> created;
    for (int i = 0; i < 24; ++i) {
        created.insert(request(s, "GET", "/v1/models").j()["data"][0]["created"].get<int64_t>());
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    CHECK(created.size() == 1);

    // include_usage: every chunk but the last has "usage": null, the last has the counts
    auto r = post(s, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                              {"max_tokens", 6}, {"temperature", 0}, {"stream", true},
                                              {"stream_options", {{"include_usage", true}}}});
    REQUIRE(r.status == 200);
    const auto ev = sse_events(r.body);
    REQUIRE(ev.size() >= 2);
    for (size_t i = 0; i + 1 < ev.size(); ++i) CHECK((ev[i].contains("usage") && ev[i]["usage"].is_null()));
    CHECK(ev.back()["usage"]["completion_tokens"].get<int>() > 0);
    // without include_usage no chunk has the field
    auto plain = post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 3}, {"stream", true}});
    for (const auto& e : sse_events(plain.body)) CHECK(!e.contains("usage"));

    // integer fields take numbers with integral values
    auto four = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 4.0}, {"temperature", 0},
                                            {"ignore_eos", true}, {"n", 1.0}, {"seed", 7.0}});
    CHECK(four.status == 200);
    CHECK(four.j()["usage"]["completion_tokens"] == 4);
    CHECK(post(s, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 4.5}}).status == 400);
    CHECK(post(s, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 1e30}}).status == 400);

    // the tool role needs the id of the call it answers, and is rendered with it
    auto tool = post(s, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}},
                                                               {{"role", "tool"}, {"content", "42"}}}}});
    CHECK(tool.status == 400);
    CHECK(tool.j()["error"]["param"] == "messages[1].tool_call_id");
    auto answered = post(s, "/v1/chat/completions",
                         {{"messages", {{{"role", "user"}, {"content", "Hi"}},
                                        {{"role", "tool"}, {"content", "42"}, {"tool_call_id", "call_1"}}}},
                          {"max_tokens", 2}});
    CHECK(answered.status == 200);
}
