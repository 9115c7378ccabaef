// One request and its answer as a handler sees them: the request (headers, body, who sent it)
// and a responder, the connection's side (the session) that a handler writes to: a whole
// reply, or a stream of pieces. Handlers know nothing of sockets, deadlines or HTTP framing.
#pragma once

#include "runtime/prelude.hpp"

#include "daemon/access.hpp"
#include "daemon/reply.hpp"
#include "runtime/engine.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace tandem::daemon {

namespace asio = boost::asio;
namespace http = boost::beast::http;

struct daemon_state;
struct model_state;
struct upstream_section;

// Engine events of one request on their way from the engine thread to the handler, which
// waits on the timer; the session marks the peer gone when the client hangs up.
struct generation_channel {
    explicit generation_channel(asio::any_io_executor ex)
        : exec(ex), timer(ex, std::chrono::steady_clock::time_point::max()) {}

    // Engine thread: queue the event, wake the handler on its own thread.
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
    static std::shared_ptr<generation_channel> make(asio::any_io_executor ex) {
        auto ch = std::make_shared<generation_channel>(ex);
        ch->this_ptr = ch;
        return ch;
    }

    asio::any_io_executor exec;
    asio::steady_timer timer;      // waited on by the handler; cancelled to wake it
    std::weak_ptr<generation_channel> this_ptr;
    std::mutex mu;
    std::deque<std::pair<int, engine_event>> q; // guarded by mu
    bool peer_gone = false;        // io thread only
    bool finished = false;         // io thread only
};

// The connection's side of an exchange: what a handler may do with it. All on the io thread.
class responder {
public:
    virtual ~responder() = default;
    virtual asio::any_io_executor executor() = 0;
    // A whole reply (`last`: the connection closes after it); false when the connection is
    // gone or closes.
    virtual asio::awaitable<bool> send(const reply& r, bool last = false) = 0;
    // A stream: its head (200 with this content type), pieces as they come, its end. Each
    // returns false once the connection is gone.
    virtual asio::awaitable<bool> open_stream(std::string_view content_type) = 0;
    virtual asio::awaitable<bool> send_piece(const std::string& data) = 0;
    virtual asio::awaitable<bool> close_stream() = 0;
    // The channel is told (peer_gone, its timer cancelled) when the client hangs up while the
    // handler waits on the engine; `current` while it runs, so that closing the session wakes it.
    virtual void watch_peer(std::shared_ptr<generation_channel> ch) = 0;
    virtual void current(std::shared_ptr<generation_channel> ch) = 0;
    virtual bool closed() const = 0;
};

// The request a handler answers.
struct request_view {
    const http::request<http::string_body>& http;
    std::string method;               // HEAD arrives as GET (the session drops the body)
    std::string path;                 // without the query
    std::map<std::string, std::string> query;    // decoded
    std::map<std::string, std::string> params;   // the route's {placeholders}
    const principal& who;
    const std::string& upload_file;   // POST /v1/files: the body, on disk
    std::chrono::steady_clock::time_point received;
    std::string_view header(std::string_view name) const {
        const auto v = http[boost::beast::string_view(name.data(), name.size())];
        return {v.data(), v.size()};
    }
};

// A handler: answers one request through `out`; returns whether the connection may take
// another request (false: it is gone, or must close).
struct exchange {
    const request_view& req;
    responder& out;
    daemon_state& st;
    std::string label;                // the route's metrics label
    model_state* ms = nullptr;        // the model the request named, held while it runs (null: st.ms)
    const upstream_section* overflow = nullptr; // its upstream for a request its queue refuses
};
// The request's model: the one it named (the session holds it), else the daemon's default.
model_state& model_of(const exchange& x);
using handler_fn = std::function<asio::awaitable<bool>(exchange&)>;

// Runs f on the daemon's pool for blocking work (tokenizing, compiling a constraint, the disk)
// and resumes the calling coroutine on its own executor with f's result; what f throws is
// rethrown there. Without a pool (a bare daemon state: tests, fuzzers), f runs here.
template <class F>
asio::awaitable<std::invoke_result_t<F&>> off_io(asio::thread_pool* pool, F f) {
    using result = std::invoke_result_t<F&>;
    if (!pool) co_return f();
    co_return co_await asio::co_spawn(
        pool->get_executor(), [&f]() -> asio::awaitable<result> { co_return f(); }, asio::use_awaitable);
}

} // namespace tandem::daemon
