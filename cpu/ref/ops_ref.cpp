// Scalar reference kernels.
#include "cpu/ref/ops_ref.hpp"

#include "quant/int8.hpp"
#include "runtime/fp16.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
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

void rope(float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim, const rope_params& rp) {
    const int n_rot = rp.n_rot;
    for (int64_t t = 0; t < n_tok; ++t) {
        const float p = float(positions[t]) * rp.freq_scale;
        for (int h = 0; h < n_head; ++h) {
            float* v = x + (t * n_head + h) * head_dim;
            for (int i = 0; i < n_rot / 2; ++i) {
                const float theta = p * rp.inv_freq[i];
                const float cs = std::cos(theta) * rp.mscale, sn = std::sin(theta) * rp.mscale;
                const int a = rp.neox ? i : 2 * i;
                const int b = rp.neox ? i + n_rot / 2 : 2 * i + 1;
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

void geglu(float* out, const float* gate, const float* up, int64_t n) {
    const float c = std::sqrt(2.0f / 3.14159265358979f);
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        out[i] = 0.5f * g * (1.0f + std::tanh(c * (g + 0.044715f * g * g * g))) * up[i];
    }
}

void scale(float* x, float s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void softcap(float* x, float cap, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void add(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void kv_write(uint8_t* page, const kv_layout& lay, int il, bool is_v, int kvh, int slot0, int n, const float* src,
              int64_t src_stride) {
    const int hd = lay.head_dim;
    const int64_t e0 = lay.offset(il, is_v, kvh) + int64_t(slot0) * hd;
    for (int j = 0; j < n; ++j) {
        const float* x = src + j * src_stride;
        switch (lay.dtype) {
        case kv_dtype::f32: std::memcpy(page + (e0 + j * hd) * 4, x, size_t(hd) * 4); break;
        case kv_dtype::f16:
            for (int i = 0; i < hd; ++i) {
                const uint16_t h = f32_to_fp16(x[i]);
                std::memcpy(page + (e0 + j * hd + i) * 2, &h, 2);
            }
            break;
        case kv_dtype::i8: {
            const float sc = quantize_row_i8_ref(x, reinterpret_cast<int8_t*>(page + e0 + j * hd), hd);
            std::memcpy(page + lay.scales_begin() + (lay.scale_offset(il, is_v, kvh) + slot0 + j) * 4, &sc, 4);
            break;
        }
        }
    }
}

void kv_read(const uint8_t* page, const kv_layout& lay, int il, bool is_v, int kvh, int slot0, int n, float* dst) {
    const int hd = lay.head_dim;
    const int64_t e0 = lay.offset(il, is_v, kvh) + int64_t(slot0) * hd;
    switch (lay.dtype) {
    case kv_dtype::f32: std::memcpy(dst, page + e0 * 4, size_t(n) * size_t(hd) * 4); return;
    case kv_dtype::f16:
        for (int64_t i = 0; i < int64_t(n) * hd; ++i) {
            uint16_t h;
            std::memcpy(&h, page + (e0 + i) * 2, 2);
            dst[i] = fp16_to_f32(h);
        }
        return;
    case kv_dtype::i8:
        for (int j = 0; j < n; ++j) {
            float sc;
            std::memcpy(&sc, page + lay.scales_begin() + (lay.scale_offset(il, is_v, kvh) + slot0 + j) * 4, 4);
            dequantize_row_i8_ref(reinterpret_cast<const int8_t*>(page + e0 + j * hd), sc, dst + j * hd, hd);
        }
        return;
    }
}

void embed(float* out, const int32_t* tokens, int64_t n_tok, const int8_t* q, const float* scale, const float* f,
           int64_t n_embd) {
    for (int64_t t = 0; t < n_tok; ++t) {
        float* o = out + t * n_embd;
        const int64_t r = tokens[t];
        if (q != nullptr)
            for (int64_t i = 0; i < n_embd; ++i) o[i] = scale[r] * float(q[r * n_embd + i]);
        else
            std::memcpy(o, f + r * n_embd, size_t(n_embd) * sizeof(float));
    }
}

void gather_rows(float* out, const float* x, const int32_t* rows, int64_t n_rows, int64_t n) {
    for (int64_t r = 0; r < n_rows; ++r) std::memcpy(out + r * n, x + int64_t(rows[r]) * n, size_t(n) * sizeof(float));
}

void kv_store(const attn_params& p, int il, const float* k, const float* v) {
    const kv_layout& lay = p.lay;
    const int hd = lay.head_dim;
    for (const attn_seq& s : p.seqs)
        for (int32_t t = 0; t < s.n_tok; ++t) {
            const int32_t pos = s.n_past + t;
            uint8_t* page = p.kv_base + int64_t(p.table(s)[pos / lay.page_size]) * lay.page_bytes();
            const int slot = pos % lay.page_size;
            const int64_t row = s.row + t;
            for (int h = 0; h < lay.n_head_kv; ++h) {
                kv_write(page, lay, il, false, h, slot, 1, k + (row * lay.n_head_kv + h) * hd, hd);
                kv_write(page, lay, il, true, h, slot, 1, v + (row * lay.n_head_kv + h) * hd, hd);
            }
        }
}

void attention(const attn_params& p, int il, float* out, const float* q, int n_head, float scale) {
    const kv_layout& lay = p.lay;
    const int hd = lay.head_dim;
    const int n_gqa = n_head / lay.n_head_kv;
    std::vector<float> scores, kv_pos(static_cast<size_t>(hd));
    for (const attn_seq& s : p.seqs)
        for (int32_t t = 0; t < s.n_tok; ++t) {
            const int32_t last = s.n_past + t, first = p.first_seen(last); // causal, within the window
            const int64_t row = s.row + t;
            scores.assign(size_t(last - first + 1), 0.0f);
            for (int h = 0; h < n_head; ++h) {
                const float* qh = q + (row * n_head + h) * hd;
                const int kvh = h / n_gqa;
                // position pos's K (or V) vector of this kv head, decoded
                auto at = [&](int32_t pos, bool is_v) {
                    const uint8_t* page = p.kv_base + int64_t(p.table(s)[pos / lay.page_size]) * lay.page_bytes();
                    kv_read(page, lay, il, is_v, kvh, pos % lay.page_size, 1, kv_pos.data());
                    return kv_pos.data();
                };
                float max = -INFINITY;
                for (int32_t pos = first; pos <= last; ++pos) {
                    const float* kp = at(pos, false);
                    double dot = 0;
                    for (int i = 0; i < hd; ++i) dot += double(qh[i]) * kp[i];
                    float sc = float(dot) * scale;
                    if (p.softcap > 0) sc = p.softcap * std::tanh(sc / p.softcap); // attention logit soft-capping
                    scores[size_t(pos - first)] = sc;
                    max = std::max(max, sc);
                }
                double sum = 0;
                for (auto& sc : scores) {
                    sc = std::exp(sc - max);
                    sum += sc;
                }
                float* oh = out + (row * n_head + h) * hd;
                std::vector<double> acc(static_cast<size_t>(hd), 0.0);
                for (int32_t pos = first; pos <= last; ++pos) {
                    const float* vp = at(pos, true);
                    for (int i = 0; i < hd; ++i) acc[size_t(i)] += double(scores[size_t(pos - first)]) * vp[i];
                }
                for (int i = 0; i < hd; ++i) oh[i] = float(acc[size_t(i)] / sum);
            }
        }
}

} // namespace tandem::cpu::ref

namespace tandem::cpu::ref {

void quantize_rows(int8_t* q, float* s, const float* x, int64_t n_tok, int64_t n) {
    for (int64_t t = 0; t < n_tok; ++t) s[t] = quantize_row_i8_ref(x + t * n, q + t * n, n);
}

void quantize_rows_split(int8_t* q_hi, float* s_hi, int8_t* q_lo, float* s_lo, const float* x, int64_t n_tok,
                         int64_t n) {
    std::vector<float> r(static_cast<size_t>(n));
    for (int64_t t = 0; t < n_tok; ++t) {
        s_hi[t] = quantize_row_i8_ref(x + t * n, q_hi + t * n, n);
        for (int64_t i = 0; i < n; ++i) r[size_t(i)] = x[t * n + i] - s_hi[t] * float(q_hi[t * n + i]);
        s_lo[t] = quantize_row_i8_ref(r.data(), q_lo + t * n, n);
    }
}

void rms_norm_quant(int8_t* q, float* s, const float* x, const float* w, int64_t n_tok, int64_t n, float eps) {
    std::vector<float> row(static_cast<size_t>(n));
    for (int64_t t = 0; t < n_tok; ++t) {
        rms_norm(row.data(), x + t * n, w, 1, n, eps);
        s[t] = quantize_row_i8_ref(row.data(), q + t * n, n);
    }
}

void swiglu_quant(int8_t* q, float* s, const float* gate, const float* up, int64_t n_tok, int64_t n) {
    std::vector<float> row(static_cast<size_t>(n));
    for (int64_t t = 0; t < n_tok; ++t) {
        swiglu(row.data(), gate + t * n, up + t * n, n);
        s[t] = quantize_row_i8_ref(row.data(), q + t * n, n);
    }
}

void matmul_i8(float* out, const int8_t* qx, const float* sx, int64_t n_tok, const int8_t* qw, const float* sw,
               const int32_t* /*qw_sum: only the u8-offset kernels need it*/, int64_t n_out, int64_t n_in,
               const float* bias) {
    for (int64_t t = 0; t < n_tok; ++t)
        for (int64_t o = 0; o < n_out; ++o)
            out[t * n_out + o] = float(dot_i8_ref(qx + t * n_in, qw + o * n_in, n_in)) * sx[t] * sw[o] +
                                 (bias ? bias[o] : 0.0f);
}

} // namespace tandem::cpu::ref
