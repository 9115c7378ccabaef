// INT8 ops: checks and dispatch.
#include "runtime/ops/quant.hpp"

#include "cpu/ops/ops.hpp"
#include "cpu/ref/ops_ref.hpp"
#if TANDEM_HAVE_CUDA
#include "cuda/device.hpp"
#include "cuda/ops/ops.hpp"
#endif

namespace tandem::ops {
namespace {

struct quantize_rows_op {
    static constexpr std::string_view name = "quantize_rows";
    static constexpr auto ref = ::tandem::cpu::ref::quantize_rows;
    static constexpr auto cpu = ::tandem::cpu::quantize_rows;
#if TANDEM_HAVE_CUDA
    static constexpr auto cuda = ::tandem::cuda::quantize_rows;
#endif
};
struct quantize_rows_split_op {
    static constexpr std::string_view name = "quantize_rows_split";
    static constexpr auto ref = ::tandem::cpu::ref::quantize_rows_split;
    static constexpr auto cpu = ::tandem::cpu::quantize_rows_split;
#if TANDEM_HAVE_CUDA
    static constexpr auto cuda = ::tandem::cuda::quantize_rows_split;
#endif
};
struct rms_norm_quant_op {
    static constexpr std::string_view name = "rms_norm_quant";
    static constexpr auto ref = ::tandem::cpu::ref::rms_norm_quant;
    static constexpr auto cpu = ::tandem::cpu::rms_norm_quant;
#if TANDEM_HAVE_CUDA
    static constexpr auto cuda = ::tandem::cuda::rms_norm_quant;
#endif
};
struct swiglu_quant_op {
    static constexpr std::string_view name = "swiglu_quant";
    static constexpr auto ref = ::tandem::cpu::ref::swiglu_quant;
    static constexpr auto cpu = ::tandem::cpu::swiglu_quant;
#if TANDEM_HAVE_CUDA
    static constexpr auto cuda = ::tandem::cuda::swiglu_quant;
#endif
};
struct matmul_i8_op {
    static constexpr std::string_view name = "matmul_i8";
    static void ref(float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w, const float* bias) {
        ::tandem::cpu::ref::matmul_i8(out, qx, sx, n_tok, w.q(), w.scale(), w.q_sum.data(), w.n_out, w.n_in, bias);
    }
    // The CPU path takes the whole weight: it may carry a oneDNN handle.
    static void cpu(::tandem::cpu::thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok,
                    const weight& w, const float* bias) {
        ::tandem::cpu::matmul_i8(pool, out, qx, sx, n_tok, w, bias);
    }
#if TANDEM_HAVE_CUDA
    // w is a device view (cuda::device_weight::view()); the bias comes from a host weight.
    static void cuda(const ::tandem::cuda::context& c, float* out, const int8_t* qx, const float* sx, int64_t n_tok,
                     const weight& w, const float* bias) {
        const auto b = bias ? ::tandem::cuda::to_device(c, bias, size_t(w.n_out) * sizeof(float))
                            : ::tandem::cuda::buffer();
        ::tandem::cuda::matmul_i8(c, out, qx, sx, n_tok, w.q(), w.scale(), w.n_out, w.n_in, b.as<float>());
    }
#endif
};

} // namespace

void quantize_rows(const exec_ctx& ctx, act_i8 out, const float* x, int64_t n_tok, int64_t n) {
    TANDEM_ASSERT(n > 0 && n_tok >= 0);
    dispatch<quantize_rows_op>(ctx, out.q, out.s, x, n_tok, n);
}

void quantize_rows_split(const exec_ctx& ctx, act_i8 hi, act_i8 lo, const float* x, int64_t n_tok, int64_t n) {
    TANDEM_ASSERT(n > 0 && n_tok >= 0);
    dispatch<quantize_rows_split_op>(ctx, hi.q, hi.s, lo.q, lo.s, x, n_tok, n);
}

void rms_norm_quant(const exec_ctx& ctx, act_i8 out, const float* x, const float* w, int64_t n_tok, int64_t n,
                    float eps) {
    TANDEM_ASSERT(n > 0 && n_tok >= 0 && eps > 0);
    dispatch<rms_norm_quant_op>(ctx, out.q, out.s, x, w, n_tok, n, eps);
}

void swiglu_quant(const exec_ctx& ctx, act_i8 out, const float* gate, const float* up, int64_t n_tok, int64_t n) {
    TANDEM_ASSERT(n > 0 && n_tok >= 0);
    dispatch<swiglu_quant_op>(ctx, out.q, out.s, gate, up, n_tok, n);
}

void matmul_i8(const exec_ctx& ctx, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w,
               const weight* bias) {
    TANDEM_ASSERT(n_tok >= 0 && w.is_i8() && w.n_in > 1 && int64_t(w.q_sum.size()) == w.n_out,
                  "matmul_i8 needs an INT8 matrix with row sums");
    TANDEM_ASSERT(w.n_in * 127 * 127 < (int64_t(1) << 31), "n_in {} overflows the int32 dot", w.n_in);
    const float* b = nullptr;
    if (bias && !bias->empty()) {
        TANDEM_ASSERT(bias->n_out == w.n_out, "bias [{}] vs weight rows {}", bias->n_out, w.n_out);
        b = bias->data.data();
    }
    dispatch<matmul_i8_op>(ctx, out, qx, sx, n_tok, w, b);
}

} // namespace tandem::ops
