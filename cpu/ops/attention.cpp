// Causal attention over paged K/V (F32, F16 or INT8 pages) with online softmax, GQA-aware: one
// pass over the pages per (token, kv head) decodes each page once for all the query heads
// that share that kv head.
#include "cpu/intrinsics.hpp"
#include "cpu/isa.hpp"
#include "cpu/ops/ops.hpp"
#include "cpu/ref/ops_ref.hpp"
#include "cpu/simd_exp.hpp"
#include "cpu/thread_pool.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace tandem::cpu {
namespace {

constexpr int lanes = 16; // independent partial sums, so the compiler can vectorize the dots

// Decodes slots [0, n) of (il, K or V, kvh) of a page into dst [n, head_dim]; F16 and INT8
// with AVX-512 when the level allows, otherwise the reference decoder (same values).
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) void decode_avx512(const uint8_t* page, const kv_layout& lay,
                                                                             int il, bool is_v, int kvh, int n,
                                                                             float* dst) {
    const int64_t e0 = lay.offset(il, is_v, kvh);
    const int64_t total = int64_t(n) * lay.head_dim;
    if (lay.dtype == kv_dtype::f16) {
        const uint16_t* src = reinterpret_cast<const uint16_t*>(page) + e0;
        int64_t i = 0;
        for (; i + 16 <= total; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
        for (; i < total; ++i) dst[i] = _cvtsh_ss(src[i]);
        return;
    }
    if (lay.dtype == kv_dtype::i8 && lay.head_dim % 16 == 0) {
        const int8_t* src = reinterpret_cast<const int8_t*>(page) + e0;
        const float* sc = reinterpret_cast<const float*>(page + lay.scales_begin()) + lay.scale_offset(il, is_v, kvh);
        for (int j = 0; j < n; ++j) {
            const __m512 s = _mm512_set1_ps(sc[j]);
            for (int i = 0; i < lay.head_dim; i += 16) {
                const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j * lay.head_dim + i));
                _mm512_storeu_ps(dst + j * lay.head_dim + i, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s));
            }
        }
        return;
    }
    ref::kv_read(page, lay, il, is_v, kvh, 0, n, dst);
}

// The same with AVX2 and F16C, 8 values at a time (CPUs without AVX-512).
__attribute__((target("avx2,f16c"))) void decode_avx2(const uint8_t* page, const kv_layout& lay, int il, bool is_v,
                                                      int kvh, int n, float* dst) {
    const int64_t e0 = lay.offset(il, is_v, kvh);
    const int64_t total = int64_t(n) * lay.head_dim;
    if (lay.dtype == kv_dtype::f16) {
        const uint16_t* src = reinterpret_cast<const uint16_t*>(page) + e0;
        int64_t i = 0;
        for (; i + 8 <= total; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
        for (; i < total; ++i) dst[i] = _cvtsh_ss(src[i]);
        return;
    }
    if (lay.dtype == kv_dtype::i8 && lay.head_dim % 8 == 0) {
        const int8_t* src = reinterpret_cast<const int8_t*>(page) + e0;
        const float* sc = reinterpret_cast<const float*>(page + lay.scales_begin()) + lay.scale_offset(il, is_v, kvh);
        for (int j = 0; j < n; ++j) {
            const __m256 s = _mm256_set1_ps(sc[j]);
            for (int i = 0; i < lay.head_dim; i += 8) {
                const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + j * lay.head_dim + i));
                _mm256_storeu_ps(dst + j * lay.head_dim + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s));
            }
        }
        return;
    }
    ref::kv_read(page, lay, il, is_v, kvh, 0, n, dst);
}

// How a kernel turns F16 and INT8 pages into floats: decode_avx512, decode_avx2, or the
// reference's kv_read (the same values).
using kv_decode_fn = void (*)(const uint8_t* page, const kv_layout& lay, int il, bool is_v, int kvh, int n, float* dst);

void decode_ref(const uint8_t* page, const kv_layout& lay, int il, bool is_v, int kvh, int n, float* dst) {
    ref::kv_read(page, lay, il, is_v, kvh, 0, n, dst);
}

inline __attribute__((always_inline)) float dot(const float* a, const float* b, int n) {
    float acc[lanes] = {};
    int i = 0;
    for (; i + lanes <= n; i += lanes)
        for (int j = 0; j < lanes; ++j) acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (; i < n; ++i) s += a[i] * b[i];
    for (float v : acc) s += v;
    return s;
}

// The window and soft-cap of attn_params, as every kernel takes them.
struct attn_mask {
    int32_t window = 0; // 0: the whole context
    float softcap = 0;  // 0: none
};

// What a score becomes under a soft-cap c > 0: c * tanh(s / c) (Gemma 2), as the reference has it.
inline float capped(float s, float c) { return c * std::tanh(s / c); }

// The same for 16 scores: tanh(a) = (1 - e) / (1 + e) with e = exp(-2|a|), the sign put back.
__attribute__((target("avx512f,avx512dq"), always_inline)) inline __m512 capped512(__m512 s, float c) {
    const __m512 a = _mm512_mul_ps(s, _mm512_set1_ps(1.0f / c));
    const __m512 e = exp512(_mm512_mul_ps(_mm512_abs_ps(a), _mm512_set1_ps(-2.0f)));
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    const __m512 sign = _mm512_and_ps(a, _mm512_castsi512_ps(_mm512_set1_epi32(int(0x80000000u))));
    return _mm512_mul_ps(_mm512_or_ps(t, sign), _mm512_set1_ps(c));
}

