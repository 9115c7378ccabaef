// Paged KV on CUDA: kv_store encodes new K/V into pages (f32, f16, or i8 with per-position
// scales, the same bytes as the CPU writes), attention reads them with an online softmax.
#include "cuda/ops/common.cuh"
#include "cuda/ops/ops.hpp"

namespace tandem::cuda {
namespace {

// kv_layout's offsets for one layer, computed on the host (kv_layout has no device members).
struct kv_geom {
    int64_t page_bytes;
    int64_t k_off, v_off;             // element offset of (il, K|V, kv head 0) in a page
    int64_t head_elems;               // page_size * head_dim: the stride between kv heads
    int64_t scales_begin;             // byte offset of the i8 scales in a page
    int64_t k_scale_off, v_scale_off; // f32 index of (il, K|V, kv head 0)'s scales
    int page_size, head_dim, n_head_kv;
};

kv_geom geom_of(const kv_layout& lay, int il) {
    return kv_geom{lay.page_bytes(),    lay.offset(il, false, 0), lay.offset(il, true, 0),
                   lay.head_elems(),    lay.scales_begin(),       lay.scale_offset(il, false, 0),
                   lay.scale_offset(il, true, 0), lay.page_size, lay.head_dim, lay.n_head_kv};
}

// Element i of position pos's K (or V) vector of kv head kvh, decoded to f32.
template <kv_dtype DT>
__device__ __forceinline__ float kv_load(const uint8_t* kv_base, const kv_geom& g, const int32_t* table, int32_t pos,
                                         bool is_v, int kvh, int i) {
    const uint8_t* page = kv_base + int64_t(table[pos / g.page_size]) * g.page_bytes;
    const int slot = pos % g.page_size;
    const int64_t e = (is_v ? g.v_off : g.k_off) + kvh * g.head_elems + int64_t(slot) * g.head_dim + i;
    if constexpr (DT == kv_dtype::f32) {
        return reinterpret_cast<const float*>(page)[e];
    } else if constexpr (DT == kv_dtype::f16) {
        return fp16_bits_to_f32(reinterpret_cast<const uint16_t*>(page)[e]);
    } else {
        const float* sc = reinterpret_cast<const float*>(page + g.scales_begin);
        const float s = sc[(is_v ? g.v_scale_off : g.k_scale_off) + kvh * g.page_size + slot];
        return __fmul_rn(s, float(reinterpret_cast<const int8_t*>(page)[e]));
    }
}

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

// Attention: a block per (tile of att_q queries, query head), one warp per query. K/V come in
// tiles of 32 positions, decoded to f32 in shared memory once for the block's queries. In a
// tile lane j scores position j; then each lane accumulates the output dims d = lane + 32 r.
constexpr int att_q = 8;       // queries (warps) per block
constexpr int att_kt = 32;     // positions per K/V tile (one per lane when scoring)
constexpr int att_max_hd = 256;

size_t att_smem(int hd) {
    return sizeof(float) * (size_t(att_kt) * (hd + 1) + size_t(att_kt) * hd + size_t(att_q) * hd);
}

template <kv_dtype DT>
__global__ void __launch_bounds__(att_q * 32)
attention_kernel(float* out, const float* q, int64_t n_tok, int32_t n_past, int n_head, int n_gqa,
                 const uint8_t* kv_base, kv_geom g, const int32_t* table, float scale) {
    extern __shared__ float smem[];
    const int hd = g.head_dim;
    float* ks = smem;                            // [att_kt][hd + 1] (padded: lane j reads row j)
    float* vs = ks + att_kt * (hd + 1);          // [att_kt][hd]
    float* qs = vs + att_kt * hd;                // [att_q][hd]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int h = blockIdx.y, kvh = h / n_gqa;
    const int64_t t0 = int64_t(blockIdx.x) * att_q;
    const int64_t t = t0 + warp;
    const bool valid = t < n_tok;
    const int32_t my_pos = n_past + int32_t(t); // this query sees positions 0..my_pos
    const int64_t t_last = min(t0 + att_q, n_tok) - 1;
    const int32_t last_pos = n_past + int32_t(t_last); // the block's last visible position

    for (int i = lane; i < hd; i += 32) qs[warp * hd + i] = valid ? q[(t * n_head + h) * hd + i] : 0.0f;

    float m = -INFINITY, l = 0.0f;
    float acc[att_max_hd / 32];
#pragma unroll
    for (int r = 0; r < att_max_hd / 32; ++r) acc[r] = 0.0f;

    for (int32_t p0 = 0; p0 <= last_pos; p0 += att_kt) {
        __syncthreads(); // the previous tile is consumed (and qs written, the first time)
        for (int idx = threadIdx.x; idx < att_kt * hd; idx += blockDim.x) {
            const int j = idx / hd, i = idx % hd;
            const int32_t p = p0 + j;
            float kv_k = 0.0f, kv_v = 0.0f;
            if (p <= last_pos) {
                kv_k = kv_load<DT>(kv_base, g, table, p, false, kvh, i);
                kv_v = kv_load<DT>(kv_base, g, table, p, true, kvh, i);
            }
            ks[j * (hd + 1) + i] = kv_k;
            vs[j * hd + i] = kv_v;
        }
        __syncthreads();
        if (!valid || p0 > my_pos) continue; // warp-uniform; the loop's barriers stay matched
        const int32_t p = p0 + lane;
        const bool seen = p <= my_pos;
        float s = -INFINITY;
        if (seen) {
            const float* qh = qs + warp * hd;
            const float* kr = ks + lane * (hd + 1);
            float dot = 0.0f;
            for (int i = 0; i < hd; ++i) dot += qh[i] * kr[i];
            s = dot * scale;
        }
        const float m_new = fmaxf(m, warp_max(s)); // finite: lane 0's position p0 <= my_pos is seen
        const float corr = expf(m - m_new);        // 0 on the first tile (m = -inf)
        const float pj = seen ? expf(s - m_new) : 0.0f;
        l = l * corr + warp_sum(pj);
#pragma unroll
        for (int r = 0; r < att_max_hd / 32; ++r) acc[r] *= corr;
        const int n_j = min(att_kt, my_pos - p0 + 1);
        for (int j = 0; j < n_j; ++j) {
            const float w = __shfl_sync(0xffffffffu, pj, j);
            const float* vr = vs + j * hd;
#pragma unroll
            for (int r = 0; r < att_max_hd / 32; ++r) {
                const int i = lane + 32 * r;
                if (i < hd) acc[r] += w * vr[i];
            }
        }
        m = m_new;
    }
    if (!valid) return;
    float* o = out + (t * n_head + h) * hd;
#pragma unroll
    for (int r = 0; r < att_max_hd / 32; ++r) {
        const int i = lane + 32 * r;
        if (i < hd) o[i] = acc[r] / l;
    }
}

template <kv_dtype DT>
void launch_attention(const context& c, float* out, const float* q, int64_t n_tok, int32_t n_past, int n_head,
                      const uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* table, float scale) {
    const size_t smem = att_smem(lay.head_dim);
    if (smem > 48 * 1024) {
        // Above 48 KiB a kernel must opt in; once per device is enough, but it is cheap.
        CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<DT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    }
    const dim3 grid(unsigned((n_tok + att_q - 1) / att_q), unsigned(n_head));
    attention_kernel<DT><<<grid, att_q * 32, smem, stream_of(c)>>>(out, q, n_tok, n_past, n_head,
                                                                   n_head / lay.n_head_kv, kv_base, geom_of(lay, il),
                                                                   table, scale);
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

void attention(const context& c, float* out, const float* q, int64_t n_tok, int32_t n_past, int n_head,
               const uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* block_table, float scale) {
    if (n_tok == 0) return;
    TANDEM_ASSERT(lay.head_dim <= att_max_hd, "CUDA attention supports head_dim up to {}, not {}", att_max_hd,
                  lay.head_dim);
    TANDEM_ASSERT(n_head % lay.n_head_kv == 0);
    c.make_current();
    switch (lay.dtype) {
    case kv_dtype::f32:
        launch_attention<kv_dtype::f32>(c, out, q, n_tok, n_past, n_head, kv_base, lay, il, block_table, scale);
        break;
    case kv_dtype::f16:
        launch_attention<kv_dtype::f16>(c, out, q, n_tok, n_past, n_head, kv_base, lay, il, block_table, scale);
        break;
    case kv_dtype::i8:
        launch_attention<kv_dtype::i8>(c, out, q, n_tok, n_past, n_head, kv_base, lay, il, block_table, scale);
        break;
    }
}

} // namespace tandem::cuda
