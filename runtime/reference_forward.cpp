// Scalar FP32 reference forward pass (the spec).
#include "runtime/reference_forward.hpp"

#include "quant/lowbit.hpp"
#include "runtime/error.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tandem {
namespace {

void rmsnorm(float* out, const float* x, const float* w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += double(x[i]) * x[i];
    const float scale = float(1.0 / std::sqrt(ss / n + eps));
    for (int i = 0; i < n; ++i) out[i] = w[i] * (x[i] * scale);
}

// out[n_out] = W[n_out, n_in] x[n_in] (+ b); INT8 weights are dequantized (activations are not
// quantized here: this is the F32 spec, which INT8 paths approach within quantization error)
void matvec(float* out, const float* x, const weight& w, const weight* b = nullptr) {
    std::vector<float> tmp(w.is_integer() ? size_t(w.n_in) : 0);
    for (int64_t i = 0; i < w.n_out; ++i) {
        double sum = 0;
        if (w.is_lowbit()) lowbit_row_f32(*w.lb, i, tmp.data());
        else if (w.is_i8()) w.row_f32(i, tmp.data());
        const float* row = w.is_integer() ? tmp.data() : w.row(i);
        for (int64_t j = 0; j < w.n_in; ++j) sum += double(row[j]) * x[j];
        out[i] = float(sum) + (b && !b->empty() ? b->data[size_t(i)] : 0.0f);
    }
}

// Rotates the first n_rot dims of each head of vec [n_heads, head_dim] by position pos, as
// layer il turns them: base^(-2i / n_rot) per pair i, divided by Llama 3's factor for the pair
// (the file's rope_freqs), positions times the linear scale, or YaRN's blend of the pair's
// interpolated and original frequency with cos and sin times its attention factor. Gemma 3's
// local layers use their own base and no scaling.
void rope(float* vec, int n_heads, const model_config& c, const float* factors, int il, int pos) {
    const bool local = c.rope_freq_base_swa > 0 && c.window_of(il) > 0;
    const double base = local ? c.rope_freq_base_swa : c.rope_freq_base;
    const double pi = 3.14159265358979323846;
    const bool yarn = c.yarn.factor > 1 && !local;
    // YaRN: the pair turning beta_fast times over the original context keeps its frequency, the
    // one turning beta_slow times and those below are interpolated; a linear ramp between.
    const auto turning = [&](double turns) {
        return c.n_rot * std::log(c.yarn.orig_ctx / (turns * 2 * pi)) / (2 * std::log(base));
    };
    const double lo = yarn ? std::max(0.0, std::floor(turning(c.yarn.beta_fast))) : 0;
    const double hi = yarn ? std::min(double(c.n_rot - 1), std::ceil(turning(c.yarn.beta_slow))) : 0;
    const double mscale = yarn ? c.yarn.attn_factor * (1 + 0.1 * std::log(c.yarn.factor)) : 1;
    for (int h = 0; h < n_heads; ++h) {
        float* v = vec + h * c.head_dim;
        for (int i = 0; i < c.n_rot / 2; ++i) {
            double freq = std::pow(base, -2.0 * i / c.n_rot);
            if (factors != nullptr && !local) freq /= factors[i];
            double theta = pos * freq;
            if (yarn) {
                const double keep = 1 - std::clamp((i - lo) / std::max(0.001, hi - lo), 0.0, 1.0);
                theta = theta / c.yarn.factor * (1 - keep) + theta * keep;
            } else if (!local) {
                theta *= c.rope_freq_scale;
            }
            const double cs = std::cos(theta) * mscale, sn = std::sin(theta) * mscale;
            // normal: the pair (2i, 2i+1); neox: the pair (i, i + n_rot/2)
            const int a = c.rope == rope_style::normal ? 2 * i : i;
            const int b = c.rope == rope_style::normal ? 2 * i + 1 : i + c.n_rot / 2;
            const double x0 = v[a], x1 = v[b];
            v[a] = float(x0 * cs - x1 * sn);
            v[b] = float(x0 * sn + x1 * cs);
        }
    }
}

void softmax(float* x, int n) {
    float max = x[0];
    for (int i = 1; i < n; ++i) max = std::max(max, x[i]);
    double sum = 0;
    for (int i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - max);
        sum += x[i];
    }
    for (int i = 0; i < n; ++i) x[i] = float(x[i] / sum);
}

} // namespace