// The positions [first, p] a token at position p sees (window 0: all of them).
inline int32_t first_seen(int32_t p, int32_t window) { return window > 0 ? std::max(0, p - window + 1) : 0; }

struct scratch {
    std::vector<float> m, l, s, acc, kb, vb;
    scratch(int n_gqa, int hd, int ps)
        : m(size_t(n_gqa)), l(size_t(n_gqa)), s(size_t(ps)), acc(size_t(n_gqa) * size_t(hd)),
          kb(size_t(ps) * size_t(hd)), vb(size_t(ps) * size_t(hd)) {}
};

// Attention for token t over kv head kvh (all of its query heads); the body is shared by the
// plain, AVX2 and AVX-512 builds below, so each vectorizes the same loops at its own width.
inline __attribute__((always_inline)) void attend(scratch& w, float* out, const float* q, int64_t t, int kvh,
                                                  int32_t n_past, int n_head, const uint8_t* kv_base,
                                                  const kv_layout& lay, int il, const int32_t* block_table,
                                                  float scale, const attn_mask& mk, kv_decode_fn decode) {
    const int hd = lay.head_dim, n_gqa = n_head / lay.n_head_kv, ps = lay.page_size;
    const int32_t n_ctx = n_past + int32_t(t) + 1;
    const int32_t first = first_seen(n_ctx - 1, mk.window);
    std::fill(w.m.begin(), w.m.end(), -INFINITY);
    std::fill(w.l.begin(), w.l.end(), 0.0f);
    std::fill(w.acc.begin(), w.acc.end(), 0.0f);
    for (int32_t p0 = first / ps * ps; p0 < n_ctx; p0 += ps) {
        const int n = std::min(ps, n_ctx - p0);
        const int j0 = std::max(0, first - p0); // keys of this page before the window
        const uint8_t* page = kv_base + int64_t(block_table[p0 / ps]) * lay.page_bytes();
        const float* kp;
        const float* vp;
        if (lay.dtype == kv_dtype::f32) { // read in place
            kp = reinterpret_cast<const float*>(page) + lay.offset(il, false, kvh);
            vp = reinterpret_cast<const float*>(page) + lay.offset(il, true, kvh);
        } else {
            decode(page, lay, il, false, kvh, n, w.kb.data());
            decode(page, lay, il, true, kvh, n, w.vb.data());
            kp = w.kb.data();
            vp = w.vb.data();
        }
        for (int g = 0; g < n_gqa; ++g) {
            const float* qh = q + (t * n_head + kvh * n_gqa + g) * hd;
            float page_max = -INFINITY;
            for (int j = j0; j < n; ++j) {
                w.s[size_t(j)] = dot(qh, kp + j * hd, hd) * scale;
                if (mk.softcap > 0) w.s[size_t(j)] = capped(w.s[size_t(j)], mk.softcap);
                page_max = std::max(page_max, w.s[size_t(j)]);
            }
            // rescale what was accumulated so far to the new running max
            const float new_m = std::max(w.m[size_t(g)], page_max);
            const float corr = std::exp(w.m[size_t(g)] - new_m);
            float* ag = w.acc.data() + size_t(g) * hd;
            w.l[size_t(g)] *= corr;
            for (int i = 0; i < hd; ++i) ag[i] *= corr;
            for (int j = j0; j < n; ++j) {
                const float pj = std::exp(w.s[size_t(j)] - new_m);
                w.l[size_t(g)] += pj;
                const float* vj = vp + j * hd;
                for (int i = 0; i < hd; ++i) ag[i] += pj * vj[i];
            }
            w.m[size_t(g)] = new_m;
        }
    }
    for (int g = 0; g < n_gqa; ++g) {
        float* oh = out + (t * n_head + kvh * n_gqa + g) * hd;
        const float inv = 1.0f / w.l[size_t(g)];
        for (int i = 0; i < hd; ++i) oh[i] = w.acc[size_t(g) * hd + i] * inv;
    }
}

void attend_plain(scratch& w, float* out, const float* q, int64_t t, int kvh, int32_t n_past, int n_head,
                  const uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* block_table, float scale,
                  const attn_mask& mk) {
    attend(w, out, q, t, kvh, n_past, n_head, kv_base, lay, il, block_table, scale, mk, decode_ref);
}

__attribute__((target("avx2,f16c,fma"))) void attend_avx2(scratch& w, float* out, const float* q, int64_t t, int kvh,
                                                           int32_t n_past, int n_head, const uint8_t* kv_base,
                                                           const kv_layout& lay, int il, const int32_t* block_table,
                                                           float scale, const attn_mask& mk) {
    attend(w, out, q, t, kvh, n_past, n_head, kv_base, lay, il, block_table, scale, mk, decode_avx2);
}

__attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma"))) void attend_avx512(
    scratch& w, float* out, const float* q, int64_t t, int kvh, int32_t n_past, int n_head, const uint8_t* kv_base,
    const kv_layout& lay, int il, const int32_t* block_table, float scale, const attn_mask& mk) {
    attend(w, out, q, t, kvh, n_past, n_head, kv_base, lay, il, block_table, scale, mk, decode_avx512);
}

using attend_fn = decltype(&attend_plain);

// The per-token kernel of the active level.
attend_fn pick_attend() {
    const isa level = active_isa();
    return level >= isa::avx512 ? attend_avx512 : level >= isa::avx2 ? attend_avx2 : attend_plain;
}

