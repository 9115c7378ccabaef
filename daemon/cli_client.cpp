// Daemon commands of `tandem`: a prompt (bare `tandem "..."`) and what `chat` and `status` share.
#include "daemon/cli_client.hpp"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <pthread.h>
#include <unistd.h>

namespace tandem::cli::client {

terminal::terminal()
    : in_tty(::isatty(STDIN_FILENO) == 1), out_tty(::isatty(STDOUT_FILENO) == 1), err_tty(::isatty(STDERR_FILENO) == 1),
      colour_ok(!std::getenv("NO_COLOR") &&
                std::string_view(std::getenv("TERM") ? std::getenv("TERM") : "") != "dumb") {}

std::string terminal::paint(bool tty, std::string_view code, std::string_view text) const {
    if (!tty || !colour_ok) return std::string(text);
    return "\033[" + std::string(code) + "m" + std::string(text) + "\033[0m";
}

std::atomic<bool> interrupted{false};

namespace {
void on_sigint(int) { interrupted = true; }
} // namespace

void install_sigint() {
    struct sigaction sa = {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);
}

bool sleep_unless_interrupted(double seconds) {
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
    while (!interrupted) {
        const auto now = std::chrono::steady_clock::now();
        if (now >= until) return true;
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(until - now, std::chrono::milliseconds(50)));
    }
    return false;
}

spinner::spinner(bool enabled) {
    if (!enabled) return;
    thread_ = std::thread([this] {
        // SIGINT goes to the main thread, whose blocking read it must interrupt.
        sigset_t block;
        sigemptyset(&block);
        sigaddset(&block, SIGINT);
        pthread_sigmask(SIG_BLOCK, &block, nullptr);
        static constexpr const char frames[] = {'|', '/', '-', '\\'};
        std::unique_lock lock(mu_);
        for (size_t i = 0; !stop_; ++i) {
            std::fprintf(stderr, "\r%c ", frames[i % 4]);
            std::fflush(stderr);
            cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; });
        }
        std::fputs("\r  \r", stderr);
        std::fflush(stderr);
    });
}

void spinner::stop() {
    if (!thread_.joinable()) return;
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
}

void spinner::say(const std::string& line) {
    std::lock_guard lock(mu_); // not between a frame's bytes
    std::fprintf(stderr, "%s%s\n", thread_.joinable() ? "\r" : "", line.c_str());
    std::fflush(stderr);
}

void message(const terminal& t, std::string_view text) {
    std::fprintf(stderr, "%s %.*s\n", t.err(red, "tandem:").c_str(), int(text.size()), text.data());
}