reference_forward::reference_forward(const model_config& cfg, const model_weights& w, int32_t n_ctx)
    : c_(cfg), w_(w), n_ctx_(n_ctx) {
    const size_t e = size_t(c_.n_embd), nq = size_t(c_.n_embd_q()), kv = size_t(c_.n_embd_kv());
    x_.resize(e); xb_.resize(e); xb2_.resize(e);
    q_.resize(nq); k_.resize(kv); v_.resize(kv); attn_.resize(nq);
    att_.resize(size_t(n_ctx));
    hb_.resize(size_t(c_.n_ff_max())); hb2_.resize(size_t(c_.n_ff_max()));
    logits_.resize(size_t(c_.n_vocab));
    key_cache_.resize(size_t(c_.n_layer) * size_t(n_ctx) * kv);
    value_cache_.resize(key_cache_.size());
}

const std::vector<float>& reference_forward::forward(token_id tok, int32_t pos) {
    TANDEM_CHECK(tok >= 0 && tok < c_.n_vocab, "token {} out of range", tok);
    TANDEM_CHECK(pos >= 0 && pos < n_ctx_, "position {} out of range", pos);
    const int e = c_.n_embd, kv = c_.n_embd_kv(), hd = c_.head_dim;
    const float* factors = w_.rope_freqs.empty() ? nullptr : w_.rope_freqs.data.data();
    float* x = x_.data();
    if (w_.tok_embd.is_lowbit()) lowbit_row_f32(*w_.tok_embd.lb, tok, x);
    else w_.tok_embd.row_f32(tok, x);
    for (int i = 0; i < e; ++i) x[i] *= c_.embd_scale; // Gemma: sqrt(n_embd); else 1

    for (int il = 0; il < c_.n_layer; ++il) {
        const layer_weights& l = w_.layers[size_t(il)];

        // attention: q, k, v of this token (each head's q and k normed where the model says
        // so); k and v go to the cache at pos
        rmsnorm(xb_.data(), x, l.attn_norm.data.data(), e, c_.rms_eps);
        matvec(q_.data(), xb_.data(), l.wq, &l.bq);
        matvec(k_.data(), xb_.data(), l.wk, &l.bk);
        matvec(v_.data(), xb_.data(), l.wv, &l.bv);
        if (c_.qk_norm) {
            for (int h = 0; h < c_.n_head; ++h) rmsnorm(q_.data() + h * hd, q_.data() + h * hd, l.q_norm.data.data(), hd, c_.rms_eps);
            for (int h = 0; h < c_.n_head_kv; ++h) rmsnorm(k_.data() + h * hd, k_.data() + h * hd, l.k_norm.data.data(), hd, c_.rms_eps);
        }
        rope(q_.data(), c_.n_head, c_, factors, il, pos);
        rope(k_.data(), c_.n_head_kv, c_, factors, il, pos);
        const size_t layer_off = size_t(il) * size_t(n_ctx_) * size_t(kv);
        for (int i = 0; i < kv; ++i) {
            key_cache_[layer_off + size_t(pos) * kv + i] = k_[size_t(i)];
            value_cache_[layer_off + size_t(pos) * kv + i] = v_[size_t(i)];
        }

        // each query head h reads kv head h / n_gqa over positions t0..pos: 0..pos, or the
        // layer's window
        const float scale = c_.attn_scale > 0 ? c_.attn_scale : 1.0f / std::sqrt(float(hd));
        const int window = c_.window_of(il), t0 = window > 0 ? std::max(0, pos - window + 1) : 0;
        for (int h = 0; h < c_.n_head; ++h) {
            const float* qh = q_.data() + h * hd;
            const int kvh = h / c_.n_gqa();
            for (int t = t0; t <= pos; ++t) {
                const float* kt = key_cache_.data() + layer_off + size_t(t) * kv + kvh * hd;
                double dot = 0;
                for (int i = 0; i < hd; ++i) dot += double(qh[i]) * kt[i];
                float score = float(dot) * scale;
                if (c_.attn_softcap > 0) score = c_.attn_softcap * std::tanh(score / c_.attn_softcap);
                att_[size_t(t - t0)] = score;
            }
            softmax(att_.data(), pos + 1 - t0);
            float* out = attn_.data() + h * hd;
            for (int i = 0; i < hd; ++i) out[i] = 0;
            for (int t = t0; t <= pos; ++t) {
                const float* vt = value_cache_.data() + layer_off + size_t(t) * kv + kvh * hd;
                for (int i = 0; i < hd; ++i) out[i] += att_[size_t(t - t0)] * vt[i];
            }
        }
        matvec(xb2_.data(), attn_.data(), l.wo);
        if (c_.post_norms) rmsnorm(xb2_.data(), xb2_.data(), l.attn_post_norm.data.data(), e, c_.rms_eps);
        for (int i = 0; i < e; ++i) x[i] += xb2_[size_t(i)];

        // feed-forward: act(gate) * up, then down; act SiLU (SwiGLU) or GELU, tanh form (GeGLU)
        rmsnorm(xb_.data(), x, l.ffn_norm.data.data(), e, c_.rms_eps);
        if (c_.is_moe()) {
            moe(l, x);
            continue;
        }
        ffn(l.w_gate, l.w_up, l.w_down, xb2_.data());
        if (c_.post_norms) rmsnorm(xb2_.data(), xb2_.data(), l.ffn_post_norm.data.data(), e, c_.rms_eps);
        for (int i = 0; i < e; ++i) x[i] += xb2_[size_t(i)];
    }

    rmsnorm(x, x, w_.output_norm.data.data(), e, c_.rms_eps);
    matvec(logits_.data(), x, w_.logits_weight());
    if (c_.final_softcap > 0) // Gemma 2
        for (float& z : logits_) z = c_.final_softcap * std::tanh(z / c_.final_softcap);
    return logits_;
}

