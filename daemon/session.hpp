// One client connection: reads HTTP/1.1 (and 1.0) requests, answers them, streams generations.
#pragma once

#include "runtime/prelude.hpp"

#include "daemon/access.hpp"
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
#include <variant>
#include <vector>

namespace tandem::daemon {

namespace asio = boost::asio;
namespace http = boost::beast::http;

class session_manager;
struct generation_channel;

class session : public std::enable_shared_from_this<session> {
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
    asio::awaitable<void> watch_peer(std::shared_ptr<generation_channel> ch);
    asio::awaitable<bool> write_reply(const struct reply& r, bool keep_alive);
    asio::awaitable<bool> write_file_reply(const struct reply& r, bool keep_alive); // r.file's bytes as the body
    // Answers one request (false: close the connection after it).
    asio::awaitable<bool> dispatch(const http::request<http::string_body>& req, bool keep_alive,
                                   std::chrono::steady_clock::time_point t0);
    // Holds the current request while the model loads, up to load_wait_s after `since`; true
    // when the model is loaded or the daemon stopping by then.
    asio::awaitable<bool> wait_for_model(std::chrono::steady_clock::time_point since);
    asio::awaitable<bool> generate(const http::request<http::string_body>& req, bool chat, bool keep_alive);
    asio::awaitable<bool> embeddings(const http::request<http::string_body>& req, bool keep_alive);
    // Each input's embedding through the engine (the model's pooling), in order; cancelled
    // when the client goes away (a 499 error, nobody to answer).
    asio::awaitable<std::variant<std::vector<std::vector<float>>, struct api_error>>
    embed(std::vector<std::vector<token_id>> inputs, int32_t priority);
    // Documents too long for the context (plan.retrieval): ranks their passages against the
    // question and completes the plan with the best that fit.
    asio::awaitable<std::optional<struct api_error>> retrieve(struct generation_plan& plan);
    void set_deadline(double seconds); // <= 0: none
    void close();
    void remove_upload();      // the current upload's file, unless the handler kept it

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
    bool replied_ = false;      // the current request's reply (or its stream's head) has gone out
    std::shared_ptr<generation_channel> current_; // the running generation, if any
};

} // namespace tandem::daemon