namespace {

// The socket a user instance of tandemd listens on, where the session has one.
std::string user_socket() {
    const char* xdg = std::getenv("XDG_RUNTIME_DIR");
    return xdg && *xdg ? std::string(xdg) + "/tandem/tandem.sock" : std::string();
}

constexpr std::string_view system_socket = "/run/tandem/tandem.sock";

std::string shell_word(const std::string& s) {
    if (s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+:@%=,") == std::string::npos)
        return s;
    std::string q = "'";
    for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return q + "'";
}

} // namespace

int report_unreachable(const terminal& t, const ipc::client& c, const ipc::response& r) {
    const std::string& path = c.socket_path();
    const bool at_user = path == user_socket(), at_system = path == system_socket;
    if (r.net == ipc::transport::denied) {
        std::string text = "permission denied on " + path;
        if (at_system)
            text += ": its group (usually `tandem`) may use it; ask to be added (sudo usermod -aG tandem $USER) or talk "
                    "to your own instance (systemctl --user start tandemd)";
        else
            text += ": its owner may let you in through its group, or start your own: tandemd --model PATH --socket "
                    "ANOTHER_PATH";
        message(t, text);
        return exit_unreachable;
    }
    // Services only where they listen: the user unit on $XDG_RUNTIME_DIR's socket, the system
    // unit on /run/tandem's; by hand, on this very socket.
    std::string text = "no daemon is listening on " + path + " (" + r.net_error + ").\n";
    if (at_user) text += "  Start one as a user service:   systemctl --user start tandemd\n";
    if (at_system) text += "  Start the system service:      sudo systemctl start tandemd\n";
    text += std::string(at_user || at_system ? "  or by hand:" : "  Start one by hand:") +
            (at_user || at_system ? "                    " : "             ") + "tandemd --model PATH" +
            (at_user ? "" : " --socket " + shell_word(path)) + "\n";
    text += "  (or choose another socket with --socket PATH or $TANDEM_SOCKET)";
    message(t, text);
    return exit_unreachable;
}

int report_http_error(const terminal& t, const ipc::response& r) {
    std::string what;
    try {
        const json j = json::parse(r.body);
        if (j.contains("error") && j["error"].is_object() && j["error"].contains("message"))
            what = j["error"]["message"].get<std::string>();
    } catch (const std::exception&) {}
    if (what.empty()) what = r.body.substr(0, 200);
    const bool busy = r.status == 429 || r.status == 503;
    const bool refused = r.status == 401 || r.status == 403;
    std::string line = std::string(busy      ? "the daemon is busy"
                                   : refused ? "the daemon does not let this user in"
                                             : "the daemon rejected the request") +
                       " (HTTP " + std::to_string(r.status) + ")";
    if (!what.empty()) line += ": " + what;
    if (!r.retry_after.empty()) line += " (retry after " + r.retry_after + " s)";
    message(t, line);
    return busy ? exit_busy : refused ? exit_unreachable : exit_rejected;
}

json request_body(const client_opts& o, bool chat, const std::vector<json>& messages, const std::string& prompt) {
    json body;
    if (!o.model.empty()) body["model"] = o.model;
    if (chat)
        body["messages"] = messages;
    else
        body["prompt"] = prompt;
    body["stream"] = !o.json;
    if (!o.json) body["stream_options"] = {{"include_usage", true}};
    if (o.max_tokens) body["max_tokens"] = *o.max_tokens;
    if (o.temp) body["temperature"] = *o.temp;
    if (o.top_p) body["top_p"] = *o.top_p;
    if (o.top_k) body["top_k"] = *o.top_k;
    if (o.seed) body["seed"] = *o.seed;
    if (!o.stop.empty()) body["stop"] = o.stop;
    return body;
}

namespace {

// The text a chunk (streamed) or a whole response carries, for chat or completions.
std::string text_of(const json& j, bool chat, bool delta) {
    if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return {};
    const json& c = j["choices"][0];
    const json* t = nullptr;
    if (!chat)
        t = c.contains("text") ? &c["text"] : nullptr;
    else if (const char* key = delta ? "delta" : "message"; c.contains(key) && c[key].contains("content"))
        t = &c[key]["content"];
    return t && t->is_string() ? t->get<std::string>() : std::string{};
}

std::string seconds_text(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g s", s);
    return buf;
}

// The daemon is busy or loading (429/503 with Retry-After, as tandemd answers while it loads
// the model under socket activation): waits as it asks, while the whole wait stays within
// --wait. False: give up now (no Retry-After, out of time, or Ctrl-C).
class busy_wait {
public:
    busy_wait(const terminal& t, const client_opts& o) : t_(t), o_(o), start_(std::chrono::steady_clock::now()) {}

