// Reading a request's JSON fields: each reader checks the type and range before it uses a
// value, and every refusal is a 400 whose param names the field's place ("messages[2].content",
// "stream_options.include_usage"), for every API surface alike. No reader throws.
#pragma once

#include "daemon/reply.hpp"

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace tandem::daemon {

// The JSON object of a request body, or a 400 (not JSON, not an object, or nested deeper
// than max_depth: runtime/json_limits.hpp; the 400's param names where).
std::variant<json, api_error> parse_request_body(std::string_view body, int max_depth);

// A reader's verdict: nullopt when the field was fine (or absent), else the 400.
using field_error = std::optional<api_error>;

// Returns the error of `expr` from the enclosing function, if it has one.
#define TANDEM_TRY(expr)                                                                           \
    do {                                                                                           \
        if (auto e_ = (expr)) return *e_;                                                          \
    } while (0)

// The place of `key` in the object at `where` ("" for the body): "stream_options.include_usage".
std::string place(std::string_view where, std::string_view key);
// The place of element i of the array at `where`: "messages[2]".
std::string place(std::string_view where, size_t i);

// Optional fields of the object j at `where`: absent or null leave `out` as it is.
field_error read_number(const json& j, const char* key, double lo, double hi, double& out, std::string_view where = {});
// An integer, or a number with an integral value (4.0, as JSON encoders of floats write it).
field_error read_int(const json& j, const char* key, int64_t lo, int64_t hi, int64_t& out, std::string_view where = {});
field_error read_bool(const json& j, const char* key, bool& out, std::string_view where = {});
field_error read_string(const json& j, const char* key, std::string& out, std::string_view where = {});

// The keys of the object j at `where` must be among `known`: any other is a 400 naming it
// ("'messages[2].name' is not supported (role, content, ...)"), so nothing nested is silently
// ignored either. A key in `asks_nothing` (or, when null_passes, any key whose value is null
// or an empty array) passes: it asks for nothing.
field_error check_keys(const json& j, std::string_view where, std::initializer_list<std::string_view> known,
                       bool null_passes = false, std::initializer_list<std::string_view> asks_nothing = {});

// Whether every element of the array a is an integer.
bool all_ints(const json& a);

} // namespace tandem::daemon
