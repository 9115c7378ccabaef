// Parsing of tandemd.conf (`key = value` lines, `#` comments) and of --set overrides.
#include "daemon/config.hpp"

#include "daemon/peer_cred.hpp"

#include "runtime/error.hpp"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>

namespace tandem::daemon {
namespace {

std::string trim(const std::string& s) {
    const auto b = s.find_first_not_of(" \t\r");
    if (b == std::string::npos) return {};
    const auto e = s.find_last_not_of(" \t\r");
    return s.substr(b, e - b + 1);
}

template <class T>
std::optional<std::string> parse_int(const std::string& v, T& out, T lo, T hi, int base = 10) {
    T x{};
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x, base);
    if (ec != std::errc() || p != v.data() + v.size() || x < lo || x > hi)
        return "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
    out = x;
    return std::nullopt;
}

// Seconds up to a day; more than 0 unless `zero_ok`.
std::optional<std::string> parse_seconds(const std::string& v, double& out, bool zero_ok = false) {
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(x > 0 || (zero_ok && x == 0)) || x > 86400)
        return zero_ok ? "expected seconds, 0 or more" : "expected seconds, more than 0";
    out = x;
    return std::nullopt;
}

std::optional<std::string> parse_bool(const std::string& v, bool& out) {
    if (v == "true" || v == "yes" || v == "on" || v == "1") out = true;
    else if (v == "false" || v == "no" || v == "off" || v == "0") out = false;
    else return "expected true or false";
    return std::nullopt;
}

std::optional<std::string> parse_device(const std::string& v, std::string& out) {
    if (v != "auto" && v != "cpu" && v != "gpu") return "expected auto, cpu or gpu";
    out = v;
    return std::nullopt;
}

std::vector<std::string> split_list(const std::string& v) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : v + ",") {
        if (c == ',' || c == ' ' || c == '\t') {
            if (!cur.empty()) out.push_back(cur);
            cur.clear();
        } else {
            cur.push_back(c);
        }
    }
    return out;
}

using setter = std::function<std::optional<std::string>(config&, const std::string&)>;