    bool wait(const ipc::response& r, spinner& spin) {
        if (!r.reached() || (r.status != 429 && r.status != 503)) return false;
        char* end = nullptr;
        const double after = std::strtod(r.retry_after.c_str(), &end);
        if (r.retry_after.empty() || *end != '\0' || !(after >= 0)) return false;
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        if (waited + after > o_.wait_s) {
            if (waited > 0) note_ = "gave up after waiting " + seconds_text(waited) + " (--wait " + seconds_text(o_.wait_s) + ")";
            return false;
        }
        if (!told_) { // once, not on every retry
            told_ = true;
            spin.say(t_.err(red, "tandem:") + " the daemon is " + (r.status == 503 ? "not ready" : "busy") + " (HTTP " +
                     std::to_string(r.status) + "); waiting up to " + seconds_text(o_.wait_s) + " for it (--wait)");
        }
        return sleep_unless_interrupted(std::max(after, 0.05));
    }
    // Why it stopped waiting, for the error message; empty when it never waited.
    const std::string& note() const { return note_; }

private:
    const terminal& t_;
    const client_opts& o_;
    std::chrono::steady_clock::time_point start_;
    bool told_ = false;
    std::string note_;
};

int report_http_error_after(const terminal& t, const ipc::response& r, const busy_wait& w) {
    const int rc = report_http_error(t, r);
    if (!w.note().empty()) message(t, w.note());
    return rc;
}

} // namespace

posted post_json(const ipc::client& c, const terminal& t, const client_opts& o, std::string_view target,
                 const json& body) {
    busy_wait busy(t, o);
    ipc::response r;
    for (;;) {
        r = c.post(target, body.dump());
        spinner spin(false);
        if (!busy.wait(r, spin)) break;
    }
    if (interrupted) return {exit_interrupted, r};
    if (!r.reached()) return {report_unreachable(t, c, r), r};
    if (!r.ok()) return {report_http_error_after(t, r, busy), r};
    return {exit_ok, r};
}

reply send(const ipc::client& c, const terminal& t, const client_opts& o, const json& body, bool chat) {
    const std::string target = chat ? "/v1/chat/completions" : "/v1/completions";
    busy_wait busy(t, o);
    reply out;
    if (o.json) {
        const posted p = post_json(c, t, o, target, body);
        if (p.rc != exit_ok) return {p.rc, {}};
        const ipc::response& r = p.r;
        write_out(r.body);
        if (!r.body.ends_with('\n')) write_out("\n");
        try {
            out.text = text_of(json::parse(r.body), chat, false);
        } catch (const std::exception&) {}
        return out;
    }

    spinner spin(t.err_tty);
    bool done = false;
    std::string stream_error;
    auto on_event = [&](std::string_view data) {
        if (interrupted) return false;
        if (data == "[DONE]") {
            done = true;
            return true;
        }
        json j;
        try {
            j = json::parse(data);
        } catch (const std::exception&) {
            stream_error = "the daemon sent an event that is not JSON: " + std::string(data.substr(0, 80));
            return false;
        }
        if (j.contains("error")) {
            const json& e = j["error"];
            stream_error = e.is_object() && e.contains("message") && e["message"].is_string()
                               ? e["message"].get<std::string>() : e.dump();
            return false;
        }
        const std::string piece = text_of(j, chat, true);
        if (!piece.empty()) {
            spin.stop();
            write_out(piece);
            out.text += piece;
        }
        return true;
    };
    ipc::response r;
    do {
        r = c.post_stream(target, body.dump(), on_event);
    } while (busy.wait(r, spin));
    spin.stop();
    if (!out.text.empty() && !out.text.ends_with('\n')) write_out("\n");
    if (interrupted) {
        out.rc = exit_interrupted;
        return out;
    }
    if (!r.reached()) {
        if (r.net != ipc::transport::io) return {report_unreachable(t, c, r), {}};
        message(t, "lost the daemon: " + r.net_error);
        out.rc = exit_error;
        return out;
    }
    if (!r.ok()) return {report_http_error_after(t, r, busy), {}};
    if (!stream_error.empty()) {
        message(t, "the daemon stopped the reply: " + stream_error);
        out.rc = exit_error;
    } else if (!r.content_type.starts_with("text/event-stream")) {
        // A daemon may answer a stream request whole; print it all the same.
        try {
            out.text = text_of(json::parse(r.body), chat, false);
            write_out(out.text);
            if (!out.text.ends_with('\n')) write_out("\n");
        } catch (const std::exception&) {
            message(t, "the daemon's reply is not JSON");
            out.rc = exit_error;
        }
    } else if (!done) {
        message(t, "the daemon ended the stream early (no [DONE])");
        out.rc = exit_error;
    }
    return out;
}

namespace {

int cmd_prompt(const client_opts& o, CLI::App& app) {
    const terminal t;
    std::string prompt;
    for (const auto& w : o.prompt) prompt += (prompt.empty() ? "" : " ") + w;
    if (prompt.empty() && !t.in_tty) prompt = read_stdin();
    if (prompt.empty()) {
        std::fputs(app.help().c_str(), stderr);
        return exit_usage;
    }
    if (o.raw && !o.system.empty()) return usage_error(app, "--system: needs a chat request; drop --raw");
    const bool chat = !o.raw;
    std::vector<json> messages;
    if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
    messages.push_back({{"role", "user"}, {"content", prompt}});
    const ipc::client c(ipc::default_socket_path(o.socket));
    return send(c, t, o, request_body(o, chat, messages, prompt), chat).rc;
}

void add_request(CLI::App& a, client_opts& o) {
    a.add_option("--model", o.model, "model name for the request (default: the daemon's)");
    a.add_option("--system", o.system, "system prompt");
    a.add_option("--temp", o.temp, "temperature (0: greedy)")->check(between(0.0, 2.0, number::real));
    a.add_option("--top-p", o.top_p, "top-p")->check(between(0.0, 1.0, number::real));
    a.add_option("--top-k", o.top_k, "top-k (0: off)")->check(at_least(0));
    a.add_option("--seed", o.seed, "sampling seed");
    a.add_option("-n,--max-tokens", o.max_tokens, "most tokens to generate")->check(at_least(1));
    a.add_option("--stop", o.stop, "stop string (repeatable; \\n, \\t, \\r, \\\\ are escapes)")
        ->allow_extra_args(false)
        ->transform(unescape);
    a.add_option("--wait", o.wait_s,
                 "seconds to wait for a daemon that is busy or still loading (HTTP 429/503 with Retry-After) "
                 "before giving up with exit code 5 (default 60; 0: do not wait)")
        ->check(between(0, 86400, number::real));
    a.add_flag("--json", o.json, "print the daemon's response JSON instead of streaming text");
}

} // namespace

void add_socket(CLI::App& a, client_opts& o) {
    a.add_option("--socket", o.socket,
                 "daemon socket (default: $TANDEM_SOCKET, else $XDG_RUNTIME_DIR/tandem/tandem.sock, else "
                 "/run/tandem/tandem.sock)");
}

} // namespace tandem::cli::client

