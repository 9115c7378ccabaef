// Speculative decoding as an engine policy: after each sampled token a sequence may get
// drafts (from its proposer: prompt lookup, runtime/prompt_lookup.hpp, or the draft model,
// runtime/draft_model.hpp), computed with it in the next step and verified row by row, so
// every token comes from the distribution plain decoding gives. How many drafts a sequence
// gets follows how often its drafts stood and what a draft costs, measured.
#pragma once

#include "runtime/draft_model.hpp"
#include "runtime/engine_state.hpp"
#include "runtime/scheduler.hpp"

#include <array>
#include <functional>
#include <memory>
#include <span>
#include <vector>

namespace tandem {

// What a decode step costs by its token count, measured: t = a + b n, fit by least squares
// over recent steps (older ones count less and less). A draft's cost relative to a step is
// what speculation weighs against the tokens it expects to gain: small where a step is bound
// by reading the weights (a large model at a small batch), near one token's where it is
// compute-bound (a large batch, or a model so small that a step is all overhead).
class step_cost {
public:
    void add(int32_t n_tokens, double seconds);
    // b / (a + b n): one more token's time over a step of n tokens; `prior` until steps of
    // different sizes were seen (then the last slope read stays while they are all alike).
    double relative(int32_t n_tokens, double prior = 0.1) const;
    // a + b n: a step of n tokens, in seconds (the mean step before any slope is known; 0
    // before any step).
    double seconds(int32_t n_tokens) const;

private:
    double w_ = 0, sn_ = 0, st_ = 0, snn_ = 0, snt_ = 0; // decayed sums of 1, n, t, n^2, n t
    double b_ = -1;                                      // the slope, once read
};

// How many drafts to propose: the k in 0..k_max that gains most tokens a unit of time when
// each draft stands with probability `alpha` (given the one before it stood) and costs
// `cost` of a step: (1 + alpha + ... + alpha^k) / (1 + cost k), 0 when nothing beats 1.
int32_t drafts_worth(double alpha, double cost, int32_t k_max);

class speculation {
public:
    // `drafter`: the draft model's proposer, when the engine has one.
    speculation(scheduler& sched, engine_core& core, const engine_options& opts, std::unique_ptr<draft_model> drafter)
        : sched_(sched), core_(core), opts_(opts), drafter_(std::move(drafter)) {}

    bool has_draft_model() const { return drafter_ != nullptr; }
    std::string draft_device() const { return drafter_ ? drafter_->device() : std::string(); }

    // A decode step of n_tokens took `seconds`: what a draft costs is read from such steps.
    void record_step(int32_t n_tokens, double seconds) { step_cost_.add(n_tokens, seconds); }

    // After a newly sampled token of q: the drafts for the next step (as many as gain most
    // while n_running sequences run), computed with it and verified by verify(). Prompt
    // lookup's at once; the draft model's once every sequence of the batch is sampled
    // (run_draft_jobs).
    void propose(request_state& r, seq_state& q, int32_t n_running);
    // The draft model's drafts for the sequences that asked for them in this batch, computed
    // together; `find` gives a sequence's state (null when it is gone).
    void run_draft_jobs(const std::function<seq_state*(uint64_t sid)>& find);
    // Sequence q's last sampled token and its drafts after it were computed, with logits rows
    // from `first_row` on: row j is sampled as plain decoding would sample it, with the tokens
    // up to draft j as history. While the token sampled from row j is draft j, the draft
    // stands; the first one it is not replaces that draft and cuts the rest (speculative
    // sampling's rejection rule, a draft being a point mass or the draft model's draw).
    void verify(request_state& r, seq_state& q, executor& ex, int32_t first_row, int32_t n_running);
    // The drafts of q that will not be verified go (its tokens end at the sampled one).
    void drop(uint64_t sid, seq_state& q);
    // Sequence `sid` ended: the draft model's pages for it go.
    void forget(uint64_t sid) {
        if (drafter_) drafter_->forget(sid);
    }

    uint64_t n_drafts() const { return n_drafts_; }             // sequences' drafts verified together
    uint64_t n_draft_tokens() const { return n_draft_tokens_; } // drafts computed
    const std::array<uint64_t, engine_stats::max_draft_positions>& n_accepted_at() const { return n_accepted_at_; }

private:
    void adapt(seq_state& q, int32_t k, int32_t accepted);
    void add_drafts(seq_state& q, uint64_t sid, std::span<const token_id> d);

    scheduler& sched_;
    engine_core& core_;
    const engine_options& opts_;
    std::unique_ptr<draft_model> drafter_;
    std::vector<draft_job> draft_jobs_;   // calls for its drafts while a batch is taken
    step_cost step_cost_;                 // decode steps' time by their token count
    double draft_s_per_token_ = 0;        // the draft model's time a draft (a moving mean)
    uint64_t n_drafts_ = 0, n_draft_tokens_ = 0;
    std::array<uint64_t, engine_stats::max_draft_positions> n_accepted_at_{};
};

} // namespace tandem
