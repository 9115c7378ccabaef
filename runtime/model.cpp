// Llama-family forward pass from ops over paged KV, on any backend.
#include "runtime/model.hpp"

#include "runtime/ops/attention.hpp"
#include "runtime/ops/elementwise.hpp"
#include "runtime/ops/matmul.hpp"
#include "runtime/ops/moe.hpp"
#include "runtime/ops/quant.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace tandem {

model::model(model_config cfg, model_weights weights, kv_dtype kv)
    : cfg_(std::move(cfg)), w_(std::move(weights)), kv_(kv) {
    // Each layer's RoPE table; layers that turn alike share one.
    const float* factors = w_.rope_freqs.empty() ? nullptr : w_.rope_freqs.f32();
    for (int il = 0; il < cfg_.n_layer; ++il) {
        model_config::rope_table t = cfg_.rope_of(il, factors);
        const auto same = [&](const model_config::rope_table& o) {
            return o.inv_freq == t.inv_freq && o.freq_scale == t.freq_scale && o.mscale == t.mscale;
        };
        const auto it = std::find_if(rope_.begin(), rope_.end(), same);
        layer_rope_.push_back(int32_t(it - rope_.begin()));
        if (it == rope_.end()) rope_.push_back(std::move(t));
    }
}

kv_layout model::make_kv_layout(int32_t page_size) const {
    return kv_layout{cfg_.n_layer, cfg_.n_head_kv, cfg_.head_dim, page_size, kv_};
}

void model::forward(const exec_ctx& ctx, const batch& b, kv_cache& kv, float* logits) {
    TANDEM_CHECK(ctx.be != backend::cuda, "a CUDA forward runs through make_cuda_runner");
    exec_ctx c = ctx;
    if (c.scratch == nullptr) c.scratch = &scratch_;
    const forward_pages pages{kv.layout(), kv.base(), kv.n_pages(), b.tables,
                              std::span(b.table_begin).first(size_t(b.n_seqs()))};
    forward(c, w_, b, pages, logits);
}

void model::prepare(const exec_ctx& ctx, int32_t max_tokens, int32_t max_rows) const {
    // The row counts forward gives matmul_i8: n_tok for most, 2 * n_tok for the two-term
    // down projection, 2 * n_rows (n_rows <= n_tok) for the logits.
    const int64_t n = max_tokens, rows = std::clamp<int64_t>(max_rows, 1, n);
    const auto prep = [&](const weight& m, int64_t rows) {
        if (!m.empty()) ops::prepare_matmul_i8(ctx, m, rows);
    };
    for (const layer_weights& l : w_.layers) {
        for (const weight* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_gate_shexp, &l.w_up_shexp})
            prep(*m, n);
        prep(l.w_down, 2 * n);
        prep(l.w_down_shexp, 2 * n);
        // the experts are alike in shape: one of them builds what all of them use
        if (!l.gate_exps.empty()) {
            prep(l.gate_exps[0], n);
            prep(l.up_exps[0], n);
            prep(l.down_exps[0], 2 * n);
        }
    }
    ops::prepare_matmul_i8(ctx, w_.logits_weight(), 2 * rows);
    if (ctx.scratch != nullptr) ctx.scratch->reserve(scratch_bytes(n, rows));
}

