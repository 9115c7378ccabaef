// Forwarding to an upstream (daemon/upstream.hpp): one libcurl transfer per request on a thread
// of its own, its bytes handed to the io thread as they come.
#include "daemon/upstream.hpp"

#include "daemon/fields.hpp"
#include "daemon/model_host.hpp"
#include "daemon/state.hpp"
#include "runtime/log.hpp"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <curl/curl.h>
#include <fmt/format.h>

#include <atomic>
#include <deque>
#include <fstream>
#include <mutex>
#include <thread>

namespace tandem::daemon {
namespace {

// One transfer, shared by its thread and the handler.
struct upstream_call {
    std::shared_ptr<generation_channel> ch; // its timer wakes the handler
    std::mutex mu;
    std::deque<std::string> chunks;  // guarded by mu
    long status = 0;                 // guarded by mu; 0 until the head came
    std::string content_type;        // guarded by mu
    bool done = false;               // guarded by mu
    CURLcode rc = CURLE_OK;          // guarded by mu
    std::string error;               // guarded by mu: curl's words for a failure
    std::atomic<bool> cancel{false};
    std::shared_ptr<std::atomic<bool>> finished = std::make_shared<std::atomic<bool>>(false); // its thread ended
    CURL* handle = nullptr;          // the transfer's thread only

    void wake() {
        asio::post(ch->exec, [c = ch] { c->timer.cancel(); });
    }
};

size_t on_data(char* p, size_t size, size_t n, void* user) {
    auto* call = static_cast<upstream_call*>(user);
    if (call->cancel) return 0; // aborts the transfer
    {
        std::lock_guard lock(call->mu);
        if (call->status == 0) { // the head is in: its status and type go with the first bytes
            curl_easy_getinfo(call->handle, CURLINFO_RESPONSE_CODE, &call->status);
            char* ct = nullptr;
            curl_easy_getinfo(call->handle, CURLINFO_CONTENT_TYPE, &ct);
            if (ct) call->content_type = ct;
        }
        call->chunks.emplace_back(p, size * n);
    }
    call->wake();
    return size * n;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    return static_cast<upstream_call*>(user)->cancel ? 1 : 0;
}

std::string read_key(const std::string& path) {
    std::ifstream in(path);
    std::string key;
    std::getline(in, key);
    while (!key.empty() && (key.back() == '\r' || key.back() == ' ')) key.pop_back();
    return key;
}

void run_transfer(std::shared_ptr<upstream_call> call, std::string url, std::string body, std::string key,
                  std::string accept, double timeout_s) {
    static const bool init = [] { return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK; }();
    (void)init;
    CURL* h = curl_easy_init();
    call->handle = h;
    curl_slist* headers = nullptr;
    headers = curl_slist_append(headers, "Content-Type: application/json");
    headers = curl_slist_append(headers, ("Accept: " + (accept.empty() ? std::string("*/*") : accept)).c_str());
    if (!key.empty()) headers = curl_slist_append(headers, ("Authorization: Bearer " + key).c_str());
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(body.size()));
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, long(std::min(timeout_s, 10.0) * 1000));
    // Silent for timeout_s (no byte): given up, a 504 (a stream's pauses between tokens are short).
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, long(std::max(1.0, timeout_s)));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, call.get());
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L); // the progress callback notices a cancel
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, call.get());
    const CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    char* ct = nullptr;
    curl_easy_getinfo(h, CURLINFO_CONTENT_TYPE, &ct);
    {
        std::lock_guard lock(call->mu);
        call->rc = rc;
        if (rc != CURLE_OK) call->error = curl_easy_strerror(rc);
        if (call->status == 0) call->status = status;
        if (ct && call->content_type.empty()) call->content_type = ct;
        call->done = true;
    }
    curl_slist_free_all(headers);
    curl_easy_cleanup(h);
    call->wake();
    call->finished->store(true);
}

api_error transfer_error(const upstream_section& u, CURLcode rc, const std::string& what) {
    const bool timeout = rc == CURLE_OPERATION_TIMEDOUT;
    return api_error{timeout ? 504 : 502,
                     fmt::format("upstream '{}' ({}) {}: {}", u.name, u.base_url,
                                 timeout ? "did not answer in time" : "could not be reached", what),
                     "server_error", "", timeout ? "upstream_timeout" : "upstream_unreachable"};
}

} // namespace

bool forwardable_path(std::string_view path) {
    return path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/embeddings";
}

std::optional<api_error> tandem_only_field(const json& body, const upstream_section& u) {
    static const char* own[] = {"documents",       "citation_options", "whitespace",     "speculative",
                                "use_beam_search", "length_penalty",   "early_stopping", "grammar"};
    if (!body.is_object()) return std::nullopt;
    for (const char* f : own)
        if (body.contains(f))
            return bad(fmt::format("'{}' is a Tandem extension, and this model is served by upstream '{}', which does "
                                   "not take it (grounding, Tandem's constraint extensions and beam search run only "
                                   "on local models)",
                                   f, u.name),
                       f);
    return std::nullopt;
}