const std::vector<std::pair<std::string, setter>>& setters() {
    static const std::vector<std::pair<std::string, setter>> s = {
        {"model", [](config& c, const std::string& v) { c.model = v; return std::optional<std::string>(); }},
        {"model_id", [](config& c, const std::string& v) { c.model_id = v; return std::optional<std::string>(); }},
        {"store", [](config& c, const std::string& v) { c.store = v; return std::optional<std::string>(); }},
        {"chat_template",
         [](config& c, const std::string& v) { c.chat_template = v; return std::optional<std::string>(); }},
        {"socket", [](config& c, const std::string& v) { c.socket = v; return std::optional<std::string>(); }},
        {"socket_group",
         [](config& c, const std::string& v) { c.socket_group = v; return std::optional<std::string>(); }},
        {"socket_mode", [](config& c, const std::string& v) { return parse_int<uint32_t>(v, c.socket_mode, 0, 0777, 8); }},
        {"listen_tcp", [](config& c, const std::string& v) { c.listen_tcp = v; return std::optional<std::string>(); }},
        {"api_keys_file",
         [](config& c, const std::string& v) { c.api_keys_file = v; return std::optional<std::string>(); }},
        {"tcp_allowed_origins",
         [](config& c, const std::string& v) { c.tcp_allowed_origins = split_list(v); return std::optional<std::string>(); }},
        {"tcp_allowed_hosts",
         [](config& c, const std::string& v) { c.tcp_allowed_hosts = split_list(v); return std::optional<std::string>(); }},
        {"placement",
         [](config& c, const std::string& v) -> std::optional<std::string> {
             if (v != "auto" && v != "cpu" && v != "gpu" && v != "local") return "expected auto, cpu, gpu or local";
             c.placement = v;
             c.workers = v != "local";
             // gpu: GPU prefill with CPU decode, the split the daemon is built around
             c.prefill = v == "auto" ? "auto" : v == "gpu" ? "gpu" : "cpu";
             c.decode = v == "auto" ? "auto" : "cpu";
             return std::nullopt;
         }},
        {"prefill", [](config& c, const std::string& v) { return parse_device(v, c.prefill); }},
        {"decode", [](config& c, const std::string& v) { return parse_device(v, c.decode); }},
        {"workers", [](config& c, const std::string& v) { return parse_bool(v, c.workers); }},
        {"threads", [](config& c, const std::string& v) { return parse_int(v, c.threads, 0, 1024); }},
        {"prefill_threads", [](config& c, const std::string& v) { return parse_int(v, c.prefill_threads, 0, 1024); }},
        {"decode_threads", [](config& c, const std::string& v) { return parse_int(v, c.decode_threads, 0, 1024); }},
        {"n_ctx", [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.n_ctx, 0, 1 << 20); }},
        {"page_size", [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.engine.sched.page_size, 1, 1024); }},
        {"kv_cache_mb", [](config& c, const std::string& v) { return parse_int<int64_t>(v, c.kv_cache_mb, 0, 1 << 24); }},
        // the name before the worker split
        {"kv_size_mb", [](config& c, const std::string& v) { return parse_int<int64_t>(v, c.kv_cache_mb, 0, 1 << 24); }},
        {"kv_pages", [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.kv_pages, 0, 1 << 30); }},
        {"kv_dtype",
         [](config& c, const std::string& v) -> std::optional<std::string> {
             if (v != "f16" && v != "int8" && v != "f32") return "expected f16, int8 or f32";
             c.kv_dtype = v;
             return std::nullopt;
         }},
        {"weights",
         [](config& c, const std::string& v) -> std::optional<std::string> {
             if (v != "auto" && v != "int8") return "expected auto or int8";
             c.weights = v;
             return std::nullopt;
         }},
        {"kv_pool", [](config& c, const std::string& v) { c.kv_pool = v; return std::optional<std::string>(); }},
        {"kv_pool_persist", [](config& c, const std::string& v) { return parse_bool(v, c.kv_pool_persist); }},
        {"prefix_cache", [](config& c, const std::string& v) { return parse_bool(v, c.engine.sched.prefix_cache); }},
        {"priority_aging_s", [](config& c, const std::string& v) { return parse_seconds(v, c.engine.sched.priority_aging_s); }},
        {"background_step_tokens",
         [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.engine.sched.background_step_tokens, 0, 1 << 20); }},
        {"max_running", [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.engine.sched.max_running, 1, 4096); }},
        {"max_waiting", [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.engine.max_waiting, 0, 1 << 20); }},
        {"max_connections",
         [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.max_connections, 1, 1 << 20); }},
        {"step_tokens", [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.engine.sched.step_tokens, 1, 1 << 20); }},
        {"draft_tokens", [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.draft_tokens, 0, 16); }},
        {"draft_model", [](config& c, const std::string& v) { c.draft_model = v; return std::optional<std::string>(); }},
        {"draft_cost",
         [](config& c, const std::string& v) -> std::optional<std::string> {
             char* end = nullptr;
             const double x = std::strtod(v.c_str(), &end);
             if (v == "auto") c.engine.draft_cost = 0;
             else if (v.empty() || *end != '\0' || !(x > 0) || x > 1) return "expected auto, or a fraction in (0, 1]";
             else c.engine.draft_cost = x;
             return std::nullopt;
         }},
        {"state_dir", [](config& c, const std::string& v) { c.state_dir = v; return std::optional<std::string>(); }},
        {"max_file_bytes",
         [](config& c, const std::string& v) { return parse_int<int64_t>(v, c.max_file_bytes, 1024, int64_t(1) << 34); }},
        {"max_files", [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.max_files, 1, 1 << 24); }},
        {"responses_ttl_h",
         [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.responses_ttl_h, 1, 24 * 365 * 10); }},
        {"batch_concurrency",
         [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.batch_concurrency, 0, 4096); }},
        {"max_body_bytes",
         [](config& c, const std::string& v) { return parse_int<int64_t>(v, c.max_body_bytes, 1024, int64_t(1) << 32); }},
        {"max_json_depth", [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.max_json_depth, 2, 1000); }},
        {"max_inflight_mb",
         [](config& c, const std::string& v) { return parse_int<int64_t>(v, c.max_inflight_mb, 1, int64_t(1) << 20); }},
        {"max_document_bytes",
         [](config& c, const std::string& v) { return parse_int<int64_t>(v, c.max_document_bytes, 1, int64_t(1) << 32); }},
        {"max_passages", [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.max_passages, 1, 1 << 20); }},
        {"max_stop_bytes", [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.max_stop_bytes, 1, 1 << 20); }},
        {"grammar_compile_ms",
         [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.grammar_compile_ms, 1, 600000); }},
        {"max_embedding_floats", [](config& c, const std::string& v) {
             return parse_int<int64_t>(v, c.max_embedding_floats, 1, int64_t(1) << 34);
         }},
        {"max_prompt_tokens",
         [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.max_prompt_tokens, 0, 1 << 24); }},
        {"max_tokens_limit",
         [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.max_tokens_limit, 0, 1 << 24); }},
        {"max_n", [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.max_n, 1, 128); }},
        {"request_timeout_s", [](config& c, const std::string& v) { return parse_seconds(v, c.request_timeout_s); }},
        {"load_wait_s", [](config& c, const std::string& v) { return parse_seconds(v, c.load_wait_s, true); }},
        {"drain_timeout_s", [](config& c, const std::string& v) { return parse_seconds(v, c.drain_timeout_s); }},
        {"worker_timeout_s", [](config& c, const std::string& v) { return parse_seconds(v, c.worker_timeout_s); }},
        {"worker_heartbeat_s", [](config& c, const std::string& v) { return parse_seconds(v, c.worker_heartbeat_s); }},
        {"allowed_users",
         [](config& c, const std::string& v) { c.allowed_users = split_list(v); return std::optional<std::string>(); }},
        {"allowed_groups",
         [](config& c, const std::string& v) { c.allowed_groups = split_list(v); return std::optional<std::string>(); }},
        {"models_max", [](config& c, const std::string& v) { return parse_int<int32_t>(v, c.models_max, 1, 1024); }},
        {"memory_budget_mb",
         [](config& c, const std::string& v) { return parse_int<int64_t>(v, c.memory_budget_mb, 0, int64_t(1) << 30); }},
        {"keep_alive",
         [](config& c, const std::string& v) -> std::optional<std::string> {
             const auto s = parse_keep_alive(v);
             if (!s) return "expected seconds or a duration (5m, 1h), -1 for never";
             c.keep_alive_s = *s;
             return std::nullopt;
         }},
        {"log_level",
         [](config& c, const std::string& v) -> std::optional<std::string> {
             static const char* levels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
             for (const char* l : levels)
                 if (v == l) {
                     c.log_level = v;
                     return std::nullopt;
                 }
             return "expected trace, debug, info, warn, error, critical or off";
         }},
    };
    return s;
}

} // namespace