size_t model::scratch_bytes(int64_t n_tok, int64_t n_rows) const {
    // forward's takes in order, each rounded to the arena's alignment; the rows' takes of the
    // mixed-rows path (gathered input, projected logits, the two-term logits), which hold
    // those of the all-logits path. Host inputs staged on a device backend are not counted.
    const int64_t e = cfg_.n_embd, nq = cfg_.n_embd_q(), n_kv = cfg_.n_embd_kv(), ff = cfg_.n_ff_max(), nv = cfg_.n_vocab;
    size_t total = 0;
    const auto take = [&](int64_t n, size_t size) {
        total += (size_t(std::max<int64_t>(n, 1)) * size + scratch_arena::align - 1) / scratch_arena::align *
                 scratch_arena::align;
    };
    for (const int64_t n : {n_tok * e, n_tok * e, n_tok * nq, n_tok * n_kv, n_tok * n_kv, n_tok * nq, 2 * n_tok * e,
                            n_tok * ff, n_tok * ff})
        take(n, sizeof(float));
    take(2 * n_tok * std::max({e, nq, ff}), sizeof(int8_t));
    take(2 * n_tok, sizeof(float));
    if (cfg_.is_moe()) {
        take(n_tok * cfg_.n_expert, sizeof(float));
        take(n_tok * cfg_.n_expert_used, sizeof(int32_t));
        take(n_tok * cfg_.n_expert_used, sizeof(float));
        take(n_tok * e, sizeof(float));
    }
    take(n_tok * e, sizeof(float)); // the wanted tokens' rows, gathered
    for (const int64_t n : {n_rows * e, n_rows * nv, 2 * n_rows * nv}) take(n, sizeof(float));
    return total;
}

