// libFuzzer target for tandemd's request path, in process: the bytes a client sends go over a
// socket pair into the daemon's own session (Beast's parser under the daemon's header and body
// limits, routing, handle_simple, the JSON validation of every endpoint with guided
// generation and tools, and the generation itself on a real in-process engine serving
// stories260K, which load_model_state loads once). The first byte picks how the rest is read:
// - even: raw bytes on the socket (pipelined requests, broken framing, odd methods);
// - odd: one well-framed request, so that JSON mutations always reach the validation (the
//   fuzz_json_request of issue 19, folded in here): the second byte picks the route, the
//   method, HTTP/1.0 and whether it is sent twice on one connection; the rest is the body.
// Limits are the daemon's own (max_body_bytes 1 MiB, max_json_depth 64). The daemon must
// answer the first request, when it is whole, with a well-formed HTTP response (silence is a
// failure: a handler that threw once ended the connection so), never 500 (the
// engine in process has no reason to fail), every error a JSON error object
// ({"error": {"message", "type", ...}}), every JSON reply valid JSON, every event stream
// valid JSON events ending with [DONE]; and the session must end once the client has sent
// everything (a hang is libFuzzer's timeout).
#include "runtime/prelude.hpp"

#include "daemon/peer_cred.hpp"
#include "daemon/server.hpp"
#include "daemon/session.hpp"
#include "daemon/session_manager.hpp"
#include "runtime/log.hpp"
#include "tests/sse_events.hpp"
#include "tests/test_util.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using namespace tandem::daemon;

struct served {
    asio::io_context io;
    daemon_state st;
    peer_policy policy;
    session_manager sessions;
};
served* srv = nullptr; // for the lifetime of the process

void require(bool ok, const char* what, std::string_view reply) {
    if (ok) return;
    std::fprintf(stderr, "fuzz_http: %s\n--- reply ---\n%.*s\n", what, int(std::min<size_t>(reply.size(), 4096)),
                 reply.data());
    std::abort();
}

// The framed request of an odd first byte.
std::string framed(uint8_t how, std::string_view body) {
    static const char* const targets[] = {
        "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize", "/detokenize",
        "/v1/tandem/apply-template", "/v1/chat/completions?stream=1", "/v1/completions", "/v1/models",
        "/v1/models/stories260K", "/health", "/metrics", "/v1/tandem/status", "/v1/chat/completions", "/nope",
        "/v1/models/other"};
    static const char* const methods[] = {"POST", "POST", "GET", "HEAD"};
    const std::string one = fmt::format("{} {} HTTP/1.{}\r\nHost: tandem\r\nContent-Type: application/json\r\n"
                                        "Content-Length: {}\r\n\r\n{}",
                                        methods[(how >> 4) % 4], targets[how % 16], how & 0x40 ? 0 : 1, body.size(), body);
    return how & 0x80 ? one + one : one;
}

// What the first request in `sent` is: a HEAD (its reply then has no body), and whole (the
// daemon must answer it, never close the connection in silence).
struct first_request {
    bool head = false;
    bool complete = false;
};
first_request first_of(std::string_view sent) {
    http::request_parser<http::string_body> p;
    p.header_limit(16 * 1024);
    p.body_limit(uint64_t(srv->st.cfg.max_body_bytes));
    p.eager(true);
    boost::system::error_code ec;
    size_t used = 0;
    while (!ec && !p.is_done() && used < sent.size()) {
        const size_t n = p.put(asio::buffer(sent.data() + used, sent.size() - used), ec);
        if (n == 0) break;
        used += n;
    }
    return {p.is_header_done() && p.get().method() == http::verb::head, !ec && p.is_done()};
}