std::optional<std::string> config::set(const std::string& key, const std::string& value) {
    for (const auto& [k, fn] : setters())
        if (k == key) return fn(*this, value);
    return "unknown key";
}

namespace {

// One line without its comment: `#` starts one outside quotes. "" when the line is blank.
std::string strip_comment(const std::string& line) {
    char quote = 0;
    for (size_t i = 0; i < line.size(); ++i) {
        const char c = line[i];
        if (quote) {
            if (c == quote) quote = 0;
        } else if (c == '"' || c == '\'') {
            quote = c;
        } else if (c == '#') {
            return trim(line.substr(0, i));
        }
    }
    return trim(line);
}

// A value in matching quotes loses them; a quote left open is an error.
std::optional<std::string> unquote(std::string& v) {
    if (v.empty() || (v.front() != '"' && v.front() != '\'')) return std::nullopt;
    if (v.size() < 2 || v.back() != v.front()) return std::string("unterminated quote");
    if (v.find(v.front(), 1) != v.size() - 1) return std::string("text after the closing quote");
    v = v.substr(1, v.size() - 2);
    return std::nullopt;
}

} // namespace

void config::load_file(const std::string& path) {
    std::ifstream in(path);
    TANDEM_CHECK(in, "{}: cannot open the config file", path);
    load(in, path);
}

