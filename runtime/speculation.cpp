// Speculative decoding's policy (runtime/speculation.hpp).
#include "runtime/speculation.hpp"

#include "runtime/prompt_lookup.hpp"

#include <algorithm>
#include <chrono>
#include <limits>

namespace tandem {

void step_cost::add(int32_t n_tokens, double seconds) {
    constexpr double keep = 0.97; // about the last 30 steps
    const double n = n_tokens;
    w_ = w_ * keep + 1;
    sn_ = sn_ * keep + n;
    st_ = st_ * keep + seconds;
    snn_ = snn_ * keep + n * n;
    snt_ = snt_ * keep + n * seconds;
    const double mn = sn_ / w_, mt = st_ / w_, var = snn_ / w_ - mn * mn;
    if (w_ >= 4 && var >= 0.1) b_ = std::max(0.0, (snt_ / w_ - mn * mt) / var); // else: steps alike, no slope to read
}

double step_cost::seconds(int32_t n_tokens) const {
    if (w_ <= 0) return 0;
    return b_ < 0 ? st_ / w_ : std::max(st_ / w_ + b_ * (n_tokens - sn_ / w_), 1e-9);
}

double step_cost::relative(int32_t n_tokens, double prior) const { return b_ < 0 ? prior : b_ / seconds(n_tokens); }

int32_t drafts_worth(double alpha, double cost, int32_t k_max) {
    int32_t best_k = 0;
    double best = 1.0, expected = 1.0, p = 1.0; // tokens a step: the verified one, and drafts that stand
    for (int32_t k = 1; k <= k_max; ++k) {
        p *= alpha;
        expected += p;
        const double gain = expected / (1.0 + cost * k);
        if (gain > best) {
            best = gain;
            best_k = k;
        }
    }
    return best_k;
}

void speculation::verify(request_state& r, seq_state& q, executor& ex, int32_t first_row, int32_t n_running) {
    const uint64_t sid = seq_id_of(r.id, q.index);
    const int32_t k = q.n_drafts, base = int32_t(sched_.tokens(sid).size()) - k; // tokens through the sampled one
    q.n_drafts = 0;
    if (k > 0) sched_.set_logits_from(sid, std::numeric_limits<int32_t>::max()); // the last token's row only
    int32_t accepted = 0;
    const std::vector<float> draft_q = std::move(q.draft_q);
    q.draft_q.clear();
    const size_t n_vocab = ex.logits(first_row).size();
    const auto q_of = [&](int32_t j) {
        return draft_q.empty() ? std::span<const float>{}
                               : std::span<const float>(draft_q).subspan(size_t(j) * n_vocab, n_vocab);
    };
    while (accepted < k && core_.sample_next(r, q, ex.logits(first_row + accepted), base + accepted,
                                             sched_.tokens(sid)[size_t(base + accepted)], q_of(accepted))) {
        ++n_accepted_at_[size_t(accepted)];
        ++accepted;
    }
    if (k > 0) ++n_drafts_;
    if (accepted == k) // every draft stood: one more
        core_.sample_next(r, q, ex.logits(first_row + k), base + k, sampler::none, {});
    if (q.done) return;
    if (k > 0) adapt(q, k, accepted);
    propose(r, q, n_running);
}

// After a step verified k drafts of q and kept `accepted`: the counts fade and grow; none
// kept starts (or doubles) a pause, so a task where drafts fail costs a lone draft now and
// then.
void speculation::adapt(seq_state& q, int32_t k, int32_t accepted) {
    constexpr double fade = 0.8;
    q.n_stood = q.n_stood * fade + accepted;
    q.n_fell = q.n_fell * fade + (accepted < k ? 1 : 0);
    if (accepted > 0) {
        q.backoff = 0;
    } else { // (a probe after a pause that was not worth drafting: a longer one)
        q.backoff = std::clamp(q.backoff * 2, 4, 64);
        q.skip = q.backoff;
    }
}

void speculation::drop(uint64_t sid, seq_state& q) {
    if (q.n_drafts == 0) return;
    sched_.truncate(sid, int32_t(sched_.tokens(sid).size()) - q.n_drafts);
    sched_.set_logits_from(sid, std::numeric_limits<int32_t>::max());
    q.n_drafts = 0;
    q.draft_q.clear();
}

void speculation::propose(request_state& r, seq_state& q, int32_t n_running) {
    if (r.req.draft_tokens <= 0) return;
    if (q.skip > 0) {
        --q.skip;
        return;
    }
    // A step of many sequences is compute-bound: each draft costs about what a token does.
    if (n_running > opts_.max_draft_batch) return;
    // As many drafts as gain most: the rate this sequence's drafts stood at (0.4 before any
    // stood or fell), against what a token costs in the decode steps measured so far.
    const double alpha = (q.n_stood + 0.8) / (q.n_stood + q.n_fell + 2.0);
    // The draft model's time for a draft counts too.
    const double step_s = step_cost_.seconds(n_running);
    const double cost = opts_.draft_cost > 0 ? opts_.draft_cost
                        : step_cost_.relative(n_running) +
                              (r.req.drafts == draft_source::model && step_s > 0 ? draft_s_per_token_ / step_s : 0.0);
    int32_t k = drafts_worth(alpha, cost, r.req.draft_tokens);
    if (k == 0 && q.backoff == 0) { // not worth it at this cost: a pause, then a probe
        q.backoff = q.skip = 32;
        return;
    }
    k = std::max(k, 1); // after a pause, one draft to see whether they stand again
    const int32_t want = std::min({k, opts_.max_draft_tokens, r.max_tokens - q.n_generated - 1});
    if (want <= 0) return;
    const uint64_t sid = seq_id_of(r.id, q.index);
    if (r.req.drafts == draft_source::model) {
        draft_job j;
        j.id = sid;
        j.k = want;
        j.sampling = &q.smp.params();
        draft_jobs_.push_back(std::move(j));
        return;
    }
    if (r.req.drafts == draft_source::replay) {
        const auto& rp = r.req.replay;
        const size_t from = std::min(rp.size(), size_t(q.n_generated));
        add_drafts(q, sid, std::span(rp).subspan(from, std::min(rp.size() - from, size_t(want))));
        return;
    }
    add_drafts(q, sid, ngram_draft(sched_.tokens(sid), want));
}

void speculation::run_draft_jobs(const std::function<seq_state*(uint64_t sid)>& find) {
    std::erase_if(draft_jobs_, [&](const draft_job& j) { return !sched_.contains(j.id); });
    if (draft_jobs_.empty()) return;
    for (draft_job& j : draft_jobs_) j.tokens = sched_.tokens(j.id);
    const auto t0 = engine_clock::now();
    drafter_->propose(draft_jobs_);
    size_t n_drafted = 0;
    for (const draft_job& j : draft_jobs_) n_drafted += j.drafts.size();
    if (n_drafted > 0) { // a moving mean of the draft model's time a draft
        const double s = std::chrono::duration<double>(engine_clock::now() - t0).count() / double(n_drafted);
        draft_s_per_token_ = draft_s_per_token_ == 0 ? s : 0.9 * draft_s_per_token_ + 0.1 * s;
    }
    for (draft_job& j : draft_jobs_) {
        seq_state* q = find(j.id);
        if (!q || q->done) continue;
        q->draft_q = std::move(j.q);
        add_drafts(*q, j.id, j.drafts);
    }
    draft_jobs_.clear();
}

void speculation::add_drafts(seq_state& q, uint64_t sid, std::span<const token_id> d) {
    if (d.empty()) return;
    sched_.set_logits_from(sid, int32_t(sched_.tokens(sid).size()) - 1);
    sched_.append(sid, d);
    q.n_drafts = int32_t(d.size());
    q.n_drafted += q.n_drafts;
    n_draft_tokens_ += d.size();
}

} // namespace tandem
