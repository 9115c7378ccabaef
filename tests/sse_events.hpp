// The data of every SSE event in `wire`, fed to one sse_parser in pieces of `piece` bytes
// (shared by the SSE parser's tests and its fuzz target).
#pragma once

#include "ipc/sse.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace tandem::test {

inline std::vector<std::string> sse_events(std::string_view wire, size_t piece) {
    ipc::sse_parser p;
    std::vector<std::string> out;
    for (size_t i = 0; i < wire.size(); i += piece)
        p.feed(wire.substr(i, piece), [&](std::string_view d) {
            out.emplace_back(d);
            return true;
        });
    return out;
}

} // namespace tandem::test
