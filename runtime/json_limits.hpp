// JSON from outside the process, parsed with a nesting limit: nlohmann's parser is iterative,
// but copying, comparing and printing a value recurse once per level, so a value nested
// 200,000 deep would end the process on the first copy. Every JSON text a client, a batch
// file or a stored state file hands us goes through parse_json_limited.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace tandem {

// The default nesting limit (objects and arrays inside each other) of the daemon's inputs;
// config key max_json_depth.
inline constexpr int default_max_json_depth = 64;

// Where `text` first opens a container deeper than `max_depth`: its byte offset, and the place
// of that container as an API names it ("messages[0].content[0][0]"). Found by one iterative
// pass that skips strings; nullopt when it never does. Text that is not JSON is not judged
// here (the parser says what is wrong with it).
struct json_depth_excess {
    size_t offset = 0;
    std::string path;
};
std::optional<json_depth_excess> json_too_deep(std::string_view text, int max_depth);

// Parses `text` unless it nests deeper than `max_depth`; never throws. nullopt with `why`
// ("nested deeper than 64 levels (at byte 130)", "not valid JSON: ...") otherwise, and for
// nesting, the place where it goes too deep in `*where`.
template <class Json = nlohmann::ordered_json>
std::optional<Json> parse_json_limited(std::string_view text, int max_depth, std::string& why,
                                       std::string* where = nullptr) {
    if (const auto e = json_too_deep(text, max_depth)) {
        why = "nested deeper than " + std::to_string(max_depth) + " levels (at byte " + std::to_string(e->offset) + ")";
        if (where) *where = e->path;
        return std::nullopt;
    }
    try {
        return Json::parse(text);
    } catch (const std::exception& e) { // syntax, a number out of range, invalid UTF-8
        why = std::string("not valid JSON: ") + e.what();
        return std::nullopt;
    }
}

} // namespace tandem
