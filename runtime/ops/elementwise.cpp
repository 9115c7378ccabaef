// Element-wise ops: checks and dispatch.
#include "runtime/ops/elementwise.hpp"

#include "quant/lowbit.hpp"
#include "cpu/ops/ops.hpp"
#include "cpu/ref/ops_ref.hpp"
#include "cpu/thread_pool.hpp"
#include "runtime/ops/op_defs.hpp"

#include <vector>

namespace tandem::ops {
namespace {

// The ref and CPU bindings; CUDA comes through each op's slot.
// Copies of rows: the reference is all the CPU needs.
struct embed_impl : embed_op {
    static constexpr auto ref = ::tandem::cpu::ref::embed;
    static void cpu(::tandem::cpu::thread_pool&, float* out, const int32_t* tokens, int64_t n_tok, const int8_t* q,
                    const float* scale, const float* f, int64_t n_embd) {
        ref(out, tokens, n_tok, q, scale, f, n_embd);
    }
};
struct gather_rows_impl : gather_rows_op {
    static constexpr auto ref = ::tandem::cpu::ref::gather_rows;
    static void cpu(::tandem::cpu::thread_pool&, float* out, const float* x, const int32_t* rows, int64_t n_rows,
                    int64_t n) {
        ref(out, x, rows, n_rows, n);
    }
};
struct rms_norm_impl : rms_norm_op {
    static constexpr auto ref = ::tandem::cpu::ref::rms_norm;
    static constexpr auto cpu = ::tandem::cpu::rms_norm;
};
struct rope_impl : rope_op {
    static constexpr auto ref = ::tandem::cpu::ref::rope;
    static constexpr auto cpu = ::tandem::cpu::rope;
};
struct swiglu_impl : swiglu_op {
    static constexpr auto ref = ::tandem::cpu::ref::swiglu;
    static constexpr auto cpu = ::tandem::cpu::swiglu;
};
// The element-wise maps the reference writes, on the pool a range each.
struct geglu_impl : geglu_op {
    static constexpr auto ref = ::tandem::cpu::ref::geglu;
    static void cpu(::tandem::cpu::thread_pool& pool, float* out, const float* gate, const float* up, int64_t n) {
        pool.parallel_for(n, ::tandem::cpu::thread_pool::grain_for(16, 1024),
                          [&](int64_t b, int64_t e) { ref(out + b, gate + b, up + b, e - b); });
    }
};
struct scale_impl : scale_op {
    static constexpr auto ref = ::tandem::cpu::ref::scale;
    static void cpu(::tandem::cpu::thread_pool& pool, float* x, float s, int64_t n) {
        pool.parallel_for(n, ::tandem::cpu::thread_pool::grain_for(1, 4096),
                          [&](int64_t b, int64_t e) { ref(x + b, s, e - b); });
    }
};
struct softcap_impl : softcap_op {
    static constexpr auto ref = ::tandem::cpu::ref::softcap;
    static void cpu(::tandem::cpu::thread_pool& pool, float* x, float cap, int64_t n) {
        pool.parallel_for(n, ::tandem::cpu::thread_pool::grain_for(16, 1024),
                          [&](int64_t b, int64_t e) { ref(x + b, cap, e - b); });
    }
};
struct add_impl : add_op {
    static constexpr auto ref = ::tandem::cpu::ref::add;
    static constexpr auto cpu = ::tandem::cpu::add;
};

} // namespace

void embed(const exec_ctx& ctx, float* out, const int32_t* tokens, int64_t n_tok, const weight& table) {
    TANDEM_ASSERT(n_tok >= 0 && !table.empty() && table.n_in > 1, "embed needs an embedding matrix");
    if (table.is_lowbit()) { // the low-bit family (host memory only): each token's row dequantized
        TANDEM_ASSERT(ctx.be != backend::cuda, "low-bit weights are the CPU's");
        for (int64_t t = 0; t < n_tok; ++t) {
            TANDEM_ASSERT(tokens[t] >= 0 && tokens[t] < table.n_out, "token {} outside the table", tokens[t]);
            lowbit_row_f32(*table.lb, tokens[t], out + t * table.n_in);
        }
        return;
    }
    if (table.is_i8() && table.layout == q_layout::blocked) { // a table tied to the logits, in host memory
        TANDEM_ASSERT(ctx.be != backend::cuda, "a device's weights are rows");
        // the tokens' rows read back, then the op on them as a table of n_tok rows
        std::vector<int8_t> rows(size_t(n_tok * table.n_in));
        std::vector<float> scales(static_cast<size_t>(n_tok));
        std::vector<int32_t> ids(static_cast<size_t>(n_tok));
        for (int64_t t = 0; t < n_tok; ++t) {
            table.q_row(tokens[t], &rows[size_t(t * table.n_in)]);
            scales[size_t(t)] = table.scale()[tokens[t]];
            ids[size_t(t)] = int32_t(t);
        }
        dispatch<embed_impl>(ctx, out, ids.data(), n_tok, rows.data(), scales.data(), nullptr, table.n_in);
        return;
    }
    dispatch<embed_impl>(ctx, out, tokens, n_tok, table.is_i8() ? table.q() : nullptr,
                         table.is_i8() ? table.scale() : nullptr, table.f32(), table.n_in);
}

void gather_rows(const exec_ctx& ctx, float* out, const float* x, const int32_t* rows, int64_t n_rows, int64_t n) {
    TANDEM_ASSERT(n_rows >= 0 && n > 0);
    dispatch<gather_rows_impl>(ctx, out, x, rows, n_rows, n);
}

void rms_norm(const exec_ctx& ctx, float* out, const float* x, const float* w, int64_t n_tok, int64_t n, float eps) {
    TANDEM_ASSERT(n > 0 && n_tok >= 0 && eps > 0);
    dispatch<rms_norm_impl>(ctx, out, x, w, n_tok, n, eps);
}

void rope(const exec_ctx& ctx, float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim,
          const rope_params& rp) {
    TANDEM_ASSERT(rp.n_rot % 2 == 0 && rp.n_rot <= head_dim && n_head > 0 && rp.inv_freq != nullptr,
                  "n_rot {} head_dim {}", rp.n_rot, head_dim);
    dispatch<rope_impl>(ctx, x, positions, n_tok, n_head, head_dim, rp);
}

void swiglu(const exec_ctx& ctx, float* out, const float* gate, const float* up, int64_t n) {
    dispatch<swiglu_impl>(ctx, out, gate, up, n);
}

void geglu(const exec_ctx& ctx, float* out, const float* gate, const float* up, int64_t n) {
    dispatch<geglu_impl>(ctx, out, gate, up, n);
}

void scale(const exec_ctx& ctx, float* x, float s, int64_t n) { dispatch<scale_impl>(ctx, x, s, n); }

void softcap(const exec_ctx& ctx, float* x, float cap, int64_t n) {
    TANDEM_ASSERT(cap > 0, "soft-cap {}", cap);
    dispatch<softcap_impl>(ctx, x, cap, n);
}

void add(const exec_ctx& ctx, float* x, const float* y, int64_t n) { dispatch<add_impl>(ctx, x, y, n); }

} // namespace tandem::ops
