// A connection's coroutine (daemon/session.hpp): the request loop with its deadlines and
// limits, who is asking, dispatch through the route table, replies and streams.
#include "daemon/session.hpp"

#include "daemon/model_host.hpp"
#include "daemon/upstream.hpp"

#include "daemon/batch_jobs.hpp"
#include "daemon/routes.hpp"
#include "daemon/session_manager.hpp"
#include "runtime/log.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/chunk_encode.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/file_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include <fmt/format.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>

namespace tandem::daemon {

using boost::system::error_code;
using asio::redirect_error;
using asio::use_awaitable;
using clock_type = std::chrono::steady_clock;

namespace {

// A coroutine's escaped exception ends its session, never the io_context.
void log_exception(std::exception_ptr e) {
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& ex) {
        logger("server")->error("session ended by an exception: {}", ex.what());
    } catch (...) {
        logger("server")->error("session ended by an unknown exception");
    }
}

double secs(clock_type::duration d) { return std::chrono::duration<double>(d).count(); }

std::string_view as_view(boost::beast::string_view v) { return {v.data(), v.size()}; }

api_error shutting_down() {
    return {503, "the daemon is shutting down", "server_error", "", "shutting_down", 5};
}

api_error model_loading() {
    return {503, "the model is still loading; try again shortly", "server_error", "", "model_loading", 2};
}

} // namespace

session::session(socket_type socket, daemon_state& st, session_manager& mgr, const peer_policy& policy,
                 const tcp_policy* tcp)
    : socket_(std::move(socket)), st_(st), mgr_(mgr), policy_(policy), tcp_(tcp), held_(st),
      deadline_(socket_.get_executor(), clock_type::time_point::max()), load_wait_(socket_.get_executor()) {}

void session::start() {
    auto self = shared_from_this();
    asio::co_spawn(socket_.get_executor(), [self] { return self->watchdog(); }, asio::detached);
    asio::co_spawn(socket_.get_executor(), [self] { return self->run(); }, [self](std::exception_ptr e) {
        if (e) log_exception(e);
        self->close();
        self->mgr_.remove(self);
    });
}

void session::stop() { close(); }

void session::state_changed() { load_wait_.cancel(); }

void session::close() {
    if (closed_) return;
    closed_ = true;
    remove_upload();
    held_.release();
    error_code ec;
    socket_.shutdown(asio::socket_base::shutdown_both, ec);
    socket_.close(ec);
    deadline_.cancel();
    load_wait_.cancel();
    if (current_) current_->timer.cancel();
}

void session::remove_upload() {
    if (upload_file_.empty()) return;
    (void)::unlink(upload_file_.c_str()); // (gone already when the upload was kept: renamed)
    upload_file_.clear();
}

void session::set_deadline(double seconds) {
    if (seconds > 0)
        deadline_.expires_after(std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds)));
    else
        deadline_.expires_at(clock_type::time_point::max());
}

asio::awaitable<void> session::watchdog() {
    auto self = shared_from_this();
    while (!closed_) {
        error_code ec;
        co_await deadline_.async_wait(redirect_error(use_awaitable, ec));
        if (closed_) break;
        if (deadline_.expiry() <= clock_type::now()) {
            logger("server")->debug("request not received in time; closing the connection");
            close();
            break;
        }
    }
}

asio::awaitable<bool> session::write_reply(const reply& r, bool keep_alive) {
    if (!r.file.empty()) co_return co_await write_file_reply(r, keep_alive);
    replied_ = true;
    http::response<http::string_body> res{static_cast<http::status>(r.status), version_};
    res.set(http::field::server, "tandemd");
    res.set(http::field::content_type, r.content_type);
    if (r.retry_after_s > 0) res.set(http::field::retry_after, std::to_string(r.retry_after_s));
    if (!r.allow.empty()) res.set(http::field::allow, r.allow);
    res.keep_alive(keep_alive); // HTTP/1.0: "Connection: keep-alive" when the client asked for it
    error_code ec;
    set_deadline(st_.cfg.request_timeout_s); // a client that stops reading is dropped
    if (head_) { // the GET reply's headers, its length included, and no body
        res.content_length(r.body.size());
        http::response_serializer<http::string_body> sr{res};
        co_await http::async_write_header(socket_, sr, redirect_error(use_awaitable, ec));
    } else {
        res.body() = r.body;
        res.prepare_payload();
        co_await http::async_write(socket_, res, redirect_error(use_awaitable, ec));
    }
    set_deadline(0);
    co_return !ec;
}