std::optional<double> parse_keep_alive(const std::string& v) {
    if (v.empty()) return std::nullopt;
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (end == v.c_str()) return std::nullopt;
    const std::string unit(end);
    double scale = 0;
    if (unit.empty() || unit == "s") scale = 1;
    else if (unit == "ms") scale = 0.001;
    else if (unit == "m") scale = 60;
    else if (unit == "h") scale = 3600;
    else return std::nullopt;
    if (!std::isfinite(x)) return std::nullopt;
    return x < 0 ? -1.0 : x * scale;
}

const std::vector<std::string>& model_section_keys() {
    static const std::vector<std::string> keys = {
        "model_id",      "chat_template", "placement",       "prefill",        "decode",         "workers",
        "threads",       "prefill_threads", "decode_threads", "n_ctx",         "page_size",      "kv_cache_mb",
        "kv_pages",      "kv_dtype",      "weights",         "kv_pool",        "kv_pool_persist", "prefix_cache",
        "max_running",   "max_waiting",   "step_tokens",     "draft_tokens",   "draft_model",    "draft_cost",
        "max_prompt_tokens", "max_tokens_limit", "max_n"};
    return keys;
}

namespace {

// One key of a [model NAME] section: path, keep_alive, overflow, or a key the model may have
// of its own (checked on a scratch config).
std::optional<std::string> check_model_key(const std::string& key, const std::string& value) {
    if (key == "path" || key == "overflow") return value.empty() ? std::optional<std::string>("must not be empty")
                                                                 : std::nullopt;
    if (key == "keep_alive")
        return parse_keep_alive(value) ? std::nullopt
                                       : std::optional<std::string>("expected seconds or a duration (5m, 1h), -1 for never");
    const auto& keys = model_section_keys();
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
        return key == "model" ? "a model section names its file with `path`"
                              : "not a key a [model] section takes (it is the daemon's, for every model)";
    config scratch;
    return scratch.set(key, value);
}

std::optional<std::string> set_upstream_key(upstream_section& u, const std::string& key, const std::string& value) {
    if (key == "base_url") {
        if (!value.starts_with("http://") && !value.starts_with("https://")) return "expected an http:// or https:// URL";
        u.base_url = value;
        while (u.base_url.ends_with("/")) u.base_url.pop_back();
        if (u.base_url.ends_with("/v1")) u.base_url.resize(u.base_url.size() - 3); // its routes are /v1/...
    } else if (key == "api_key_file") {
        u.api_key_file = value;
    } else if (key == "models") {
        u.models = split_list(value);
        if (u.models.empty()) return "expected one or more model names";
    } else if (key == "timeout_s") {
        return parse_seconds(value, u.timeout_s);
    } else {
        return "unknown key (an [upstream] section takes base_url, api_key_file, models, timeout_s)";
    }
    return std::nullopt;
}

} // namespace

