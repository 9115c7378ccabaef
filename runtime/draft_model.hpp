// The draft-model proposer of speculative decoding: a second, smaller model with the target's
// vocabulary drafts for the sequences that ask it, verified by the engine like any draft.
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