asio::awaitable<bool> session::write_file_reply(const reply& r, bool keep_alive) {
    replied_ = true;
    http::response<http::file_body> res{static_cast<http::status>(r.status), version_};
    res.set(http::field::server, "tandemd");
    res.set(http::field::content_type, r.content_type);
    res.keep_alive(keep_alive);
    error_code ec;
    res.body().open(r.file.c_str(), boost::beast::file_mode::scan, ec);
    if (ec) {
        api_error e{500, fmt::format("cannot read the file: {}", ec.message()), "server_error"};
        co_return co_await write_reply(reply::of(e), false);
    }
    res.prepare_payload(); // Content-Length: the file's size
    set_deadline(st_.cfg.request_timeout_s);
    if (head_) {
        http::response_serializer<http::file_body> sr{res};
        co_await http::async_write_header(socket_, sr, redirect_error(use_awaitable, ec));
    } else {
        co_await http::async_write(socket_, res, redirect_error(use_awaitable, ec));
    }
    set_deadline(0);
    co_return !ec;
}

asio::awaitable<bool> session::send(const reply& r, bool last) {
    const bool keep = keep_alive_ && !last;
    const bool ok = co_await write_reply(r, keep);
    co_return ok && keep;
}

asio::awaitable<bool> session::open_stream(std::string_view content_type) {
    // HTTP/1.0 has no chunked encoding (RFC 7230 3.3.1): the stream's end is the connection's.
    chunked_ = version_ >= 11;
    write_failed_ = false;
    http::response<http::empty_body> head{http::status::ok, version_};
    head.set(http::field::server, "tandemd");
    head.set(http::field::content_type, boost::beast::string_view(content_type.data(), content_type.size()));
    head.set(http::field::cache_control, "no-cache");
    head.keep_alive(keep_alive_ && chunked_);
    head.chunked(chunked_);
    http::response_serializer<http::empty_body> sr{head};
    replied_ = true;
    error_code ec;
    set_deadline(st_.cfg.request_timeout_s);
    co_await http::async_write_header(socket_, sr, redirect_error(use_awaitable, ec));
    set_deadline(0);
    if (ec) write_failed_ = true;
    co_return !write_failed_;
}

asio::awaitable<bool> session::send_piece(const std::string& data) {
    if (write_failed_ || closed_) co_return false;
    error_code ec;
    set_deadline(st_.cfg.request_timeout_s); // a client that stops reading is dropped (and cancelled)
    if (chunked_)
        co_await asio::async_write(socket_, http::make_chunk(asio::buffer(data)), redirect_error(use_awaitable, ec));
    else
        co_await asio::async_write(socket_, asio::buffer(data), redirect_error(use_awaitable, ec));
    set_deadline(0);
    if (ec) write_failed_ = true;
    co_return !write_failed_;
}

asio::awaitable<bool> session::close_stream() {
    if (write_failed_ || closed_) co_return false;
    if (chunked_) {
        error_code ec;
        co_await asio::async_write(socket_, http::make_chunk_last(), redirect_error(use_awaitable, ec));
        if (ec) write_failed_ = true;
    }
    co_return !write_failed_ && chunked_ && keep_alive_; // an HTTP/1.0 stream ends with the connection
}

asio::awaitable<bool> session::wait_for_model(clock_type::time_point since) {
    auto self = shared_from_this();
    load_wait_.expires_at(since + std::chrono::duration_cast<clock_type::duration>(
                                      std::chrono::duration<double>(st_.cfg.load_wait_s)));
    while (!st_.ms && !st_.serving && !st_.stopping && !closed_ && load_wait_.expiry() > clock_type::now()) {
        error_code ec; // operation_aborted: state_changed (or close) woke us; look again
        co_await load_wait_.async_wait(redirect_error(use_awaitable, ec));
    }
    co_return st_.ms || st_.serving || st_.stopping;
}

