// Perplexity and distribution drift over non-overlapping windows of a token sequence.
#include "runtime/evaluate.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace tandem {
namespace {

// Calls fn(logits [n, n_vocab], targets [n]) for each window: the logits of every position
// but the window's last, with the tokens that follow them.
void for_each_window(const exec_ctx& ctx, model& m, std::span<const token_id> toks, const eval_params& p,
                     const std::function<void(const float*, std::span<const token_id>)>& fn) {
    TANDEM_CHECK(p.n_ctx >= 2 && p.n_batch >= 1, "evaluation needs windows of at least 2 tokens");
    const int32_t n_vocab = m.config().n_vocab;
    const int32_t page = 16;
    kv_cache kv(m.make_kv_layout(page), (p.n_ctx + page - 1) / page);
    block_pool pages(kv.n_pages());
    std::vector<float> logits;
    for (size_t w0 = 0; w0 + 1 < toks.size(); w0 += size_t(p.n_ctx)) {
        const auto win = toks.subspan(w0, std::min(toks.size() - w0, size_t(p.n_ctx)));
        if (win.size() < 2) break;
        sequence_kv seq(pages, page);
        TANDEM_ASSERT(seq.reserve(int32_t(win.size())));
        logits.resize(win.size() * size_t(n_vocab));
        for (size_t b = 0; b < win.size(); b += size_t(p.n_batch)) {
            const size_t n = std::min(win.size() - b, size_t(p.n_batch));
            batch step;
            step.add_seq(0, int32_t(b), win.subspan(b, n), seq.block_table(), {}, 0); // logits for every token
            m.forward(ctx, step, kv, &logits[b * size_t(n_vocab)]);
        }
        fn(logits.data(), win.subspan(1));
    }
}

// log softmax of one row into out, returns nothing; rows are small next to the forward.
void log_softmax(const float* x, int32_t n, std::vector<double>& out) {
    out.resize(size_t(n));
    const double mx = *std::max_element(x, x + n);
    double sum = 0;
    for (int32_t i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
    const double lse = mx + std::log(sum);
    for (int32_t i = 0; i < n; ++i) out[size_t(i)] = double(x[i]) - lse;
}

} // namespace

perplexity_result perplexity(const exec_ctx& ctx, model& m, std::span<const token_id> toks, const eval_params& p) {
    const int32_t n_vocab = m.config().n_vocab;
    perplexity_result r;
    double nll = 0;
    std::vector<double> lp;
    for_each_window(ctx, m, toks, p, [&](const float* logits, std::span<const token_id> next) {
        for (size_t i = 0; i < next.size(); ++i) {
            log_softmax(logits + i * size_t(n_vocab), n_vocab, lp);
            nll -= lp[size_t(next[i])];
            ++r.n_tokens;
        }
    });
    TANDEM_CHECK(r.n_tokens > 0, "the text has fewer than 2 tokens: nothing to score");
    r.mean_nll = nll / double(r.n_tokens);
    r.ppl = std::exp(r.mean_nll);
    return r;
}

drift_result eval_drift(const exec_ctx& ctx, model& base, model& test, std::span<const token_id> toks,
                        const eval_params& p) {
    const int32_t n_vocab = base.config().n_vocab;
    TANDEM_CHECK(test.config().n_vocab == n_vocab, "the two models' vocabularies differ");
    // The base model's logits for the whole text first, then the test model's window by window.
    std::vector<float> base_logits;
    for_each_window(ctx, base, toks, p, [&](const float* logits, std::span<const token_id> next) {
        base_logits.insert(base_logits.end(), logits, logits + next.size() * size_t(n_vocab));
    });
    drift_result r;
    double kl = 0, nll_b = 0, nll_t = 0;
    int64_t agree = 0;
    size_t row = 0;
    std::vector<double> lb, lt;
    for_each_window(ctx, test, toks, p, [&](const float* logits, std::span<const token_id> next) {
        for (size_t i = 0; i < next.size(); ++i, ++row) {
            const float* b = &base_logits[row * size_t(n_vocab)];
            const float* t = logits + i * size_t(n_vocab);
            log_softmax(b, n_vocab, lb);
            log_softmax(t, n_vocab, lt);
            double k = 0;
            for (int32_t v = 0; v < n_vocab; ++v) k += std::exp(lb[size_t(v)]) * (lb[size_t(v)] - lt[size_t(v)]);
            kl += std::max(0.0, k);
            agree += std::max_element(b, b + n_vocab) - b == std::max_element(t, t + n_vocab) - t;
            nll_b -= lb[size_t(next[i])];
            nll_t -= lt[size_t(next[i])];
            ++r.n_tokens;
        }
    });
    TANDEM_CHECK(r.n_tokens > 0, "the text has fewer than 2 tokens: nothing to compare");
    const double n = double(r.n_tokens);
    r.top1 = double(agree) / n;
    r.mean_kl = kl / n;
    r.ppl_base = std::exp(nll_b / n);
    r.ppl_test = std::exp(nll_t / n);
    return r;
}

} // namespace tandem
