// Paged KV on CUDA: kv_store encodes new K/V into pages (f32, f16, or i8 with per-position
// scales, the same bytes as the CPU writes); attention reads them flash style on tensor cores,
// every sequence of a batch in one launch.
#include "cuda/ops/common.cuh"

#include <mma.h>

#include "cuda/ops/attention_kernel.cuh"

namespace tandem::cuda {
namespace {

// One warp per (token, kv head, K|V): grid (n_tok, n_head_kv, 2).
template <kv_dtype DT>
__global__ void kv_store_kernel(uint8_t* kv_base, kv_geom g, const int32_t* table, int32_t pos0, const float* k,
                                const float* v) {
    const int64_t t = blockIdx.x;
    const int kvh = blockIdx.y;
    const bool is_v = blockIdx.z == 1;
    const int lane = threadIdx.x;
    const int32_t pos = pos0 + int32_t(t);
    uint8_t* page = kv_base + int64_t(table[pos / g.page_size]) * g.page_bytes;
    const int slot = pos % g.page_size;
    const float* src = (is_v ? v : k) + (t * g.n_head_kv + kvh) * g.head_dim;
    const int64_t e0 = (is_v ? g.v_off : g.k_off) + kvh * g.head_elems + int64_t(slot) * g.head_dim;
    if constexpr (DT == kv_dtype::f32) {
        for (int i = lane; i < g.head_dim; i += 32) reinterpret_cast<float*>(page)[e0 + i] = src[i];
    } else if constexpr (DT == kv_dtype::f16) {
        for (int i = lane; i < g.head_dim; i += 32) reinterpret_cast<uint16_t*>(page)[e0 + i] = f32_to_fp16_bits(src[i]);
    } else {
        float amax = 0.0f;
        for (int i = lane; i < g.head_dim; i += 32) amax = fmaxf(amax, finite_abs(src[i]));
        amax = warp_max(amax);
        const i8_row_scale sc = i8_scale_of(amax);
        for (int i = lane; i < g.head_dim; i += 32)
            reinterpret_cast<int8_t*>(page)[e0 + i] = quantize_one(src[i], sc.inv);
        if (lane == 0)
            reinterpret_cast<float*>(page + g.scales_begin)[(is_v ? g.v_scale_off : g.k_scale_off) +
                                                            kvh * g.page_size + slot] = sc.scale;
    }
}

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
    const dim3 grid{unsigned(n_blocks), unsigned(n_head_kv)};
    flash_attention_kernel<DT><<<grid, unsigned(n_warps * 32), L.total, stream_of(c)>>>(prm);
    TANDEM_LAUNCH_CHECK();
}

template <kv_dtype DT>
void launch_kv_store(const context& c, uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* table,
                     int32_t pos0, const float* k, const float* v, int64_t n_tok) {
    const dim3 grid(unsigned(n_tok), unsigned(lay.n_head_kv), 2);
    kv_store_kernel<DT><<<grid, 32, 0, stream_of(c)>>>(kv_base, geom_of(lay, il), table, pos0, k, v);
    TANDEM_LAUNCH_CHECK();
}

} // namespace

void kv_store(const context& c, uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* block_table,
              int32_t pos0, const float* k, const float* v, int64_t n_tok) {
    if (n_tok == 0) return;
    c.make_current();
    switch (lay.dtype) {
    case kv_dtype::f32: launch_kv_store<kv_dtype::f32>(c, kv_base, lay, il, block_table, pos0, k, v, n_tok); break;
    case kv_dtype::f16: launch_kv_store<kv_dtype::f16>(c, kv_base, lay, il, block_table, pos0, k, v, n_tok); break;
    case kv_dtype::i8: launch_kv_store<kv_dtype::i8>(c, kv_base, lay, il, block_table, pos0, k, v, n_tok); break;
    }
}

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
