// Mixture-of-experts ops: routing (scores, top-k, weights), the tokens grouped by expert, and
// the weighted scatter of each expert's rows back to its tokens.
#pragma once

#include "runtime/ops/dispatch.hpp"

#include <cstdint>
#include <vector>

namespace tandem::ops {

// ids, weights [n_tok, k] = each token's k experts from its router logits [n_tok, n_expert]:
// softmax over all experts, the k most probable (most probable first, a tie to the lower
// index), their probabilities as weights, renormalised to sum 1 when norm
// (cpu/ref/moe_ref.hpp is the spec). Host backends.
void moe_route(const exec_ctx& ctx, int32_t* ids, float* weights, const float* logits, int64_t n_tok, int n_expert,
               int k, bool norm);

// x [., n]: row rows[i] += w[i] * y [i] for each i < n_rows; the rows must be distinct.
void add_rows_scaled(const exec_ctx& ctx, float* x, const float* y, const int32_t* rows, const float* w, int64_t n_rows,
                     int64_t n);

// A step's tokens sorted by expert (host memory): expert x's tokens are
// tokens[offset[x] .. offset[x + 1]), ascending, with the weight each gives x. A decode batch
// reads each chosen expert's weights once, and a prefill chunk runs one matmul per expert.
struct expert_groups {
    std::vector<int32_t> offset; // [n_expert + 1]
    std::vector<int32_t> tokens; // [n_tok * k]
    std::vector<float> weights;  // [n_tok * k]
    int32_t n_tokens(int x) const { return offset[size_t(x) + 1] - offset[size_t(x)]; }
    int32_t n_active() const;    // experts with a token
};
// From moe_route's ids and weights [n_tok, k] (host memory).
expert_groups group_by_expert(const int32_t* ids, const float* weights, int64_t n_tok, int k, int n_expert);

} // namespace tandem::ops
