// Element-wise ops: checks and dispatch.
#include "runtime/ops/elementwise.hpp"

#include "cpu/ops/ops.hpp"
#include "cpu/ref/ops_ref.hpp"
#include "runtime/ops/op_defs.hpp"

namespace tandem::ops {
namespace {

// The ref and CPU bindings; CUDA comes through each op's slot.
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
struct add_impl : add_op {
    static constexpr auto ref = ::tandem::cpu::ref::add;
    static constexpr auto cpu = ::tandem::cpu::add;
};

} // namespace

void rms_norm(const exec_ctx& ctx, float* out, const float* x, const float* w, int64_t n_tok, int64_t n, float eps) {
    TANDEM_ASSERT(n > 0 && n_tok >= 0 && eps > 0);
    dispatch<rms_norm_impl>(ctx, out, x, w, n_tok, n, eps);
}

void rope(const exec_ctx& ctx, float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim,
          int n_rot, float freq_base, float freq_scale, bool neox) {
    TANDEM_ASSERT(n_rot % 2 == 0 && n_rot <= head_dim && n_head > 0, "n_rot {} head_dim {}", n_rot, head_dim);
    dispatch<rope_impl>(ctx, x, positions, n_tok, n_head, head_dim, n_rot, freq_base, freq_scale, neox);
}

void swiglu(const exec_ctx& ctx, float* out, const float* gate, const float* up, int64_t n) {
    dispatch<swiglu_impl>(ctx, out, gate, up, n);
}

void add(const exec_ctx& ctx, float* x, const float* y, int64_t n) { dispatch<add_impl>(ctx, x, y, n); }

} // namespace tandem::ops
