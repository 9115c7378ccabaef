// Attention ops over the paged KV cache: store new K/V, causal attention of new queries.
#pragma once

#include "runtime/kv_cache.hpp"
#include "runtime/ops/dispatch.hpp"

#include <cstdint>
#include <span>

namespace tandem::ops {

// On backend::cuda q, k, v, out are device memory and `kv` a view over device pages
// (kv_cache(layout, n_pages, device_base)); block_table stays in host memory, where it is
// checked, and the op copies the entries it needs over.

// Writes k, v [n_tok, n_head_kv * head_dim] at positions pos0.. into the sequence's pages.
void kv_store(const exec_ctx& ctx, kv_cache& kv, int il, std::span<const int32_t> block_table, int32_t pos0,
              const float* k, const float* v, int64_t n_tok);

// out, q [n_tok, n_head, head_dim]; token t is at position n_past + t and sees 0..n_past+t.
void attention(const exec_ctx& ctx, float* out, const float* q, int64_t n_tok, int32_t n_past, int n_head,
               const kv_cache& kv, int il, std::span<const int32_t> block_table, float scale);

// One new token of a sequence in a decode step: its query is row `row` of q [rows, n_head,
// head_dim] (its output the same row of out), at position n_past, seeing 0..n_past.
struct decode_seq {
    int64_t row;
    int32_t n_past;
    std::span<const int32_t> block_table;
};

// attention() of every sequence in seqs, one token each, in one op: the same values as one call
// per sequence, with the threads handed (sequence, kv head) jobs across all of them rather than
// woken and joined once per sequence and layer.
void attention_decode(const exec_ctx& ctx, float* out, const float* q, std::span<const decode_seq> seqs, int n_head,
                      const kv_cache& kv, int il, float scale);

} // namespace tandem::ops
