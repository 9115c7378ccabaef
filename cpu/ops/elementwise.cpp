// Row-wise and element-wise CPU kernels: RMSNorm, RoPE, SwiGLU, residual add.
#include "cpu/isa.hpp"
#include "cpu/ops/ops.hpp"
#include "cpu/thread_pool.hpp"

#include <cmath>
#include <cstring>
#include <vector>

namespace tandem::cpu {

void rms_norm(thread_pool& pool, float* out, const float* x, const float* w, int64_t n_tok, int64_t n, float eps) {
    pool.parallel_for(n_tok, thread_pool::grain_for(2 * n), [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            const float* xt = x + t * n;
            float acc[8] = {};
            int64_t i = 0;
            for (; i + 8 <= n; i += 8)
                for (int j = 0; j < 8; ++j) acc[j] += xt[i + j] * xt[i + j];
            float ss = 0;
            for (; i < n; ++i) ss += xt[i] * xt[i];
            for (float a : acc) ss += a;
            const float scale = 1.0f / std::sqrt(ss / float(n) + eps);
            float* ot = out + t * n;
            for (i = 0; i < n; ++i) ot[i] = w[i] * (xt[i] * scale);
        }
    });
}

void rope(thread_pool& pool, float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim,
          const rope_params& rp) {
    const int n_rot = rp.n_rot;
    const bool neox = rp.neox;
    pool.parallel_for(n_tok, thread_pool::grain_for(int64_t(n_head) * n_rot * 4), [&](int64_t t0, int64_t t1) {
        std::vector<float> cs(static_cast<size_t>(n_rot / 2)), sn(size_t(n_rot / 2));
        for (int64_t t = t0; t < t1; ++t) {
            const float p = float(positions[t]) * rp.freq_scale;
            for (int i = 0; i < n_rot / 2; ++i) {
                const float theta = p * rp.inv_freq[i];
                cs[size_t(i)] = std::cos(theta) * rp.mscale;
                sn[size_t(i)] = std::sin(theta) * rp.mscale;
            }
            for (int h = 0; h < n_head; ++h) {
                float* v = x + (t * n_head + h) * head_dim;
                const int half = n_rot / 2;
                for (int i = 0; i < half; ++i) {
                    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
                    const float x0 = v[a], x1 = v[b];
                    v[a] = x0 * cs[size_t(i)] - x1 * sn[size_t(i)];
                    v[b] = x0 * sn[size_t(i)] + x1 * cs[size_t(i)];
                }
            }
        }
    });
}

void swiglu(thread_pool& pool, float* out, const float* gate, const float* up, int64_t n) {
    const bool simd = active_isa() >= isa::avx512;
    pool.parallel_for(n, thread_pool::grain_for(16, 1024), [&](int64_t b, int64_t e) {
        if (simd) {
            swiglu_row_avx512(gate + b, up + b, out + b, e - b);
            return;
        }
        for (int64_t i = b; i < e; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    });
}

void add(thread_pool& pool, float* x, const float* y, int64_t n) {
    pool.parallel_for(n, thread_pool::grain_for(1, 4096), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) x[i] += y[i];
    });
}

} // namespace tandem::cpu