void model::forward(const exec_ctx& ctx, const model_weights& w, const batch& b, const forward_pages& kv,
                    float* logits) const {
    const int64_t n_tok = b.n_tokens();
    if (n_tok == 0) return;
    TANDEM_ASSERT(ctx.scratch != nullptr, "model::forward needs a scratch arena");
    TANDEM_ASSERT(int64_t(kv.table_begin.size()) == b.n_seqs());
    TANDEM_CHECK(kv.lay.n_layer == cfg_.n_layer && kv.lay.n_head_kv == cfg_.n_head_kv && kv.lay.head_dim == cfg_.head_dim,
                 "KV pages of {} layers x {} heads x {} dims do not fit the model", kv.lay.n_layer, kv.lay.n_head_kv,
                 kv.lay.head_dim);
    for (const token_id id : b.tokens)
        TANDEM_CHECK(id >= 0 && id < cfg_.n_vocab, "token id {} is outside the vocabulary [0, {})", id, cfg_.n_vocab);

    // Every activation of the batch, from the context's scratch.
    scratch_arena& s = *ctx.scratch;
    s.reset();
    TANDEM_CHECK(!cfg_.is_moe() || ctx.be != backend::cuda,
                 "{}: mixture-of-experts layers run on the CPU (placement prefill=cpu, decode=cpu)", cfg_.arch);
    const int64_t e = cfg_.n_embd, nq = cfg_.n_embd_q(), n_kv = cfg_.n_embd_kv(), ff = cfg_.n_ff_max(),
                  n_rows = b.n_logits();
    float* x = s.take<float>(n_tok * e);        // the residual stream
    float* xn = s.take<float>(n_tok * e);       // normed
    float* q = s.take<float>(n_tok * nq);
    float* k = s.take<float>(n_tok * n_kv);
    float* v = s.take<float>(n_tok * n_kv);
    float* attn = s.take<float>(n_tok * nq);
    float* proj = s.take<float>(2 * n_tok * e); // the down projection's two terms
    float* gate = s.take<float>(n_tok * ff);
    float* up = s.take<float>(n_tok * ff);
    // INT8 activations with their per-token scales (W8A8); two terms for w_down and the logits
    int8_t* xq = s.take<int8_t>(2 * n_tok * std::max({e, nq, ff}));
    float* xs = s.take<float>(2 * n_tok);
    ffn_bufs fb{gate, up, proj, xq, xs, nullptr, nullptr, nullptr, nullptr};
    if (cfg_.is_moe()) {
        fb.scores = s.take<float>(n_tok * cfg_.n_expert);
        fb.ids = s.take<int32_t>(n_tok * cfg_.n_expert_used);
        fb.weights = s.take<float>(n_tok * cfg_.n_expert_used);
        fb.rows = s.take<float>(n_tok * e);
    }
    // The host inputs, staged before any op is queued (on CUDA a copy from pageable memory
    // waits for the stream: the rows wanted are staged here, not after the layers). The tokens
    // whose final hidden state is needed (`wanted`, in token order) make the output rows: a
    // logits or hidden row is one token's; a pooled row sums its sequence's pooled tokens
    // (its only row, so they are consecutive in `wanted`).
    struct out_row {
        row_kind kind;
        int32_t first, n; // of the wanted tokens
    };
    std::vector<int32_t> wanted, logit_src; // the tokens; which of them the logits rows take
    std::vector<out_row> out;
    for (int32_t i = 0; i < b.n_seqs(); ++i) {
        bool pooling = false;
        for (int32_t t = b.tok_begin[size_t(i)]; t < b.tok_begin[size_t(i) + 1]; ++t) {
            const auto kind = row_kind(b.wants_row[size_t(t)]);
            if (kind == row_kind::none) continue;
            const int32_t src = int32_t(wanted.size());
            wanted.push_back(t);
            if (kind == row_kind::pooled && std::exchange(pooling, true)) {
                ++out.back().n;
                continue;
            }
            if (kind == row_kind::logits) logit_src.push_back(src);
            out.push_back({kind, src, 1});
        }
    }
    TANDEM_ASSERT(int64_t(out.size()) == n_rows, "{} rows for a batch of {}", out.size(), n_rows);
    const int64_t n_src = int64_t(wanted.size());
    const bool all_logits = logit_src.size() == out.size();
    TANDEM_CHECK(all_logits || cfg_.n_embd <= cfg_.n_vocab, "hidden-state rows of {} floats do not fit rows of {} logits",
                 cfg_.n_embd, cfg_.n_vocab);
    if (n_src == n_tok) wanted.clear();    // every token: no gather
    if (all_logits) logit_src.clear();     // every row: no second gather
    const int32_t* tokens = ops::stage(ctx, std::span<const int32_t>(b.tokens));
    const int32_t* pos = ops::stage(ctx, std::span<const int32_t>(b.pos));
    const int32_t* rows_wanted = ops::stage(ctx, std::span<const int32_t>(wanted));
    const int32_t* rows_logits = ops::stage(ctx, std::span<const int32_t>(logit_src));
    const int32_t* tables = ops::stage(ctx, kv.tables);
    std::vector<rope_params> ropes;
    for (const model_config::rope_table& t : rope_)
        ropes.push_back({cfg_.n_rot, ops::stage(ctx, std::span<const float>(t.inv_freq)), t.freq_scale, t.mscale,
                         cfg_.rope == rope_style::neox});

    std::vector<attn_seq> seqs;
    seqs.reserve(size_t(b.n_seqs()));
    for (int32_t i = 0; i < b.n_seqs(); ++i)
        seqs.push_back({b.tok_begin[size_t(i)], b.n_new(i), b.n_past(i), kv.table_begin[size_t(i)]});
    attn_params ap{kv.lay, kv.kv_base, kv.n_pages, tables, kv.tables, seqs};
    ap.softcap = cfg_.attn_softcap;

    ops::embed(ctx, x, tokens, n_tok, w.tok_embd);
    if (cfg_.embd_scale != 1.0f) ops::scale(ctx, x, cfg_.embd_scale, n_tok * e);
    const float scale = cfg_.attn_scale > 0 ? cfg_.attn_scale : 1.0f / std::sqrt(float(cfg_.head_dim));
    const ops::act_i8 act{xq, xs};
    for (int il = 0; il < cfg_.n_layer; ++il) {
        const layer_weights& l = w.layers[size_t(il)];
        // W8A8: each normed activation row is quantized once and shared by the matmuls that read it.
        const bool i8 = l.wq.is_integer();
        if (i8) {
            ops::rms_norm_quant(ctx, act, x, l.attn_norm.f32(), n_tok, e, cfg_.rms_eps);
            ops::matmul_i8(ctx, q, act.q, act.s, n_tok, l.wq, &l.bq);
            ops::matmul_i8(ctx, k, act.q, act.s, n_tok, l.wk, &l.bk);
            ops::matmul_i8(ctx, v, act.q, act.s, n_tok, l.wv, &l.bv);
        } else {
            ops::rms_norm(ctx, xn, x, l.attn_norm.f32(), n_tok, e, cfg_.rms_eps);
            ops::matmul(ctx, q, xn, n_tok, l.wq, &l.bq);
            ops::matmul(ctx, k, xn, n_tok, l.wk, &l.bk);
            ops::matmul(ctx, v, xn, n_tok, l.wv, &l.bv);
        }
        if (cfg_.qk_norm) { // each head's q and k, normed on their own
            ops::rms_norm(ctx, q, q, l.q_norm.f32(), n_tok * cfg_.n_head, cfg_.head_dim, cfg_.rms_eps);
            ops::rms_norm(ctx, k, k, l.k_norm.f32(), n_tok * cfg_.n_head_kv, cfg_.head_dim, cfg_.rms_eps);
        }
        const rope_params& rp = ropes[size_t(layer_rope_[size_t(il)])];
        ops::rope(ctx, q, pos, n_tok, cfg_.n_head, cfg_.head_dim, rp);
        ops::rope(ctx, k, pos, n_tok, cfg_.n_head_kv, cfg_.head_dim, rp);
        // Every sequence of the batch, prefill chunks and decode tokens alike, in one op each.
        ap.window = cfg_.window_of(il);
        ops::kv_store(ctx, ap, il, k, v);
        ops::attention(ctx, ap, il, attn, q, cfg_.n_head, scale);
        if (i8) {
            ops::quantize_rows(ctx, act, attn, n_tok, nq);
            ops::matmul_i8(ctx, proj, act.q, act.s, n_tok, l.wo);
        } else {
            ops::matmul(ctx, proj, attn, n_tok, l.wo);
        }
        if (cfg_.post_norms) ops::rms_norm(ctx, proj, proj, l.attn_post_norm.f32(), n_tok, e, cfg_.rms_eps);
        ops::add(ctx, x, proj, n_tok * e);

        if (cfg_.is_moe()) {
            ops::rms_norm(ctx, xn, x, l.ffn_norm.f32(), n_tok, e, cfg_.rms_eps);
            moe_ffn(ctx, l, xn, x, n_tok, fb);
            continue;
        }
        if (i8) {
            ops::rms_norm_quant(ctx, act, x, l.ffn_norm.f32(), n_tok, e, cfg_.rms_eps);
            ops::matmul_i8(ctx, gate, act.q, act.s, n_tok, l.w_gate);
            ops::matmul_i8(ctx, up, act.q, act.s, n_tok, l.w_up);
            // The SwiGLU output is outlier-heavy: per-token int8 there cost most of the top-1
            // agreement lost to activation quantization. It goes in as two int8 terms (the second
            // quantizes the first's rounding error), run as 2 * n_tok rows of one int8 matmul
            // (the GEMV still reads each weight once; prefill stays on oneDNN) and summed.
            glu(ctx, gate, up, n_tok * ff);
            const ops::act_i8 lo{xq + n_tok * ff, xs + n_tok};
            ops::quantize_rows_split(ctx, act, lo, gate, n_tok, ff);
            ops::matmul_i8(ctx, proj, act.q, act.s, 2 * n_tok, l.w_down);
            ops::add(ctx, proj, proj + n_tok * e, n_tok * e);
        } else {
            ops::rms_norm(ctx, xn, x, l.ffn_norm.f32(), n_tok, e, cfg_.rms_eps);
            ops::matmul(ctx, gate, xn, n_tok, l.w_gate);
            ops::matmul(ctx, up, xn, n_tok, l.w_up);
            glu(ctx, gate, up, n_tok * ff);
            ops::matmul(ctx, proj, gate, n_tok, l.w_down);
        }
        if (cfg_.post_norms) ops::rms_norm(ctx, proj, proj, l.ffn_post_norm.f32(), n_tok, e, cfg_.rms_eps);
        ops::add(ctx, x, proj, n_tok * e);
    }

    // The output norm only for the tokens wanted, then the vocab projection for the logits rows.
    if (n_rows == 0) return;
    const float* rows = x;
    if (n_src < n_tok) {
        float* last = s.take<float>(n_src * e);
        ops::gather_rows(ctx, last, x, rows_wanted, n_src, e);
        rows = last;
    }
    ops::rms_norm(ctx, xn, rows, w.output_norm.f32(), n_src, e, cfg_.rms_eps);
    if (all_logits) {
        project_logits(ctx, w, xn, n_rows, logits, act);
        return;
    }
    // Hidden, pooled or mixed rows: each goes to its own row of the output, n_vocab floats apart.
    // A pooled row's tokens are summed in place, halving: the back half added onto the front.
    for (const out_row& o : out)
        if (o.kind == row_kind::pooled)
            for (int64_t k = o.n; k > 1;) {
                const int64_t h = k / 2;
                ops::add(ctx, xn + o.first * e, xn + (o.first + k - h) * e, h * e);
                k -= h;
            }
    const int64_t nv = cfg_.n_vocab, n_logit_rows = int64_t(logit_src.size());
    float* projected = nullptr;
    if (n_logit_rows > 0) {
        float* in = s.take<float>(n_logit_rows * e);
        ops::gather_rows(ctx, in, xn, rows_logits, n_logit_rows, e);
        projected = s.take<float>(n_logit_rows * nv);
        project_logits(ctx, w, in, n_logit_rows, projected, act);
    }
    int64_t next_logits = 0;
    for (int64_t r = 0; r < n_rows; ++r) {
        const out_row& o = out[size_t(r)];
        if (o.kind == row_kind::logits)
            ops::copy(ctx, logits + r * nv, projected + next_logits++ * nv, size_t(nv) * sizeof(float));
        else
            ops::copy(ctx, logits + r * nv, xn + o.first * e, size_t(e) * sizeof(float));
    }
}