// AVX-512, head_dim a multiple of 16: a block of query tokens shares each decoded page, and
// the page's (up to) 16 keys sit in the lanes of one register, so scores, the online softmax
// and the P.V update are whole-register operations with no horizontal sums per key.
constexpr int key_chunk = 16;
constexpr int tok_block = 16;
constexpr int max_nv = 16; // head_dim up to 256

// dst[i * 16 + j] = src[j * ld + i] for i, j < 16: a 16 x 16 block of keys (rows j, dims i) with
// the keys in lanes; rows j >= n are zeros. Pairs of rows, then pairs of pairs within 128-bit
// lanes, then the 128-bit lanes themselves. Src is F32, or F16 (uint16_t) decoded on the way in.
template <class T>
__attribute__((target("avx512f,f16c"))) inline void transpose16(const T* src, int64_t ld, int n, float* dst) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, uint16_t>);
    __m512 r[16], t[16];
    for (int j = 0; j < 16; ++j) {
        if (j >= n) r[j] = _mm512_setzero_ps();
        else if constexpr (std::is_same_v<T, float>) r[j] = _mm512_loadu_ps(src + j * ld);
        else r[j] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + j * ld)));
    }
    for (int j = 0; j < 16; j += 2) { // per 128-bit lane: [a0 b0 a1 b1], [a2 b2 a3 b3]
        t[j] = _mm512_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm512_unpackhi_ps(r[j], r[j + 1]);
    }
    for (int g = 0; g < 16; g += 4) { // u[g + k], lane L: column 4L + k of rows g..g+3
        const __m512d t0 = _mm512_castps_pd(t[g]), t1 = _mm512_castps_pd(t[g + 1]), t2 = _mm512_castps_pd(t[g + 2]),
                      t3 = _mm512_castps_pd(t[g + 3]);
        r[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        r[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        r[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        r[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
    for (int k = 0; k < 4; ++k) { // lane L of the four row groups -> column 4L + k
        const __m512 x0 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x44), x1 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xee);
        const __m512 x2 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x44),
                     x3 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xee);
        _mm512_storeu_ps(dst + (0 + k) * 16, _mm512_shuffle_f32x4(x0, x2, 0x88));
        _mm512_storeu_ps(dst + (4 + k) * 16, _mm512_shuffle_f32x4(x0, x2, 0xdd));
        _mm512_storeu_ps(dst + (8 + k) * 16, _mm512_shuffle_f32x4(x1, x3, 0x88));
        _mm512_storeu_ps(dst + (12 + k) * 16, _mm512_shuffle_f32x4(x1, x3, 0xdd));
    }
}

