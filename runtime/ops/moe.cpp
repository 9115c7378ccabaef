// Mixture-of-experts ops: checks, dispatch, and the grouping of tokens by expert.
#include "runtime/ops/moe.hpp"

#include "cpu/ref/moe_ref.hpp"
#include "cpu/thread_pool.hpp"

namespace tandem::ops {
namespace {

// The reference is the CPU's kernel too, a range of tokens (or rows) per thread: routing is
// a few hundred operations a token beside the experts' matmuls.
struct moe_route_impl {
    static constexpr std::string_view name = "moe_route";
    static constexpr auto ref = ::tandem::cpu::ref::moe_route;
    static void cpu(::tandem::cpu::thread_pool& pool, int32_t* ids, float* weights, const float* logits, int64_t n_tok,
                    int n_expert, int k, bool norm) {
        pool.parallel_for(n_tok, ::tandem::cpu::thread_pool::grain_for(n_expert * 16, 1), [&](int64_t b, int64_t e) {
            ref(ids + b * k, weights + b * k, logits + b * n_expert, e - b, n_expert, k, norm);
        });
    }
};
struct add_rows_scaled_impl {
    static constexpr std::string_view name = "add_rows_scaled";
    static constexpr auto ref = ::tandem::cpu::ref::add_rows_scaled;
    static void cpu(::tandem::cpu::thread_pool& pool, float* x, const float* y, const int32_t* rows, const float* w,
                    int64_t n_rows, int64_t n) {
        pool.parallel_for(n_rows, ::tandem::cpu::thread_pool::grain_for(n * 2, 1), [&](int64_t b, int64_t e) {
            ref(x, y + b * n, rows + b, w + b, e - b, n);
        });
    }
};

} // namespace

void moe_route(const exec_ctx& ctx, int32_t* ids, float* weights, const float* logits, int64_t n_tok, int n_expert,
               int k, bool norm) {
    TANDEM_ASSERT(n_tok >= 0 && n_expert > 0 && k > 0 && k <= n_expert, "top {} of {} experts", k, n_expert);
    dispatch<moe_route_impl>(ctx, ids, weights, logits, n_tok, n_expert, k, norm);
}

void add_rows_scaled(const exec_ctx& ctx, float* x, const float* y, const int32_t* rows, const float* w, int64_t n_rows,
                     int64_t n) {
    TANDEM_ASSERT(n_rows >= 0 && n > 0);
    dispatch<add_rows_scaled_impl>(ctx, x, y, rows, w, n_rows, n);
}

int32_t expert_groups::n_active() const {
    int32_t n = 0;
    for (size_t x = 0; x + 1 < offset.size(); ++x) n += offset[x + 1] > offset[x];
    return n;
}

expert_groups group_by_expert(const int32_t* ids, const float* weights, int64_t n_tok, int k, int n_expert) {
    // A counting sort: tokens stay ascending within each expert.
    expert_groups g;
    g.offset.assign(size_t(n_expert) + 1, 0);
    for (int64_t i = 0; i < n_tok * k; ++i) {
        TANDEM_ASSERT(ids[i] >= 0 && ids[i] < n_expert, "expert {} of {}", ids[i], n_expert);
        ++g.offset[size_t(ids[i]) + 1];
    }
    for (int x = 0; x < n_expert; ++x) g.offset[size_t(x) + 1] += g.offset[size_t(x)];
    g.tokens.resize(size_t(n_tok * k));
    g.weights.resize(size_t(n_tok * k));
    std::vector<int32_t> next(g.offset.begin(), g.offset.end() - 1);
    for (int64_t t = 0; t < n_tok; ++t)
        for (int j = 0; j < k; ++j) {
            const int32_t at = next[size_t(ids[t * k + j])]++;
            g.tokens[size_t(at)] = int32_t(t);
            g.weights[size_t(at)] = weights[t * k + j];
        }
    return g;
}

} // namespace tandem::ops