namespace tandem::cli {

void register_client(CLI::App& app, registry& reg) {
    using namespace client;
    auto o = std::make_shared<client_opts>();

    // Bare `tandem "prompt"`: the prompt words are the main app's positional arguments.
    add_socket(app, *o);
    add_request(app, *o);
    auto* raw = app.add_flag("--raw", o->raw, "a plain completion (/v1/completions) instead of a chat turn");
    auto* chat_flag = app.add_flag("--chat", o->chat, "a chat turn through the model's chat template (the default)");
    raw->excludes(chat_flag);
    app.add_option("prompt", o->prompt,
                   "prompt for the daemon (default: stdin when it is not a terminal); after --, words are the "
                   "prompt even when one is a command's name");

    auto* chat = app.add_subcommand("chat", "interactive chat with the daemon (/help inside for commands)");
    add_socket(*chat, *o);
    add_request(*chat, *o);
    reg.push_back({chat, [o] { return cmd_chat(*o); }});

    auto* status = app.add_subcommand("status", "the daemon's model, placement, load and metrics (--watch: live)");
    auto* top = app.add_subcommand("top", "a live view of the daemon: tandem status --watch");
    for (CLI::App* s : {status, top}) {
        add_socket(*s, *o);
        s->add_flag("--json", o->json, "print one JSON object (with --watch: one a line)");
        CLI::Option* watch = nullptr;
        if (s == status) watch = s->add_flag("--watch", o->watch, "a live view, refreshed every --interval seconds");
        auto* interval = s->add_option("--interval", o->interval_s, "seconds between samples (default 2)")
                             ->check(between(0.05, 86400, number::real));
        auto* count = s->add_option("--count", o->count, "samples to show, then exit (default 0: until Ctrl-C)")
                          ->check(at_least(0));
        if (watch) {
            interval->needs(watch);
            count->needs(watch);
        }
    }
    reg.push_back({status, [o] { return cmd_status(*o); }});
    reg.push_back({top, [o] {
                       o->watch = true;
                       return cmd_status(*o);
                   }});

    reg.push_back({&app, [o, &app] { return cmd_prompt(*o, app); }});
}

} // namespace tandem::cli
