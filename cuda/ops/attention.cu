// Paged KV on CUDA: kv_store encodes new K/V into pages (f32, f16, or i8 with per-position
// scales, the same bytes as the CPU writes); attention reads them flash style on tensor cores,
// every sequence of a batch in one launch.
#include "cuda/ops/common.cuh"

#include "cuda/ops/attention_kernel.cuh"

namespace tandem::cuda {
namespace {

// The opt-in shared memory per block of the context's device.
int max_smem_optin(const context& c) {
    int v = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, c.device()));
    return v;
}

template <kv_dtype DT>
void launch_flash(const context& c, const fa_params& prm, int n_warps, int64_t n_blocks, int n_head_kv) {
    const fa_smem L = fa_smem_of(prm.hd_pad, n_warps, DT == kv_dtype::f32, DT != kv_dtype::f16);
    if (L.total > 48 * 1024) { // above 48 KiB a kernel must opt in
        const int limit = max_smem_optin(c);
        TANDEM_CHECK(L.total <= size_t(limit),
                     "CUDA attention over {} KV pages with head_dim {} needs {} KiB of shared memory per block; "
                     "device {} allows {} KiB",
                     name_of(DT), prm.g.head_dim, L.total / 1024, c.device(), limit / 1024);
        CUDA_CHECK(cudaFuncSetAttribute(flash_attention_kernel<DT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(L.total)));
    }
    launch_kernel(c, flash_attention_kernel<DT>, dim3{unsigned(n_blocks), unsigned(n_head_kv)},
                  unsigned(n_warps * 32), L.total, prm);
}

} // namespace

void attention(const context& c, float* out, const float* q, const attn_seg* segs, int64_t n_seg, int n_head,
               const uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* tables, float scale) {
    TANDEM_ASSERT(lay.head_dim >= 1 && lay.head_dim <= fa_max_hd, "CUDA attention supports head_dim up to {}, not {}",
                  fa_max_hd, lay.head_dim);
    TANDEM_ASSERT(n_head % lay.n_head_kv == 0);
    c.make_current();
    fa_launches(out, q, segs, n_seg, n_head, kv_base, lay, il, tables, scale,
                [&](const fa_params& prm, int n_warps, int64_t n_blocks) {
                    switch (lay.dtype) {
                    case kv_dtype::f32: launch_flash<kv_dtype::f32>(c, prm, n_warps, n_blocks, lay.n_head_kv); break;
                    case kv_dtype::f16: launch_flash<kv_dtype::f16>(c, prm, n_warps, n_blocks, lay.n_head_kv); break;
                    case kv_dtype::i8: launch_flash<kv_dtype::i8>(c, prm, n_warps, n_blocks, lay.n_head_kv); break;
                    }
                });
}

void attention(const context& c, float* out, const float* q, int64_t n_tok, int32_t n_past, int n_head,
               const uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* block_table, float scale) {
    const attn_seg seg{0, int32_t(n_tok), n_past, 0};
    attention(c, out, q, &seg, 1, n_head, kv_base, lay, il, block_table, scale);
}

} // namespace tandem::cuda
