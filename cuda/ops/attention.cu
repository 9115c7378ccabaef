// Paged KV on CUDA: kv_store encodes new K/V into pages (f32, f16, or i8 with per-position
// scales, the same bytes as the CPU writes); attention reads them flash style on tensor cores,
// every sequence of a batch in one launch.
#include "cuda/ops/common.cuh"
#include "cuda/ops/ops.hpp"

#include <algorithm>

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

// A batch's sequences as segments of one launch: each gets a run of blocks, and a block finds
// its segment in the kernel's parameters (no copy, no allocation per launch).
constexpr int max_segs = 64; // segments per launch

struct seg_desc {
    int64_t q_row;     // the row of its first token in q, k, v and out
    int64_t table_off; // its block table is tables + table_off
    int32_t n_tok, n_past;
    int32_t block0, n_blocks; // its blocks: blockIdx.x in [block0, block0 + n_blocks)
    int32_t n_split;          // attention: blocks splitting its positions (1: none)
    int32_t part0;            // attention, n_split > 1: its first slot of partial results
};

struct seg_batch {
    int n_seg;
    seg_desc segs[max_segs];
};

// This block's segment: the last one whose first block is at or before this one.
__device__ __forceinline__ const seg_desc& seg_of_block(const seg_batch& b) {
    int lo = 0, hi = b.n_seg - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (b.segs[mid].block0 <= int(blockIdx.x)) lo = mid;
        else hi = mid - 1;
    }
    return b.segs[lo];
}

// Fills b with the next segments from segs[i] on (empty ones skipped, at most max_segs), each
// given blocks_of(segment) blocks, times split_of(segment) splits; returns how many blocks they
// take in all (0: none left) and, in n_parts, how many partial-result slots the splits need.
template <class Blocks, class Splits>
int64_t next_seg_batch(array_view<attn_seq> segs, size_t& i, seg_batch& b, Blocks blocks_of, Splits split_of,
                       int32_t& n_parts) {
    b.n_seg = 0;
    int64_t blocks = 0;
    n_parts = 0;
    for (; i < segs.size() && b.n_seg < max_segs; ++i) {
        const attn_seq& s = segs[i];
        if (s.n_tok <= 0) continue;
        const int32_t n_split = split_of(s);
        const int64_t nb = blocks_of(s) * n_split;
        b.segs[b.n_seg++] = seg_desc{s.row, s.table_begin, s.n_tok, s.n_past, int32_t(blocks), int32_t(nb), n_split,
                                     n_split > 1 ? n_parts : 0};
        blocks += nb;
        if (n_split > 1) n_parts += n_split;
    }
    return blocks;
}

struct kv_store_params {
    uint8_t* kv_base;
    const int32_t* tables;
    const float* k;
    const float* v;
    kv_geom g;
    seg_batch b;
};

