// Prompt lookup: a plain scan, the longest recurring suffix first, its newest occurrence first.
#include "runtime/prompt_lookup.hpp"

#include <algorithm>

namespace tandem {

std::vector<token_id> ngram_draft(std::span<const token_id> tokens, int32_t k, int32_t n_max, int32_t n_min) {
    const int64_t size = int64_t(tokens.size());
    if (k <= 0) return {};
    for (int64_t n = std::min<int64_t>(n_max, size - 1); n >= std::max(1, n_min); --n) {
        const auto suffix = tokens.last(size_t(n));
        // Every earlier start, newest first (an occurrence may overlap the suffix: a run of one token).
        for (int64_t i = size - n - 1; i >= 0; --i) {
            if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + i)) continue;
            const int64_t from = i + n, to = std::min(size, from + k);
            return {tokens.begin() + from, tokens.begin() + to};
        }
    }
    return {};
}

} // namespace tandem
