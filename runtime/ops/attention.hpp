// Attention ops over paged KV: store each sequence's new K/V, causal attention of its new queries.
#pragma once

#include "runtime/attn_params.hpp"
#include "runtime/ops/dispatch.hpp"

#include <cstdint>

namespace tandem::ops {

// Every sequence of p in one op (runtime/attn_params.hpp). p's pages and tables are backend
// memory, its host_tables and sequences host memory, where they are checked: every page a new
// position goes to, and every page a new token sees (within the window), must be one of the
// n_pages. On backend::cuda q, k, v and out are device memory.

// Writes each sequence's new rows of k, v [n_tok, n_head_kv * head_dim] at its new positions.
void kv_store(const exec_ctx& ctx, const attn_params& p, int il, const float* k, const float* v);

// out, q [n_tok, n_head, head_dim]: each new token attends to the positions it sees.
void attention(const exec_ctx& ctx, const attn_params& p, int il, float* out, const float* q, int n_head, float scale);

} // namespace tandem::ops