// Kept per thread across calls (decode calls attention once per sequence and layer); every
// kernel writes what it reads, so sizes are all that has to fit.
struct block_scratch {
    std::vector<float> kb, vb, kt, m, l, acc;
    void fit(int n_gqa, int hd, int ps) {
        kb.resize(size_t(ps) * size_t(hd));
        vb.resize(kb.size());
        kt.resize(size_t(hd) * key_chunk);
        m.resize(size_t(tok_block) * size_t(n_gqa));
        l.resize(m.size());
        acc.resize(m.size() * size_t(hd));
    }
};

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma"))) void attend_block_avx512(
    block_scratch& w, float* out, const float* q, int64_t t0, int64_t t1, int kvh, int32_t n_past, int n_head,
    const uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* block_table, float scale,
    const attn_mask& mk) {
    const int hd = lay.head_dim, n_gqa = n_head / lay.n_head_kv, ps = lay.page_size, nv = hd / 16;
    const int nq = int(t1 - t0) * n_gqa;
    std::fill(w.m.begin(), w.m.begin() + nq, -INFINITY);
    std::fill(w.l.begin(), w.l.begin() + nq, 0.0f);
    std::fill(w.acc.begin(), w.acc.begin() + size_t(nq) * hd, 0.0f);
    const int32_t n_end = n_past + int32_t(t1); // the last token's context
    const int32_t first0 = first_seen(n_past + int32_t(t0), mk.window); // the first token's first position
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int32_t p0 = first0 / ps * ps; p0 < n_end; p0 += ps) {
        const int n_page = std::min(ps, n_end - p0);
        const uint8_t* page = kv_base + int64_t(block_table[p0 / ps]) * lay.page_bytes();
        const float* kp;
        const float* vp;
        if (lay.dtype == kv_dtype::f32) {
            kp = reinterpret_cast<const float*>(page) + lay.offset(il, false, kvh);
            vp = reinterpret_cast<const float*>(page) + lay.offset(il, true, kvh);
        } else {
            decode_avx512(page, lay, il, false, kvh, n_page, w.kb.data());
            decode_avx512(page, lay, il, true, kvh, n_page, w.vb.data());
            kp = w.kb.data();
            vp = w.vb.data();
        }
        for (int c0 = 0; c0 < n_page; c0 += key_chunk) {
            const int n = std::min(key_chunk, n_page - c0);
            // K chunk transposed: kt[i] holds dim i of the chunk's keys in lanes 0..n-1
            for (int i = 0; i < hd; i += 16) transpose16(kp + c0 * hd + i, hd, n, w.kt.data() + i * key_chunk);
            const int32_t pos0 = p0 + c0;
            for (int64_t t = t0; t < t1; ++t) {
                const int32_t n_ctx = n_past + int32_t(t) + 1;
                const int valid = std::min(n, n_ctx - pos0);
                const int skip = std::max(0, first_seen(n_ctx - 1, mk.window) - pos0); // keys before the window
                if (valid <= skip) continue;
                const __mmask16 live = __mmask16(((1u << valid) - 1) & ~((1u << std::min(skip, 16)) - 1));
                for (int g = 0; g < n_gqa; ++g) {
                    const int qi = int(t - t0) * n_gqa + g;
                    const float* qh = q + (t * n_head + kvh * n_gqa + g) * hd;
                    // four independent chains: one chain of hd FMAs would wait on FMA latency
                    __m512 s4[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
                    const float* kt = w.kt.data();
                    for (int i = 0; i < hd; i += 4)
                        for (int u = 0; u < 4; ++u)
                            s4[u] = _mm512_fmadd_ps(_mm512_set1_ps(qh[i + u]), _mm512_loadu_ps(kt + (i + u) * key_chunk), s4[u]);
                    __m512 sc = _mm512_add_ps(_mm512_add_ps(s4[0], s4[1]), _mm512_add_ps(s4[2], s4[3]));
                    sc = _mm512_mul_ps(sc, vscale);
                    if (mk.softcap > 0) sc = capped512(sc, mk.softcap);
                    sc = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), live, sc);
                    const float m_old = w.m[size_t(qi)];
                    const float m_new = std::max(m_old, _mm512_reduce_max_ps(sc));
                    const float corr = std::exp(m_old - m_new);
                    const __m512 pr = _mm512_maskz_mov_ps(live, exp512(_mm512_sub_ps(sc, _mm512_set1_ps(m_new))));
                    w.l[size_t(qi)] = w.l[size_t(qi)] * corr + _mm512_reduce_add_ps(pr);
                    w.m[size_t(qi)] = m_new;
                    alignas(64) float pj[key_chunk];
                    _mm512_store_ps(pj, pr);
                    float* acc = &w.acc[size_t(qi) * hd];
                    const __m512 vc = _mm512_set1_ps(corr);
                    __m512 a[max_nv]; // one register per 16 dims: nv independent chains over the keys
                    for (int v = 0; v < nv; ++v) a[v] = _mm512_mul_ps(_mm512_loadu_ps(acc + v * 16), vc);
                    for (int j = skip; j < valid; ++j) {
                        const __m512 pb = _mm512_set1_ps(pj[j]);
                        const float* vj = vp + (c0 + j) * hd;
                        for (int v = 0; v < nv; ++v) a[v] = _mm512_fmadd_ps(pb, _mm512_loadu_ps(vj + v * 16), a[v]);
                    }
                    for (int v = 0; v < nv; ++v) _mm512_storeu_ps(acc + v * 16, a[v]);
                }
            }
        }
    }
    for (int64_t t = t0; t < t1; ++t)
        for (int g = 0; g < n_gqa; ++g) {
            const int qi = int(t - t0) * n_gqa + g;
            float* oh = out + (t * n_head + kvh * n_gqa + g) * hd;
            const float inv = 1.0f / w.l[size_t(qi)];
            for (int i = 0; i < hd; ++i) oh[i] = w.acc[size_t(qi) * hd + i] * inv;
        }
}

// The register-blocked kernel, for every call where the head dim has one (see pick_prefill_job):
// a row's arithmetic never depends on the rows it is grouped with, so a token's output is the
// same bit for bit whether its prompt came in one call, in chunks, or as a decode step.
// Prefill, one kv head at a time: its K and V over the whole context (from the first page the
// window lets the first token see) are
// decoded once into f32 scratch that every job shares: K transposed in chunks of 16 positions
// (kt[chunk][dim][16], one register per dim), V as rows (vr[pos][dim]), both zero past the
// context; per kv head the scratch is 8 bytes x context x head_dim (4 MiB at 4,096 x 128). A
// job (block of tokens) then takes its query rows of that kv head eight at a time through the chunks:
// eight score registers fed by one K load per dim, an online softmax per row (the running sum
// kept per lane, reduced at the end), and P.V with each V row loaded once for several rows.
constexpr int pf_rows = 8;       // query rows per pass over the chunks
constexpr int pf_tok_block = 16; // tokens per job

struct prefill_kv {
    float* kt;        // [n_chunks][head_dim][16]
    float* vr;        // [n_chunks * 16][head_dim]
    int64_t n_chunks; // even: the kernel takes two a pass
    int32_t base;     // the position of the scratch's first key: a multiple of 2 * 16 (0 without a window)
};

// The scratch for one kv head's K/V over positions [base, n_end), base the start of the first
// page read rounded down to a pair of chunks, in the calling thread's buffer (kept across
// layers and calls: it grows to the longest span seen, a window's at most).
prefill_kv kv_scratch(int32_t first_page_pos, int32_t n_end, int hd) {
    thread_local std::vector<float> buf;
    const int32_t base = first_page_pos / (2 * key_chunk) * (2 * key_chunk);
    const int64_t n_chunks = (n_end - base + 2 * key_chunk - 1) / (2 * key_chunk) * 2;
    const size_t per_side = size_t(n_chunks) * key_chunk * size_t(hd);
    if (buf.size() < 2 * per_side) buf.resize(2 * per_side);
    return {buf.data(), buf.data() + per_side, n_chunks, base};
}

