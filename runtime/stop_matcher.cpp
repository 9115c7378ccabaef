// The stop-string matcher (runtime/stop_matcher.hpp).
#include "runtime/stop_matcher.hpp"

#include <algorithm>

namespace tandem {

stop_matcher::stop_matcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string stop_matcher::push(std::string_view text) {
    if (stopped_) return {};
    held_ += text;
    size_t first = std::string::npos;
    for (const auto& s : stops_)
        if (const size_t at = held_.find(s); at < first) {
            first = at;
            matched_ = s;
        }
    if (first != std::string::npos) {
        stopped_ = true;
        std::string out = held_.substr(0, first);
        held_.clear();
        return out;
    }
    // Keep the longest tail of held_ that is a proper prefix of some stop string.
    size_t keep = 0;
    for (const auto& s : stops_) {
        for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
            if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
                keep = n;
                break;
            }
        }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string stop_matcher::flush() {
    std::string out;
    if (!stopped_) out.swap(held_);
    return out;
}

} // namespace tandem