void config::load(std::istream& in, const std::string& path) {
    std::string line;
    model_section* sec = nullptr;   // the [model NAME] section being read
    upstream_section* up = nullptr; // the [upstream NAME] section being read
    for (int n = 1; std::getline(in, line); ++n) {
        line = strip_comment(line);
        if (line.empty()) continue;
        const std::string where = path + ":" + std::to_string(n);
        if (line.front() == '[') { // [model NAME] or [upstream NAME]: the keys below are its own
            TANDEM_CHECK(line.back() == ']', "{}: expected `[model NAME]` or `[upstream NAME]`", where);
            const std::string head = trim(line.substr(1, line.size() - 2));
            const auto sp = head.find_first_of(" \t");
            const std::string kind = head.substr(0, sp);
            const std::string name = sp == std::string::npos ? std::string() : trim(head.substr(sp));
            TANDEM_CHECK(!name.empty() && name.find_first_of(" \t/\"'") == std::string::npos,
                         "{}: expected `[model NAME]` or `[upstream NAME]`, NAME without spaces, quotes or slashes", where);
            const auto taken = [&](const std::string& nm) {
                for (const auto& m : models)
                    if (m.name == nm) return true;
                for (const auto& u : upstreams)
                    if (u.name == nm) return true;
                return false;
            };
            TANDEM_CHECK(!taken(name), "{}: a section named '{}' comes earlier", where, name);
            sec = nullptr;
            up = nullptr;
            if (kind == "model") {
                models.push_back({name, {}, where});
                sec = &models.back();
            } else if (kind == "upstream") {
                upstream_section u;
                u.name = name;
                u.origin = where;
                upstreams.push_back(std::move(u));
                up = &upstreams.back();
            } else {
                fail("{}: unknown section [{}]: expected [model NAME] or [upstream NAME]", where, kind);
            }
            continue;
        }
        const auto eq = line.find('=');
        TANDEM_CHECK(eq != std::string::npos, "{}: expected `key = value`", where);
        std::string key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
        if (auto err = unquote(value)) fail("{}: {}: {}", where, key, *err);
        if (sec) {
            if (auto err = check_model_key(key, value)) fail("{}: [model {}] {}: {}", where, sec->name, key, *err);
            sec->settings.emplace_back(key, value);
            continue;
        }
        if (up) {
            if (auto err = set_upstream_key(*up, key, value)) fail("{}: [upstream {}] {}: {}", where, up->name, key, *err);
            continue;
        }
        if (auto err = set(key, value)) fail("{}: {}: {}", where, key, *err);
        origin[key] = where;
    }
    for (const auto& m : models) {
        const bool has_path = std::any_of(m.settings.begin(), m.settings.end(), [](const auto& kv) { return kv.first == "path"; });
        TANDEM_CHECK(has_path, "{}: [model {}] has no `path` (its GGUF file)", m.origin, m.name);
    }
    for (const auto& u : upstreams) {
        TANDEM_CHECK(!u.base_url.empty(), "{}: [upstream {}] has no `base_url`", u.origin, u.name);
        TANDEM_CHECK(!u.models.empty(), "{}: [upstream {}] has no `models` (the names forwarded there)", u.origin, u.name);
    }
}

void config::validate() const {
    TANDEM_CHECK(!model.empty() || !models.empty(),
                 "no model: pass --model PATH or set `model` in the config file (no demo model is installed beside tandemd)");
    // "FILE:LINE: key: problem", or "key: problem" for a key set by a flag without a place
    const auto bad = [&](const std::string& key, const std::string& problem) {
        const auto at = origin.find(key);
        fail("{}{}: {}", at == origin.end() ? "" : at->second + ": ", key, problem);
    };
    if (!listen_tcp.empty()) {
        const auto colon = listen_tcp.rfind(':');
        if (colon == std::string::npos) bad("listen_tcp", "expected HOST:PORT, got " + listen_tcp);
        const std::string host = listen_tcp.substr(0, colon);
        if (host != "127.0.0.1" && host != "::1" && host != "[::1]" && host != "localhost" && api_keys_file.empty())
            bad("listen_tcp", "a listener on " + host + ", not a loopback address, needs api_keys_file (clients "
                              "there send a key; put TLS in front of it: docs/config.md)");
    }
    if (!socket_group.empty() && !lookup_group(socket_group)) bad("socket_group", "no group '" + socket_group + "'");
    for (const auto& g : allowed_groups)
        if (!lookup_group(g)) bad("allowed_groups", "no group '" + g + "'");
    for (const auto& u : allowed_users)
        if (!lookup_user(u)) bad("allowed_users", "no user '" + u + "'");
    for (const auto& m : models)
        for (const auto& [key, value] : m.settings)
            if (key == "overflow" && std::none_of(upstreams.begin(), upstreams.end(),
                                                  [&v = value](const upstream_section& u) { return u.name == v; }))
                fail("{}: [model {}] overflow: no [upstream {}] section", m.origin, m.name, value);
}

