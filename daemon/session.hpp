// One client connection: the transport. It reads HTTP/1.1 (and 1.0) requests within their
// deadlines and limits, checks who is asking, dispatches each through the route table
// (daemon/routes.hpp), writes what the handler answers (a reply, or a stream of pieces), and
// notices the peer leave. It knows no route and no API.
#pragma once

#include "runtime/prelude.hpp"

#include "daemon/access.hpp"
#include "daemon/exchange.hpp"
#include "daemon/peer_cred.hpp"
#include "daemon/state.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <memory>
#include <optional>
#include <string>

namespace tandem::daemon {

class session_manager;

class session : public std::enable_shared_from_this<session>, private responder {
public:
    using socket_type = asio::generic::stream_protocol::socket;

    // Peers the policy refuses get 403, and connections over max_connections 503, then close.
    // `tcp`: the TCP listener's checks, which every request on it passes (null: a Unix socket,
    // whose peer's credentials are checked once).
    session(socket_type socket, daemon_state& st, session_manager& mgr, const peer_policy& policy,
            const tcp_policy* tcp = nullptr);

    void start();
    void stop();             // closes now; a running generation is cancelled
    bool busy() const { return busy_; } // answering a request (reading the next one is not busy)
    void state_changed();    // the model loaded, or the daemon is stopping: a request held for the model goes on

private:
    asio::awaitable<void> run();
    asio::awaitable<void> watchdog();
    asio::awaitable<void> peer_watch(std::shared_ptr<generation_channel> ch);
    // Reads the next request (its body in memory, or an upload's on disk); nullopt when the
    // connection ends, after answering what went wrong where there is something to say.
    asio::awaitable<std::optional<http::request<http::string_body>>> read_request();
    // Answers one request through the route table (false: close the connection after it).
    asio::awaitable<bool> dispatch(const http::request<http::string_body>& req);
    asio::awaitable<bool> write_reply(const reply& r, bool keep_alive);
    asio::awaitable<bool> write_file_reply(const reply& r, bool keep_alive); // r.file's bytes as the body
    // Holds the current request while the model loads, up to load_wait_s after `since`; true
    // when the model is loaded or the daemon stopping by then.
    asio::awaitable<bool> wait_for_model(std::chrono::steady_clock::time_point since);
    // Waits until the daemon's models change (state_changed) or `deadline`; false when the
    // deadline passed, the session closed or the daemon stops.
    asio::awaitable<bool> wait_change(std::chrono::steady_clock::time_point deadline);
    void set_deadline(double seconds); // <= 0: none
    void close();
    void remove_upload();      // the current upload's file, unless the handler kept it

    // responder: what handlers write through
    asio::any_io_executor executor() override { return socket_.get_executor(); }
    asio::awaitable<bool> send(const reply& r, bool last) override;
    asio::awaitable<bool> open_stream(std::string_view content_type) override;
    asio::awaitable<bool> send_piece(const std::string& data) override;
    asio::awaitable<bool> close_stream() override;
    void watch_peer(std::shared_ptr<generation_channel> ch) override;
    void current(std::shared_ptr<generation_channel> ch) override { current_ = std::move(ch); }
    bool closed() const override { return closed_; }

    socket_type socket_;
    daemon_state& st_;
    session_manager& mgr_;
    const peer_policy& policy_;
    const tcp_policy* tcp_;
    principal who_;             // whom the current request acts for (its files and batches)
    body_hold held_;            // the current request's body, counted against max_inflight_mb
    std::string upload_file_;   // the current upload's body on disk (POST /v1/files), removed after it
    asio::steady_timer deadline_;
    asio::steady_timer load_wait_;  // wait_for_model's; state_changed and close cancel it
    boost::beast::flat_buffer buffer_;
    bool busy_ = false;
    bool closed_ = false;
    unsigned version_ = 11;     // the current request's HTTP version (10 or 11), echoed in replies
    bool head_ = false;         // the current request is a HEAD: replies carry no body
    bool keep_alive_ = false;   // the current request's connection may take another after it
    bool replied_ = false;      // the current request's reply (or its stream's head) has gone out
    bool chunked_ = false;      // the current stream is chunked (HTTP/1.1)
    bool write_failed_ = false; // a write of the current stream failed
    std::shared_ptr<generation_channel> current_; // the running generation, if any
};

} // namespace tandem::daemon