// Page pg of the sequence (positions p0.., n of them) into the scratch: V rows decoded in place,
// K decoded to rows in kb and then transposed into its chunks (16 keys at a time when the page
// size is a multiple of 16, so chunks and pages line up; one position at a time otherwise).
void decode_page_kv(const prefill_kv& kv, std::vector<float>& kb, int64_t pg, int32_t n_end, int kvh,
                    const uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* block_table) {
    const int hd = lay.head_dim, ps = lay.page_size;
    const int32_t p0 = int32_t(pg) * ps, r0 = p0 - kv.base; // r0: where the page starts in the scratch
    const int n = std::min(ps, n_end - p0);
    float* kt = kv.kt;
    kb.resize(size_t(ps) * size_t(hd));
    const uint8_t* page = kv_base + int64_t(block_table[pg]) * lay.page_bytes();
    decode_avx512(page, lay, il, true, kvh, n, kv.vr + int64_t(r0) * hd);
    if (ps % key_chunk == 0 && lay.dtype == kv_dtype::f16) { // straight from the page's halves
        const uint16_t* k16 = reinterpret_cast<const uint16_t*>(page) + lay.offset(il, false, kvh);
        for (int j0 = 0; j0 < n; j0 += key_chunk)
            for (int i = 0; i < hd; i += 16)
                transpose16(k16 + j0 * hd + i, hd, std::min(key_chunk, n - j0),
                            kt + ((r0 + j0) / key_chunk * hd + i) * key_chunk);
        return;
    }
    decode_avx512(page, lay, il, false, kvh, n, kb.data());
    if (ps % key_chunk == 0) {
        for (int j0 = 0; j0 < n; j0 += key_chunk)
            for (int i = 0; i < hd; i += 16)
                transpose16(kb.data() + j0 * hd + i, hd, std::min(key_chunk, n - j0),
                            kt + ((r0 + j0) / key_chunk * hd + i) * key_chunk);
        return;
    }
    for (int j = 0; j < n; ++j) {
        const int32_t r = r0 + j;
        float* dst = kt + (r / key_chunk) * hd * key_chunk + r % key_chunk;
        for (int i = 0; i < hd; ++i) dst[i * key_chunk] = kb[size_t(j * hd + i)];
    }
}

// The last chunk's lanes past the context: zeros, so no stale value meets a zero weight.
void pad_kv(const prefill_kv& kv, int32_t n_end, int hd) {
    for (int64_t r = n_end - kv.base; r < kv.n_chunks * key_chunk; ++r) {
        float* dst = kv.kt + (r / key_chunk) * hd * key_chunk + r % key_chunk;
        for (int i = 0; i < hd; ++i) dst[i * key_chunk] = 0.0f;
        std::fill_n(kv.vr + r * hd, hd, 0.0f);
    }
}

// Kv head kvh's K/V over pages [first_page, n_end / page_size) into kv, the pages spread over
// the pool's threads (prefill) or on this thread (pool null: a decode job, one of many running
// at once). Pages before first_page are not read (outside the window: they may be no_page).
void decode_kv_head(thread_pool* pool, const prefill_kv& kv, int32_t first_page, int32_t n_end, int kvh,
                    const uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* block_table) {
    const int hd = lay.head_dim, ps = lay.page_size;
    const int64_t n_pages = (n_end + ps - 1) / ps;
    const auto pages = [&](int64_t b, int64_t e) {
        thread_local std::vector<float> kb;
        for (int64_t pg = first_page + b; pg < first_page + e; ++pg)
            decode_page_kv(kv, kb, pg, n_end, kvh, kv_base, lay, il, block_table);
    };
    if (pool) pool->parallel_for(n_pages - first_page, thread_pool::grain_for(int64_t(ps) * hd * 8), pages);
    else pages(0, n_pages - first_page);
    pad_kv(kv, n_end, hd);
}