void model::glu(const exec_ctx& ctx, float* gate, const float* up, int64_t n) const {
    if (cfg_.act == ffn_act::gelu) ops::geglu(ctx, gate, gate, up, n);
    else ops::swiglu(ctx, gate, gate, up, n);
}

const float* model::gated_ffn(const exec_ctx& ctx, const weight& w_gate, const weight& w_up, const weight& w_down,
                             const float* xn, int64_t m, const ffn_bufs& b) const {
    const int64_t e = cfg_.n_embd, ff = w_gate.n_out;
    if (w_gate.is_integer()) {
        // As the dense FFN: per-token INT8 input, the SwiGLU output in two INT8 terms.
        const ops::act_i8 act{b.xq, b.xs}, lo{b.xq + m * ff, b.xs + m};
        ops::quantize_rows(ctx, act, xn, m, e);
        ops::matmul_i8(ctx, b.gate, act.q, act.s, m, w_gate);
        ops::matmul_i8(ctx, b.up, act.q, act.s, m, w_up);
        glu(ctx, b.gate, b.up, m * ff);
        ops::quantize_rows_split(ctx, act, lo, b.gate, m, ff);
        ops::matmul_i8(ctx, b.proj, act.q, act.s, 2 * m, w_down);
        ops::add(ctx, b.proj, b.proj + m * e, m * e);
    } else {
        ops::matmul(ctx, b.gate, xn, m, w_gate);
        ops::matmul(ctx, b.up, xn, m, w_up);
        glu(ctx, b.gate, b.up, m * ff);
        ops::matmul(ctx, b.proj, b.gate, m, w_down);
    }
    return b.proj;
}