bool under_systemd_runtime() {
    const char* d = std::getenv("RUNTIME_DIRECTORY");
    return d && *d && *d != ':';
}

std::string default_socket_path() {
    // systemd's RuntimeDirectory=tandem: /run/tandem for the system unit, %t/tandem for a user's
    if (const char* d = std::getenv("RUNTIME_DIRECTORY"); d && *d && *d != ':') {
        const std::string dir(d);
        return dir.substr(0, dir.find(':')) + "/tandem.sock"; // several entries: the first
    }
    if (::geteuid() == 0) return "/run/tandem/tandem.sock";
    if (const char* d = std::getenv("XDG_RUNTIME_DIR"); d && *d) return std::string(d) + "/tandem/tandem.sock";
    return "/tmp/tandem-" + std::to_string(::geteuid()) + "/tandem.sock";
}

std::string default_state_dir() {
    if (const char* d = std::getenv("STATE_DIRECTORY"); d && *d && *d != ':') {
        const std::string dir(d);
        return dir.substr(0, dir.find(':'));
    }
    if (::geteuid() == 0) return "/var/lib/tandem";
    if (const char* d = std::getenv("XDG_STATE_HOME"); d && *d) return std::string(d) + "/tandem";
    if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.local/state/tandem";
    return "/tmp/tandem-" + std::to_string(::geteuid()) + "/state";
}

std::string default_model_path() {
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) return {};
    // TANDEM_DATA_FROM_BIN: the install's data dir relative to its bin dir ("../share")
    const std::filesystem::path model =
        (exe.parent_path() / TANDEM_DATA_FROM_BIN / "tandem/models/stories260K.gguf").lexically_normal();
    return std::filesystem::is_regular_file(model, ec) ? model.string() : std::string();
}

namespace {

// 640 bytes, 22.0 KiB, 704.0 MiB, 2.0 GiB.
std::string size_text(double bytes) {
    if (bytes < 1024) return fmt::format("{:.0f} bytes", bytes);
    if (bytes < 1024.0 * 1024) return fmt::format("{:.1f} KiB", bytes / 1024);
    if (bytes < 1024.0 * 1024 * 1024) return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024));
    return fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024 * 1024));
}

} // namespace