// R query rows (rows[r] = (token, query head)) of kv head kvh over all their chunks; NV = head_dim / 16.
// Capped: the scores go through the soft-cap (a template argument, so the plain kernel stays as it was).
template <int R, int NV, bool Capped>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))) void attend_rows_prefill(
    float* out, const float* q, const int64_t* row_tok, const int* row_head, int32_t n_past, int n_head,
    const prefill_kv& kv, float* acc, float scale, const attn_mask& mk) {
    constexpr int hd = NV * 16;
    constexpr int pv_rows = NV >= 16 ? 1 : NV >= 8 ? 2 : 4; // accumulators in registers: pv_rows * NV
    const float* qr[R];
    int32_t n_ctx[R], first[R]; // each row sees positions [first, n_ctx), relative to the scratch
    for (int r = 0; r < R; ++r) {
        qr[r] = q + (row_tok[r] * n_head + row_head[r]) * hd;
        const int32_t p = n_past + int32_t(row_tok[r]);
        n_ctx[r] = p + 1 - kv.base;
        first[r] = first_seen(p, mk.window) - kv.base;
    }
    int32_t max_ctx = 0, min_first = first[0];
    for (int r = 0; r < R; ++r) {
        max_ctx = std::max(max_ctx, n_ctx[r]);
        min_first = std::min(min_first, first[r]);
    }
    alignas(64) float m[16], m_new[16], corr[16]; // lanes past R stay 0
    std::fill_n(m, 16, 0.0f);
    std::fill_n(m, R, -INFINITY);
    __m512 l[R];
    for (int r = 0; r < R; ++r) l[r] = _mm512_setzero_ps();
    std::fill_n(acc, R * hd, 0.0f);
    const __m512 vscale = _mm512_set1_ps(scale);
    // Two chunks (32 keys) a pass: two K loads per dim feed 2 * R FMAs, and the softmax's
    // reductions and exps are paid once per 32 keys. The scratch holds an even number of chunks.
    for (int64_t c = min_first / (2 * key_chunk) * 2; c * key_chunk < max_ctx; c += 2) {
        const float* kt = kv.kt + c * hd * key_chunk;
        __m512 s0[R], s1[R];
        for (int r = 0; r < R; ++r) s0[r] = s1[r] = _mm512_setzero_ps();
        for (int i = 0; i < hd; ++i) {
            const __m512 k0 = _mm512_loadu_ps(kt + i * key_chunk), k1 = _mm512_loadu_ps(kt + (hd + i) * key_chunk);
            for (int r = 0; r < R; ++r) {
                const __m512 qi = _mm512_set1_ps(qr[r][i]);
                s0[r] = _mm512_fmadd_ps(qi, k0, s0[r]);
                s1[r] = _mm512_fmadd_ps(qi, k1, s1[r]);
            }
        }
        std::copy_n(m, 16, m_new);
        __mmask16 live0[R], live1[R]; // keys of each chunk the row sees
        int j_begin = 2 * key_chunk, j_end = 0; // keys any row sees in this pair of chunks
        for (int r = 0; r < R; ++r) {
            const int64_t lo = std::clamp<int64_t>(first[r] - c * key_chunk, 0, 2 * key_chunk);
            const int64_t hi = std::clamp<int64_t>(n_ctx[r] - c * key_chunk, 0, 2 * key_chunk);
            const uint64_t bits = ((uint64_t(1) << hi) - 1) & ~((uint64_t(1) << lo) - 1);
            live0[r] = __mmask16(bits & 0xffff);
            live1[r] = __mmask16(bits >> key_chunk);
            if (hi > lo) {
                j_begin = std::min(j_begin, int(lo));
                j_end = std::max(j_end, int(hi));
            }
            s0[r] = _mm512_mul_ps(s0[r], vscale);
            s1[r] = _mm512_mul_ps(s1[r], vscale);
            if constexpr (Capped) {
                s0[r] = capped512(s0[r], mk.softcap);
                s1[r] = capped512(s1[r], mk.softcap);
            }
            s0[r] = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), live0[r], s0[r]);
            s1[r] = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), live1[r], s1[r]);
            if (live0[r] | live1[r]) m_new[r] = std::max(m[r], _mm512_reduce_max_ps(_mm512_max_ps(s0[r], s1[r])));
        }
        // exp(m_old - m_new) for all rows at once; a row with nothing here keeps its state (1)
        const __m512 e = exp512(_mm512_sub_ps(_mm512_load_ps(m), _mm512_load_ps(m_new)));
        _mm512_store_ps(corr, e);
        alignas(64) float p[R][2 * key_chunk];
        for (int r = 0; r < R; ++r) {
            if (!(live0[r] | live1[r])) {
                corr[r] = 1.0f;
                _mm512_store_ps(p[r], _mm512_setzero_ps());
                _mm512_store_ps(p[r] + key_chunk, _mm512_setzero_ps());
                continue;
            }
            const __m512 mr = _mm512_set1_ps(m_new[r]);
            const __m512 p0 = _mm512_maskz_mov_ps(live0[r], exp512(_mm512_sub_ps(s0[r], mr)));
            const __m512 p1 = _mm512_maskz_mov_ps(live1[r], exp512(_mm512_sub_ps(s1[r], mr)));
            l[r] = _mm512_add_ps(_mm512_fmadd_ps(l[r], _mm512_set1_ps(corr[r]), p0), p1);
            m[r] = m_new[r];
            _mm512_store_ps(p[r], p0);
            _mm512_store_ps(p[r] + key_chunk, p1);
        }
        const float* vc = kv.vr + c * key_chunk * hd;
        for (int r0 = 0; r0 < R; r0 += pv_rows) {
            constexpr int P = pv_rows < R ? pv_rows : R;
            __m512 a[P][NV];
            for (int r = 0; r < P; ++r) {
                const __m512 cr = _mm512_set1_ps(corr[r0 + r]);
                for (int v = 0; v < NV; ++v) a[r][v] = _mm512_mul_ps(_mm512_loadu_ps(acc + (r0 + r) * hd + v * 16), cr);
            }
            for (int j = j_begin; j < j_end; ++j) {
                __m512 vj[NV];
                for (int v = 0; v < NV; ++v) vj[v] = _mm512_loadu_ps(vc + j * hd + v * 16);
                for (int r = 0; r < P; ++r) {
                    const __m512 pb = _mm512_set1_ps(p[r0 + r][j]);
                    for (int v = 0; v < NV; ++v) a[r][v] = _mm512_fmadd_ps(pb, vj[v], a[r][v]);
                }
            }
            for (int r = 0; r < P; ++r)
                for (int v = 0; v < NV; ++v) _mm512_storeu_ps(acc + (r0 + r) * hd + v * 16, a[r][v]);
        }
    }
    for (int r = 0; r < R; ++r) {
        const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(l[r]));
        float* o = out + (row_tok[r] * n_head + row_head[r]) * hd;
        for (int v = 0; v < NV; ++v) _mm512_storeu_ps(o + v * 16, _mm512_mul_ps(_mm512_loadu_ps(acc + r * hd + v * 16), inv));
    }
}

