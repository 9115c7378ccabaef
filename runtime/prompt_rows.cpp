// Prompt rows as an engine policy (runtime/prompt_rows.hpp): scoring a prompt's tokens and
// pooling its hidden states.
#include "runtime/prompt_rows.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tandem {

// Batch row i (sequence 0 of r, computing its prompt) has rows for prompt positions: each
// scores the next prompt token. Positions scored before (recomputed after a preemption)
// are passed over.
void score_prompt(request_state& r, const batch& b, int32_t i, executor& ex) {
    int32_t row = b.logits_begin[size_t(i)];
    for (int32_t t = b.tok_begin[size_t(i)]; t < b.tok_begin[size_t(i) + 1]; ++t) {
        if (!b.wants_row[size_t(t)]) continue;
        const int32_t next = b.pos[size_t(t)] + 1; // the prompt token this row predicts
        const auto logits = ex.logits(row++);
        if (next != int32_t(r.scored.size()) || next >= r.n_prompt) continue;
        const token_id id = r.req.prompt[size_t(next)];
        r.scored.push_back({id, logprob_of(logits, id),
                            r.req.n_top_logprobs > 0 ? top_logprobs(logits, r.req.n_top_logprobs)
                                                     : std::vector<token_logprob>{}});
    }
}

// Batch sequence i computed a chunk of embedding request r's prompt. Mean pooling has one
// row for it, the sum of its positions' hidden states, added on in order (a preempted
// prompt is computed again from position 0: the sum starts again); cls and last take the
// hidden-state row of the first or last position.
void pool_rows(request_state& r, const batch& b, int32_t i, executor& ex, int32_t n_embd) {
    const pooling_type how = *r.req.embed;
    const int32_t first = b.n_past(i), row = b.logits_begin[size_t(i)];
    if (how == pooling_type::mean) {
        if (first == 0) {
            std::fill(r.pooled.begin(), r.pooled.end(), 0.0);
            r.n_pooled = 0;
        }
        TANDEM_ASSERT(first == r.n_pooled && b.n_seq_logits(i) == 1, "a chunk from {} after {} pooled", first,
                      r.n_pooled);
        const auto h = ex.logits(row).first(size_t(n_embd));
        for (size_t j = 0; j < h.size(); ++j) r.pooled[j] += double(h[j]);
        r.n_pooled += b.n_new(i);
        return;
    }
    const int32_t want = how == pooling_type::cls ? 0 : r.n_prompt - 1, k = want - first;
    if (k < 0 || k >= b.n_new(i)) return;
    int32_t at = row; // the wanted position's row: rows are the chunk's tokens from logits_from on
    for (int32_t t = b.tok_begin[size_t(i)]; t < b.tok_begin[size_t(i)] + k; ++t) at += b.wants_row[size_t(t)] != 0;
    const auto h = ex.logits(at).first(size_t(n_embd));
    std::copy(h.begin(), h.end(), r.pooled.begin());
    r.n_pooled = r.n_prompt;
}

// r's prompt is computed: its pooled hidden state, L2-normalised, is its embedding.
void finish_embedding(request_state& r) {
    TANDEM_ASSERT(r.n_pooled == r.n_prompt, "{} of {} prompt positions pooled", r.n_pooled, r.n_prompt);
    const double n = *r.req.embed == pooling_type::mean ? double(r.n_prompt) : 1.0;
    double norm = 0;
    for (double& v : r.pooled) {
        v /= n;
        norm += v * v;
    }
    norm = std::sqrt(norm);
    r.embedding.resize(r.pooled.size());
    for (size_t j = 0; j < r.pooled.size(); ++j) r.embedding[j] = float(norm > 0 ? r.pooled[j] / norm : 0.0);
}

// r's prompt is computed and scored: the event with its scores, and from here only the
// last token of sequence `sid` wants a row.
void send_prompt_scores(request_state& r, uint64_t sid, scheduler& sched) {
    TANDEM_ASSERT(int32_t(r.scored.size()) == r.n_prompt, "{} of {} prompt tokens scored", r.scored.size(),
                  r.n_prompt);
    sched.set_logits_from(sid, std::numeric_limits<int32_t>::max());
    engine_event ev;
    ev.index = 0;
    ev.id = -1;
    ev.prompt = std::move(r.scored);
    ev.t = engine_clock::now();
    r.prompt_sent = true;
    r.sink(std::move(ev));
}

} // namespace tandem
