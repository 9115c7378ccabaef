// Prompt lookup, the n-gram proposer of speculative decoding: drafts from the sequence's own
// tokens, where its latest tokens occurred before.
#pragma once

#include "runtime/tokenizer.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

// Up to k tokens that followed an earlier occurrence of the sequence's last n tokens: n from
// n_max down to n_min (the longest suffix that recurs wins), the latest occurrence of it, and
// what followed it up to the end of the sequence. Empty when no suffix recurs.
std::vector<token_id> ngram_draft(std::span<const token_id> tokens, int32_t k, int32_t n_max = 3, int32_t n_min = 1);

} // namespace tandem