// One warp per (token, kv head, K|V): grid (the segments' tokens, n_head_kv, 2).
template <kv_dtype DT>
__global__ void kv_store_kernel(const __grid_constant__ kv_store_params p) {
    const kv_geom& g = p.g;
    const seg_desc& sg = seg_of_block(p.b);
    const int local = int(blockIdx.x) - sg.block0; // the token within its segment
    const int64_t t = sg.q_row + local;              // its row in k and v
    const int32_t pos = sg.n_past + local;
    const int kvh = blockIdx.y;
    const bool is_v = blockIdx.z == 1;
    const int lane = threadIdx.x;
    uint8_t* page = p.kv_base + int64_t(p.tables[sg.table_off + pos / g.page_size]) * g.page_bytes;
    const int slot = pos % g.page_size;
    const float* src = (is_v ? p.v : p.k) + (t * g.n_head_kv + kvh) * g.head_dim;
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

// Attention, flash style on tensor cores (WMMA: f16 products, f32 accumulation). A block owns
// one kv head and 16 rows per warp, a row being a (token, query head) pair of one segment with
// the query heads of that kv head side by side: each K/V tile the block decodes into shared
// memory serves every query head that reads it (GQA). Per tile of fa_keys positions, each warp
// computes S = Q K^T for its 16 rows on tensor cores, runs the online softmax (two lanes per
// row), rescales its rows of O and adds P V, again on tensor cores. O stays in shared memory in
// f32 so the softmax can rescale it row by row.
//
// Precision: the reference computes in f32, and so, nearly, does this. Q and P are split into
// two f16 terms (hi + lo, 22 significant bits together); K and V are exact in f16 when the pages
// are f16 (the default) and K is when they are int8 (the integers; the scale multiplies the
// score). f32 pages' K and V and int8 pages' dequantized V are split as well, a third product.
// Q rows and f32 K rows are scaled by a power of two first, so their split keeps every bit
// whatever their magnitude; V from f32 or int8 pages has to stay within f16's range (65504).
constexpr int fa_keys = 32;    // positions per K/V tile
constexpr int fa_max_hd = 256; // head dims are padded to a multiple of 16, up to this
// A segment whose rows fit one block (a decoding sequence, a short chunk) and that sees more
// than twice this many positions is split over its positions, a block per this many, and the
// blocks' partial results combined (fa_combine_kernel): otherwise a decode step with few
// sequences would keep a handful of SMs busy over the whole context.
constexpr int fa_split_keys = 512; // a multiple of fa_keys

struct fa_params {
    float* out;
    const float* q;
    const uint8_t* kv_base;
    const int32_t* tables;
    kv_geom g;
    int n_head, n_gqa, hd_pad;
    float scale;
    int32_t window; // attn_params::window: 0, or the positions a token sees (pages before may be no_page)
    float softcap;  // attn_params::softcap: > 0 caps each score s to softcap * tanh(s / softcap)
    // Partial results of split segments: O (unnormalized) [n_head_kv][n_parts][part_rows][hd]
    // and its running max and sum [n_head_kv][n_parts][part_rows][2].
    float* part_o;
    float* part_ml;
    int32_t n_parts, part_rows;
    seg_batch b;
};

// Byte offsets of the block's shared memory, the same on host and device. Every array starts
// 128-byte aligned; row strides are padded (8 halves, 4 floats) against bank conflicts while
// keeping WMMA's alignment (fragments start on 16-row boundaries: 32-byte multiples).
struct fa_smem {
    int ldh = 0, ldo = 0; // halves per K/V/Q row, floats per O row
    static constexpr int lds = fa_keys + 4, ldp = fa_keys + 8;
    size_t kh = 0, kl = 0, vh = 0, vl = 0, kf = 0, qh = 0, ql = 0, qf = 0, pos = 0, s = 0, ph = 0, pl = 0, o = 0,
           l = 0, total = 0;
};

__host__ __device__ inline fa_smem fa_smem_of(int hd_pad, int n_warps, bool k_split, bool v_split) {
    fa_smem m;
    m.ldh = hd_pad + 8;
    m.ldo = hd_pad + 4;
    const size_t rows = size_t(16) * size_t(n_warps);
    size_t at = 0;
    auto take = [&at](size_t bytes) {
        const size_t begin = at;
        at = (at + bytes + 127) / 128 * 128;
        return begin;
    };
    const size_t tile = size_t(fa_keys) * size_t(m.ldh) * 2;
    m.kh = take(tile);
    m.kl = take(k_split ? tile : 0);
    m.vh = take(tile);
    m.vl = take(v_split ? tile : 0);
    m.kf = take(fa_keys * 4);
    m.qh = take(rows * size_t(m.ldh) * 2);
    m.ql = take(rows * size_t(m.ldh) * 2);
    m.qf = take(rows * 4);
    m.pos = take(rows * 4);
    m.s = take(rows * fa_smem::lds * 4);
    m.ph = take(rows * fa_smem::ldp * 2);
    m.pl = take(rows * fa_smem::ldp * 2);
    m.o = take(rows * size_t(m.ldo) * 4);
    m.l = take(rows * 4);
    m.total = at;
    return m;
}

// The exponent e with |a| = m * 2^e, m in [0.5, 1); 0 for 0, inf and NaN (nothing to scale).
// Where row r's partial result from split `part` (of the launch's n_parts) under kv head kvh
// sits: part_o[slot * head_dim ...], part_ml[slot * 2 ...].
__device__ __forceinline__ int64_t fa_part_slot(const fa_params& p, int kvh, int32_t part, int64_t r) {
    return (int64_t(kvh) * p.n_parts + part) * p.part_rows + r;
}

__device__ __forceinline__ int pow2_exponent(float a) {
    if (!(a > 0.0f) || isinf(a)) return 0;
    int e;
    frexpf(a, &e);
    return e;
}

// x = hi + lo with both in f16: hi the rounding of x, lo that of the (exact) remainder.
__device__ __forceinline__ void split_f16(float x, __half& hi, __half& lo) {
    hi = __float2half_rn(x);
    lo = __float2half_rn(__fsub_rn(x, __half2float(hi)));
}

// The first position a token at position pos sees (its window's, else 0).
__host__ __device__ __forceinline__ int32_t fa_first_seen(int32_t pos, int32_t window) {
    return window > 0 && pos >= window ? pos - window + 1 : 0;
}

// Positions [p0, p0 + fa_keys) of kv head kvh into the K/V tiles (zero outside [first_pos,
// last_pos], where pages may be no_page, and in the padding columns, which the products then
// ignore), a warp per position.
template <kv_dtype DT>
__device__ void fa_load_tile(const fa_params& p, const fa_smem& L, unsigned char* smem, const int32_t* table, int kvh,
                             int32_t p0, int32_t first_pos, int32_t last_pos) {
    const kv_geom& g = p.g;
    const int n_warps = int(blockDim.x / 32), warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
    const int hd = g.head_dim, hd_pad = p.hd_pad;
    __half* kh = reinterpret_cast<__half*>(smem + L.kh);
    __half* kl = reinterpret_cast<__half*>(smem + L.kl);
    __half* vh = reinterpret_cast<__half*>(smem + L.vh);
    __half* vl = reinterpret_cast<__half*>(smem + L.vl);
    float* kf = reinterpret_cast<float*>(smem + L.kf);
    for (int j = warp; j < fa_keys; j += n_warps) {
        const int32_t ps = p0 + j;
        const bool live = ps >= first_pos && ps <= last_pos;
        const uint8_t* page = p.kv_base + (live ? int64_t(table[ps / g.page_size]) * g.page_bytes : 0);
        const int slot = live ? ps % g.page_size : 0;
        const int64_t ke = g.k_off + kvh * g.head_elems + int64_t(slot) * hd;
        const int64_t ve = g.v_off + kvh * g.head_elems + int64_t(slot) * hd;
        __half* khr = kh + j * L.ldh;
        __half* klr = kl + j * L.ldh;
        __half* vhr = vh + j * L.ldh;
        __half* vlr = vl + j * L.ldh;
        if constexpr (DT == kv_dtype::f16) {
            const uint16_t* e16 = reinterpret_cast<const uint16_t*>(page);
            for (int i = lane; i < hd_pad; i += 32) {
                const bool in = live && i < hd;
                khr[i] = __ushort_as_half(in ? e16[ke + i] : uint16_t(0));
                vhr[i] = __ushort_as_half(in ? e16[ve + i] : uint16_t(0));
            }
            if (lane == 0) kf[j] = 1.0f;
        } else if constexpr (DT == kv_dtype::i8) {
            const int8_t* e8 = reinterpret_cast<const int8_t*>(page);
            const float* sc = reinterpret_cast<const float*>(page + g.scales_begin);
            const float ks = live ? sc[g.k_scale_off + kvh * g.page_size + slot] : 0.0f;
            const float vs = live ? sc[g.v_scale_off + kvh * g.page_size + slot] : 0.0f;
            for (int i = lane; i < hd_pad; i += 32) {
                const bool in = live && i < hd;
                khr[i] = __float2half_rn(in ? float(e8[ke + i]) : 0.0f); // |k| <= 127: exact
                split_f16(in ? __fmul_rn(vs, float(e8[ve + i])) : 0.0f, vhr[i], vlr[i]);
            }
            if (lane == 0) kf[j] = ks;
        } else {
            const float* e32 = reinterpret_cast<const float*>(page);
            float x[fa_max_hd / 32];
            float amax = 0.0f;
#pragma unroll
            for (int r = 0; r < fa_max_hd / 32; ++r) {
                const int i = lane + 32 * r;
                x[r] = live && i < hd ? e32[ke + i] : 0.0f;
                amax = fmaxf(amax, fabsf(x[r]));
            }
            const int e = pow2_exponent(warp_max(amax));
#pragma unroll
            for (int r = 0; r < fa_max_hd / 32; ++r) {
                const int i = lane + 32 * r;
                if (i < hd_pad) {
                    split_f16(ldexpf(x[r], -e), khr[i], klr[i]);
                    split_f16(live && i < hd ? e32[ve + i] : 0.0f, vhr[i], vlr[i]);
                }
            }
            if (lane == 0) kf[j] = ldexpf(1.0f, e);
        }
    }
}

template <kv_dtype DT>
__global__ void __launch_bounds__(128) flash_attention_kernel(const __grid_constant__ fa_params p) {
    namespace wmma = nvcuda::wmma;
    constexpr bool k_split = DT == kv_dtype::f32, v_split = DT != kv_dtype::f16;
    unsigned char* smem = dynamic_smem();
    const int n_warps = int(blockDim.x / 32), rows = 16 * n_warps;
    const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
    const int hd = p.g.head_dim, hd_pad = p.hd_pad;
    const fa_smem L = fa_smem_of(hd_pad, n_warps, k_split, v_split);
    __half* kh = reinterpret_cast<__half*>(smem + L.kh);
    __half* kl = reinterpret_cast<__half*>(smem + L.kl);
    __half* vh = reinterpret_cast<__half*>(smem + L.vh);
    __half* vl = reinterpret_cast<__half*>(smem + L.vl);
    const float* kf = reinterpret_cast<const float*>(smem + L.kf);
    __half* qh = reinterpret_cast<__half*>(smem + L.qh);
    __half* ql = reinterpret_cast<__half*>(smem + L.ql);
    float* qf = reinterpret_cast<float*>(smem + L.qf);
    int32_t* pos = reinterpret_cast<int32_t*>(smem + L.pos);
    float* s = reinterpret_cast<float*>(smem + L.s);
    __half* ph = reinterpret_cast<__half*>(smem + L.ph);
    __half* pl = reinterpret_cast<__half*>(smem + L.pl);
    float* o = reinterpret_cast<float*>(smem + L.o);
    float* lsum = reinterpret_cast<float*>(smem + L.l);

    const seg_desc& sg = seg_of_block(p.b);
    const int local = int(blockIdx.x) - sg.block0;
    const int split = local % sg.n_split;
    // The segment's blocks run latest rows first: they see the most positions (causal mask).
    const int64_t r0 = int64_t(sg.n_blocks / sg.n_split - 1 - local / sg.n_split) * rows;
    const int64_t n_rows = int64_t(sg.n_tok) * p.n_gqa;
    const int kvh = int(blockIdx.y);
    const int32_t* table = p.tables + sg.table_off;
    const int32_t last_pos = sg.n_past + int32_t((min(r0 + rows, n_rows) - 1) / p.n_gqa);
    // The first position any row of the block sees: its first token's window's first.
    const int32_t first_pos = fa_first_seen(sg.n_past + int32_t(r0 / p.n_gqa), p.window);
    // The positions this block reads: all it sees, or its split's share of them (splits count
    // from the tile of the segment's first seen position).
    const int32_t seg_first = fa_first_seen(sg.n_past, p.window) / fa_keys * fa_keys;
    const int32_t k_begin = sg.n_split == 1 ? first_pos / fa_keys * fa_keys : seg_first + split * fa_split_keys;
    const int32_t k_last = sg.n_split == 1 ? last_pos : min(last_pos, k_begin + fa_split_keys - 1);
    // Row r of the block: token r0+r / n_gqa of the segment, query head kvh * n_gqa + r0+r % n_gqa.
    auto q_offset = [&](int r) {
        const int64_t lr = r0 + r;
        const int64_t t = lr / p.n_gqa;
        const int h = kvh * p.n_gqa + int(lr % p.n_gqa);
        return ((sg.q_row + t) * p.n_head + h) * int64_t(hd);
    };

    // Q of this warp's 16 rows, each scaled by a power of two and split; O at zero.
    for (int rr = 0; rr < 16; ++rr) {
        const int r = warp * 16 + rr;
        const bool valid = r0 + r < n_rows;
        const float* qr = valid ? p.q + q_offset(r) : nullptr;
        float x[fa_max_hd / 32];
        float amax = 0.0f;
#pragma unroll
        for (int k = 0; k < fa_max_hd / 32; ++k) {
            const int i = lane + 32 * k;
            x[k] = valid && i < hd ? qr[i] : 0.0f;
            amax = fmaxf(amax, fabsf(x[k]));
        }
        const int e = pow2_exponent(warp_max(amax));
#pragma unroll
        for (int k = 0; k < fa_max_hd / 32; ++k) {
            const int i = lane + 32 * k;
            if (i < hd_pad) split_f16(ldexpf(x[k], -e), qh[r * L.ldh + i], ql[r * L.ldh + i]);
        }
        if (lane == 0) {
            qf[r] = ldexpf(p.scale, e);
            pos[r] = valid ? sg.n_past + int32_t((r0 + r) / p.n_gqa) : -1;
        }
    }
    for (int idx = lane; idx < 16 * L.ldo; idx += 32) o[warp * 16 * L.ldo + idx] = 0.0f;
    __syncwarp();
    int32_t warp_last = -1; // the last position any of this warp's rows sees (-1: no rows)
    for (int rr = 0; rr < 16; ++rr) warp_last = max(warp_last, pos[warp * 16 + rr]);
    // and the first (rows are in position order: the warp's first row's window's first)
    const int32_t warp_first = pos[warp * 16] >= 0 ? fa_first_seen(pos[warp * 16], p.window) : 0;

    // Lanes 2r and 2r+1 keep row r's running max and sum, each for half of the tile's keys.
    const int my_r = warp * 16 + lane / 2, my_half = lane % 2;
    const int32_t my_pos = pos[my_r];
    const int32_t my_first = fa_first_seen(my_pos, p.window);
    float m = -INFINITY, l = 0.0f;

    for (int32_t p0 = k_begin; p0 <= k_last; p0 += fa_keys) {
        __syncthreads(); // the previous tile is consumed
        fa_load_tile<DT>(p, L, smem, table, kvh, p0, first_pos, k_last);
        __syncthreads();
        // warp-uniform: this tile is past all of its rows, or before all of their windows
        if (warp_last < p0 || p0 + fa_keys <= warp_first) continue;

        // S = Q K^T: [16 rows] x [fa_keys], (Qhi + Qlo) Khi (+ Qhi Klo)
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        for (int nt = 0; nt < fa_keys / 16; ++nt) {
            wmma::fill_fragment(acc, 0.0f);
            for (int kk = 0; kk < hd_pad / 16; ++kk) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
                const int qo = warp * 16 * L.ldh + kk * 16, ko = nt * 16 * L.ldh + kk * 16;
                wmma::load_matrix_sync(b, kh + ko, unsigned(L.ldh));
                wmma::load_matrix_sync(a, qh + qo, unsigned(L.ldh));
                wmma::mma_sync(acc, a, b, acc);
                if constexpr (k_split) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b_lo;
                    wmma::load_matrix_sync(b_lo, kl + ko, unsigned(L.ldh));
                    wmma::mma_sync(acc, a, b_lo, acc);
                }
                wmma::load_matrix_sync(a, ql + qo, unsigned(L.ldh));
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(s + warp * 16 * fa_smem::lds + nt * 16, acc, unsigned(fa_smem::lds),
                                    wmma::mem_row_major);
        }
        __syncwarp();

        // Online softmax: scores scaled and masked, the new max, P split into f16 terms, O rescaled.
        const int j0 = my_half * (fa_keys / 2);
        float sv[fa_keys / 2];
        float tmax = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < fa_keys / 2; ++jj) {
            const int j = j0 + jj;
            const bool seen = my_pos >= p0 + j && p0 + j >= my_first;
            float x = seen ? s[my_r * fa_smem::lds + j] * qf[my_r] * kf[j] : -INFINITY;
            if (seen && p.softcap > 0.0f) x = p.softcap * tanhf(x / p.softcap);
            sv[jj] = x;
            tmax = fmaxf(tmax, sv[jj]);
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        const float m_new = fmaxf(m, tmax);
        const float corr = m_new == -INFINITY ? 1.0f : expf(m - m_new); // 0 on a row's first keys
        float psum = 0.0f;
#pragma unroll
        for (int jj = 0; jj < fa_keys / 2; ++jj) {
            const float pj = sv[jj] == -INFINITY ? 0.0f : expf(sv[jj] - m_new);
            psum += pj;
            split_f16(pj, ph[my_r * fa_smem::ldp + j0 + jj], pl[my_r * fa_smem::ldp + j0 + jj]);
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        l = l * corr + psum;
        m = m_new;
        if (corr != 1.0f) {
            float* orow = o + my_r * L.ldo + my_half * (hd_pad / 2);
            for (int i = 0; i < hd_pad / 2; ++i) orow[i] *= corr;
        }
        __syncwarp();

        // O += P V: [16 rows] x [hd_pad], (Phi + Plo) Vhi (+ Phi Vlo)
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> pa[fa_keys / 16][2];
        for (int kk = 0; kk < fa_keys / 16; ++kk) {
            wmma::load_matrix_sync(pa[kk][0], ph + warp * 16 * fa_smem::ldp + kk * 16, unsigned(fa_smem::ldp));
            wmma::load_matrix_sync(pa[kk][1], pl + warp * 16 * fa_smem::ldp + kk * 16, unsigned(fa_smem::ldp));
        }
        for (int nt = 0; nt < hd_pad / 16; ++nt) {
            float* ot = o + warp * 16 * L.ldo + nt * 16;
            wmma::load_matrix_sync(acc, ot, unsigned(L.ldo), wmma::mem_row_major);
            for (int kk = 0; kk < fa_keys / 16; ++kk) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
                const int vo = kk * 16 * L.ldh + nt * 16;
                wmma::load_matrix_sync(b, vh + vo, unsigned(L.ldh));
                wmma::mma_sync(acc, pa[kk][0], b, acc);
                wmma::mma_sync(acc, pa[kk][1], b, acc);
                if constexpr (v_split) {
                    wmma::load_matrix_sync(b, vl + vo, unsigned(L.ldh));
                    wmma::mma_sync(acc, pa[kk][0], b, acc);
                }
            }
            wmma::store_matrix_sync(ot, acc, unsigned(L.ldo), wmma::mem_row_major);
        }
    }

    __syncwarp();
    if (sg.n_split > 1) { // a share of the positions: O as it is, with the row's max and sum
        if (my_half == 0 && my_pos >= 0) {
            const int64_t at = fa_part_slot(p, kvh, sg.part0 + split, my_r);
            p.part_ml[at * 2] = m;
            p.part_ml[at * 2 + 1] = l;
        }
        for (int rr = 0; rr < 16; ++rr) {
            const int r = warp * 16 + rr;
            if (pos[r] < 0) continue; // warp-uniform
            const int64_t at = fa_part_slot(p, kvh, sg.part0 + split, r);
            for (int i = lane; i < hd; i += 32) p.part_o[at * hd + i] = o[r * L.ldo + i];
        }
        return;
    }
    if (my_half == 0) lsum[my_r] = l;
    __syncwarp();
    for (int rr = 0; rr < 16; ++rr) {
        const int r = warp * 16 + rr;
        if (pos[r] < 0) continue; // warp-uniform
        float* out = p.out + q_offset(r);
        for (int i = lane; i < hd; i += 32) out[i] = o[r * L.ldo + i] / lsum[r];
    }
}

