// Draft tokens for speculative decoding, verified by the engine: prompt lookup (n-gram) and
// a draft model.
#pragma once

#include "runtime/sampler.hpp"
#include "runtime/tokenizer.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace tandem {

class kv_cache;
class model;
class page_store;
class runner;
class scheduler;

// Up to k tokens that followed an earlier occurrence of the sequence's last n tokens: n from
// n_max down to n_min (the longest suffix that recurs wins), the latest occurrence of it, and
// what followed it up to the end of the sequence. Empty when no suffix recurs.
std::vector<token_id> ngram_draft(std::span<const token_id> tokens, int32_t k, int32_t n_max = 3, int32_t n_min = 1);

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

// Where a sequence's drafts come from.
enum class draft_source : uint8_t {
    automatic, // the engine's draft model when it has one, else prompt lookup
    ngram,     // prompt lookup
    model,     // the draft model
    replay,    // engine_request::replay: a benchmark's upper bound (drafts that are the output)
};

// One sequence's call for drafts from the draft model.
struct draft_job {
    uint64_t id = 0;                      // the engine's sequence
    std::span<const token_id> tokens;     // its tokens, the one just sampled last
    int32_t k = 0;                        // drafts wanted
    const sampling_params* sampling = nullptr; // the request's: drafts are drawn at its temperature, top_k, top_p, min_p
    // out:
    std::vector<token_id> drafts;         // up to k (fewer when the draft model's pool is short)
    std::vector<float> q;                 // [drafts, n_vocab] the distributions they were drawn from;
                                          // empty when greedy (each draft is a point mass)
};

// A second, smaller model with the same vocabulary that proposes drafts: each sequence keeps
// its tokens and K/V in the draft model's own page pool, synchronised with the engine's
// sequence at each call (the longest common prefix stays computed, the rest is cut and
// recomputed), and the drafts of every sequence are computed together, one token of each a
// forward. Runs on the caller's thread (the engine's), on the CPU.
class draft_model {
public:
    // n_pages pages of page_size positions for up to max_seqs sequences.
    draft_model(model& mdl, int n_threads, int32_t page_size, int32_t n_pages, int32_t max_seqs);
    ~draft_model();
    draft_model(const draft_model&) = delete;
    draft_model& operator=(const draft_model&) = delete;

    // Fills each job's drafts (and q): greedy where the request is greedy, else drawn from
    // the draft model's distribution under the request's sampling parameters.
    void propose(std::span<draft_job> jobs);
    // The sequence ended: its pages go.
    void forget(uint64_t id);
    std::string device() const;

private:
    struct seq_state;
    void sync(const draft_job& job);

    int32_t n_vocab_;
    std::unique_ptr<kv_cache> kv_;
    std::unique_ptr<page_store> store_;
    std::unique_ptr<scheduler> sched_;
    std::unique_ptr<runner> runner_;
    std::unordered_map<uint64_t, std::unique_ptr<seq_state>> seqs_;
    std::vector<float> logits_, row_;
};

// Why a draft model cannot draft for the target (a vocabulary of another size, or a token
// that differs: "token 17 is 'ab' in the model, 'ba' in the draft model"), or empty.
std::string draft_vocab_mismatch(const tokenizer& target, const tokenizer& draft);

} // namespace tandem