void reference_forward::ffn(const weight& w_gate, const weight& w_up, const weight& w_down, float* out) {
    matvec(hb_.data(), xb_.data(), w_gate);
    matvec(hb2_.data(), xb_.data(), w_up);
    for (int64_t i = 0; i < w_gate.n_out; ++i) {
        const double g = hb_[size_t(i)];
        const double act = c_.act == ffn_act::silu
                               ? g / (1 + std::exp(-g))
                               : 0.5 * g * (1 + std::tanh(std::sqrt(2 / 3.14159265358979323846) * (g + 0.044715 * g * g * g)));
        hb_[size_t(i)] = float(act * hb2_[size_t(i)]);
    }
    matvec(out, hb_.data(), w_down);
}

void reference_forward::moe(const layer_weights& l, float* x) {
    // The router's probabilities: a softmax over every expert's score.
    const int e = c_.n_embd, n_expert = c_.n_expert;
    std::vector<float> p(static_cast<size_t>(n_expert));
    matvec(p.data(), xb_.data(), l.router);
    softmax(p.data(), n_expert);
    // The token's experts: the n_expert_used most probable, a tie to the lower index; each
    // output weighted by its probability (over the chosen ones' sum where the model normalises).
    std::vector<int> chosen;
    double sum = 0;
    for (int j = 0; j < c_.n_expert_used; ++j) {
        int best = -1;
        for (int i = 0; i < n_expert; ++i)
            if (std::find(chosen.begin(), chosen.end(), i) == chosen.end() && (best < 0 || p[size_t(i)] > p[size_t(best)]))
                best = i;
        chosen.push_back(best);
        sum += p[size_t(best)];
    }
    std::vector<double> acc(static_cast<size_t>(e), 0.0);
    for (const int xi : chosen) {
        const double w = c_.expert_norm ? p[size_t(xi)] / sum : p[size_t(xi)];
        ffn(l.gate_exps[size_t(xi)], l.up_exps[size_t(xi)], l.down_exps[size_t(xi)], xb2_.data());
        for (int i = 0; i < e; ++i) acc[size_t(i)] += w * xb2_[size_t(i)];
    }
    // The shared expert (qwen2moe), times sigmoid(the row . its gate).
    if (c_.n_ff_shexp > 0) {
        double dot = 0;
        for (int i = 0; i < e; ++i) dot += double(xb_[size_t(i)]) * l.shexp_gate.data[size_t(i)];
        const double gate = 1 / (1 + std::exp(-dot));
        ffn(l.w_gate_shexp, l.w_up_shexp, l.w_down_shexp, xb2_.data());
        for (int i = 0; i < e; ++i) acc[size_t(i)] += gate * xb2_[size_t(i)];
    }
    for (int i = 0; i < e; ++i) x[i] += float(acc[size_t(i)]);
}

} // namespace tandem