asio::awaitable<bool> session::wait_change(clock_type::time_point deadline) {
    auto self = shared_from_this();
    if (closed_ || st_.stopping || clock_type::now() >= deadline) co_return false;
    load_wait_.expires_at(deadline);
    error_code ec; // operation_aborted: state_changed (or close) woke us
    co_await load_wait_.async_wait(redirect_error(use_awaitable, ec));
    co_return !closed_;
}

asio::awaitable<std::optional<http::request<http::string_body>>> session::read_request() {
    http::request_parser<http::string_body> parser;
    parser.header_limit(16 * 1024);
    parser.body_limit(uint64_t(st_.cfg.max_body_bytes));
    set_deadline(st_.cfg.request_timeout_s);
    error_code ec;
    co_await http::async_read_header(socket_, buffer_, parser, redirect_error(use_awaitable, ec));
    int64_t body_limit = st_.cfg.max_body_bytes;
    // An upload's body (up to max_file_bytes) goes to a file beside the others as it comes,
    // never into memory; every other body is held, within max_inflight_mb for all together.
    const bool upload = !ec && !parser.is_done() && st_.jobs && parser.get().method() == http::verb::post &&
                        parser.get().target() == "/v1/files";
    if (upload) body_limit = std::max(body_limit, st_.cfg.max_file_bytes + 65536); // the file and its form
    std::optional<api_error> refused;
    http::request<http::string_body> uploaded;
    if (!ec && !parser.is_done() && !upload) {
        const int64_t want = parser.content_length() ? int64_t(*parser.content_length()) : body_limit;
        if (!held_.reserve(std::min(want, body_limit)))
            refused = api_error{503, fmt::format("the daemon holds {} MiB of request bodies already (max_inflight_mb); "
                                                 "try again shortly", st_.cfg.max_inflight_mb),
                                "server_error", "", "server_busy", 1};
    }
    if (!ec && !parser.is_done() && !refused) {
        // curl sends Expect: 100-continue for big bodies and waits a second without it
        if (boost::beast::iequals(parser.get()[http::field::expect], "100-continue")) {
            static constexpr std::string_view cont = "HTTP/1.1 100 Continue\r\n\r\n";
            co_await asio::async_write(socket_, asio::buffer(cont), redirect_error(use_awaitable, ec));
        }
        if (!ec && upload) {
            http::request_parser<http::file_body> to_disk{std::move(parser)};
            to_disk.body_limit(uint64_t(body_limit));
            upload_file_ = st_.jobs->new_upload_path();
            to_disk.get().body().open(upload_file_.c_str(), boost::beast::file_mode::write_new, ec);
            if (ec) {
                refused = api_error{500, fmt::format("cannot store the upload: {}", ec.message()), "server_error"};
                upload_file_.clear();
            } else {
                co_await http::async_read(socket_, buffer_, to_disk, redirect_error(use_awaitable, ec));
                to_disk.get().body().close();
            }
            // The request as the handlers take it: its headers, and an empty body (the bytes
            // are in upload_file_).
            uploaded.base() = to_disk.get().base();
        } else if (!ec) {
            co_await http::async_read(socket_, buffer_, parser, redirect_error(use_awaitable, ec));
        }
    }
    set_deadline(0);
    if (closed_) co_return std::nullopt;
    version_ = 11;
    head_ = false;
    if (!ec && !refused) co_return upload ? std::move(uploaded) : parser.release();

    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
        ec == asio::error::operation_aborted)
        co_return std::nullopt;
    api_error e;
    if (refused) {
        e = *refused;
    } else if (ec == http::error::body_limit) {
        e = {413, fmt::format("the request body is larger than {} bytes", body_limit), "invalid_request_error", "",
             "request_too_large"};
    } else if (ec == http::error::header_limit) {
        e = {431, "the request headers are too large"};
    } else {
        e = {400, "malformed HTTP request: " + ec.message()};
    }
    st_.met.request_done(
        upload ? "/v1/files" : parser.is_header_done() ? route_label(as_view(parser.get().target())) : "other", e.status);
    remove_upload();
    held_.release();
    co_await write_reply(reply::of(e), false);
    // Let the client read the reply: stop sending, then discard what it still sends for a moment.
    socket_.shutdown(asio::socket_base::shutdown_send, ec);
    set_deadline(2);
    std::array<char, 8192> sink;
    for (int i = 0; i < 4096 && !closed_; ++i) {
        co_await socket_.async_read_some(asio::buffer(sink), redirect_error(use_awaitable, ec));
        if (ec) break;
    }
    co_return std::nullopt;
}

