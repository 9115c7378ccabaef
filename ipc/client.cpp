// HTTP/1.1 client over a Unix socket (Beast, synchronous), streaming through the SSE parser.
#include "runtime/prelude.hpp"

#include "ipc/client.hpp"

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <limits>

namespace tandem::ipc {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using stream_protocol = asio::local::stream_protocol;

std::string default_socket_path(const std::string& flag) {
    if (!flag.empty()) return flag;
    if (const char* env = std::getenv("TANDEM_SOCKET"); env && *env) return env;
    // A user session has XDG_RUNTIME_DIR; its socket wins only if a user instance is there,
    // so that users talk to the system service by default.
    if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg && *xdg) {
        const std::string user_sock = std::string(xdg) + "/tandem/tandem.sock";
        std::error_code ec;
        if (std::filesystem::exists(user_sock, ec) || !std::filesystem::exists("/run/tandem/tandem.sock", ec))
            return user_sock;
    }
    return "/run/tandem/tandem.sock";
}

response client::get(std::string_view target) const { return exchange("GET", target, {}, nullptr); }

response client::post(std::string_view target, std::string_view json_body) const {
    return exchange("POST", target, json_body, nullptr);
}

response client::post_stream(std::string_view target, std::string_view json_body,
                             const std::function<bool(std::string_view)>& on_data) const {
    return exchange("POST", target, json_body, &on_data);
}

response client::exchange(std::string_view method, std::string_view target, std::string_view body,
                          const std::function<bool(std::string_view)>* on_data) const {
    response r;
    asio::io_context io;
    stream_protocol::socket sock(io);
    boost::system::error_code ec;
    sock.connect(stream_protocol::endpoint(path_), ec);
    if (ec) {
        r.net_error = ec.message();
        // Whatever else stops a connect (not a socket, a full backlog) also means no daemon
        // to talk to; net_error says which.
        r.net = ec == boost::system::errc::no_such_file_or_directory ? transport::no_socket
              : ec == boost::system::errc::permission_denied        ? transport::denied
                                                                    : transport::refused;
        return r;
    }

    http::request<http::string_body> req{method == "GET" ? http::verb::get : http::verb::post,
                                         boost::beast::string_view(target.data(), target.size()), 11};
    req.set(http::field::host, "localhost");
    req.set(http::field::user_agent, "tandem");
    req.set(http::field::connection, "close");
    if (method != "GET") {
        req.set(http::field::content_type, "application/json");
        req.set(http::field::accept, on_data ? "text/event-stream" : "application/json");
        req.body() = std::string(body);
        req.prepare_payload();
    }
    http::write(sock, req, ec);
    auto io_fail = [&](std::string what) {
        r.net = transport::io;
        r.net_error = std::move(what);
        return r;
    };
    if (ec) return io_fail("sending the request: " + ec.message());

    boost::beast::flat_buffer buf;
    http::response_parser<http::buffer_body> p;
    // A stream is as long as the reply (the daemon bounds it). Not boost::none: Boost 1.74
    // compares a Content-Length against the optional and rejects every sized body.
    p.body_limit(std::numeric_limits<std::uint64_t>::max());
    http::read_header(sock, buf, p, ec);
    if (ec) return io_fail("reading the response: " + ec.message());
    const auto& head = p.get();
    r.status = int(head.result_int());
    r.content_type = std::string(head[http::field::content_type]);
    r.retry_after = std::string(head[http::field::retry_after]);
    const bool sse = on_data && r.ok() && r.content_type.starts_with("text/event-stream");

    sse_parser events;
    std::array<char, 8192> chunk;
    while (!p.is_done()) {
        p.get().body().data = chunk.data();
        p.get().body().size = chunk.size();
        // read_some: hand over what has arrived; read() would wait for the buffer to fill,
        // holding streamed tokens back until 8 KiB of them had come.
        http::read_some(sock, buf, p, ec);
        if (ec == http::error::need_buffer) ec = {};
        if (ec) return io_fail("reading the response: " + ec.message());
        const std::string_view got(chunk.data(), chunk.size() - p.get().body().size);
        if (!sse) {
            r.body.append(got);
        } else if (!events.feed(got, *on_data)) {
            r.cancelled = true; // closing the socket (at return) tells the daemon to stop
            break;
        }
    }
    if (sse && !r.cancelled) events.feed("\n\n", *on_data); // an event cut off by the end of the body
    return r;
}

} // namespace tandem::ipc