void model::moe_ffn(const exec_ctx& ctx, const layer_weights& l, const float* xn, float* x, int64_t n_tok,
                    const ffn_bufs& b) const {
    const int64_t e = cfg_.n_embd;
    const int n_expert = cfg_.n_expert, k = cfg_.n_expert_used;
    // Route every token, then group the step's tokens by expert (host memory: the CPU's and the
    // reference's), so that each chosen expert's weights are read once for all its tokens.
    ops::matmul(ctx, b.scores, xn, n_tok, l.router);
    ops::moe_route(ctx, b.ids, b.weights, b.scores, n_tok, n_expert, k, cfg_.expert_norm);
    const ops::expert_groups g = ops::group_by_expert(b.ids, b.weights, n_tok, k, n_expert);
    for (int xi = 0; xi < n_expert; ++xi) {
        const int32_t m = g.n_tokens(xi);
        if (m == 0) continue;
        const int32_t* toks = &g.tokens[size_t(g.offset[size_t(xi)])];
        ops::gather_rows(ctx, b.rows, xn, toks, m, e);
        const float* y = gated_ffn(ctx, l.gate_exps[size_t(xi)], l.up_exps[size_t(xi)], l.down_exps[size_t(xi)], b.rows,
                                   m, b);
        ops::add_rows_scaled(ctx, x, y, toks, &g.weights[size_t(g.offset[size_t(xi)])], m, e);
        ++expert_runs_;
        expert_bytes_ += l.gate_exps[size_t(xi)].bytes() + l.up_exps[size_t(xi)].bytes() + l.down_exps[size_t(xi)].bytes();
    }
    if (cfg_.n_ff_shexp > 0) {
        // The shared expert, every token, scaled by the sigmoid of its gate's dot with the row.
        std::vector<int32_t> all(static_cast<size_t>(n_tok));
        std::vector<float> gates(static_cast<size_t>(n_tok));
        const float* gw = l.shexp_gate.f32();
        for (int64_t t = 0; t < n_tok; ++t) {
            all[size_t(t)] = int32_t(t);
            float dot = 0;
            for (int64_t i = 0; i < e; ++i) dot += xn[t * e + i] * gw[i];
            gates[size_t(t)] = 1.0f / (1.0f + std::exp(-dot));
        }
        const float* y = gated_ffn(ctx, l.w_gate_shexp, l.w_up_shexp, l.w_down_shexp, xn, n_tok, b);
        ops::add_rows_scaled(ctx, x, y, all.data(), gates.data(), n_tok, e);
    }
}