asio::awaitable<bool> forward_upstream(exchange& x, const upstream_section& u) {
    auto log = logger("server");
    const auto refuse = [&](const api_error& e) -> asio::awaitable<bool> {
        x.st.met.request_done(x.label, e.status);
        const reply r = reply::of(e);
        co_return co_await x.out.send(r);
    };
    if (!forwardable_path(x.req.path))
        co_return co_await refuse(bad(fmt::format("{} is not forwarded to upstream '{}': it takes /v1/chat/completions, "
                                                  "/v1/completions and /v1/embeddings",
                                                  x.req.path, u.name),
                                      "model"));
    {
        auto parsed = parse_request_body(x.req.http.body(), x.st.cfg.max_json_depth);
        if (auto* e = std::get_if<api_error>(&parsed)) co_return co_await refuse(*e);
        if (auto e = tandem_only_field(std::get<json>(parsed), u)) co_return co_await refuse(*e);
    }
    auto call = std::make_shared<upstream_call>();
    call->ch = generation_channel::make(x.out.executor());
    const std::string key = u.api_key_file.empty() ? std::string() : read_key(u.api_key_file);
    std::thread t(run_transfer, call, u.base_url + x.req.path, std::string(x.req.http.body()), key,
                  std::string(x.req.header("Accept")), u.timeout_s);
    // However the handler ends (the client gone, the daemon stopping), the transfer is
    // cancelled; its thread ends at its next byte or progress call (about a second when the
    // upstream is silent), joined by the model host, not here on the io thread.
    struct joiner {
        upstream_call& c;
        std::thread& t;
        model_host* host;
        ~joiner() {
            c.cancel = true;
            if (host && !c.finished->load()) host->keep_thread(std::move(t), c.finished);
            else if (t.joinable()) t.join();
        }
    } join{*call, t, x.st.models};
    x.out.current(call->ch);
    x.out.watch_peer(call->ch);

    bool streaming = false, whole = false, ok = true;
    bool timed_out = false; // the upstream silent past timeout_s: cancelled here, answered 504
    const auto idle_limit = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(u.timeout_s));
    auto last_byte = std::chrono::steady_clock::now();
    std::string body; // a reply that is not a stream, collected
    long status = 0;
    std::string ctype;
    for (;;) {
        std::deque<std::string> chunks;
        bool done = false;
        CURLcode rc = CURLE_OK;
        std::string err;
        {
            std::lock_guard lock(call->mu);
            chunks = std::exchange(call->chunks, {});
            done = call->done;
            rc = call->rc;
            err = call->error;
        }
        if (x.out.closed() || call->ch->peer_gone) { // the client left: the upstream request is cancelled
            call->cancel = true;
            log->info("client gone: cancelling the request forwarded to upstream {}", u.name);
            x.st.met.request_done(x.label, 499);
            co_return false;
        }
        if (!chunks.empty()) last_byte = std::chrono::steady_clock::now();
        if (timed_out && rc == CURLE_ABORTED_BY_CALLBACK) rc = CURLE_OPERATION_TIMEDOUT;
        for (std::string& c : chunks) {
            if (!streaming && !whole) {
                // The first bytes: a 2xx event stream is passed through as it comes, anything
                // else is collected and sent whole with the upstream's status.
                {
                    std::lock_guard lock(call->mu);
                    status = call->status;
                    ctype = call->content_type;
                }
                if (status == 0) status = 200;
                if (status == 200 && ctype.starts_with("text/event-stream")) {
                    streaming = true;
                    if (!co_await x.out.open_stream(ctype)) ok = false;
                } else {
                    whole = true;
                }
            }
            if (streaming && ok) {
                if (!co_await x.out.send_piece(c)) ok = false;
            } else if (whole) {
                body += c;
            }
        }
        if (!ok) { // the client stopped reading
            call->cancel = true;
            x.st.met.request_done(x.label, 499);
            co_return false;
        }
        if (done) {
            {
                std::lock_guard lock(call->mu);
                status = call->status;
                if (ctype.empty()) ctype = call->content_type;
            }
            if (streaming) {
                if (rc != CURLE_OK) { // cut off mid-stream: the client is told in the stream
                    const api_error e = transfer_error(u, rc, err);
                    co_await x.out.send_piece("data: " + error_body(e) + "\n\n");
                }
                x.st.met.request_done(x.label, 200);
                co_return co_await x.out.close_stream();
            }
            if (rc != CURLE_OK && body.empty()) {
                log->warn("upstream {}: {}", u.name, err);
                co_return co_await refuse(transfer_error(u, rc, err));
            }
            reply r;
            r.status = int(status ? status : 502);
            r.content_type = ctype.empty() ? "application/json" : ctype;
            r.body = std::move(body);
            x.st.met.request_done(x.label, r.status);
            co_return co_await x.out.send(r);
        }
        // Waits only when nothing came while this handler was writing (a wake posted then found
        // no wait to cancel): the check and the wait's start run with no suspension between.
        {
            std::lock_guard lock(call->mu);
            if (!call->chunks.empty() || call->done) continue;
        }
        if (x.out.closed() || call->ch->peer_gone) continue;
        boost::system::error_code ec;
        call->ch->timer.expires_at(timed_out ? std::chrono::steady_clock::time_point::max() : last_byte + idle_limit);
        co_await call->ch->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        if (!ec && !timed_out && std::chrono::steady_clock::now() - last_byte >= idle_limit) {
            log->warn("upstream {}: nothing for {} s (timeout_s): cancelled", u.name, u.timeout_s);
            timed_out = true;
            call->cancel = true; // the transfer ends at its next progress call, then answered below
        }
    }
}

} // namespace tandem::daemon
