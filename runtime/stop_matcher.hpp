// Stop strings: text held back while it might be the start of one, cut at the first found.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// Holds back text that might be the start of a stop string; cuts the text at the first
// stop string found (the stop string itself is not part of the output).
class stop_matcher {
public:
    explicit stop_matcher(std::vector<std::string> stops);
    // Returns the text that is safe to emit now.
    std::string push(std::string_view text);
    // Returns what is still held back (at the end of generation).
    std::string flush();
    bool stopped() const { return stopped_; }
    // The stop string that stopped it (empty while none has).
    const std::string& matched() const { return matched_; }

private:
    std::vector<std::string> stops_;
    std::string matched_;
    std::string held_;
    bool stopped_ = false;
};

} // namespace tandem
