// The CUDA slots of runtime/ops, and the glue between an op's arguments and its kernels.
#include "cuda/ops/register.hpp"

#include "cuda/device.hpp"
#include "cuda/ops/ops.hpp"
#include "runtime/ops/op_defs.hpp"

namespace tandem::cuda {
namespace {

// w is a device view (device_weight::view()), the bias device memory or null.
void matmul_i8_view(const context& c, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w,
                    const float* bias) {
    matmul_i8(c, out, qx, sx, n_tok, w.q(), w.scale(), w.n_out, w.n_in, bias);
}

void upload(const context& c, void* dst, const void* src, size_t bytes) { c.upload(dst, src, bytes); }
void copy(const context& c, void* dst, const void* src, size_t bytes) { c.copy(dst, src, bytes); }

} // namespace

void register_ops() {
    // A magic static: contexts made on several threads at once fill the slots once, before any
    // of them is handed out.
    static const bool filled = [] {
        ops::embed_op::cuda_impl = embed;
        ops::gather_rows_op::cuda_impl = gather_rows;
        ops::upload_op::cuda_impl = upload;
        ops::copy_op::cuda_impl = copy;
        ops::rms_norm_op::cuda_impl = rms_norm;
        ops::rope_op::cuda_impl = rope;
        ops::swiglu_op::cuda_impl = swiglu;
        ops::geglu_op::cuda_impl = geglu;
        ops::scale_op::cuda_impl = scale;
        ops::softcap_op::cuda_impl = softcap;
        ops::add_op::cuda_impl = add;
        ops::kv_store_op::cuda_impl = kv_store;
        ops::attention_op::cuda_impl = attention;
        ops::quantize_rows_op::cuda_impl = quantize_rows;
        ops::quantize_rows_split_op::cuda_impl = quantize_rows_split;
        ops::rms_norm_quant_op::cuda_impl = rms_norm_quant;
        ops::swiglu_quant_op::cuda_impl = swiglu_quant;
        ops::matmul_i8_op::cuda_impl = matmul_i8_view;
        return true;
    }();
    (void)filled;
}

} // namespace tandem::cuda
