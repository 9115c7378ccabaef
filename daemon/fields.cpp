// The field readers of daemon/fields.hpp.
#include "daemon/fields.hpp"

#include "runtime/json_limits.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace tandem::daemon {

std::variant<json, api_error> parse_request_body(std::string_view body, int max_depth) {
    std::string why, where;
    std::optional<json> j = parse_json_limited<json>(body, max_depth, why, &where);
    if (!j) {
        api_error e = bad(fmt::format("the request body is {}", why), where);
        if (why.starts_with("nested")) {
            e.message += " (max_json_depth in tandemd.conf)";
            e.code = "json_too_deep";
        }
        return e;
    }
    if (!j->is_object()) return bad("the request body must be a JSON object");
    return std::move(*j);
}

std::string place(std::string_view where, std::string_view key) {
    return where.empty() ? std::string(key) : fmt::format("{}.{}", where, key);
}

std::string place(std::string_view where, size_t i) { return fmt::format("{}[{}]", where, i); }

field_error read_number(const json& j, const char* key, double lo, double hi, double& out, std::string_view where) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    const std::string q = place(where, key);
    if (!it->is_number()) return bad(fmt::format("'{}' must be a number", q), q);
    const double v = it->get<double>();
    if (!(v >= lo && v <= hi)) return bad(fmt::format("'{}' must be between {} and {}", q, lo, hi), q);
    out = v;
    return std::nullopt;
}

field_error read_int(const json& j, const char* key, int64_t lo, int64_t hi, int64_t& out, std::string_view where) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    const std::string q = place(where, key);
    const auto out_of_range = [&] { return bad(fmt::format("'{}' must be between {} and {}", q, lo, hi), q); };
    int64_t v = 0;
    if (it->is_number_float()) {
        const double d = it->get<double>();
        if (d != std::floor(d)) return bad(fmt::format("'{}' must be an integer", q), q);
        if (!(d >= -0x1p63 && d < 0x1p63)) return out_of_range();
        v = int64_t(d);
    } else if (it->is_number_integer()) {
        if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(hi)) return out_of_range();
        v = it->get<int64_t>();
    } else {
        return bad(fmt::format("'{}' must be an integer", q), q);
    }
    if (v < lo || v > hi) return out_of_range();
    out = v;
    return std::nullopt;
}

field_error read_bool(const json& j, const char* key, bool& out, std::string_view where) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    const std::string q = place(where, key);
    if (!it->is_boolean()) return bad(fmt::format("'{}' must be a boolean", q), q);
    out = it->get<bool>();
    return std::nullopt;
}

field_error read_string(const json& j, const char* key, std::string& out, std::string_view where) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    const std::string q = place(where, key);
    if (!it->is_string()) return bad(fmt::format("'{}' must be a string", q), q);
    out = it->get<std::string>();
    return std::nullopt;
}

field_error check_keys(const json& j, std::string_view where, std::initializer_list<std::string_view> known,
                       bool null_passes, std::initializer_list<std::string_view> asks_nothing) {
    for (const auto& item : j.items()) { // (clang 14: a lambda cannot capture a structured binding)
        const std::string& key = item.key();
        const json& value = item.value();
        const auto is = [&](std::string_view k) { return k == key; };
        if (std::any_of(known.begin(), known.end(), is) || std::any_of(asks_nothing.begin(), asks_nothing.end(), is))
            continue;
        if (null_passes && (value.is_null() || (value.is_array() && value.empty()))) continue;
        std::string list;
        for (const std::string_view k : known) list += fmt::format("{}{}", list.empty() ? "" : ", ", k);
        const std::string q = place(where, key);
        return bad(fmt::format("'{}' is not supported ({})", q, list), q);
    }
    return std::nullopt;
}

bool all_ints(const json& a) {
    for (const auto& x : a)
        if (!x.is_number_integer()) return false;
    return true;
}

} // namespace tandem::daemon
