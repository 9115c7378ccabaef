// A stand-in for tandemd in client tests: canned HTTP responses over a temporary Unix socket.
#pragma once

#include "runtime/prelude.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace tandem::test {

namespace fake {
namespace asio = boost::asio;
namespace http = boost::beast::http;
using socket = asio::local::stream_protocol::socket;

struct request {
    std::string method, target, body, content_type, accept;
};

// Writes raw bytes; false once the peer is gone.
inline bool write_raw(socket& s, std::string_view bytes) {
    boost::system::error_code ec;
    asio::write(s, asio::buffer(bytes.data(), bytes.size()), ec);
    return !ec;
}

inline void reply(socket& s, int status, std::string_view content_type, std::string_view body,
                  std::string_view extra_headers = "") {
    std::string head = "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: " + std::string(content_type) +
                       "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + std::string(extra_headers) +
                       "Connection: close\r\n\r\n";
    write_raw(s, head);
    write_raw(s, body);
}

inline void reply_json(socket& s, int status, std::string_view body, std::string_view extra_headers = "") {
    reply(s, status, "application/json", body, extra_headers);
}

// An event stream, each event `data: <e>\n\n`, written in pieces split mid-event (so the
// client's parser sees arbitrary boundaries), chunked or ended by closing. Returns false
// when the client went away before the end.
inline bool reply_sse(socket& s, const std::vector<std::string>& events, bool chunked,
                      std::chrono::milliseconds gap = std::chrono::milliseconds(0)) {
    write_raw(s, std::string("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n") +
                     (chunked ? "Transfer-Encoding: chunked\r\n" : "") + "Connection: close\r\n\r\n");
    auto send = [&](std::string_view piece) {
        if (!chunked) return write_raw(s, piece);
        char size[32];
        std::snprintf(size, sizeof size, "%zx\r\n", piece.size());
        return write_raw(s, std::string(size) + std::string(piece) + "\r\n");
    };
    if (!send(": keep-alive comment\n\n")) return false;
    for (const auto& e : events) {
        const std::string wire = "data: " + e + "\n\n";
        const size_t half = wire.size() / 2;
        if (!send(wire.substr(0, half))) return false;
        if (gap.count()) std::this_thread::sleep_for(gap);
        if (!send(wire.substr(half))) return false;
    }
    if (chunked) return write_raw(s, "0\r\n\r\n");
    return true;
}

} // namespace fake

// Serves one connection at a time on its own thread. Routes map "METHOD /target" to a
// handler; unknown routes get 404 in OpenAI's error shape. Every request is recorded.
class fake_daemon {
public:
    using handler = std::function<void(const fake::request&, fake::socket&)>;

    explicit fake_daemon(std::string path) : path_(std::move(path)), acceptor_(io_) {
        ::unlink(path_.c_str());
        acceptor_.open();
        acceptor_.bind(boost::asio::local::stream_protocol::endpoint(path_));
        acceptor_.listen();
        accept();
        thread_ = std::thread([this] { io_.run(); });
    }
    ~fake_daemon() {
        io_.stop();
        thread_.join();
        ::unlink(path_.c_str());
    }

    void route(const std::string& key, handler h) {
        std::lock_guard lock(mu_);
        routes_[key] = std::move(h);
    }

    std::vector<fake::request> requests() const {
        std::lock_guard lock(mu_);
        return requests_;
    }

    const std::string& path() const { return path_; }

private:
    void accept() {
        acceptor_.async_accept([this](boost::system::error_code ec, fake::socket s) {
            if (ec) return;
            serve(s);
            accept();
        });
    }

    void serve(fake::socket& s) {
        boost::beast::flat_buffer buf;
        fake::http::request<fake::http::string_body> req;
        boost::system::error_code ec;
        fake::http::read(s, buf, req, ec);
        if (ec) return;
        fake::request r{std::string(req.method_string()), std::string(req.target()), req.body(),
                        std::string(req[fake::http::field::content_type]),
                        std::string(req[fake::http::field::accept])};
        handler h;
        {
            std::lock_guard lock(mu_);
            requests_.push_back(r);
            if (auto it = routes_.find(r.method + " " + r.target); it != routes_.end()) h = it->second;
        }
        if (h)
            h(r, s);
        else
            fake::reply_json(s, 404, R"({"error":{"message":"unknown route","type":"invalid_request_error"}})");
        s.shutdown(fake::socket::shutdown_both, ec);
    }

    std::string path_;
    boost::asio::io_context io_;
    boost::asio::local::stream_protocol::acceptor acceptor_;
    std::thread thread_;
    mutable std::mutex mu_;
    std::map<std::string, handler> routes_;
    std::vector<fake::request> requests_;
};

} // namespace tandem::test
