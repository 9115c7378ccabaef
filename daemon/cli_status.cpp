// `tandem status` (once, or --watch / `tandem top`: a live view) from /health, /v1/models, /metrics and /v1/tandem/status.
#include "daemon/cli_client.hpp"
#include "daemon/cli_metrics.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iostream>

namespace tandem::cli::client {

namespace {

// What the daemon said at one moment.
struct snapshot {
    std::chrono::steady_clock::time_point at;
    ipc::response health;
    json hj, mj, xj; // /health, /v1/models, /v1/tandem/status (null where absent)
    metric_set m;
    int metrics_status = 0;
    bool ready = false;
    std::string state;
};

json parse_json(const ipc::response& r) {
    try {
        return json::parse(r.body);
    } catch (const std::exception&) {
        return json();
    }
}

snapshot take(const ipc::client& c) {
    snapshot s;
    s.at = std::chrono::steady_clock::now();
    s.health = c.get("/health");
    s.state = s.health.reached() ? "refused" : "unreachable";
    if (!s.health.reached() || s.health.status == 401 || s.health.status == 403) return s;
    const ipc::response models = c.get("/v1/models");
    const ipc::response metrics = c.get("/metrics");
    // tandemd's extension: placement, threads, uptime (older or other servers: 404, skipped).
    const ipc::response ext = c.get("/v1/tandem/status");
    s.hj = parse_json(s.health);
    if (models.ok()) s.mj = parse_json(models);
    if (ext.ok()) s.xj = parse_json(ext);
    s.metrics_status = metrics.status;
    if (metrics.ok()) s.m = metric_set::parse(metrics.body);
    s.ready = s.health.status == 200;
    s.state = s.ready ? "ready" : s.health.status == 503 ? "loading" : "unhealthy";
    if (s.hj.is_object() && s.hj.contains("status") && s.hj["status"].is_string()) s.state = s.hj["status"].get<std::string>();
    return s;
}

// Exit code of a status: 0 ready, 5 loading or stopping (503), 4 another answer.
int status_rc(const snapshot& s) { return s.ready ? exit_ok : s.health.status == 503 ? exit_busy : exit_rejected; }

std::string num(double v) {
    char buf[64];
    if (std::fabs(v) < 1e15 && v == std::floor(v)) // an integer that fits: print it whole
        std::snprintf(buf, sizeof buf, "%lld", (long long)v);
    else
        std::snprintf(buf, sizeof buf, "%.3g", v);
    return buf;
}

std::string fmt(const char* f, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

std::string ms_text(double seconds) { return seconds < 10 ? fmt("%.1f ms", seconds * 1000) : fmt("%.1f s", seconds); }

std::string scalar_text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// "prefill=gpu decode=cpu (policy auto)", from a string or an object of those keys.
std::string placement_text(const json& p) {
    if (!p.is_object()) return scalar_text(p);
    std::string s;
    for (const char* k : {"prefill", "decode"})
        if (p.contains(k)) s += (s.empty() ? "" : " ") + std::string(k) + "=" + scalar_text(p[k]);
    for (const auto& [k, v] : p.items())
        if (k != "prefill" && k != "decode" && k != "policy" && k != "workers")
            s += (s.empty() ? "" : " ") + k + "=" + scalar_text(v);
    if (p.contains("policy")) s += " (policy " + scalar_text(p["policy"]) + ")";
    return s;
}

json placement_of(const snapshot& s) {
    if (s.xj.is_object() && s.xj.contains("placement")) return s.xj["placement"];
    if (s.hj.is_object() && s.hj.contains("placement")) return s.hj["placement"];
    if (s.mj.is_object() && s.mj.contains("data") && s.mj["data"].is_array())
        for (const auto& d : s.mj["data"])
            if (d.contains("placement")) return d["placement"];
    return json();
}

std::string duration_text(double s) {
    if (s < 120) return fmt("%.0f s", s);
    if (s < 7200) return fmt("%.0f min", s / 60);
    return fmt("%.1f h", s / 3600);
}

// "p50 50.0 ms, p99 99.0 ms" of a latency histogram; empty without samples.
std::string percentiles_text(const histogram_series& h) {
    const auto p50 = h.quantile(0.5), p99 = h.quantile(0.99);
    if (!p50 || !p99) return {};
    return "p50 " + ms_text(*p50) + ", p99 " + ms_text(*p99);
}

// The rows both views print, as label and text.
using rows = std::vector<std::pair<std::string, std::string>>;

void print_rows(const terminal& t, const rows& r) {
    for (const auto& [label, value] : r) {
        if (value.empty()) continue;
        const std::string padded = label + std::string(label.size() < 12 ? 12 - label.size() : 1, ' ');
        std::printf("  %s %s\n", t.out(bold, padded).c_str(), value.c_str());
    }
}

std::string kv_text(const snapshot& s) {
    const auto used = s.m.total("tandem_kv_pages_used"), total = s.m.total("tandem_kv_pages_total");
    if (!used || !total || *total <= 0) return {};
    std::string text = num(*used) + "/" + num(*total) + " pages used" + fmt(" (%.0f%%)", 100.0 * *used / *total);
    if (auto cached = s.m.total("tandem_kv_pages_cached")) text += ", " + num(*cached) + " cached";
    if (s.xj.is_object() && s.xj.contains("kv_page_size") && s.xj["kv_page_size"].is_number())
        text += ", " + num(s.xj["kv_page_size"].get<double>()) + " tokens a page";
    return text;
}

std::string prefix_hits_text(const snapshot& s) {
    const auto hits = s.m.total("tandem_prefix_cache_hits_total");
    return hits ? num(*hits) + " tokens" : std::string();
}

std::string workers_text(const snapshot& s) {
    const json p = placement_of(s);
    std::string text = p.is_null() ? "" : placement_text(p);
    if (p.is_object() && p.contains("workers") && p["workers"].is_boolean())
        text += p["workers"].get<bool>() ? ", worker processes" : ", in the daemon's process";
    if (auto restarts = s.m.total("tandem_worker_restarts_total"))
        text += (text.empty() ? "" : ", ") + num(*restarts) + " restarts";
    return text;
}

void print_status(const terminal& t, const ipc::client& c, const snapshot& s) {
    std::printf("tandemd on %s\n", c.socket_path().c_str());
    rows r;
    r.reserve(16);
    r.emplace_back("state", t.out(s.ready ? green : yellow, s.state) + " (HTTP " + std::to_string(s.health.status) + ")");
    std::string model, meta;
    if (s.mj.is_object() && s.mj.contains("data") && s.mj["data"].is_array())
        for (const auto& d : s.mj["data"]) {
            if (d.contains("id") && d["id"].is_string()) model += (model.empty() ? "" : ", ") + d["id"].get<std::string>();
            if (meta.empty() && d.contains("meta") && d["meta"].is_object())
                for (const char* k : {"arch", "n_ctx", "path"})
                    if (d["meta"].contains(k)) meta += (meta.empty() ? "" : ", ") + std::string(k) + " " + scalar_text(d["meta"][k]);
        }
    r.emplace_back("model", model + (meta.empty() ? "" : " (" + meta + ")"));
    // Several models (model_host): a line each, its state, memory and requests.
    if (s.xj.is_object() && s.xj.contains("models") && s.xj["models"].is_object() &&
        s.xj["models"].value("models", json::array()).size() > 1)
        for (const auto& e : s.xj["models"]["models"]) {
            if (!e.is_object()) continue;
            std::string text = e.value("id", std::string()) + ": " + e.value("state", std::string());
            if (e.value("default", false)) text += " (default)";
            if (e.value("state", std::string()) == "loaded")
                text += fmt(", %.1f MiB", double(e.value("memory_bytes", int64_t(0))) / 1048576.0) + ", " +
                        num(double(e.value("requests_active", 0))) + " requests";
            text += ", " + num(double(e.value("loads", 0))) + " loads";
            r.emplace_back("  model", text);
        }
    if (const json p = placement_of(s); !p.is_null()) r.emplace_back("placement", placement_text(p));
    if (s.xj.is_object() && s.xj.contains("threads")) r.emplace_back("threads", scalar_text(s.xj["threads"]));
    if (s.xj.is_object() && s.xj.contains("uptime_s") && s.xj["uptime_s"].is_number())
        r.emplace_back("uptime", duration_text(s.xj["uptime_s"].get<double>()));

    const metric_set& m = s.m;
    std::string load;
    if (auto v = m.total({"tandem_requests_running", "tandem_running_requests"})) load += num(*v) + " running";
    if (auto v = m.total({"tandem_requests_waiting", "tandem_waiting_requests"})) load += (load.empty() ? "" : ", ") + num(*v) + " waiting";
    if (auto v = m.total("tandem_requests_total")) load += (load.empty() ? "" : ", ") + num(*v) + " served";
    r.emplace_back("requests", load);
    std::string tokens;
    if (auto v = m.total("tandem_prompt_tokens_total")) tokens += num(*v) + " prompt";
    if (auto v = m.total({"tandem_generation_tokens_total", "tandem_completion_tokens_total", "tandem_generated_tokens_total"}))
        tokens += (tokens.empty() ? "" : ", ") + num(*v) + " generated";
    r.emplace_back("tokens", tokens);
    // Latencies: percentiles estimated from the histogram's buckets, and the exact mean.
    for (const auto& [label, name] : {std::pair{"first token", "tandem_time_to_first_token_seconds"},
                                      std::pair{"per token", "tandem_inter_token_latency_seconds"},
                                      std::pair{"queued", "tandem_queue_time_seconds"}}) {
        const histogram_series* h = m.histogram(name);
        if (!h || h->count <= 0) continue;
        std::string text = percentiles_text(*h);
        text += (text.empty() ? "" : ", ") + ("mean " + ms_text(h->sum / h->count)) + " (" + num(h->count) + ")";
        r.emplace_back(label, text);
    }
    r.emplace_back("kv cache", kv_text(s));
    r.emplace_back("prefix hits", prefix_hits_text(s));
    const auto drafted = m.total("tandem_speculative_draft_tokens_total");
    const auto accepted = m.total("tandem_speculative_accepted_tokens_total");
    if (drafted && accepted && *drafted > 0)
        r.emplace_back("speculative", num(*accepted) + " of " + num(*drafted) + " draft tokens accepted" +
                                          fmt(" (%.0f%%)", 100.0 * *accepted / *drafted));
    // GPU workers only: past K/V copied to the device, against what its kept pages held already.
    const auto up = m.total("tandem_kv_device_upload_bytes_total"), kept = m.total("tandem_kv_device_kept_bytes_total");
    if (up && kept && *up + *kept > 0)
        r.emplace_back("device kv", fmt("%.1f MiB uploaded, ", *up / 1048576.0) + fmt("%.1f MiB kept on the device", *kept / 1048576.0));
    if (s.metrics_status != 200) r.emplace_back("metrics", "unavailable (HTTP " + std::to_string(s.metrics_status) + ")");
    print_rows(t, r);
}

json status_json(const ipc::client& c, const snapshot& s) {
    json j{{"socket", c.socket_path()}, {"ready", s.ready}, {"state", s.state}, {"health", s.hj}, {"models", s.mj},
           {"metrics", s.m.to_json()}};
    if (!s.xj.is_null()) j["status"] = s.xj;
    return j;
}

// 401/403 and no daemon end a status at once (exit 3); nullopt: there is a status to show.
std::optional<int> unreachable(const terminal& t, const ipc::client& c, const snapshot& s) {
    if (!s.health.reached()) return report_unreachable(t, c, s.health);
    if (s.health.status == 401 || s.health.status == 403) return report_http_error(t, s.health);
    return std::nullopt;
}

// One block of the live view: `prev` is the sample before (rates and latencies are over the
// time between; the first block shows totals since the daemon started).
void print_watch_block(const terminal& t, const ipc::client& c, const snapshot& s, const snapshot* prev) {
    const std::time_t now = std::time(nullptr);
    char clock[16];
    std::strftime(clock, sizeof clock, "%H:%M:%S", std::localtime(&now));
    std::printf("tandemd on %s  %s  %s\n", c.socket_path().c_str(),
                t.out(s.ready ? green : yellow, s.state).c_str(), clock);
    rows r;
    r.reserve(16);
    const metric_set& m = s.m;
    std::string load;
    if (auto v = m.total("tandem_requests_running")) load += num(*v) + " running";
    if (auto v = m.total("tandem_requests_waiting")) load += (load.empty() ? "" : ", ") + num(*v) + " waiting";
    r.emplace_back("requests", load);

    const double dt = prev ? std::chrono::duration<double>(s.at - prev->at).count() : 0;
    const std::string window = prev ? "last " + fmt("%.3g s", dt) : "since start";
    std::string rate;
    if (prev && dt > 0) {
        // The engine's counts move every step; the request totals only when a request ends.
        struct counter {
            const char* what;
            const char* engine;
            const char* requests;
        };
        static constexpr counter counters[] = {
            {"generated", "tandem_engine_generated_tokens_total", "tandem_generation_tokens_total"},
            {"prompt", "tandem_engine_prompt_tokens_total", "tandem_prompt_tokens_total"}};
        for (const counter& k : counters) {
            const auto now_v = m.total({k.engine, k.requests}), then_v = prev->m.total({k.engine, k.requests});
            if (!now_v || !then_v) continue;
            rate += (rate.empty() ? "" : ", ") + fmt("%.1f ", std::max(0.0, *now_v - *then_v) / dt) + k.what;
        }
    } else {
        rate = "(from the next sample on)";
    }
    r.emplace_back("tokens/s", rate);
    for (const auto& [label, name] : {std::pair{"first token", "tandem_time_to_first_token_seconds"},
                                      std::pair{"per token", "tandem_inter_token_latency_seconds"}}) {
        const histogram_series* h = m.histogram(name);
        if (!h) continue;
        const histogram_series* before = prev ? prev->m.histogram(name) : nullptr;
        const histogram_series w = before ? h->since(*before) : *h;
        const std::string p = percentiles_text(w);
        r.emplace_back(label, p.empty() ? "- (none, " + window + ")" : p + " (" + window + ", " + num(w.count) + ")");
    }
    const auto used = m.total("tandem_kv_pages_used"), cached = m.total("tandem_kv_pages_cached"),
               total = m.total("tandem_kv_pages_total");
    if (used && total)
        r.emplace_back("kv pages", num(*used) + " used, " + (cached ? num(*cached) : std::string("?")) + " cached, " +
                                       num(*total) + " total");
    std::string hits = prefix_hits_text(s);
    if (auto now_v = m.total("tandem_prefix_cache_hits_total"); now_v && prev)
        if (auto then_v = prev->m.total("tandem_prefix_cache_hits_total"))
            hits += " (+" + num(std::max(0.0, *now_v - *then_v)) + ")";
    r.emplace_back("prefix hits", hits);
    r.emplace_back("workers", workers_text(s));
    if (s.metrics_status != 200) r.emplace_back("metrics", "unavailable (HTTP " + std::to_string(s.metrics_status) + ")");
    print_rows(t, r);
}

int watch(const terminal& t, const ipc::client& c, const client_opts& o) {
    install_sigint(); // Ctrl-C ends the view: exit 0
    std::optional<snapshot> prev;
    for (int64_t n = 0; o.count == 0 || n < o.count; ++n) {
        if (n > 0 && !sleep_unless_interrupted(o.interval_s)) break;
        snapshot s = take(c);
        if (n == 0) {
            if (auto rc = unreachable(t, c, s)) return *rc; // not even once: as `tandem status` would
        }
        if (o.json) {
            // One object a line: what `status --json` prints, plus the time it was taken.
            json j = status_json(c, s);
            j["time"] = std::time(nullptr);
            std::printf("%s\n", j.dump().c_str());
        } else {
            if (t.out_tty) std::printf("\033[H\033[2J"); // refreshed in place
            if (!s.health.reached())
                std::printf("tandemd on %s: not reachable (%s)\n", c.socket_path().c_str(), s.health.net_error.c_str());
            else
                print_watch_block(t, c, s, prev ? &*prev : nullptr);
            if (!t.out_tty) std::printf("\n"); // a blank line between blocks
        }
        std::fflush(stdout);
        if (s.health.reached()) prev = std::move(s);
        if (interrupted) break;
    }
    if (interrupted && t.out_tty) std::printf("\n"); // past the ^C the terminal echoed
    return exit_ok;
}

} // namespace

int cmd_status(const client_opts& o) {
    const terminal t;
    const ipc::client c(ipc::default_socket_path(o.socket));
    if (o.watch) return watch(t, c, o);
    const snapshot s = take(c);
    if (auto rc = unreachable(t, c, s)) return *rc;
    if (o.json)
        std::cout << status_json(c, s).dump(2) << "\n";
    else
        print_status(t, c, s);
    return status_rc(s);
}

} // namespace tandem::cli::client
