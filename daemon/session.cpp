// A connection's coroutine: request loop with a read deadline, plain replies, and
// generations whose engine events arrive through a channel posted from the engine thread.
#include "daemon/session.hpp"

#include "daemon/api.hpp"
#include "daemon/batch_jobs.hpp"
#include "daemon/session_manager.hpp"
#include "runtime/log.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/chunk_encode.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/file_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include <poll.h>
#include <unistd.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <mutex>

namespace tandem::daemon {

using boost::system::error_code;
using asio::redirect_error;
using asio::use_awaitable;
using clock_type = std::chrono::steady_clock;

// Engine events of one generation on their way from the engine thread to the session.
struct generation_channel {
    explicit generation_channel(asio::any_io_executor ex) : exec(ex), timer(ex, clock_type::time_point::max()) {}

    // Engine thread: queue the event, wake the session on its own thread.
    void push(int index, engine_event&& ev) {
        {
            std::lock_guard lock(mu);
            q.emplace_back(index, std::move(ev));
        }
        asio::post(exec, [self = this_ptr.lock()] {
            if (self) self->timer.cancel();
        });
    }
    std::deque<std::pair<int, engine_event>> take() {
        std::lock_guard lock(mu);
        return std::exchange(q, {});
    }

    asio::any_io_executor exec;
    asio::steady_timer timer;      // waited on by the session; cancelled to wake it
    std::weak_ptr<generation_channel> this_ptr;
    std::mutex mu;
    std::deque<std::pair<int, engine_event>> q; // guarded by mu
    bool peer_gone = false;        // io thread only
    bool finished = false;         // io thread only
};

namespace {

std::string new_id(bool chat) {
    static std::atomic<uint64_t> n{0};
    static const uint64_t salt = uint64_t(clock_type::now().time_since_epoch().count());
    return fmt::format("{}-{:x}{:06x}", chat ? "chatcmpl" : "cmpl", salt & 0xffffffffffull, ++n);
}

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

// Runs f on the daemon's pool for blocking work (tokenizing, compiling a constraint, the disk)
// and resumes the calling coroutine on its own executor with f's result; what f throws is
// rethrown there. Without a pool (a test's bare daemon state), f runs here.
template <class F>
asio::awaitable<std::invoke_result_t<F&>> off_io(daemon_state& st, F f) {
    using result = std::invoke_result_t<F&>;
    if (!st.blocking) co_return f();
    co_return co_await asio::co_spawn(
        st.blocking->get_executor(), [&f]() -> asio::awaitable<result> { co_return f(); }, use_awaitable);
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
    remove_upload();
    held_.release();
    closed_ = true;
    error_code ec;
    socket_.shutdown(asio::socket_base::shutdown_both, ec);
    socket_.close(ec);
    deadline_.cancel();
    load_wait_.cancel();
    if (current_) current_->timer.cancel();
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

asio::awaitable<bool> session::wait_for_model(clock_type::time_point since) {
    auto self = shared_from_this();
    load_wait_.expires_at(since + std::chrono::duration_cast<clock_type::duration>(
                                      std::chrono::duration<double>(st_.cfg.load_wait_s)));
    while (!st_.ms && !st_.stopping && !closed_ && load_wait_.expiry() > clock_type::now()) {
        error_code ec; // operation_aborted: state_changed (or close) woke us; look again
        co_await load_wait_.async_wait(redirect_error(use_awaitable, ec));
    }
    co_return st_.ms || st_.stopping;
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
        remove_upload();
        if (!ec && !parser.is_done() && !upload) {
            const int64_t want = parser.content_length() ? int64_t(*parser.content_length()) : body_limit;
            if (!held_.reserve(std::min(want, body_limit)))
                refused = api_error{503, fmt::format("the daemon holds {} MiB of request bodies already "
                                                     "(max_inflight_mb); try again shortly", st_.cfg.max_inflight_mb),
                                    "server_error", "", "server_busy", 1};
        }
        const bool expect_continue = !ec && boost::beast::iequals(parser.get()[http::field::expect], "100-continue");
        if (!ec && !parser.is_done() && !refused) {
            // curl sends Expect: 100-continue for big bodies and waits a second without it
            if (expect_continue) {
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
                // The request as the handlers take it: its headers, and an empty body (the
                // bytes are in upload_file_).
                uploaded.base() = to_disk.get().base();
                uploaded.keep_alive(to_disk.get().keep_alive());
            } else if (!ec) {
                co_await http::async_read(socket_, buffer_, parser, redirect_error(use_awaitable, ec));
            }
        }
        set_deadline(0);
        if (closed_) break;
        version_ = 11;
        head_ = false;
        if (ec || refused) {
            if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
                ec == asio::error::operation_aborted)
                break;
            api_error e;
            if (refused) {
                e = *refused;
            } else if (ec == http::error::body_limit) {
                e = {413, fmt::format("the request body is larger than {} bytes", body_limit),
                     "invalid_request_error", "", "request_too_large"};
            } else if (ec == http::error::header_limit) {
                e = {431, "the request headers are too large"};
            } else {
                e = {400, "malformed HTTP request: " + ec.message()};
            }
            st_.met.request_done(
                upload ? "/v1/files" : parser.is_header_done() ? route_label(std::string(parser.get().target())) : "other",
                e.status);
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
            break;
        }
        busy_ = true;
        http::request<http::string_body> req = upload ? std::move(uploaded) : parser.release();
        version_ = req.version() == 10 ? 10 : 11;
        head_ = req.method() == http::verb::head;
        const std::string target(req.target());
        const std::string method(req.method_string());
        const auto t0 = clock_type::now();
        const bool keep = req.keep_alive() && !st_.stopping; // during the drain: one reply, then close
        bool ok = false;
        replied_ = false;
        // Whatever a handler throws (a bug, a field of the wrong type it read unchecked) ends
        // this request with a 400 or 500 that says so, never the connection without a reply.
        std::exception_ptr failure;
        try {
            if (tcp_) { // every request on a TCP listener: no browser, our own Host, a key where needed
                auto checked = check_tcp_request(*tcp_, as_view(req[http::field::host]), as_view(req[http::field::origin]),
                                                 as_view(req[http::field::authorization]), as_view(req["x-api-key"]));
                if (auto* e = std::get_if<api_error>(&checked)) {
                    st_.met.request_done("refused", e->status);
                    log->warn("refused {} {} over TCP: {}", method, target.substr(0, target.find('?')), e->message);
                    co_await write_reply(reply::of(*e), false);
                    break;
                }
                who_ = std::get<principal>(checked);
            }
            ok = co_await dispatch(req, keep, t0);
        } catch (...) {
            failure = std::current_exception();
        }
        if (failure) {
            const reply r = reply_for_exception(failure, method, target);
            if (!replied_ && !closed_) {
                st_.met.request_done(route_label(target), r.status);
                co_await write_reply(r, false);
            }
            ok = false;
        }
        if (closed_) break;
        busy_ = false;
        remove_upload();
        held_.release();
        if (!ok || !keep || st_.stopping) break;
    }
    close();
}

void session::remove_upload() {
    if (upload_file_.empty()) return;
    (void)::unlink(upload_file_.c_str()); // (gone already when the upload was kept: renamed)
    upload_file_.clear();
}

asio::awaitable<bool> session::dispatch(const http::request<http::string_body>& req, bool keep,
                                        clock_type::time_point t0) {
    auto self = shared_from_this();
    auto log = logger("server");
    const std::string target(req.target());
    const std::string method(req.method_string());
    std::optional<reply> r;
    if (batch_jobs::handles(target.substr(0, target.find('?')))) {
        const auto ct = req[http::field::content_type];
        // (an if, not ?:: GCC 12 destroys the other arm's temporaries around a co_await)
        if (st_.jobs) {
            r = co_await off_io(st_, [&] { return st_.jobs->handle(method, target, as_view(ct), req.body(), who_, upload_file_); });
        } else {
            r = reply::of(api_error{404,
                                    "batch jobs are off in this daemon: tandem batch's own, or one whose state_dir "
                                    "could not be had (its log says why)",
                                    "invalid_request_error", "", "not_found"});
        }
    } else {
        r = handle_simple(method, target, req.body(), st_);
    }
    // A request that needs the model while it loads (the one socket activation started
    // the daemon for, say) is held until it has loaded, and answered 503 only when that
    // takes longer than load_wait_s.
    if (r && r->model_loading && co_await wait_for_model(t0)) r = handle_simple(method, target, req.body(), st_);
    if (closed_) co_return false;
    bool ok = true;
    if (r) {
        st_.met.request_done(route_label(target), r->status);
        ok = co_await write_reply(*r, keep);
        log->debug("{} {} -> {} in {:.1f} ms", method, target, r->status, 1e3 * secs(clock_type::now() - t0));
    } else if (route_label(target) == "/v1/embeddings") {
        ok = co_await embeddings(req, keep);
        log->debug("{} {} done in {:.1f} ms", method, target, 1e3 * secs(clock_type::now() - t0));
    } else {
        ok = co_await generate(req, route_label(target) == "/v1/chat/completions", keep);
        log->debug("{} {} done in {:.1f} ms", method, target, 1e3 * secs(clock_type::now() - t0));
    }
    co_return ok;
}

asio::awaitable<void> session::watch_peer(std::shared_ptr<generation_channel> ch) {
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

namespace {

// Why the engine refused a request that passed the prompt check: its sequences cannot all
// reach max_tokens in the KV pool, even alone. The numbers, and what to change.
std::string too_long_message(const engine_request& r, const model_state& ms) {
    const int64_t n_prompt = int64_t(r.prompt.size());
    const int64_t max_tokens = std::clamp<int64_t>(r.max_tokens, 0, ms.n_ctx - n_prompt);
    const engine_stats es = ms.eng->stats();
    return fmt::format("the prompt ({} tokens) with {} sequence(s) of up to {} tokens each does not fit in the KV pool "
                       "({} pages of {} tokens) even with nothing else running: lower n, best_of or max_tokens, or "
                       "raise kv_cache_mb in tandemd.conf",
                       n_prompt, std::max(r.n, r.beam.width), max_tokens, es.n_pages_total, es.page_size);
}

} // namespace

asio::awaitable<std::variant<std::vector<std::vector<float>>, api_error>>
session::embed(std::vector<std::vector<token_id>> inputs, int32_t priority) {
    auto self = shared_from_this();
    model_state& ms = *st_.ms;
    auto ch = std::make_shared<generation_channel>(socket_.get_executor());
    ch->this_ptr = ch;
    std::vector<uint64_t> ids;
    auto cancel_all = [&] {
        for (uint64_t id : ids) ms.eng->cancel(id); // (those done already are no longer known: no-ops)
        ch->finished = true;
        current_.reset();
    };
    // A window of inputs in the engine at a time, the next as each one finishes: the engine's
    // queue is bounded (max_waiting), and a list of 2,048 inputs is not a daemon at capacity.
    const size_t window = size_t(std::max(1, st_.cfg.max_running));
    size_t next = 0, n_live = 0;
    auto submit_more = [&]() -> std::optional<api_error> {
        for (; next < inputs.size() && n_live < window; ++next, ++n_live) {
            engine_request r;
            r.prompt = inputs[next]; // (kept: a refused one is submitted again)
            r.embed = ms.bundle.cfg.pooling;
            r.priority = priority;
            const size_t i = next;
            const submit_result sr =
                ms.eng->submit(std::move(r), [ch, i](engine_event&& ev) { ch->push(int(i), std::move(ev)); });
            if (sr.status == submit_status::ok) {
                ids.push_back(sr.id);
                continue;
            }
            if (sr.status == submit_status::queue_full && n_live > 0) break; // again when one of ours ends
            api_error e = submit_error(sr.status);
            if (sr.status == submit_status::too_long) {
                e.message = fmt::format("input {} does not fit in the context or the KV cache", i);
                e.param = "input";
            }
            return e;
        }
        return std::nullopt;
    };
    if (auto e = submit_more()) {
        cancel_all();
        co_return *e;
    }
    current_ = ch;
    asio::co_spawn(socket_.get_executor(), watch_peer(ch), asio::detached);
    std::vector<std::vector<float>> out(inputs.size());
    size_t n_done = 0;
    error_code ec;
    while (n_done < out.size()) {
        if (ch->peer_gone || closed_) {
            cancel_all();
            co_return api_error{499, "the client went away", "server_error"};
        }
        auto events = ch->take();
        if (events.empty()) {
            ch->timer.expires_at(clock_type::time_point::max());
            co_await ch->timer.async_wait(redirect_error(use_awaitable, ec));
            continue;
        }
        for (auto& [i, ev] : events) {
            if (!ev.done) continue;
            ++n_done;
            --n_live;
            if (ev.finish_reason != "stop" || ev.embedding.empty()) {
                cancel_all();
                co_return api_error{500, fmt::format("the engine failed while embedding input {}{}", i,
                                                     ev.error.empty() ? "" : ": " + ev.error),
                                    "server_error"};
            }
            out[size_t(i)] = std::move(ev.embedding);
        }
        if (auto e = submit_more()) {
            cancel_all();
            co_return *e;
        }
    }
    ch->finished = true;
    current_.reset();
    co_return out;
}

asio::awaitable<std::optional<api_error>> session::retrieve(generation_plan& plan) {
    auto self = shared_from_this();
    model_state& ms = *st_.ms;
    const tokenizer& tok = *ms.bundle.tok;
    const pending_grounding& g = *plan.retrieval;
    const std::vector<document>& docs = g.ground.documents;
    if (auto e = embeddings_unavailable(ms)) { // passages are ranked by embeddings
        e->param = "documents";
        co_return e;
    }
    // Passages of a quarter of the room the messages leave (16 to 256 tokens).
    const int32_t room = g.budget - int32_t(grounded_prompt(g, {}, ms).size());
    constexpr int32_t min_passage = 16, max_passage = 256, tags = 24; // a passage's <document> tags, at most
    if (room < min_passage + tags) {
        co_return api_error{400,
                            fmt::format("the documents do not fit in the context ({} tokens for the prompt), and the "
                                        "messages leave no room for passages of them",
                                        g.budget),
                            "invalid_request_error", "documents", "context_length_exceeded"};
    }
    const int32_t passage_tokens = std::clamp(room / 4, min_passage, max_passage);
    const std::vector<passage> passages = co_await off_io(st_, [&] { return split_passages(docs, tok, passage_tokens); });
    if (int64_t(passages.size()) > st_.cfg.max_passages) // each is embedded: bounded work per request
        co_return api_error{400,
                            fmt::format("the documents split into {} passages, more than the {} this daemon embeds "
                                        "for one request (max_passages in tandemd.conf): send fewer or shorter "
                                        "documents",
                                        passages.size(), st_.cfg.max_passages),
                            "invalid_request_error", "documents", "too_many_passages"};
    if (!ms.passage_embeddings) // at most 64 MiB of vectors
        ms.passage_embeddings = std::make_unique<embedding_cache>(
            std::max<size_t>(256, (size_t(64) << 20) / (sizeof(float) * size_t(ms.bundle.cfg.n_embd))));
    embedding_cache& cache = *ms.passage_embeddings;
    const auto text_of = [&](const passage& p) {
        return docs[size_t(p.document)].text.substr(size_t(p.begin), size_t(p.end - p.begin));
    };
    // The question (its last max_prompt_tokens tokens) and every passage not embedded before.
    std::vector<std::vector<token_id>> inputs{tok.encode(g.query, true, false)};
    if (int32_t(inputs[0].size()) > ms.max_prompt_tokens)
        inputs[0].erase(inputs[0].begin(), inputs[0].end() - ms.max_prompt_tokens);
    if (inputs[0].empty()) inputs[0].push_back(tok.bos() >= 0 ? tok.bos() : 0);
    std::vector<size_t> missing;
    std::vector<std::vector<float>> embedded(passages.size());
    for (size_t i = 0; i < passages.size(); ++i) {
        if (const auto* known = cache.find(text_of(passages[i]))) {
            embedded[i] = *known;
            continue;
        }
        missing.push_back(i);
        inputs.push_back(tok.encode(text_of(passages[i]), true, false));
    }
    auto vectors = co_await embed(std::move(inputs), g.base.priority);
    if (auto* e = std::get_if<api_error>(&vectors)) co_return *e;
    auto& v = std::get<0>(vectors);
    for (size_t k = 0; k < missing.size(); ++k) { // (more passages than the cache holds: the vectors are kept here)
        embedded[missing[k]] = v[k + 1];
        cache.put(text_of(passages[missing[k]]), std::move(v[k + 1]));
    }

    // The best-ranked passages that fit, rendered in document order; while the prompt is over
    // the budget (the tags' estimate was short), the lowest-ranked goes.
    std::vector<size_t> chosen;
    int32_t used = 0;
    for (size_t i : rank_passages(v[0], embedded))
        if (used + passages[i].n_tokens + tags <= room) {
            chosen.push_back(i);
            used += passages[i].n_tokens + tags;
        }
    std::vector<document> shown;
    std::vector<token_id> prompt;
    for (; !chosen.empty(); chosen.pop_back()) {
        std::vector<size_t> order = chosen;
        std::sort(order.begin(), order.end()); // passages are in document order
        shown.clear();
        plan.passages.clear();
        for (size_t i : order) {
            const passage& p = passages[i];
            shown.push_back(passage_document(p, docs));
            plan.passages.push_back({docs[size_t(p.document)].id, p.document, p.start, p.stop});
        }
        prompt = grounded_prompt(g, shown, ms);
        if (int32_t(prompt.size()) <= g.budget) break;
    }
    if (chosen.empty()) {
        co_return api_error{400, "no passage of the documents fits beside the messages", "invalid_request_error",
                            "documents", "context_length_exceeded"};
    }
    logger("server")->debug("retrieval: {} of {} passages ({} embedded now) in a prompt of {} tokens", chosen.size(),
                            passages.size(), missing.size(), prompt.size());
    const pending_grounding pending = std::move(*plan.retrieval);
    plan.retrieval.reset();
    ground_plan(plan, pending, std::move(shown), std::move(prompt), ms);
    co_return std::nullopt;
}

asio::awaitable<bool> session::embeddings(const http::request<http::string_body>& req, bool keep_alive) {
    auto self = shared_from_this();
    const std::string route = "/v1/embeddings";
    std::variant<embedding_plan, api_error> parsed = co_await off_io(st_, [&]() -> std::variant<embedding_plan, api_error> {
        auto body = parse_request_body(req.body(), st_.cfg.max_json_depth);
        if (auto* e = std::get_if<api_error>(&body)) return *e;
        return parse_embeddings(std::get<json>(body), *st_.ms, st_.cfg);
    });
    if (auto* e = std::get_if<api_error>(&parsed)) {
        st_.met.request_done(route, e->status);
        co_return co_await write_reply(reply::of(*e), keep_alive);
    }
    const embedding_plan& plan = std::get<embedding_plan>(parsed);
    auto vectors = co_await embed(plan.inputs, plan.priority);
    if (auto* e = std::get_if<api_error>(&vectors)) {
        st_.met.request_done(route, e->status);
        if (e->status == 499) co_return false; // nobody to answer
        co_return co_await write_reply(reply::of(*e), keep_alive);
    }
    int64_t n_tokens = 0;
    for (const auto& in : plan.inputs) n_tokens += int64_t(in.size());
    st_.met.tokens(n_tokens, 0);
    st_.met.request_done(route, 200);
    const json out = embeddings_response(plan, std::get<0>(vectors), st_.ms->id);
    co_return co_await write_reply(reply::of_json(out), keep_alive);
}

asio::awaitable<bool> session::generate(const http::request<http::string_body>& req, bool chat, bool keep_alive) {
    auto self = shared_from_this();
    const auto t_received = clock_type::now();
    const std::string route = chat ? "/v1/chat/completions" : "/v1/completions";
    auto fail_with = [&](const api_error& e) -> asio::awaitable<bool> {
        st_.met.request_done(route, e.status);
        co_return co_await write_reply(reply::of(e), keep_alive);
    };
    model_state& ms = *st_.ms;
    // Off the io thread: the chat template, tokenizing up to max_body_bytes of text, and
    // compiling a constraint (up to grammar_compile_ms) would stall every other client.
    auto parsed = co_await off_io(st_, [&]() -> std::variant<generation_plan, api_error> {
        auto body = parse_request_body(req.body(), st_.cfg.max_json_depth);
        if (auto* e = std::get_if<api_error>(&body)) return *e;
        return parse_generation(std::get<json>(body), chat, ms, st_.cfg);
    });
    if (auto* e = std::get_if<api_error>(&parsed)) co_return co_await fail_with(*e);
    generation_plan& plan = std::get<generation_plan>(parsed);
    if (plan.retrieval) {
        const std::optional<api_error> e = co_await retrieve(plan);
        if (e && e->status == 499) { // the client left while its passages were embedded
            st_.met.request_done(route, 499);
            co_return false;
        }
        if (e) co_return co_await fail_with(*e);
    }

    auto ch = std::make_shared<generation_channel>(socket_.get_executor());
    ch->this_ptr = ch;
    std::vector<uint64_t> ids;
    for (size_t k = 0; k < plan.requests.size(); ++k) {
        const int first = int(k) * plan.n_seqs; // the request's sequence i is first + i
        const submit_result r = ms.eng->submit(plan.requests[k], [ch, first](engine_event&& ev) {
            const int choice = first + ev.index;
            ch->push(choice, std::move(ev));
        });
        if (r.status == submit_status::ok) {
            ids.push_back(r.id);
            continue;
        }
        for (uint64_t id : ids) ms.eng->cancel(id);
        ch->finished = true;
        api_error e = submit_error(r.status);
        if (r.status == submit_status::too_long) e.message = too_long_message(plan.requests[k], ms);
        co_return co_await fail_with(e);
    }
    current_ = ch;
    asio::co_spawn(socket_.get_executor(), watch_peer(ch), asio::detached);

    const std::string id = new_id(chat);
    std::vector<choice_state> cs(plan.n_sequences()); // the choices, when nothing ranks them
    if (plan.tools)
        for (auto& c : cs) c.parser.emplace(plan.tools->syntax);
    std::vector<clock_type::time_point> last_t(plan.n_sequences());
    size_t n_done = 0;
    bool write_failed = false;
    error_code ec;

    // HTTP/1.0 has no chunked encoding (RFC 7230 3.3.1): the stream's end is the connection's.
    const bool chunked = req.version() >= 11;
    auto send = [&](const std::string& data) -> asio::awaitable<void> {
        if (write_failed || closed_) co_return;
        set_deadline(st_.cfg.request_timeout_s); // a client that stops reading is dropped (and cancelled)
        if (chunked)
            co_await asio::async_write(socket_, http::make_chunk(asio::buffer(data)), redirect_error(use_awaitable, ec));
        else
            co_await asio::async_write(socket_, asio::buffer(data), redirect_error(use_awaitable, ec));
        set_deadline(0);
        if (ec) write_failed = true;
    };
    auto sse = [](const json& j) { return "data: " + dump(j) + "\n\n"; };

    http::response<http::empty_body> head{http::status::ok, version_};
    http::response_serializer<http::empty_body> sr{head};
    if (plan.stream) {
        head.set(http::field::server, "tandemd");
        head.set(http::field::content_type, "text/event-stream");
        head.set(http::field::cache_control, "no-cache");
        head.keep_alive(keep_alive && chunked);
        head.chunked(chunked);
        replied_ = true;
        co_await http::async_write_header(socket_, sr, redirect_error(use_awaitable, ec));
        if (ec) write_failed = true;
    }
    // echo: each choice starts with its prompt's text (with logprobs, when the prompt is scored)
    const auto echo_of = [&](size_t i) -> const std::string& { return plan.echo[i / size_t(plan.n_seqs)]; };
    if (!plan.echo.empty() && !plan.logprobs)
        for (size_t i = 0; i < cs.size(); ++i) {
            cs[i].text = echo_of(i);
            if (!plan.stream) continue;
            // (named: GCC 12 mishandles a braced temporary inside a co_await expression)
            const reply_delta d{echo_of(i), nullptr};
            const std::string chunk = sse(stream_chunk(id, ms.id, chat, int(i), cs[i], d, nullptr, "", plan.include_usage));
            co_await send(chunk);
        }

    while (n_done < cs.size()) {
        if (ch->peer_gone || write_failed || closed_) {
            for (uint64_t rid : ids) ms.eng->cancel(rid);
            for (const auto& c : cs)
                if (!c.done) st_.met.finished("cancelled");
            ch->finished = true;
            current_.reset();
            st_.met.request_done(route, 499); // nginx's "client closed request"
            logger("server")->debug("client went away; generation {} cancelled", id);
            co_return false;
        }
        // Wait only with the queue seen empty: a wake-up posted while we were writing is spent.
        auto batch = ch->take();
        if (batch.empty()) {
            ch->timer.expires_at(clock_type::time_point::max());
            co_await ch->timer.async_wait(redirect_error(use_awaitable, ec));
            continue;
        }
        for (auto& [i, ev] : batch) {
            choice_state& c = cs[size_t(i)];
            if (!ev.prompt.empty()) { // the prompt scored (echo with logprobs): every sequence of it starts so
                if (plan.echo.empty() || !plan.logprobs) continue;
                for (int j = i; j < i + plan.n_seqs; ++j) {
                    const json lp = add_prompt_logprobs(cs[size_t(j)], ev.prompt, echo_of(size_t(j)), *ms.bundle.tok);
                    if (!plan.stream) continue;
                    const reply_delta d{echo_of(size_t(j)), nullptr};
                    const std::string chunk = sse(stream_chunk(id, ms.id, chat, j, cs[size_t(j)], d, lp, "", plan.include_usage));
                    co_await send(chunk);
                }
                continue;
            }
            if (!ev.done) {
                if (c.n_generated == 0 && last_t[size_t(i)] == clock_type::time_point{})
                    st_.met.ttft(secs(ev.t - t_received));
                else
                    st_.met.inter_token(secs(ev.t - last_t[size_t(i)]));
                last_t[size_t(i)] = ev.t;
                json lp = nullptr;
                if (plan.logprobs) lp = add_logprobs(c, ev, chat, *ms.bundle.tok);
                c.text += ev.text;
                const reply_delta d = read_reply(c, ev.text, false);
                const json cites = add_citations(c, ev, plan); // (closed spans: their text was sent before)
                if (plan.stream && (!d.content.empty() || !d.tool_calls.is_null() || plan.logprobs || !cites.empty())) {
                    json chunk = stream_chunk(id, ms.id, chat, i, c, d, lp, "", plan.include_usage);
                    if (!cites.empty()) chunk["choices"][0]["delta"]["citations"] = cites;
                    co_await send(sse(chunk));
                }
                continue;
            }
            c.text += ev.text;
            const reply_delta d = read_reply(c, ev.text, true);
            c.finish_reason = ev.finish_reason;
            c.error = ev.error;
            c.n_prompt = ev.n_prompt;
            c.n_cached = ev.n_cached;
            c.n_generated = ev.n_generated;
            c.n_drafted = ev.n_draft_tokens;
            c.n_accepted = ev.n_accepted_tokens;
            c.score = ev.score;
            c.cumulative_logprob = ev.cumulative_logprob;
            c.done = true;
            ++n_done;
            if (ev.t_admitted != clock_type::time_point{}) st_.met.queue_time(secs(ev.t_admitted - t_received));
            st_.met.finished(ev.finish_reason);
            const json cites = add_citations(c, ev, plan);
            if (plan.stream) {
                json last = stream_chunk(id, ms.id, chat, i, c, d, nullptr, client_finish_reason(c), plan.include_usage);
                if (plan.beam) add_beam_fields(last["choices"][0], c);
                if (c.finish_reason == "error" && !c.error.empty())
                    last["error"] = {{"message", "the engine failed while generating: " + c.error}, {"type", "server_error"}};
                if (!cites.empty()) last["choices"][0]["delta"]["citations"] = cites;
                if (plan.cites()) last["choices"][0]["citations"] = c.citations; // all of them
                if (plan.strict) last["choices"][0]["unsupported"] = unsupported_sentences(c.text, c.citations);
                if (!plan.passages.empty()) last["passages"] = passages_json(plan);
                if (plan.truncate) // (a stream without include_usage has no usage to say it in)
                    last["choices"][0]["truncated_prompt_tokens"] = plan.truncated[size_t(i / plan.n_seqs)];
                co_await send(sse(last));
            }
        }
    }
    ch->finished = true;
    current_.reset();

    const json usage = usage_json(cs, plan);
    st_.met.tokens(usage["prompt_tokens"].get<int64_t>(), usage["completion_tokens"].get<int64_t>());
    const auto failed = std::find_if(cs.begin(), cs.end(), [](const choice_state& c) { return c.finish_reason == "error"; });
    if (failed != cs.end() && !plan.stream) {
        api_error e{500,
                    fmt::format("the engine failed while generating{}",
                                failed->error.empty() ? " (see the daemon's log)" : ": " + failed->error),
                    "server_error"};
        st_.met.request_done(route, 500);
        co_return co_await write_reply(reply::of(e), false);
    }
    st_.met.request_done(route, 200);
    if (!plan.stream) co_return co_await write_reply(reply::of_json(final_response(id, ms.id, plan, cs)), keep_alive);

    if (plan.include_usage) {
        json last = {{"id", id},
                     {"object", chat ? "chat.completion.chunk" : "text_completion"},
                     {"created", int64_t(std::time(nullptr))},
                     {"model", ms.id},
                     {"choices", json::array()},
                     {"usage", usage}};
        co_await send(sse(last));
    }
    co_await send("data: [DONE]\n\n");
    if (chunked && !write_failed && !closed_) {
        co_await asio::async_write(socket_, http::make_chunk_last(), redirect_error(use_awaitable, ec));
        if (ec) write_failed = true;
    }
    co_return !write_failed && chunked; // an HTTP/1.0 stream ends with the connection
}

} // namespace tandem::daemon