void model::project_logits(const exec_ctx& ctx, const model_weights& w, const float* xn, int64_t n_rows, float* logits,
                           const ops::act_i8& act) const {
    const weight& out_w = w.logits_weight();
    const int64_t e = cfg_.n_embd;
    if (out_w.is_integer()) {
        // The logits' error moves the argmax directly, so their input goes in as two int8 terms
        // (the second quantizes the first's rounding error, as for the down projection), run as
        // 2 * n_rows rows of one int8 matmul and summed (its accuracy and cost: docs/cpu.md).
        // Integer dots make each row's logits independent of the batch it is in.
        const int64_t nv = cfg_.n_vocab;
        const ops::act_i8 lo{act.q + n_rows * e, act.s + n_rows};
        ops::quantize_rows_split(ctx, act, lo, xn, n_rows, e);
        float* both = ctx.scratch->take<float>(2 * n_rows * nv);
        ops::matmul_i8(ctx, both, act.q, act.s, 2 * n_rows, out_w);
        ops::add(ctx, both, both + n_rows * nv, n_rows * nv);
        ops::copy(ctx, logits, both, size_t(n_rows * nv) * sizeof(float));
    } else {
        ops::matmul(ctx, logits, xn, n_rows, out_w);
    }
    if (cfg_.final_softcap > 0) ops::softcap(ctx, logits, cfg_.final_softcap, n_rows * cfg_.n_vocab);
}

} // namespace tandem
