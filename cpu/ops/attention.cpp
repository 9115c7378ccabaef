// Causal attention over paged K/V with online softmax, GQA-aware: one pass over the pages
// per (token, kv head) serves all the query heads that share that kv head.
#include "cpu/ops/ops.hpp"
#include "cpu/thread_pool.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tandem::cpu {

void attention(thread_pool& pool, float* out, const float* q, int64_t n_tok, int32_t n_past, int n_head,
               const float* kv_base, const kv_layout& lay, int il, const int32_t* block_table, float scale) {
    const int hd = lay.head_dim;
    const int n_kv = lay.n_head_kv;
    const int n_gqa = n_head / n_kv;
    const int ps = lay.page_size;
    const int64_t work = int64_t(n_past + n_tok) * hd * n_gqa * 2; // per job, roughly
    pool.parallel_for(n_tok * n_kv, thread_pool::grain_for(work), [&](int64_t b, int64_t e) {
        std::vector<float> m(static_cast<size_t>(n_gqa)), l(static_cast<size_t>(n_gqa)), s(static_cast<size_t>(ps));
        std::vector<float> acc(static_cast<size_t>(n_gqa) * hd);
        for (int64_t job = b; job < e; ++job) {
            const int64_t t = job / n_kv;
            const int kvh = int(job % n_kv);
            const int32_t n_ctx = n_past + int32_t(t) + 1;
            std::fill(m.begin(), m.end(), -INFINITY);
            std::fill(l.begin(), l.end(), 0.0f);
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int32_t p0 = 0; p0 < n_ctx; p0 += ps) {
                const int n = std::min(ps, n_ctx - p0);
                const float* page = kv_base + int64_t(block_table[p0 / ps]) * lay.page_floats();
                const float* kp = page + lay.offset(il, false, kvh);
                const float* vp = page + lay.offset(il, true, kvh);
                for (int g = 0; g < n_gqa; ++g) {
                    const float* qh = q + (t * n_head + kvh * n_gqa + g) * hd;
                    float page_max = -INFINITY;
                    for (int j = 0; j < n; ++j) {
                        float dot = 0;
                        for (int i = 0; i < hd; ++i) dot += qh[i] * kp[j * hd + i];
                        s[size_t(j)] = dot * scale;
                        page_max = std::max(page_max, s[size_t(j)]);
                    }
                    // rescale what was accumulated so far to the new running max
                    const float new_m = std::max(m[size_t(g)], page_max);
                    const float corr = std::exp(m[size_t(g)] - new_m);
                    float* ag = acc.data() + size_t(g) * hd;
                    l[size_t(g)] *= corr;
                    for (int i = 0; i < hd; ++i) ag[i] *= corr;
                    for (int j = 0; j < n; ++j) {
                        const float pj = std::exp(s[size_t(j)] - new_m);
                        l[size_t(g)] += pj;
                        for (int i = 0; i < hd; ++i) ag[i] += pj * vp[j * hd + i];
                    }
                    m[size_t(g)] = new_m;
                }
            }
            for (int g = 0; g < n_gqa; ++g) {
                float* oh = out + (t * n_head + kvh * n_gqa + g) * hd;
                const float inv = 1.0f / l[size_t(g)];
                for (int i = 0; i < hd; ++i) oh[i] = acc[size_t(g) * hd + i] * inv;
            }
        }
    });
}

} // namespace tandem::cpu