// The split segments' partial results merged: a block per (split segment, kv head), its rows in
// turn. Each partial was computed against its own running max m_s; with M the largest,
// out = sum_s O_s e^(m_s - M) / sum_s l_s e^(m_s - M). A row that saw none of a split's
// positions left m_s = -inf, l_s = 0 there: its weight is 0.
__global__ void fa_combine_kernel(const __grid_constant__ fa_params p) {
    const seg_desc& sg = p.b.segs[blockIdx.x];
    const int kvh = int(blockIdx.y), hd = p.g.head_dim;
    const int64_t n_rows = int64_t(sg.n_tok) * p.n_gqa;
    for (int64_t r = 0; r < n_rows; ++r) {
        auto slot = [&](int s) { return fa_part_slot(p, kvh, sg.part0 + s, r); };
        float big = -INFINITY;
        for (int s = 0; s < sg.n_split; ++s) big = fmaxf(big, p.part_ml[slot(s) * 2]);
        float den = 0.0f;
        for (int s = 0; s < sg.n_split; ++s) {
            const float* ml = p.part_ml + slot(s) * 2;
            if (ml[0] != -INFINITY) den += ml[1] * expf(ml[0] - big);
        }
        const int64_t t = r / p.n_gqa;
        const int h = kvh * p.n_gqa + int(r % p.n_gqa);
        float* out = p.out + ((sg.q_row + t) * p.n_head + h) * int64_t(hd);
        for (int i = int(threadIdx.x); i < hd; i += int(blockDim.x)) {
            float num = 0.0f;
            for (int s = 0; s < sg.n_split; ++s) {
                const int64_t at = slot(s);
                const float ms = p.part_ml[at * 2];
                if (ms != -INFINITY) num += p.part_o[at * hd + i] * expf(ms - big);
            }
            out[i] = num / den;
        }
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
    launch_kernel(c, flash_attention_kernel<DT>, dim3{unsigned(n_blocks), unsigned(n_head_kv)},
                  unsigned(n_warps * 32), L.total, prm);
}

} // namespace

