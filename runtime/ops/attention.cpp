// Attention ops: checks and dispatch.
#include "runtime/ops/attention.hpp"

#include "cpu/ops/ops.hpp"
#include "cpu/ref/ops_ref.hpp"
#include "runtime/ops/op_defs.hpp"

#include <vector>

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
// Rows, positions and block tables of a decode step as arrays (what the kernels take).
struct decode_batch {
    std::vector<int64_t> rows;
    std::vector<int32_t> n_past;
    std::vector<const int32_t*> tables;
};

struct attention_decode_impl : attention_decode_op {
    static void ref(float* out, const float* q, int64_t n_seq, const int64_t* rows, const int32_t* n_past,
                    const int32_t* const* tables, int n_head, const uint8_t* kv_base, const kv_layout& lay, int il,
                    float scale) {
        const int64_t stride = int64_t(n_head) * lay.head_dim;
        for (int64_t i = 0; i < n_seq; ++i)
            ::tandem::cpu::ref::attention(out + rows[i] * stride, q + rows[i] * stride, 1, n_past[i], n_head, kv_base,
                                          lay, il, tables[i], scale);
    }
    static constexpr auto cpu = ::tandem::cpu::attention_decode;
};

// The sequence's pages must cover positions [0, n_end).
void check_pages(const kv_cache& kv, std::span<const int32_t> block_table, int64_t n_end) {
    const int32_t ps = kv.layout().page_size;
    TANDEM_ASSERT(int64_t(block_table.size()) * ps >= n_end, "{} pages cannot hold {} positions",
                  block_table.size(), n_end);
    for (int64_t i = 0; i < (n_end + ps - 1) / ps; ++i)
        TANDEM_ASSERT(block_table[size_t(i)] >= 0 && block_table[size_t(i)] < kv.n_pages());
}

} // namespace

void kv_store(const exec_ctx& ctx, kv_cache& kv, int il, std::span<const int32_t> block_table, int32_t pos0,
              const float* k, const float* v, int64_t n_tok) {
    TANDEM_ASSERT(il >= 0 && il < kv.layout().n_layer && pos0 >= 0);
    check_pages(kv, block_table, pos0 + n_tok);
    dispatch<kv_store_impl>(ctx, kv.base(), kv.layout(), il, block_table.data(), pos0, k, v, n_tok);
}

void attention(const exec_ctx& ctx, float* out, const float* q, int64_t n_tok, int32_t n_past, int n_head,
               const kv_cache& kv, int il, std::span<const int32_t> block_table, float scale) {
    TANDEM_ASSERT(il >= 0 && il < kv.layout().n_layer && n_past >= 0);
    TANDEM_ASSERT(n_head % kv.layout().n_head_kv == 0, "{} heads over {} kv heads", n_head, kv.layout().n_head_kv);
    check_pages(kv, block_table, n_past + n_tok);
    dispatch<attention_impl>(ctx, out, q, n_tok, n_past, n_head, kv.base(), kv.layout(), il, block_table.data(),
                             scale);
}

void attention_decode(const exec_ctx& ctx, float* out, const float* q, std::span<const decode_seq> seqs, int n_head,
                      const kv_cache& kv, int il, float scale) {
    TANDEM_ASSERT(il >= 0 && il < kv.layout().n_layer);
    TANDEM_ASSERT(n_head % kv.layout().n_head_kv == 0, "{} heads over {} kv heads", n_head, kv.layout().n_head_kv);
    thread_local decode_batch b; // reused: a decode step calls this once per layer
    b.rows.clear();
    b.n_past.clear();
    b.tables.clear();
    for (const decode_seq& s : seqs) {
        TANDEM_ASSERT(s.row >= 0 && s.n_past >= 0);
        check_pages(kv, s.block_table, int64_t(s.n_past) + 1);
        b.rows.push_back(s.row);
        b.n_past.push_back(s.n_past);
        b.tables.push_back(s.block_table.data());
    }
    dispatch<attention_decode_impl>(ctx, out, q, int64_t(seqs.size()), b.rows.data(), b.n_past.data(),
                                    b.tables.data(), n_head, kv.base(), kv.layout(), il, scale);
}

} // namespace tandem::ops
