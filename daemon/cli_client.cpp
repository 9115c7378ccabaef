// Daemon commands of `tandem`: a prompt (bare `tandem "..."`), `chat` and `status`, over tandemd's socket.
#include "daemon/cli.hpp"

#include "ipc/client.hpp"

#include <nlohmann/json.hpp>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include <pthread.h>
#include <unistd.h>

namespace tandem::cli {

namespace {

using json = nlohmann::json;

// Exit codes of the daemon commands (README "Using the daemon" lists them too).
enum exit_code : int {
    exit_ok = 0,
    exit_error = 1,       // anything else: a broken stream, a bad reply, a local failure
    exit_usage = 2,       // bad command line
    exit_unreachable = 3, // no daemon on the socket, or no permission to use it
    exit_rejected = 4,    // the daemon answered with an error (4xx/5xx other than below)
    exit_busy = 5,        // 429/503: over capacity or still loading; try again later
    exit_interrupted = 130,
};

struct client_opts {
    std::string socket, model, system;
    std::vector<std::string> prompt; // words, joined by spaces
    std::optional<double> temp, top_p;
    std::optional<int64_t> top_k, seed, max_tokens;
    std::vector<std::string> stop;
    bool json = false, raw = false, chat = false;
};

// Colour and the spinner only when a person is watching: a TTY, and NO_COLOR unset.
struct terminal {
    bool in_tty = ::isatty(STDIN_FILENO) == 1;
    bool out_tty = ::isatty(STDOUT_FILENO) == 1;
    bool err_tty = ::isatty(STDERR_FILENO) == 1;
    bool colour_ok = !std::getenv("NO_COLOR") && std::string_view(std::getenv("TERM") ? std::getenv("TERM") : "") != "dumb";