context_plan plan_context(const config& cfg, int32_t n_ctx_train, int64_t page_bytes) {
    context_plan p;
    const int64_t ps = std::max(1, cfg.engine.sched.page_size);
    page_bytes = std::max<int64_t>(1, page_bytes);
    const double token_bytes = double(page_bytes) / double(ps);
    // The pool the memory keys ask for, and how to name it in the notes.
    constexpr int64_t default_mb = 2048;
    int64_t budget_pages = 0;
    std::string source;
    if (cfg.kv_pages > 0) {
        budget_pages = cfg.kv_pages;
        source = fmt::format("kv_pages {}", cfg.kv_pages);
    } else {
        const int64_t mb = cfg.kv_cache_mb > 0 ? cfg.kv_cache_mb : default_mb;
        budget_pages = std::max<int64_t>(1, mb * (int64_t(1) << 20) / page_bytes);
        source = cfg.kv_cache_mb > 0 ? fmt::format("kv_cache_mb {}", mb)
                                     : fmt::format("the default KV pool (kv_cache_mb 0: at most {} MiB)", default_mb);
    }
    const int64_t budget_tokens = budget_pages * ps;

    if (cfg.n_ctx > n_ctx_train) {
        const auto at = cfg.origin.find("n_ctx"); // "FILE:LINE", or the flag
        p.error = fmt::format("n_ctx {}{} is more than the model's training context, {} tokens (it was not trained for "
                              "later positions, and Tandem applies no RoPE scaling beyond the file's): set n_ctx to {} "
                              "or less, or 0 for the longest context the KV memory holds",
                              cfg.n_ctx, at == cfg.origin.end() ? "" : " (" + at->second + ")", n_ctx_train,
                              n_ctx_train);
        return p;
    }
    if (cfg.n_ctx > 0) {
        p.n_ctx = cfg.n_ctx;
        p.notes.push_back({false, fmt::format("n_ctx {} (set in the config; the model's training context is {})",
                                              p.n_ctx, n_ctx_train)});
    } else if (budget_tokens < n_ctx_train) {
        p.n_ctx = int32_t(std::max<int64_t>(budget_tokens, std::min(n_ctx_train, 2)));
        p.notes.push_back(
            {false, fmt::format("n_ctx {}: the model's training context is {} tokens, but {} holds {} tokens ({} a "
                                "token, {} for the whole training context); for a longer context raise kv_cache_mb "
                                "(or kv_pages), or set n_ctx (the pool then grows to hold one full context)",
                                p.n_ctx, n_ctx_train, source, budget_tokens, size_text(token_bytes),
                                size_text(token_bytes * n_ctx_train))});
    } else {
        p.n_ctx = n_ctx_train;
        p.notes.push_back({false, fmt::format("n_ctx {}: the model's training context", p.n_ctx)});
    }

    const int64_t per_ctx = (p.n_ctx + ps - 1) / ps;
    int64_t n_pages = budget_pages;
    if (cfg.kv_pages <= 0 && cfg.kv_cache_mb == 0) n_pages = std::min(n_pages, per_ctx * std::max(1, cfg.engine.sched.max_running));
    if (n_pages < per_ctx) { // any request the context allows must fit, alone
        p.notes.push_back({false, fmt::format("the KV pool is grown from {}'s {} pages ({}) to {} pages ({}): one "
                                              "full context of n_ctx {}",
                                              source, n_pages, size_text(double(n_pages) * double(page_bytes)), per_ctx,
                                              size_text(double(per_ctx) * double(page_bytes)), p.n_ctx)});
        n_pages = per_ctx;
    }
    p.n_pages = std::min<int64_t>(n_pages, INT32_MAX);

    p.max_prompt_tokens = p.n_ctx - 1;
    if (cfg.max_prompt_tokens > p.n_ctx - 1)
        p.notes.push_back({true, fmt::format("max_prompt_tokens {} is more than the context allows: {} (n_ctx {} less "
                                             "one, for the first generated token)",
                                             cfg.max_prompt_tokens, p.n_ctx - 1, p.n_ctx)});
    else if (cfg.max_prompt_tokens > 0)
        p.max_prompt_tokens = cfg.max_prompt_tokens;
    p.max_tokens_limit = p.n_ctx;
    if (cfg.max_tokens_limit > p.n_ctx)
        p.notes.push_back({true, fmt::format("max_tokens_limit {} is more than the context allows: {} (n_ctx)",
                                             cfg.max_tokens_limit, p.n_ctx)});
    else if (cfg.max_tokens_limit > 0)
        p.max_tokens_limit = cfg.max_tokens_limit;
    return p;
}

std::vector<std::string> config_keys() {
    std::vector<std::string> out;
    for (const auto& [k, fn] : setters()) out.push_back(k);
    return out;
}

} // namespace tandem::daemon
