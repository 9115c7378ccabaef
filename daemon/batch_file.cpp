// The Batch file format: input lines checked one by one, output lines, and what an output
// file written before already holds.
#include "daemon/batch_file.hpp"

#include "runtime/error.hpp"
#include "runtime/json_limits.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iterator>
#include <map>
#include <random>

namespace tandem::daemon::batch {
namespace {

// "batch_req_" and 24 hex digits, unique in this process and unlikely across runs.
std::string new_request_id() {
    static const uint64_t salt = std::random_device{}() * 0x9e3779b97f4a7c15ull ^ std::random_device{}();
    static std::atomic<uint64_t> n{0};
    return fmt::format("batch_req_{:016x}{:08x}", salt, uint32_t(++n));
}

std::string routes_list() {
    std::string s;
    for (std::string_view r : routes) s += (s.empty() ? "" : ", ") + std::string(r);
    return s;
}

} // namespace

std::variant<request_line, line_error> parse_line(std::string_view text, int64_t line, int max_depth) {
    line_error e{line, "", "invalid_line", ""};
    const auto fail = [&](std::string message) {
        e.message = fmt::format("line {}: {}", line, message);
        return e;
    };
    std::string why;
    std::optional<json> parsed = parse_json_limited<json>(text, max_depth, why);
    if (!parsed) { // (a syntax error, a number out of range, or nesting past the limit)
        e.code = "invalid_json";
        return fail(why);
    }
    const json& j = *parsed;
    if (!j.is_object()) return fail("not a JSON object");
    if (auto id = j.find("custom_id"); id != j.end() && id->is_string()) e.custom_id = id->get<std::string>();
    for (const auto& [key, value] : j.items())
        if (key != "custom_id" && key != "method" && key != "url" && key != "body")
            return fail(fmt::format("unknown key \"{}\" (a line holds custom_id, method, url and body)", key));
    if (e.custom_id.empty()) return fail("\"custom_id\" must be a non-empty string");
    const auto method = j.find("method");
    if (method == j.end() || !method->is_string() || method->get<std::string>() != "POST")
        return fail("\"method\" must be \"POST\"");
    const auto url = j.find("url");
    if (url == j.end() || !url->is_string() ||
        std::find(std::begin(routes), std::end(routes), url->get<std::string>()) == std::end(routes))
        return fail(fmt::format("\"url\" must be one of {}", routes_list()));
    const auto body = j.find("body");
    if (body == j.end() || !body->is_object()) return fail("\"body\" must be a JSON object");
    if (auto s = body->find("stream"); s != body->end() && s->is_boolean() && s->get<bool>())
        return fail("\"stream\": true is not supported in a batch (each result is written whole)");
    return request_line{line, e.custom_id, url->get<std::string>(), *body};
}

input read_input(std::string_view text, int max_depth) {
    input in;
    std::map<std::string, int64_t> seen; // custom_id -> its line
    int64_t line = 0;
    size_t at = 0;
    while (at < text.size()) {
        size_t end = text.find('\n', at);
        if (end == std::string_view::npos) end = text.size();
        std::string_view l = text.substr(at, end - at);
        at = end + 1;
        ++line;
        if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
        if (l.find_first_not_of(" \t") == std::string_view::npos) continue;
        auto parsed = parse_line(l, line, max_depth);
        const std::string id = std::visit([](const auto& p) { return p.custom_id; }, parsed);
        if (!id.empty()) {
            const auto [it, fresh] = seen.emplace(id, line);
            if (!fresh)
                throw error(fmt::format("custom_id \"{}\" is on lines {} and {}: each request needs its own", id,
                                        it->second, line));
        }
        if (auto* r = std::get_if<request_line>(&parsed))
            in.requests.push_back(std::move(*r));
        else
            in.errors.push_back(std::get<line_error>(std::move(parsed)));
    }
    return in;
}

json result_line(const std::string& custom_id, int status, const std::string& body_text) {
    std::string why;
    std::optional<json> parsed = parse_json_limited<json>(body_text, default_max_json_depth, why);
    json body = parsed ? std::move(*parsed) : json(body_text); // not JSON (never from tandemd): kept as text
    std::string request_id;
    if (body.is_object())
        if (auto id = body.find("id"); id != body.end() && id->is_string()) request_id = id->get<std::string>();
    if (request_id.empty()) request_id = new_request_id();
    return json{{"id", new_request_id()},
                {"custom_id", custom_id},
                {"response", {{"status_code", status}, {"request_id", request_id}, {"body", std::move(body)}}},
                {"error", nullptr}};
}

json error_line(const line_error& e) {
    return json{{"id", new_request_id()},
                {"custom_id", e.custom_id.empty() ? json(nullptr) : json(e.custom_id)},
                {"response", nullptr},
                {"error", {{"code", e.code}, {"message", e.message}, {"line", e.line}}}};
}

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw error(fmt::format("cannot read {}", path));
    return std::string(std::istreambuf_iterator<char>(f), {});
}

done_set read_done(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return {}; // (an unreadable file fails when it is opened for writing)
    return parse_done(std::string(std::istreambuf_iterator<char>(f), {}), path);
}

done_set parse_done(std::string_view text, const std::string& path) {
    done_set done;
    size_t at = 0;
    int64_t n = 0;
    while (at < text.size()) {
        const size_t end = text.find('\n', at);
        if (end == std::string_view::npos) break; // cut short: not counted, truncated away
        const std::string_view l = text.substr(at, end - at);
        ++n;
        std::string why;
        const json j = parse_json_limited<json>(l, default_max_json_depth, why).value_or(json());
        const auto id = j.is_object() ? j.find("custom_id") : j.end();
        const bool ok = j.is_object() && id != j.end() && j.contains("response") && j.contains("error");
        if (!ok) throw error(fmt::format("{}: line {} is not a batch output line; not appending to it", path, n));
        if (id->is_string()) {
            done.ids.insert(id->get<std::string>());
        } else {
            const json& err = j["error"];
            if (!err.is_object() || !err.contains("line") || !err["line"].is_number_integer())
                throw error(fmt::format("{}: line {} has neither a custom_id nor an input line", path, n));
            done.lines.insert(err["line"].get<int64_t>());
        }
        at = end + 1;
        done.whole_bytes = at;
    }
    return done;
}

} // namespace tandem::daemon::batch