asio::awaitable<void> session::run() {
    auto self = shared_from_this();
    auto log = logger("server");
    const peer_check pc = tcp_ ? peer_check{true} : check_peer(socket_.native_handle(), policy_);
    if (!pc.allowed) {
        log->warn("refused a connection from uid {} (pid {}): not an allowed user or group", pc.uid, pc.pid);
        api_error e{403, "this user is not allowed to use tandemd (see allowed_users/allowed_groups)",
                    "permission_error"};
        co_await write_reply(reply::of(e), false);
        st_.met.request_done("refused", 403);
        co_return;
    }
    if (!tcp_) who_ = principal::of_uid(pc.uid);
    if (int64_t(mgr_.size()) > int64_t(st_.cfg.max_connections)) {
        api_error e{503, "too many connections; try again shortly", "server_error", "", "too_many_connections", 1};
        co_await write_reply(reply::of(e), false);
        st_.met.request_done("refused", 503);
        co_return;
    }
    while (!closed_) {
        std::optional<http::request<http::string_body>> req = co_await read_request();
        if (!req || closed_) break;
        busy_ = true;
        version_ = req->version() == 10 ? 10 : 11;
        head_ = req->method() == http::verb::head;
        keep_alive_ = req->keep_alive() && !st_.stopping; // during the drain: one reply, then close
        replied_ = false;
        const auto t0 = clock_type::now();
        const std::string target(req->target());
        const std::string method(req->method_string());
        // Whatever a handler throws (a bug, a field of the wrong type it read unchecked) ends
        // this request with a 400 or 500 that says so, never the connection without a reply.
        bool keep = false;
        std::exception_ptr failure;
        try {
            keep = co_await dispatch(*req);
        } catch (...) {
            failure = std::current_exception();
        }
        if (failure && !replied_ && !closed_) {
            const reply r = reply_for_exception(failure, method, target);
            st_.met.request_done(route_label(target), r.status);
            co_await write_reply(r, false);
        }
        log->debug("{} {} done in {:.1f} ms", method, target.substr(0, target.find('?')), 1e3 * secs(clock_type::now() - t0));
        busy_ = false;
        remove_upload();
        held_.release();
        if (failure || !keep || !keep_alive_ || st_.stopping) break;
    }
    close();
}

