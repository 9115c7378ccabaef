// INT8 ops: checks and dispatch.
#include "runtime/ops/quant.hpp"

#include "cpu/ops/ops.hpp"
#include "cpu/ref/ops_ref.hpp"
#include "runtime/ops/op_defs.hpp"
#include "quant/lowbit.hpp"

#include <vector>

namespace tandem::ops {
namespace {

// The ref and CPU bindings; CUDA comes through each op's slot.
struct quantize_rows_impl : quantize_rows_op {
    static constexpr auto ref = ::tandem::cpu::ref::quantize_rows;
    static constexpr auto cpu = ::tandem::cpu::quantize_rows;
};
struct quantize_rows_split_impl : quantize_rows_split_op {
    static constexpr auto ref = ::tandem::cpu::ref::quantize_rows_split;
    static constexpr auto cpu = ::tandem::cpu::quantize_rows_split;
};
struct rms_norm_quant_impl : rms_norm_quant_op {
    static constexpr auto ref = ::tandem::cpu::ref::rms_norm_quant;
    static constexpr auto cpu = ::tandem::cpu::rms_norm_quant;
};
struct swiglu_quant_impl : swiglu_quant_op {
    static constexpr auto ref = ::tandem::cpu::ref::swiglu_quant;
    static constexpr auto cpu = ::tandem::cpu::swiglu_quant;
};
struct matmul_i8_impl : matmul_i8_op {
    static void ref(float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w, const float* bias) {
        if (w.layout == q_layout::rows) {
            ::tandem::cpu::ref::matmul_i8(out, qx, sx, n_tok, w.q(), w.scale(), w.q_sum.data(), w.n_out, w.n_in, bias);
            return;
        }
        // Blocked: the same reference one output at a time, on its row read back.
        std::vector<int8_t> row(size_t(w.n_in));
        std::vector<float> col(static_cast<size_t>(n_tok));
        for (int64_t o = 0; o < w.n_out; ++o) {
            w.q_row(o, row.data());
            ::tandem::cpu::ref::matmul_i8(col.data(), qx, sx, n_tok, row.data(), w.scale() + o, w.q_sum.data() + o, 1,
                                          w.n_in, bias ? bias + o : nullptr);
            for (int64_t t = 0; t < n_tok; ++t) out[t * w.n_out + o] = col[size_t(t)];
        }
    }
    // The CPU path takes the whole weight: it may carry a oneDNN handle.
    static constexpr auto cpu = ::tandem::cpu::matmul_i8;
};

// The low-bit family: the CPU's kernels and the reference; no CUDA implementation (a GPU
// deployment loads low-bit files as INT8, runtime/weights.hpp), so dispatch refuses it by name.
struct matmul_lowbit_impl {
    static constexpr std::string_view name = "matmul_lowbit";
    static void ref(float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w, const float* bias) {
        matmul_lowbit_ref(out, qx, sx, n_tok, *w.lb, bias);
    }
    static void cpu(::tandem::cpu::thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok,
                    const weight& w, const float* bias) {
        ::tandem::cpu::matmul_lowbit(pool, out, qx, sx, n_tok, *w.lb, bias);
    }
};

} // namespace

void quantize_rows(const exec_ctx& ctx, act_i8 out, const float* x, int64_t n_tok, int64_t n) {
    TANDEM_ASSERT(n > 0 && n_tok >= 0);
    dispatch<quantize_rows_impl>(ctx, out.q, out.s, x, n_tok, n);
}

void quantize_rows_split(const exec_ctx& ctx, act_i8 hi, act_i8 lo, const float* x, int64_t n_tok, int64_t n) {
    TANDEM_ASSERT(n > 0 && n_tok >= 0);
    dispatch<quantize_rows_split_impl>(ctx, hi.q, hi.s, lo.q, lo.s, x, n_tok, n);
}

void rms_norm_quant(const exec_ctx& ctx, act_i8 out, const float* x, const float* w, int64_t n_tok, int64_t n,
                    float eps) {
    TANDEM_ASSERT(n > 0 && n_tok >= 0 && eps > 0);
    dispatch<rms_norm_quant_impl>(ctx, out.q, out.s, x, w, n_tok, n, eps);
}

void swiglu_quant(const exec_ctx& ctx, act_i8 out, const float* gate, const float* up, int64_t n_tok, int64_t n) {
    TANDEM_ASSERT(n > 0 && n_tok >= 0);
    dispatch<swiglu_quant_impl>(ctx, out.q, out.s, gate, up, n_tok, n);
}

void matmul_i8(const exec_ctx& ctx, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w,
               const weight* bias) {
    if (w.is_lowbit()) {
        TANDEM_ASSERT(n_tok >= 0 && w.lb->n_out == w.n_out && w.lb->n_in == w.n_in);
        const float* b = nullptr;
        if (bias && !bias->empty()) {
            TANDEM_ASSERT(bias->n_out == w.n_out, "bias [{}] vs weight rows {}", bias->n_out, w.n_out);
            b = bias->f32();
        }
        dispatch<matmul_lowbit_impl>(ctx, out, qx, sx, n_tok, w, b);
        return;
    }
    TANDEM_ASSERT(n_tok >= 0 && w.is_i8() && w.n_in > 1 && int64_t(w.q_sum.size()) == w.n_out,
                  "matmul_i8 needs an INT8 matrix with row sums");
    TANDEM_ASSERT(w.n_in * 127 * 127 < (int64_t(1) << 31), "n_in {} overflows the int32 dot", w.n_in);
    const float* b = nullptr;
    if (bias && !bias->empty()) {
        TANDEM_ASSERT(bias->n_out == w.n_out, "bias [{}] vs weight rows {}", bias->n_out, w.n_out);
        b = bias->f32();
    }
    dispatch<matmul_i8_impl>(ctx, out, qx, sx, n_tok, w, b);
}

void prepare_matmul_i8(const exec_ctx& ctx, const weight& w, int64_t max_tok) {
    if (ctx.be == backend::cpu && w.is_i8()) ::tandem::cpu::prepare_matmul_i8(w, max_tok);
}

} // namespace tandem::ops