template <int NV, bool Capped>
void attend_job_prefill(float* out, const float* q, int64_t t0, int64_t t1, int kvh, int32_t n_past, int n_head,
                        int n_gqa, const prefill_kv& kv, float scale, const attn_mask& mk) {
    alignas(64) float acc[pf_rows * NV * 16];
    int64_t row_tok[pf_rows];
    int row_head[pf_rows];
    const int64_t n_rows = (t1 - t0) * n_gqa;
    for (int64_t r0 = 0; r0 < n_rows;) {
        const int64_t left = n_rows - r0;
        const int R = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        for (int r = 0; r < R; ++r) {
            row_tok[r] = t0 + (r0 + r) / n_gqa;
            row_head[r] = kvh * n_gqa + int((r0 + r) % n_gqa);
        }
        switch (R) {
        case 8: attend_rows_prefill<8, NV, Capped>(out, q, row_tok, row_head, n_past, n_head, kv, acc, scale, mk); break;
        case 4: attend_rows_prefill<4, NV, Capped>(out, q, row_tok, row_head, n_past, n_head, kv, acc, scale, mk); break;
        case 2: attend_rows_prefill<2, NV, Capped>(out, q, row_tok, row_head, n_past, n_head, kv, acc, scale, mk); break;
        default: attend_rows_prefill<1, NV, Capped>(out, q, row_tok, row_head, n_past, n_head, kv, acc, scale, mk); break;
        }
        r0 += R;
    }
}

using prefill_job_fn = void (*)(float*, const float*, int64_t, int64_t, int, int32_t, int, int, const prefill_kv&, float,
                                const attn_mask&);

template <bool Capped>
prefill_job_fn pick_prefill_job(int hd) {
    switch (hd) {
    case 32: return attend_job_prefill<2, Capped>;
    case 64: return attend_job_prefill<4, Capped>;
    case 96: return attend_job_prefill<6, Capped>;
    case 128: return attend_job_prefill<8, Capped>;
    case 256: return attend_job_prefill<16, Capped>;
    default: return nullptr;
    }
}

// The head dims with a register-blocked prefill kernel (others take the block path).
prefill_job_fn pick_prefill_job(int hd, const attn_mask& mk) {
    return mk.softcap > 0 ? pick_prefill_job<true>(hd) : pick_prefill_job<false>(hd);
}

// The first page a sequence's new tokens read (from n_past on): pages before it may be no_page.
int32_t first_page(int32_t n_past, const attn_mask& mk, int ps) { return first_seen(n_past, mk.window) / ps; }

void attention_prefill(thread_pool& pool, prefill_job_fn job_fn, float* out, const float* q, int64_t n_tok,
                       int32_t n_past, int n_head, const uint8_t* kv_base, const kv_layout& lay, int il,
                       const int32_t* block_table, float scale, const attn_mask& mk) {
    const int hd = lay.head_dim, n_kv = lay.n_head_kv, n_gqa = n_head / n_kv;
    const int32_t n_end = n_past + int32_t(n_tok), pg0 = first_page(n_past, mk, lay.page_size);
    const prefill_kv kv = kv_scratch(pg0 * lay.page_size, n_end, hd);
    const int64_t n_blocks = (n_tok + pf_tok_block - 1) / pf_tok_block;
    for (int kvh = 0; kvh < n_kv; ++kvh) {
        decode_kv_head(&pool, kv, pg0, n_end, kvh, kv_base, lay, il, block_table);
        // Handed out one block at a time, the longest contexts (the last blocks) first: causal
        // work grows with the block, so contiguous ranges per thread would leave one thread most of it.
        pool.parallel_for_dynamic(n_blocks, 1, [&](int64_t b, int64_t e) {
            for (int64_t job = b; job < e; ++job) {
                const int64_t blk = n_blocks - 1 - job;
                const int64_t t0 = blk * pf_tok_block, t1 = std::min(n_tok, t0 + pf_tok_block);
                job_fn(out, q, t0, t1, kvh, n_past, n_head, n_gqa, kv, scale, mk);
            }
        });
    }
}

// One sequence's new tokens (rows 0..n_tok of q and out at positions n_past..).
void attention_seq(thread_pool& pool, float* out, const float* q, int64_t n_tok, int32_t n_past, int n_head,
                   const uint8_t* kv_base, const kv_layout& lay, int il, const int32_t* block_table, float scale,
                   const attn_mask& mk) {
    const int hd = lay.head_dim;
    const int n_kv = lay.n_head_kv;
    const int n_gqa = n_head / n_kv;
    // Work per job, roughly: the positions a token sees (all of them, or a window's).
    const int64_t seen = mk.window > 0 ? std::min<int64_t>(mk.window, n_past + n_tok) : n_past + n_tok;
    if (active_isa() >= isa::avx512) {
        if (const prefill_job_fn job = pick_prefill_job(hd, mk)) {
            attention_prefill(pool, job, out, q, n_tok, n_past, n_head, kv_base, lay, il, block_table, scale, mk);
            return;
        }
    }
    if (active_isa() >= isa::avx512 && hd % 16 == 0 && hd / 16 <= max_nv) {
        // jobs: (token block, kv head); decode (one token) still gets one job per kv head
        const int64_t n_blocks = (n_tok + tok_block - 1) / tok_block;
        const int64_t work = seen * hd * n_gqa * 2 * std::min<int64_t>(n_tok, tok_block);
        pool.parallel_for(n_blocks * n_kv, thread_pool::grain_for(work), [&](int64_t b, int64_t e) {
            thread_local block_scratch w;
            w.fit(n_gqa, hd, lay.page_size);
            for (int64_t job = b; job < e; ++job) {
                const int64_t blk = job / n_kv;
                const int64_t t0 = blk * tok_block, t1 = std::min(n_tok, t0 + tok_block);
                attend_block_avx512(w, out, q, t0, t1, int(job % n_kv), n_past, n_head, kv_base, lay, il,
                                    block_table, scale, mk);
            }
        });
        return;
    }
    const attend_fn fn = pick_attend();
    const int64_t work = seen * hd * n_gqa * 2; // per job, roughly
    pool.parallel_for(n_tok * n_kv, thread_pool::grain_for(work), [&](int64_t b, int64_t e) {
        scratch w(n_gqa, hd, lay.page_size);
        for (int64_t job = b; job < e; ++job)
            fn(w, out, q, job / n_kv, int(job % n_kv), n_past, n_head, kv_base, lay, il, block_table, scale, mk);
    });
}

