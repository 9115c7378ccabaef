// Attention ops: checks and dispatch.
#include "runtime/ops/attention.hpp"

#include "cpu/ops/ops.hpp"
#include "cpu/ref/ops_ref.hpp"
#include "runtime/ops/op_defs.hpp"

namespace tandem::ops {
namespace {

// The ref and CPU bindings; CUDA comes through each op's slot.
struct kv_store_impl : kv_store_op {
    static constexpr auto ref = ::tandem::cpu::ref::kv_store;
    static constexpr auto cpu = ::tandem::cpu::kv_store;
};
struct attention_impl : attention_op {
    static constexpr auto ref = ::tandem::cpu::ref::attention;
    static constexpr auto cpu = ::tandem::cpu::attention;
};

// Each sequence's pages, from the one its first new token sees first to its last new
// position, must be pages of the pool: tables come from the scheduler, possibly through a
// worker's channel, so a bad one is a tandem::error, not a wild write.
void check(const attn_params& p, int il) {
    TANDEM_ASSERT(il >= 0 && il < p.lay.n_layer && p.window >= 0);
    TANDEM_ASSERT(p.seqs.empty() || (p.tables != nullptr && p.kv_base != nullptr));
    const int32_t ps = p.lay.page_size;
    for (const attn_seq& s : p.seqs) {
        TANDEM_ASSERT(s.row >= 0 && s.n_tok >= 0 && s.n_past >= 0 && s.table_begin >= 0);
        if (s.n_tok == 0) continue;
        const int32_t end = s.n_past + s.n_tok;
        TANDEM_CHECK(int64_t(s.table_begin) + (end + ps - 1) / ps <= int64_t(p.host_tables.size()),
                      "a block table of {} entries from {} cannot hold {} positions", p.host_tables.size(),
                      s.table_begin, end);
        const int32_t* table = p.host_tables.data() + s.table_begin;
        for (int32_t pg = p.first_seen(s.n_past) / ps; pg < (end + ps - 1) / ps; ++pg)
            TANDEM_CHECK(table[pg] >= 0 && table[pg] < p.n_pages, "page {} of a sequence's table is {} ({} pages)",
                          pg, table[pg], p.n_pages);
    }
}

} // namespace

void kv_store(const exec_ctx& ctx, const attn_params& p, int il, const float* k, const float* v) {
    check(p, il);
    dispatch<kv_store_impl>(ctx, p, il, k, v);
}

void attention(const exec_ctx& ctx, const attn_params& p, int il, float* out, const float* q, int n_head,
               float scale) {
    check(p, il);
    TANDEM_ASSERT(n_head % p.lay.n_head_kv == 0, "{} heads over {} kv heads", n_head, p.lay.n_head_kv);
    dispatch<attention_impl>(ctx, p, il, out, q, n_head, scale);
}

} // namespace tandem::ops
