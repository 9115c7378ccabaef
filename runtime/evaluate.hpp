// Model quality over a text: perplexity, and the drift of one model's next-token
// distributions from another's (INT8 vs F32).
#pragma once

#include "runtime/model.hpp"

#include <cstdint>
#include <span>

namespace tandem {

struct eval_params {
    int32_t n_ctx = 512;  // tokens per window; windows do not overlap, each starts fresh
    int32_t n_batch = 128; // tokens per forward step inside a window
};

struct perplexity_result {
    double ppl = 0;
    double mean_nll = 0;
    int64_t n_tokens = 0; // tokens scored (every token of a window but its first)
};

perplexity_result perplexity(const exec_ctx& ctx, model& m, std::span<const token_id> toks, const eval_params& p);

struct drift_result {
    double top1 = 0;      // fraction of positions where both argmaxes agree
    double mean_kl = 0;   // mean KL(base || test) in nats
    double ppl_base = 0, ppl_test = 0;
    int64_t n_tokens = 0;
};

// Both models must share the vocabulary; each runs with its own KV dtype.
drift_result eval_drift(const exec_ctx& ctx, model& base, model& test, std::span<const token_id> toks,
                        const eval_params& p);

} // namespace tandem
