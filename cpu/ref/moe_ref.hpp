// Scalar reference kernels of mixture-of-experts routing: the spec of the routing op.
#pragma once

#include <cstdint>

namespace tandem::cpu::ref {

// Each token's experts from its router logits [n_tok, n_expert]: the probabilities are the
// softmax over all experts, the chosen ids [n_tok, k] the k most probable, most probable first,
// a tie going to the lower index; weights [n_tok, k] their probabilities, divided by the k's sum
// when norm (qwen3moe, Mixtral), as they are otherwise (qwen2moe).
void moe_route(int32_t* ids, float* weights, const float* logits, int64_t n_tok, int n_expert, int k, bool norm);

// x [., n]: row rows[i] += w[i] * y [i] for each i < n_rows (rows distinct), in order.
void add_rows_scaled(float* x, const float* y, const int32_t* rows, const float* w, int64_t n_rows, int64_t n);

} // namespace tandem::cpu::ref