// One token for each of n_seq sequences: sequence i's query and output are row rows[i] of q and out.
void attention_decode(thread_pool& pool, float* out, const float* q, int64_t n_seq, const int64_t* rows,
                      const int32_t* n_past, const int32_t* const* tables, int n_head, const uint8_t* kv_base,
                      const kv_layout& lay, int il, float scale, const attn_mask& mk) {
    // The same kernels as attention() with one token, so each row gets the values a call of its
    // own would give; only the jobs, (sequence, kv head) over the whole step, are shared out.
    const int hd = lay.head_dim, n_kv = lay.n_head_kv, n_gqa = n_head / n_kv, ps = lay.page_size;
    const int64_t stride = int64_t(n_head) * hd;
    int64_t work = 0; // multiply-adds of the step, for the chunk size
    for (int64_t i = 0; i < n_seq; ++i)
        work += (int64_t(n_past[i]) + 1 - first_seen(n_past[i], mk.window)) * hd * n_gqa * 2 * n_kv;
    const int64_t n_jobs = n_seq * n_kv;
    const int64_t chunk = std::max<int64_t>(1, thread_pool::min_parallel_work * n_jobs / std::max<int64_t>(1, work));
    const prefill_job_fn job_fn = active_isa() >= isa::avx512 ? pick_prefill_job(hd, mk) : nullptr;
    if (job_fn) { // each job decodes its own sequence's K/V of one kv head into a scratch of its thread
        pool.parallel_for_dynamic(n_jobs, chunk, [&](int64_t b, int64_t e) {
            for (int64_t job = b; job < e; ++job) {
                const int64_t i = job / n_kv;
                const int kvh = int(job % n_kv);
                const int32_t n_end = n_past[i] + 1, pg0 = first_page(n_past[i], mk, ps);
                const prefill_kv kv = kv_scratch(pg0 * ps, n_end, hd);
                decode_kv_head(nullptr, kv, pg0, n_end, kvh, kv_base, lay, il, tables[i]);
                job_fn(out + rows[i] * stride, q + rows[i] * stride, 0, 1, kvh, n_past[i], n_head, n_gqa, kv, scale, mk);
            }
        });
        return;
    }
    if (active_isa() >= isa::avx512 && hd % 16 == 0 && hd / 16 <= max_nv) {
        pool.parallel_for_dynamic(n_jobs, chunk, [&](int64_t b, int64_t e) {
            thread_local block_scratch w;
            w.fit(n_gqa, hd, lay.page_size);
            for (int64_t job = b; job < e; ++job) {
                const int64_t i = job / n_kv;
                attend_block_avx512(w, out + rows[i] * stride, q + rows[i] * stride, 0, 1, int(job % n_kv), n_past[i],
                                    n_head, kv_base, lay, il, tables[i], scale, mk);
            }
        });
        return;
    }
    const attend_fn fn = pick_attend();
    pool.parallel_for_dynamic(n_jobs, chunk, [&](int64_t b, int64_t e) {
        scratch w(n_gqa, hd, lay.page_size);
        for (int64_t job = b; job < e; ++job) {
            const int64_t i = job / n_kv;
            fn(w, out + rows[i] * stride, q + rows[i] * stride, 0, int(job % n_kv), n_past[i], n_head, kv_base, lay,
               il, tables[i], scale, mk);
        }
    });
}

} // namespace

void attention(thread_pool& pool, const attn_params& p, int il, float* out, const float* q, int n_head, float scale) {
    const attn_mask mk{p.window, p.softcap};
    const int64_t stride = int64_t(n_head) * p.lay.head_dim;
    struct decode_rows { // the step's one-token sequences, as the decode kernel takes them
        std::vector<int64_t> rows;
        std::vector<int32_t> n_past;
        std::vector<const int32_t*> tables;
    };
    thread_local decode_rows d; // reused: a step calls this once per layer
    d.rows.clear();
    d.n_past.clear();
    d.tables.clear();
    for (const attn_seq& s : p.seqs) {
        if (s.n_tok == 1) {
            d.rows.push_back(s.row);
            d.n_past.push_back(s.n_past);
            d.tables.push_back(p.table(s));
        } else if (s.n_tok > 1) {
            attention_seq(pool, out + s.row * stride, q + s.row * stride, s.n_tok, s.n_past, n_head, p.kv_base, p.lay,
                          il, p.table(s), scale, mk);
        }
    }
    if (!d.rows.empty())
        attention_decode(pool, out, q, int64_t(d.rows.size()), d.rows.data(), d.n_past.data(), d.tables.data(), n_head,
                         p.kv_base, p.lay, il, scale, mk);
}

} // namespace tandem::cpu