void kv_store(const context& c, const attn_params& p, int il, const float* k, const float* v) {
    const kv_layout& lay = p.lay;
    c.make_current();
    kv_store_params prm{p.kv_base, p.tables, k, v, geom_of(lay, il), {}};
    int32_t n_parts = 0;
    for (size_t i = 0; i < p.seqs.size();) {
        const int64_t n_tok = next_seg_batch(
            p.seqs, i, prm.b, [](const attn_seq& s) { return int64_t(s.n_tok); },
            [](const attn_seq&) { return int32_t(1); }, n_parts);
        if (n_tok == 0) continue;
        const dim3 grid{unsigned(n_tok), unsigned(lay.n_head_kv), 2};
        switch (lay.dtype) {
        case kv_dtype::f32: launch_kernel(c, kv_store_kernel<kv_dtype::f32>, grid, 32, 0, prm); break;
        case kv_dtype::f16: launch_kernel(c, kv_store_kernel<kv_dtype::f16>, grid, 32, 0, prm); break;
        case kv_dtype::i8: launch_kernel(c, kv_store_kernel<kv_dtype::i8>, grid, 32, 0, prm); break;
        }
    }
}

void attention(const context& c, const attn_params& p, int il, float* out, const float* q, int n_head, float scale) {
    const kv_layout& lay = p.lay;
    TANDEM_ASSERT(lay.head_dim >= 1 && lay.head_dim <= fa_max_hd, "CUDA attention supports head_dim up to {}, not {}",
                  fa_max_hd, lay.head_dim);
    TANDEM_ASSERT(n_head % lay.n_head_kv == 0);
    const int n_gqa = n_head / lay.n_head_kv;
    int64_t max_rows = 0;
    for (const attn_seq& s : p.seqs) max_rows = std::max(max_rows, int64_t(s.n_tok) * n_gqa);
    if (max_rows == 0) return;
    c.make_current();
    fa_params prm{};
    prm.out = out;
    prm.q = q;
    prm.kv_base = p.kv_base;
    prm.tables = p.tables;
    prm.g = geom_of(lay, il);
    prm.n_head = n_head;
    prm.n_gqa = n_gqa;
    prm.hd_pad = (lay.head_dim + 15) / 16 * 16;
    prm.scale = scale;
    prm.window = p.window;
    prm.softcap = p.softcap;
    // Four warps (64 rows) a block, two for head dims above 128 (shared memory); fewer when no
    // segment has that many rows (a decode step: n_gqa rows each).
    const int n_warps = int(std::clamp<int64_t>((max_rows + 15) / 16, 1, prm.hd_pad <= 128 ? 4 : 2));
    const int64_t rows = 16 * n_warps;
    prm.part_rows = int32_t(rows);
    auto row_blocks = [&](const attn_seq& s) { return (int64_t(s.n_tok) * n_gqa + rows - 1) / rows; };
    auto splits = [&](const attn_seq& s) { // over the positions from the tile of the first one seen
        const int64_t seen = int64_t(s.n_past) + s.n_tok - fa_first_seen(s.n_past, p.window) / fa_keys * fa_keys;
        return row_blocks(s) == 1 && seen > 2 * fa_split_keys ? int32_t((seen + fa_split_keys - 1) / fa_split_keys)
                                                              : int32_t(1);
    };
    // Up to max_segs segments a launch; the grid is (their blocks, n_head_kv).
    for (size_t i = 0; i < p.seqs.size();) {
        const int64_t blocks = next_seg_batch(p.seqs, i, prm.b, row_blocks, splits, prm.n_parts);
        if (blocks == 0) continue;
        buffer parts; // freed in stream order, after the combine
        if (prm.n_parts > 0) {
            parts = buffer(c, size_t(lay.n_head_kv) * size_t(prm.n_parts) * size_t(rows) * size_t(lay.head_dim + 2) *
                                  sizeof(float));
            prm.part_o = parts.as<float>();
            prm.part_ml = prm.part_o + int64_t(lay.n_head_kv) * prm.n_parts * rows * lay.head_dim;
        }
        switch (lay.dtype) {
        case kv_dtype::f32: launch_flash<kv_dtype::f32>(c, prm, n_warps, blocks, lay.n_head_kv); break;
        case kv_dtype::f16: launch_flash<kv_dtype::f16>(c, prm, n_warps, blocks, lay.n_head_kv); break;
        case kv_dtype::i8: launch_flash<kv_dtype::i8>(c, prm, n_warps, blocks, lay.n_head_kv); break;
        }
        if (prm.n_parts == 0) continue;
        // The combine reads the split segments only: the same parameters, those segments kept.
        fa_params cmb = prm;
        cmb.b.n_seg = 0;
        for (int j = 0; j < prm.b.n_seg; ++j)
            if (prm.b.segs[j].n_split > 1) cmb.b.segs[cmb.b.n_seg++] = prm.b.segs[j];
        launch_kernel(c, fa_combine_kernel, dim3{unsigned(cmb.b.n_seg), unsigned(lay.n_head_kv)}, 128, 0, cmb);
    }
}

} // namespace tandem::cuda
