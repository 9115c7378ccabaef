// The OpenAI Batch file format: one request a line in, one result a line out. Input lines
// {"custom_id", "method": "POST", "url", "body"}; output lines {"id", "custom_id", "response":
// {"status_code", "request_id", "body"}, "error"}. `tandem batch` reads and writes these files;
// a rerun with the same output file goes on where the last one stopped (batch_done).
#pragma once

#include "runtime/json_limits.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace tandem::daemon::batch {

using json = nlohmann::ordered_json; // bodies keep their keys in order (a schema's properties)

// The routes a line may name.
inline constexpr std::string_view routes[] = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings"};

// A valid input line.
struct request_line {
    int64_t line = 0;                 // 1-based, in the input file
    std::string custom_id;
    std::string url;
    json body;
};

// An input line that cannot run: its error line goes to the output, the rest goes on.
struct line_error {
    int64_t line = 0;
    std::string custom_id;            // empty when the line has none
    std::string code;                 // "invalid_json" or "invalid_line"
    std::string message;
};

// Reads input line `line` (without its newline). Unknown keys, a method other than POST, a
// route not in `routes`, a body that is not an object or asks to stream are errors that name
// what is wrong.
// A line nested deeper than `max_depth` is an error line of its own (runtime/json_limits.hpp).
std::variant<request_line, line_error> parse_line(std::string_view text, int64_t line,
                                                  int max_depth = default_max_json_depth);

// Every line of an input file: requests and errors in file order; blank lines are skipped.
// A custom_id on two lines throws tandem::error naming both (the results could not be told
// apart, nor a rerun know which one it answered), as OpenAI refuses such a file.
struct input {
    std::vector<request_line> requests;
    std::vector<line_error> errors;
};
input read_input(std::string_view text, int max_depth = default_max_json_depth);

// The output line of a request answered with `status` (any HTTP status: a 400 is the line's
// result too) and its response body; request_id is the body's "id" when it has one.
json result_line(const std::string& custom_id, int status, const std::string& body_text);
// The output line of an input line that could not run: "response" null, "error" {code,
// message, line} (line: Tandem's, so a line without a custom_id is known on a rerun).
json error_line(const line_error& e);

// The whole of the file at `path`; throws tandem::error "cannot read PATH".
std::string read_file(const std::string& path);

// What an output file holds already: the custom_ids it answered, and the input lines without
// one that it answered (their errors). A last line cut short (a crash while writing it) is
// not counted: `whole_bytes` is where the whole lines end, and the next writer truncates the
// file there before appending.
struct done_set {
    std::set<std::string> ids;
    std::set<int64_t> lines;
    uint64_t whole_bytes = 0;
    size_t size() const { return ids.size() + lines.size(); }
    bool has(const request_line& r) const { return ids.count(r.custom_id) > 0; }
    bool has(const line_error& e) const {
        return e.custom_id.empty() ? lines.count(e.line) > 0 : ids.count(e.custom_id) > 0;
    }
};
// Reads the output file at `path` (none yet: an empty set). Throws tandem::error when the
// file holds whole lines that are not output lines (it is not a batch output: better refuse
// than append to it).
done_set read_done(const std::string& path);
// The same from the file's text, its errors naming `name`.
done_set parse_done(std::string_view text, const std::string& name);

} // namespace tandem::daemon::batch
