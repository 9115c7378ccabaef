// The CUDA slots of runtime/ops, and the host-side glue between an op's arguments and its kernels.
#include "cuda/ops/register.hpp"

#include "cuda/device.hpp"
#include "cuda/ops/ops.hpp"
#include "runtime/ops/op_defs.hpp"

#include <vector>

namespace tandem::cuda {
namespace {

// The ops take the host's block table (checked by runtime/ops); the kernels a device copy of
// the entries covering positions [0, n_end).
buffer device_table(const context& c, const kv_layout& lay, const int32_t* table, int64_t n_end) {
    const int64_t n = (n_end + lay.page_size - 1) / lay.page_size;
    return to_device(c, table, size_t(n) * sizeof(int32_t));
}

void kv_store_host_table(const context& c, uint8_t* kv_base, const kv_layout& lay, int il,
                         const int32_t* block_table, int32_t pos0, const float* k, const float* v, int64_t n_tok) {
    const auto t = device_table(c, lay, block_table, pos0 + n_tok);
    kv_store(c, kv_base, lay, il, t.as<int32_t>(), pos0, k, v, n_tok);
}

void attention_host_table(const context& c, float* out, const float* q, int64_t n_tok, int32_t n_past, int n_head,
                          const uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* block_table,
                          float scale) {
    const auto t = device_table(c, lay, block_table, n_past + n_tok);
    attention(c, out, q, n_tok, n_past, n_head, kv_base, lay, il, t.as<int32_t>(), scale);
}

void attention_decode_segments(const context& c, float* out, const float* q, int64_t n_seq, const int64_t* rows,
                               const int32_t* n_past, const int32_t* const* tables, int n_head,
                               const uint8_t* kv_base, const kv_layout& lay, int il, float scale) {
    if (n_seq == 0) return;
    // One segment per sequence, every block table in one upload, one launch.
    thread_local std::vector<attn_seg> segs;
    thread_local std::vector<int32_t> flat;
    segs.clear();
    flat.clear();
    for (int64_t i = 0; i < n_seq; ++i) {
        const int32_t n_pages = n_past[i] / lay.page_size + 1; // positions 0..n_past
        segs.push_back({rows[i], 1, n_past[i], int64_t(flat.size())});
        flat.insert(flat.end(), tables[i], tables[i] + n_pages);
    }
    const auto t = to_device(c, flat.data(), flat.size() * sizeof(int32_t));
    attention(c, out, q, segs.data(), n_seq, n_head, kv_base, lay, il, t.as<int32_t>(), scale);
}

// w is a device view (device_weight::view()); the bias comes from a host weight.
void matmul_i8_host_bias(const context& c, float* out, const int8_t* qx, const float* sx, int64_t n_tok,
                         const weight& w, const float* bias) {
    const auto b = bias ? to_device(c, bias, size_t(w.n_out) * sizeof(float)) : buffer();
    matmul_i8(c, out, qx, sx, n_tok, w.q(), w.scale(), w.n_out, w.n_in, b.as<float>());
}

} // namespace

void register_ops() {
    // A magic static: contexts made on several threads at once fill the slots once, before any
    // of them is handed out.
    static const bool filled = [] {
        ops::rms_norm_op::cuda_impl = rms_norm;
        ops::rope_op::cuda_impl = rope;
        ops::swiglu_op::cuda_impl = swiglu;
        ops::add_op::cuda_impl = add;
        ops::kv_store_op::cuda_impl = kv_store_host_table;
        ops::attention_op::cuda_impl = attention_host_table;
        ops::attention_decode_op::cuda_impl = attention_decode_segments;
        ops::quantize_rows_op::cuda_impl = quantize_rows;
        ops::quantize_rows_split_op::cuda_impl = quantize_rows_split;
        ops::rms_norm_quant_op::cuda_impl = rms_norm_quant;
        ops::swiglu_quant_op::cuda_impl = swiglu_quant;
        ops::matmul_i8_op::cuda_impl = matmul_i8_host_bias;
        return true;
    }();
    (void)filled;
}

} // namespace tandem::cuda
