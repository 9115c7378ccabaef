// Matmul op: checks and dispatch.
#include "runtime/ops/matmul.hpp"

#include "cpu/ops/ops.hpp"
#include "cpu/ref/ops_ref.hpp"
#include "runtime/ops/op_defs.hpp"

namespace tandem::ops {
namespace {

struct matmul_impl : matmul_op {
    static constexpr auto ref = ::tandem::cpu::ref::matmul;
    static constexpr auto cpu = ::tandem::cpu::matmul;
};

} // namespace

void matmul(const exec_ctx& ctx, float* out, const float* x, int64_t n_tok, const weight& w, const weight* bias) {
    TANDEM_ASSERT(n_tok >= 0 && w.is_f32() && w.n_in > 1, "matmul needs an F32 matrix (INT8: matmul_i8)");
    const float* b = nullptr;
    if (bias && !bias->empty()) {
        TANDEM_ASSERT(bias->n_out == w.n_out, "bias [{}] vs weight rows {}", bias->n_out, w.n_out);
        b = bias->f32();
    }
    dispatch<matmul_impl>(ctx, out, x, n_tok, w.f32(), w.n_out, w.n_in, b);
}

} // namespace tandem::ops