// The first response in `reply` (after any 100 Continue), checked.
void check_reply(std::string_view reply, bool head) {
    size_t at = 0;
    for (;;) {
        http::response_parser<http::string_body> p;
        p.body_limit(boost::none);
        p.eager(true);
        if (head) p.skip(true);
        boost::system::error_code ec;
        size_t used = 0;
        while (!ec && !p.is_done() && at + used < reply.size()) {
            const size_t n = p.put(asio::buffer(reply.data() + at + used, reply.size() - at - used), ec);
            if (n == 0 && !ec) break;
            used += n;
        }
        if (!ec && !p.is_done()) p.put_eof(ec); // a body that ends with the connection (HTTP/1.0)
        require(!ec && p.is_done(), "the reply is not a complete HTTP response", reply);
        const auto& res = p.get();
        if (res.result_int() == 100) {
            at += used;
            continue;
        }
        const int status = res.result_int();
        require(status != 500, "500: the engine failed", reply);
        const std::string type(res[http::field::content_type]);
        const std::string& body = res.body();
        if (head || body.empty()) return;
        if (type == "application/json") {
            const auto j = nlohmann::json::parse(body, nullptr, false);
            require(!j.is_discarded() && j.is_object(), "a JSON reply is not a JSON object", reply);
            if (status >= 400 && !j.contains("status")) // (/health's 503 is {"status": ...})
                require(j.contains("error") && j["error"].is_object() && j["error"]["message"].is_string() &&
                            j["error"]["type"].is_string(),
                        "an error reply is not an error object", reply);
        } else if (type == "text/event-stream") {
            require(status == 200, "an event stream with an error status", reply);
            const auto events = tandem::test::sse_events(body, body.size() + 1);
            require(!events.empty() && events.back() == "[DONE]", "an event stream that does not end with [DONE]", reply);
            for (size_t i = 0; i + 1 < events.size(); ++i)
                require(nlohmann::json::accept(events[i]), "an event that is not JSON", reply);
        }
        return;
    }
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
    // No leak check after every input (flags given later override this): the daemon keeps
    // caches (compiled grammars, metrics, passage vectors) and its engine thread allocates
    // on its own, so most inputs end with more allocations than frees, and libFuzzer would
    // run each again and scan the heap. Leaks are still reported at exit.
    static std::vector<char*> args(*argv, *argv + *argc);
    static char no_leak_check[] = "-detect_leaks=0";
    args.insert(args.begin() + 1, no_leak_check);
    args.push_back(nullptr);
    *argc += 1;
    *argv = args.data();

    tandem::init_logging("off");
    config cfg;
    const std::pair<const char*, std::string> settings[] = {
        {"model", tandem::test::model_path("stories260K.gguf")},
        {"placement", "local"}, // the engine in this process
        {"threads", "1"},
        {"n_ctx", "512"},           // documents longer than about 1,500 characters are retrieved from
        {"max_tokens_limit", "16"}, // generations stay short: many inputs a second
        {"max_n", "4"},
        {"draft_tokens", "2"}, // speculative requests (prompt lookup) are honoured
        {"max_running", "4"},
        {"max_waiting", "8"},
        {"request_timeout_s", "10"},
    };
    for (const auto& [key, value] : settings)
        if (auto err = cfg.set(key, value)) {
            std::fprintf(stderr, "fuzz_http: %s: %s\n", key, err->c_str());
            std::abort();
        }
    srv = new served;
    srv->st.cfg = cfg;
    srv->policy = make_peer_policy(cfg);
    const std::atomic<bool> never{false};
    srv->st.ms = load_model_state(cfg, "", never);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2) return 0;
    const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
    const std::string sent = data[0] % 2 ? framed(uint8_t(rest[0]), rest.substr(1)) : std::string(rest);

    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) std::abort();
    ::fcntl(fds[1], F_SETFL, O_NONBLOCK);
    session::socket_type sock(srv->io, asio::generic::stream_protocol(AF_UNIX, SOCK_STREAM), fds[0]);
    srv->sessions.start(std::make_shared<session>(std::move(sock), srv->st, srv->sessions, srv->policy));
    if (srv->io.stopped()) srv->io.restart();

    // The client: sends everything, then half-closes (as curl does not, but a pipe does), and
    // reads the replies until the daemon closes the connection.
    size_t n_sent = 0;
    bool shut = false;
    std::string reply;
    char buf[65536];
    for (;;) {
        if (n_sent < sent.size()) {
            const ssize_t n = ::send(fds[1], sent.data() + n_sent, sent.size() - n_sent, MSG_NOSIGNAL);
            if (n > 0) n_sent += size_t(n);
            else if (errno != EAGAIN) n_sent = sent.size(); // the daemon closed: the rest is not read
        }
        if (n_sent == sent.size() && !shut) {
            ::shutdown(fds[1], SHUT_WR);
            shut = true;
        }
        const ssize_t n = ::recv(fds[1], buf, sizeof buf, 0);
        if (n > 0) {
            reply.append(buf, size_t(n));
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) break; // the daemon closed the connection
        srv->io.run_one_for(std::chrono::milliseconds(5));
    }
    ::close(fds[1]);
    while (srv->sessions.size() > 0) srv->io.run_one_for(std::chrono::milliseconds(5));

    if (std::getenv("FUZZ_HTTP_SHOW")) // to see what an input does: FUZZ_HTTP_SHOW=1 fuzz_http FILE
        std::fprintf(stderr, "--- sent ---\n%s\n--- reply ---\n%s\n", sent.c_str(), reply.c_str());
    const first_request first = first_of(sent);
    require(!first.complete || !reply.empty(), "no reply to a complete request", reply);
    if (!reply.empty()) check_reply(reply, first.head);
    return 0;
}
