// The nesting scan of runtime/json_limits.hpp.
#include "runtime/json_limits.hpp"

#include <vector>

namespace tandem {
namespace {

// One open container on the way down: an array counts its elements, an object remembers the
// key of the value being read (raw, as the text writes it between its quotes).
struct frame {
    bool object = false;
    bool expect_key = false;
    size_t index = 0;
    std::string_view key;
};

std::string path_of(const std::vector<frame>& stack) {
    std::string p;
    for (size_t i = 0; i + 1 < stack.size(); ++i) { // (the last is the one opened too deep)
        const frame& f = stack[i];
        if (f.object) p += (p.empty() ? "" : ".") + std::string(f.key);
        else p += "[" + std::to_string(f.index) + "]";
    }
    return p;
}

} // namespace

std::optional<json_depth_excess> json_too_deep(std::string_view text, int max_depth) {
    std::vector<frame> stack;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (c == '"') { // a string: skipped, or taken as the key it is
            const size_t start = i + 1;
            for (++i; i < text.size() && text[i] != '"'; ++i)
                if (text[i] == '\\') ++i; // the escaped character (\" included) cannot end the string
            if (!stack.empty() && stack.back().object && stack.back().expect_key) {
                stack.back().key = text.substr(start, std::min(i, text.size()) - start);
                stack.back().expect_key = false;
            }
        } else if (c == '[' || c == '{') {
            stack.push_back({c == '{', c == '{', 0, {}});
            if (int(stack.size()) > max_depth) return json_depth_excess{i, path_of(stack)};
        } else if (c == ']' || c == '}') {
            if (!stack.empty()) stack.pop_back();
        } else if (c == ',' && !stack.empty()) {
            if (stack.back().object) stack.back().expect_key = true;
            else ++stack.back().index;
        }
    }
    return std::nullopt;
}

} // namespace tandem