asio::awaitable<bool> session::dispatch(const http::request<http::string_body>& req) {
    auto self = shared_from_this();
    const std::string target(req.target());
    const size_t q = target.find('?');
    const std::string path = target.substr(0, q);
    const std::string method = head_ ? "GET" : std::string(req.method_string());
    const auto refuse = [&](const api_error& e, const std::string& label, std::string allow = {}) -> asio::awaitable<bool> {
        st_.met.request_done(label, e.status);
        reply r = error_reply(path, e); // (in the shape of the path's API)
        r.allow = std::move(allow);
        co_return co_await send(r, false);
    };
    if (tcp_) { // every request on a TCP listener: no browser, our own Host, a key where needed
        auto checked = check_tcp_request(*tcp_, as_view(req[http::field::host]), as_view(req[http::field::origin]),
                                         as_view(req[http::field::authorization]), as_view(req["x-api-key"]));
        if (auto* e = std::get_if<api_error>(&checked)) {
            logger("server")->warn("refused {} {} over TCP: {}", method, path, e->message);
            st_.met.request_done("refused", e->status);
            co_return co_await send(error_reply(path, *e), true);
        }
        who_ = std::get<principal>(checked);
    }
    const std::vector<route_match> rows = match_routes(path);
    if (rows.empty()) {
        api_error e = bad(fmt::format("no route {} {}", as_view(req.method_string()), path));
        e.status = 404;
        e.code = "unknown_url";
        co_return co_await refuse(e, "other");
    }
    const auto row = std::find_if(rows.begin(), rows.end(), [&](const route_match& m) { return m.row->method == method; });
    if (row == rows.end()) { // 405, and what the path takes (HEAD wherever GET)
        std::string allow;
        for (const route_match& m : rows) {
            allow += (allow.empty() ? "" : ", ") + std::string(m.row->method);
            if (m.row->method == "GET") allow += ", HEAD";
        }
        api_error e = bad(fmt::format("{} {} is not allowed; use {}", as_view(req.method_string()), path, allow));
        e.status = 405;
        co_return co_await refuse(e, std::string(rows.front().row->label), allow);
    }
    const route& r = *row->row;
    const std::string label(r.label);
    // A request that needs the model while it loads (the one socket activation started the
    // daemon for, say) is held until it has loaded, and answered 503 only when that takes
    // longer than load_wait_s.
    const auto t0 = clock_type::now();
    if (r.generates && st_.stopping) co_return co_await refuse(shutting_down(), label);
    const request_view view{req, method, path, parse_query(q == std::string::npos ? std::string_view{}
                                                                                  : std::string_view(target).substr(q + 1)),
                            row->params, who_, upload_file_, t0};
    exchange x{view, *this, st_, label};
    // The model a request names (its body's `model`, the load route's id; none: the default),
    // held while the handler runs: loaded on demand, the request waiting up to load_wait_s;
    // or the upstream that serves it. The one place a request meets its model.
    model_lease lease;
    if (r.needs_model && st_.models && method != "GET") {
        const bool load_route = path.starts_with("/v1/tandem/models/");
        model_request mr = load_route ? model_request{row->params.at("id"), std::nullopt}
                                      : peek_model_request(req.body(), path.starts_with("/api/"));
        const auto deadline = t0 + std::chrono::duration_cast<clock_type::duration>(
                                       std::chrono::duration<double>(st_.cfg.load_wait_s));
        for (;;) {
            if (st_.stopping) co_return co_await refuse(shutting_down(), label);
            model_pick p = st_.models->pick(mr.name, r.generates && forwardable_path(path));
            if (p.error) co_return co_await refuse(*p.error, label);
            if (p.upstream) {
                st_.models->count_forward(p.upstream->name, p.overflow);
                co_return co_await forward_upstream(x, *p.upstream);
            }
            if (!p.wait) {
                x.overflow = p.overflow_to;
                lease = std::move(p.lease);
                lease.keep_alive(mr.keep_alive_s);
                break;
            }
            if (!co_await wait_change(deadline)) {
                if (closed_) co_return false;
                if (st_.stopping) co_return co_await refuse(shutting_down(), label);
                co_return co_await refuse(model_loading(), label);
            }
        }
        x.ms = lease.get();
    } else if (r.needs_model) {
        if (!st_.ms && !st_.serving && !co_await wait_for_model(t0)) co_return co_await refuse(model_loading(), label);
        if (closed_) co_return false;
        if (r.generates && st_.stopping) co_return co_await refuse(shutting_down(), label);
        if (!st_.ms && !st_.serving) co_return co_await refuse(model_loading(), label);
        if (!st_.models && !st_.ms) co_return co_await refuse(model_loading(), label);
    }
    if (closed_) co_return false;
    co_return co_await r.handle(x);
}

void session::watch_peer(std::shared_ptr<generation_channel> ch) {
    asio::co_spawn(socket_.get_executor(), peer_watch(std::move(ch)), asio::detached);
}

asio::awaitable<void> session::peer_watch(std::shared_ptr<generation_channel> ch) {
    auto self = shared_from_this();
    error_code ec;
    co_await socket_.async_wait(asio::socket_base::wait_read, redirect_error(use_awaitable, ec));
    if (ch->finished || closed_) co_return;
    const int fd = socket_.native_handle();
    bool gone = bool(ec);
    if (!ec) {
        char b;
        const ssize_t n = ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        gone = n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
        // EOF after a complete request is a half-close (nc -N, socat): the client still reads
        // the reply. Only a peer gone both ways (POLLHUP; a Unix socket's close) cancels now; on
        // TCP the two look alike, and the next failed write cancels.
        asio::steady_timer tick(socket_.get_executor());
        while (n == 0 && !ch->finished && !closed_) {
            pollfd p{fd, 0, 0};
            if (::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR))) {
                gone = true;
                break;
            }
            tick.expires_after(std::chrono::milliseconds(50));
            co_await tick.async_wait(redirect_error(use_awaitable, ec));
        }
    }
    if (gone && !ch->finished && !closed_) { // the client hung up: cancel now, not when the next write fails
        ch->peer_gone = true;
        ch->timer.cancel();
    }
}

} // namespace tandem::daemon
