// Scalar reference kernels.
#include "cpu/ref/ops_ref.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tandem::cpu::ref {

void rms_norm(float* out, const float* x, const float* w, int64_t n_tok, int64_t n, float eps) {
    for (int64_t t = 0; t < n_tok; ++t) {
        const float* xt = x + t * n;
        double ss = 0;
        for (int64_t i = 0; i < n; ++i) ss += double(xt[i]) * xt[i];
        const float scale = float(1.0 / std::sqrt(ss / double(n) + eps));
        for (int64_t i = 0; i < n; ++i) out[t * n + i] = w[i] * (xt[i] * scale);
    }
}

void matmul(float* out, const float* x, int64_t n_tok, const float* w, int64_t n_out, int64_t n_in,
            const float* bias) {
    for (int64_t t = 0; t < n_tok; ++t) {
        for (int64_t o = 0; o < n_out; ++o) {
            double sum = 0;
            for (int64_t i = 0; i < n_in; ++i) sum += double(x[t * n_in + i]) * w[o * n_in + i];
            out[t * n_out + o] = float(sum) + (bias ? bias[o] : 0.0f);
        }
    }
}

void rope(float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim, int n_rot,
          float freq_base, float freq_scale, bool neox) {
    for (int64_t t = 0; t < n_tok; ++t) {
        const float p = float(positions[t]) * freq_scale;
        for (int h = 0; h < n_head; ++h) {
            float* v = x + (t * n_head + h) * head_dim;
            for (int i = 0; i < n_rot / 2; ++i) {
                const float theta = p * std::pow(freq_base, -2.0f * float(i) / float(n_rot));
                const float cs = std::cos(theta), sn = std::sin(theta);
                const int a = neox ? i : 2 * i;
                const int b = neox ? i + n_rot / 2 : 2 * i + 1;
                const float x0 = v[a], x1 = v[b];
                v[a] = x0 * cs - x1 * sn;
                v[b] = x0 * sn + x1 * cs;
            }
        }
    }
}

void swiglu(float* out, const float* gate, const float* up, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void add(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void kv_store(float* kv_base, const kv_layout& lay, int il, const int32_t* block_table, int32_t pos0,
              const float* k, const float* v, int64_t n_tok) {
    const int hd = lay.head_dim;
    for (int64_t t = 0; t < n_tok; ++t) {
        const int32_t pos = pos0 + int32_t(t);
        float* page = kv_base + int64_t(block_table[pos / lay.page_size]) * lay.page_floats();
        const int slot = pos % lay.page_size;
        for (int h = 0; h < lay.n_head_kv; ++h) {
            for (int i = 0; i < hd; ++i) {
                page[lay.offset(il, false, h) + slot * hd + i] = k[(t * lay.n_head_kv + h) * hd + i];
                page[lay.offset(il, true, h) + slot * hd + i] = v[(t * lay.n_head_kv + h) * hd + i];
            }
        }
    }
}

void attention(float* out, const float* q, int64_t n_tok, int32_t n_past, int n_head, const float* kv_base,
               const kv_layout& lay, int il, const int32_t* block_table, float scale) {
    const int hd = lay.head_dim;
    const int n_gqa = n_head / lay.n_head_kv;
    std::vector<float> scores;
    for (int64_t t = 0; t < n_tok; ++t) {
        const int32_t n_ctx = n_past + int32_t(t) + 1; // causal: positions 0..n_past+t
        scores.assign(size_t(n_ctx), 0.0f);
        for (int h = 0; h < n_head; ++h) {
            const float* qh = q + (t * n_head + h) * hd;
            const int kvh = h / n_gqa;
            auto at = [&](int32_t pos, bool is_v) {
                const float* page = kv_base + int64_t(block_table[pos / lay.page_size]) * lay.page_floats();
                return page + lay.offset(il, is_v, kvh) + (pos % lay.page_size) * hd;
            };
            float max = -INFINITY;
            for (int32_t p = 0; p < n_ctx; ++p) {
                const float* kp = at(p, false);
                double dot = 0;
                for (int i = 0; i < hd; ++i) dot += double(qh[i]) * kp[i];
                scores[size_t(p)] = float(dot) * scale;
                max = std::max(max, scores[size_t(p)]);
            }
            double sum = 0;
            for (auto& s : scores) {
                s = std::exp(s - max);
                sum += s;
            }
            float* oh = out + (t * n_head + h) * hd;
            for (int i = 0; i < hd; ++i) {
                double acc = 0;
                for (int32_t p = 0; p < n_ctx; ++p) acc += double(scores[size_t(p)]) * at(p, true)[i];
                oh[i] = float(acc / sum);
            }
        }
    }
}

} // namespace tandem::cpu::ref