    std::string out(std::string_view code, std::string_view text) const { return paint(out_tty, code, text); }
    std::string err(std::string_view code, std::string_view text) const { return paint(err_tty, code, text); }

private:
    std::string paint(bool tty, std::string_view code, std::string_view text) const {
        if (!tty || !colour_ok) return std::string(text);
        return "\033[" + std::string(code) + "m" + std::string(text) + "\033[0m";
    }
};

constexpr std::string_view bold = "1", dim = "2", red = "31", green = "32", yellow = "33";

// Set by SIGINT during `tandem chat`: stops the reply being streamed, not the chat.
std::atomic<bool> interrupted{false};

// A spinner on stderr until the first token arrives (or the request ends).
class spinner {
public:
    explicit spinner(bool enabled) {
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
    ~spinner() { stop(); }
    void stop() {
        if (!thread_.joinable()) return;
        {
            std::lock_guard lock(mu_);
            stop_ = true;
        }
        cv_.notify_one();
        thread_.join();
    }

private:
    std::thread thread_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
};

void message(const terminal& t, std::string_view text) {
    std::fprintf(stderr, "%s %.*s\n", t.err(red, "tandem:").c_str(), int(text.size()), text.data());
}

int report_unreachable(const terminal& t, const ipc::client& c, const ipc::response& r) {
    if (r.net == ipc::transport::denied) {
        message(t, "permission denied on " + c.socket_path() + ": its group (usually `tandem`) may use it; ask to be " +
                       "added (sudo usermod -aG tandem $USER) or talk to your own instance (systemctl --user start tandemd)");
        return exit_unreachable;
    }
    message(t, "no daemon is listening on " + c.socket_path() + " (" + r.net_error + ").\n" +
                   "  Start one as a user service:   systemctl --user start tandemd\n" +
                   "  or the system service:         sudo systemctl start tandemd\n" +
                   "  or by hand:                    tandemd --model PATH\n" +
                   "  (or choose another socket with --socket PATH or $TANDEM_SOCKET)");
    return exit_unreachable;
}

// An HTTP error from the daemon: OpenAI's {"error": {"message": ...}} when it is there.
int report_http_error(const terminal& t, const ipc::response& r) {
    std::string what;
    try {
        const json j = json::parse(r.body);
        if (j.contains("error") && j["error"].is_object() && j["error"].contains("message"))
            what = j["error"]["message"].get<std::string>();
    } catch (const std::exception&) {}
    if (what.empty()) what = r.body.substr(0, 200);
    const bool busy = r.status == 429 || r.status == 503;
    std::string line = "the daemon " + std::string(busy ? "is busy" : "rejected the request") + " (HTTP " +
                       std::to_string(r.status) + ")";
    if (!what.empty()) line += ": " + what;
    if (!r.retry_after.empty()) line += " (retry after " + r.retry_after + " s)";
    message(t, line);
    return busy ? exit_busy : exit_rejected;
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

struct reply {
    int rc = exit_ok;
    std::string text;
};

// Sends one request and prints the reply: streamed token by token, or with --json the
// daemon's response object as it is.
reply send(const ipc::client& c, const terminal& t, const client_opts& o, const json& body, bool chat) {
    const std::string target = chat ? "/v1/chat/completions" : "/v1/completions";
    reply out;
    if (o.json) {
        const ipc::response r = c.post(target, body.dump());
        if (!r.reached()) return {report_unreachable(t, c, r), {}};
        if (!r.ok()) return {report_http_error(t, r), {}};
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
    const ipc::response r = c.post_stream(target, body.dump(), [&](std::string_view data) {
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
    });
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
    if (!r.ok()) return {report_http_error(t, r), {}};
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

int cmd_prompt(const client_opts& o, CLI::App& app) {
    const terminal t;
    std::string prompt;
    for (const auto& w : o.prompt) prompt += (prompt.empty() ? "" : " ") + w;
    if (prompt.empty() && !t.in_tty) prompt = read_stdin();
    if (prompt.empty()) {
        std::fputs(app.help().c_str(), stderr);
        return exit_usage;
    }
    if (o.raw && !o.system.empty()) {
        message(t, "--system needs a chat request; drop --raw");
        return exit_usage;
    }
    const bool chat = !o.raw;
    std::vector<json> messages;
    if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
    messages.push_back({{"role", "user"}, {"content", prompt}});
    const ipc::client c(ipc::default_socket_path(o.socket));
    return send(c, t, o, request_body(o, chat, messages, prompt), chat).rc;
}

void on_sigint(int) { interrupted = true; }

int cmd_chat(const client_opts& o) {
    const terminal t;
    const ipc::client c(ipc::default_socket_path(o.socket));
    // Ctrl-C stops the reply (or clears the line), not the chat: no SA_RESTART, so a blocked
    // read returns and sees the flag.
    struct sigaction sa = {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);

    std::string system = o.system;
    std::vector<json> history;
    auto help = [&] {
        std::printf("%s\n", t.out(dim, "/reset clears the history, /system TEXT sets the system prompt (empty: none), "
                                       "/quit ends (or Ctrl-D); Ctrl-C stops a reply").c_str());
        std::fflush(stdout);
    };
    if (t.in_tty) {
        std::printf("%s\n", t.out(dim, "tandem chat on " + c.socket_path() + " (/help for commands)").c_str());
        std::fflush(stdout);
    }
    int last_rc = exit_ok;
    for (;;) {
        if (t.in_tty) {
            std::printf("%s", t.out(std::string(bold) + ";" + std::string(green), "> ").c_str());
            std::fflush(stdout);
        }
        std::string line;
        interrupted = false;
        if (!std::getline(std::cin, line)) {
            if (interrupted) { // Ctrl-C at the prompt: a fresh line
                std::cin.clear();
                std::clearerr(stdin);
                std::printf("\n");
                continue;
            }
            if (t.in_tty) std::printf("\n");
            break;
        }
        if (line.empty()) continue;
        if (line[0] == '/') {
            const size_t sp = line.find(' ');
            const std::string cmd = line.substr(0, sp);
            const std::string arg = sp == std::string::npos ? "" : line.substr(sp + 1);
            if (cmd == "/quit" || cmd == "/exit") break;
            if (cmd == "/help") {
                help();
            } else if (cmd == "/reset") {
                history.clear();
                std::printf("%s\n", t.out(dim, "(history cleared)").c_str());
            } else if (cmd == "/system") {
                system = arg;
                std::printf("%s\n", t.out(dim, arg.empty() ? "(no system prompt)" : "(system prompt set)").c_str());
            } else {
                std::printf("%s\n", t.out(yellow, "unknown command " + cmd + "; /help lists them").c_str());
            }
            std::fflush(stdout);
            continue;
        }
        history.push_back({{"role", "user"}, {"content", line}});
        std::vector<json> messages;
        if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
        messages.insert(messages.end(), history.begin(), history.end());
        reply r = send(c, t, o, request_body(o, true, messages, ""), true);
        if (r.rc == exit_ok || r.rc == exit_interrupted) {
            // An interrupted reply stays in the history as far as it got, as it was shown.
            history.push_back({{"role", "assistant"}, {"content", r.text}});
            last_rc = exit_ok;
            continue;
        }
        history.pop_back(); // the turn did not happen
        if (r.rc == exit_unreachable) return r.rc;
        last_rc = r.rc;
    }
    return last_rc;
}

// Prometheus text exposition: metric name -> value, summed over label sets.
std::map<std::string, double> parse_metrics(const std::string& text) {
    std::map<std::string, double> m;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        size_t name_end = line.find_first_of("{ ");
        if (name_end == std::string::npos) continue;
        const std::string name = line.substr(0, name_end);
        size_t value_at = name_end;
        if (line[name_end] == '{') {
            const size_t close = line.find('}', name_end);
            if (close == std::string::npos) continue;
            value_at = close + 1;
        }
        std::istringstream vs(line.substr(value_at));
        double v = 0;
        if (vs >> v) m[name] += v;
    }
    return m;
}

std::optional<double> metric(const std::map<std::string, double>& m, std::initializer_list<const char*> names) {
    for (const char* n : names)
        if (auto it = m.find(n); it != m.end()) return it->second;
    return std::nullopt;
}

std::string num(double v) {
    char buf[64];
    if (std::fabs(v) < 1e15 && v == std::floor(v)) // an integer that fits: print it whole
        std::snprintf(buf, sizeof buf, "%lld", (long long)v);
    else
        std::snprintf(buf, sizeof buf, "%.3g", v);
    return buf;
}

// "mean of a histogram" in ms, from its _sum and _count.
std::optional<double> mean_ms(const std::map<std::string, double>& m, const std::string& base) {
    auto s = m.find(base + "_sum"), c = m.find(base + "_count");
    if (s == m.end() || c == m.end() || c->second <= 0) return std::nullopt;
    return 1000.0 * s->second / c->second;
}

std::string scalar_text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// "prefill=gpu decode=cpu (policy auto)", from a string or an object of those keys.
std::string placement_text(const json& p) {
    if (!p.is_object()) return scalar_text(p);
    std::string s;
    for (const char* k : {"prefill", "decode"})
        if (p.contains(k)) s += (s.empty() ? "" : " ") + std::string(k) + "=" + scalar_text(p[k]);
    for (const auto& [k, v] : p.items())
        if (k != "prefill" && k != "decode" && k != "policy") s += (s.empty() ? "" : " ") + k + "=" + scalar_text(v);
    if (p.contains("policy")) s += " (policy " + scalar_text(p["policy"]) + ")";
    return s;
}

std::string duration_text(double s) {
    char buf[64];
    if (s < 120)
        std::snprintf(buf, sizeof buf, "%.0f s", s);
    else if (s < 7200)
        std::snprintf(buf, sizeof buf, "%.0f min", s / 60);
    else
        std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
    return buf;
}

int cmd_status(const client_opts& o) {
    const terminal t;
    const ipc::client c(ipc::default_socket_path(o.socket));
    const ipc::response health = c.get("/health");
    if (!health.reached()) return report_unreachable(t, c, health);
    const ipc::response models = c.get("/v1/models");
    const ipc::response metrics = c.get("/metrics");
    // tandemd's extension: placement, threads, uptime (older or other servers: 404, skipped).
    const ipc::response ext = c.get("/v1/tandem/status");

    auto parse = [](const ipc::response& r) {
        try {
            return json::parse(r.body);
        } catch (const std::exception&) {
            return json();
        }
    };
    const json hj = parse(health), mj = models.ok() ? parse(models) : json();
    const json xj = ext.ok() ? parse(ext) : json();
    const auto m = metrics.ok() ? parse_metrics(metrics.body) : std::map<std::string, double>{};
    const bool ready = health.status == 200;
    std::string state = ready ? "ready" : health.status == 503 ? "loading" : "unhealthy";
    if (hj.is_object() && hj.contains("status") && hj["status"].is_string()) state = hj["status"].get<std::string>();

    std::vector<std::string> ids;
    json placement;
    std::string model_meta;
    if (xj.is_object() && xj.contains("placement")) placement = xj["placement"];
    if (placement.is_null() && hj.is_object() && hj.contains("placement")) placement = hj["placement"];
    if (mj.is_object() && mj.contains("data") && mj["data"].is_array())
        for (const auto& d : mj["data"]) {
            if (d.contains("id") && d["id"].is_string()) ids.push_back(d["id"].get<std::string>());
            if (placement.is_null() && d.contains("placement")) placement = d["placement"];
            if (model_meta.empty() && d.contains("meta") && d["meta"].is_object()) {
                const json& meta = d["meta"];
                for (const char* k : {"arch", "n_ctx", "path"})
                    if (meta.contains(k)) model_meta += (model_meta.empty() ? "" : ", ") + std::string(k) + " " + scalar_text(meta[k]);
            }
        }

    if (o.json) {
        json j{{"socket", c.socket_path()}, {"ready", ready}, {"state", state}, {"health", hj}, {"models", mj},
               {"metrics", m}};
        if (!xj.is_null()) j["status"] = xj;
        std::cout << j.dump(2) << "\n";
        return ready ? exit_ok : exit_busy;
    }

    auto row = [&](std::string_view label, const std::string& value) {
        if (value.empty()) return;
        std::printf("  %s %s\n", t.out(bold, std::string(label) + std::string(12 - std::min<size_t>(label.size(), 11), ' ')).c_str(),
                    value.c_str());
    };
    std::printf("tandemd on %s\n", c.socket_path().c_str());
    row("state", t.out(ready ? green : yellow, state) + " (HTTP " + std::to_string(health.status) + ")");
    std::string model;
    for (const auto& id : ids) model += (model.empty() ? "" : ", ") + id;
    row("model", model + (model_meta.empty() ? "" : " (" + model_meta + ")"));
    if (!placement.is_null()) row("placement", placement_text(placement));
    if (xj.is_object() && xj.contains("threads")) row("threads", scalar_text(xj["threads"]));
    if (xj.is_object() && xj.contains("uptime_s") && xj["uptime_s"].is_number())
        row("uptime", duration_text(xj["uptime_s"].get<double>()));

    const auto running = metric(m, {"tandem_requests_running", "tandem_running_requests"});
    const auto waiting = metric(m, {"tandem_requests_waiting", "tandem_waiting_requests"});
    const auto served = metric(m, {"tandem_requests_total"});
    std::string load;
    if (running) load += num(*running) + " running";
    if (waiting) load += (load.empty() ? "" : ", ") + num(*waiting) + " waiting";
    if (served) load += (load.empty() ? "" : ", ") + num(*served) + " served";
    row("requests", load);

    const auto prompt_tok = metric(m, {"tandem_prompt_tokens_total"});
    const auto gen_tok = metric(m, {"tandem_generation_tokens_total", "tandem_completion_tokens_total",
                                    "tandem_generated_tokens_total"});
    std::string tokens;
    if (prompt_tok) tokens += num(*prompt_tok) + " prompt";
    if (gen_tok) tokens += (tokens.empty() ? "" : ", ") + num(*gen_tok) + " generated";
    row("tokens", tokens);

    std::string latency;
    char buf[64];
    if (auto v = mean_ms(m, "tandem_time_to_first_token_seconds")) {
        std::snprintf(buf, sizeof buf, "first token %.1f ms", *v);
        latency += buf;
    }
    if (auto v = mean_ms(m, "tandem_inter_token_latency_seconds")) {
        std::snprintf(buf, sizeof buf, "%sbetween tokens %.1f ms", latency.empty() ? "" : ", ", *v);
        latency += buf;
    }
    if (auto v = mean_ms(m, "tandem_queue_time_seconds")) {
        std::snprintf(buf, sizeof buf, "%squeued %.1f ms", latency.empty() ? "" : ", ", *v);
        latency += buf;
    }
    row("latency", latency.empty() ? "" : latency + " (means)");

    const auto used = metric(m, {"tandem_kv_pages_used"}), total = metric(m, {"tandem_kv_pages_total"});
    if (used && total && *total > 0) {
        std::snprintf(buf, sizeof buf, " (%.0f%%)", 100.0 * *used / *total);
        row("kv cache", num(*used) + "/" + num(*total) + " pages" + buf);
    }
    if (auto hits = metric(m, {"tandem_prefix_cache_hits_total"})) row("prefix hits", num(*hits));
    const auto drafted = metric(m, {"tandem_speculative_draft_tokens_total"});
    const auto accepted = metric(m, {"tandem_speculative_accepted_tokens_total"});
    if (drafted && accepted && *drafted > 0) {
        std::snprintf(buf, sizeof buf, " drafts accepted (%.0f%%)", 100.0 * *accepted / *drafted);
        row("speculative", num(*accepted) + " of " + num(*drafted) + buf);
    }
    // GPU workers only: past K/V copied to the device, against what its kept pages held already.
    const auto up = metric(m, {"tandem_kv_device_upload_bytes_total"});
    const auto kept = metric(m, {"tandem_kv_device_kept_bytes_total"});
    if (up && kept && *up + *kept > 0) {
        std::snprintf(buf, sizeof buf, "%.1f MiB uploaded, %.1f MiB kept on the device", *up / 1048576.0,
                      *kept / 1048576.0);
        row("device kv", buf);
    }
    if (!metrics.ok()) row("metrics", "unavailable (HTTP " + std::to_string(metrics.status) + ")");
    return ready ? exit_ok : exit_busy;
}

void add_socket(CLI::App& a, client_opts& o) {
    a.add_option("--socket", o.socket,
                 "daemon socket (default: $TANDEM_SOCKET, else $XDG_RUNTIME_DIR/tandem/tandem.sock, else "
                 "/run/tandem/tandem.sock)");
}

void add_request(CLI::App& a, client_opts& o) {
    a.add_option("--model", o.model, "model name for the request (default: the daemon's)");
    a.add_option("--system", o.system, "system prompt");
    a.add_option("--temp", o.temp, "temperature (0: greedy)")->check(CLI::Range(0.0, 2.0));
    a.add_option("--top-p", o.top_p, "top-p")->check(CLI::Range(0.0, 1.0));
    a.add_option("--top-k", o.top_k, "top-k (0: off)")->check(CLI::NonNegativeNumber);
    a.add_option("--seed", o.seed, "sampling seed");
    a.add_option("-n,--max-tokens", o.max_tokens, "most tokens to generate")->check(CLI::PositiveNumber);
    a.add_option("--stop", o.stop, "stop string (repeatable; \\n, \\t, \\r, \\\\ are escapes)")
        ->allow_extra_args(false)
        ->transform(unescape);
    a.add_flag("--json", o.json, "print the daemon's response JSON instead of streaming text");
}

} // namespace

void register_client(CLI::App& app, registry& reg) {
    auto o = std::make_shared<client_opts>();

    // Bare `tandem "prompt"`: the prompt words are the main app's positional arguments.
    add_socket(app, *o);
    add_request(app, *o);
    auto* raw = app.add_flag("--raw", o->raw, "a plain completion (/v1/completions) instead of a chat turn");
    auto* chat_flag = app.add_flag("--chat", o->chat, "a chat turn through the model's chat template (the default)");
    raw->excludes(chat_flag);
    app.add_option("prompt", o->prompt, "prompt for the daemon (default: stdin when it is not a terminal)");

    auto* chat = app.add_subcommand("chat", "interactive chat with the daemon (/help inside for commands)");
    add_socket(*chat, *o);
    add_request(*chat, *o);
    reg.push_back({chat, [o] { return cmd_chat(*o); }});

    auto* status = app.add_subcommand("status", "the daemon's model, placement, load and metrics");
    add_socket(*status, *o);
    status->add_flag("--json", o->json, "print one JSON object");
    reg.push_back({status, [o] { return cmd_status(*o); }});

    reg.push_back({&app, [o, &app] { return cmd_prompt(*o, app); }});
}

} // namespace tandem::cli
