// The engine's state of a request and its sequences, shared by the engine's core
// (runtime/engine.cpp) and its policies in their own files: beam search, speculation, prompt
// rows. Internal to the engine: nothing outside runtime/engine*.cpp and those policies
// includes it.
#pragma once

#include "runtime/engine.hpp"
#include "runtime/sampler.hpp"
#include "runtime/stop_matcher.hpp"
#include "runtime/tokenizer.hpp"

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tandem {

using engine_clock = std::chrono::steady_clock;

// One sequence of a request's group: its sampler, text decoding and stop strings.
struct seq_state {
    int32_t index = 0;
    int32_t n_generated = 0;
    int32_t n_drafts = 0;             // drafts after its last sampled token, not verified yet
    std::vector<float> draft_q;       // [n_drafts, n_vocab] what the draft model drew them from; empty: point masses
    int32_t n_drafted = 0, n_accepted = 0;
    // The speculation policy (runtime/speculation.hpp): how often its drafts stood (counts
    // that fade, for the rate a draft stands given the one before it did), and a pause of
    // `skip` tokens without drafts after a step that kept none (`backoff`: 4, doubling up to
    // 64 while that goes on).
    double n_stood = 0, n_fell = 0;
    int32_t skip = 0, backoff = 0;
    token_id final_token = -1;        // the EOS that ended it
    bool done = false;
    sampler smp;
    stream_decoder dec;
    stop_matcher stops;
    // A beam (runtime/beam_search.hpp): its generated tokens' logprobs (and top alternatives)
    // and their sum; once its row is due, its best continuations, until the group's step
    // takes them.
    double sum_logprob = 0;
    std::vector<float> lps;
    std::vector<std::vector<token_logprob>> tops;
    std::vector<token_logprob> cand;
    bool has_cand = false;

    seq_state(int32_t i, sampling_params p, const tokenizer& tok, std::vector<std::string> stop)
        : index(i), smp(std::move(p)), dec(tok), stops(std::move(stop)) {}

    // The state of a beam forked from this one, as sequence `i`.
    std::unique_ptr<seq_state> fork(int32_t i) const { return std::make_unique<seq_state>(*this, i); }
    seq_state(const seq_state& o, int32_t i)
        : index(i), n_generated(o.n_generated), smp(o.smp.clone()), dec(o.dec), stops(o.stops),
          sum_logprob(o.sum_logprob), lps(o.lps), tops(o.tops) {}
};

// A finished beam: its generated tokens (without the EOS that ended it) and their logprobs.
struct beam_hypothesis {
    double score = 0, sum_logprob = 0;
    std::vector<token_id> tokens;
    std::vector<float> lps;
    std::vector<std::vector<token_logprob>> tops;
    token_id final_token = -1;
    const char* finish_reason = "stop";
};

// A request inside the engine, from submission to its last done event. Sequence 0 computes
// the prompt; once its logits are due, n > 1 forks it (the prompt is computed once, its
// pages shared) and every sequence samples its first token from that row.
struct request_state {
    uint64_t id = 0;
    engine_request req;
    engine_sink sink;
    int32_t n_prompt = 0;
    int32_t n_cached = 0;             // prompt tokens the prefix cache gave it at admission
    int32_t max_tokens = 0;           // after cutting to the context
    int32_t n_failures = 0;           // batches in a row lost with it to a crashed worker
    int32_t n_live = 0;               // sequences not done
    bool forked = false;
    bool cancel_pending = false;      // cancelled (or failed, with end_error) while a batch ran it
    std::string end_error;            // why it fails once that batch is done ("": cancelled)
    steady_time t_admitted{};
    std::vector<std::unique_ptr<seq_state>> seqs; // [n]; beam search: [slot] its live beams, null when free
    std::vector<beam_hypothesis> finished;        // beam search: the best finished beams, at most width
    std::vector<prompt_token> scored;             // score_prompt: the prompt's tokens scored so far
    bool prompt_sent = false;                     // score_prompt: its event is sent
    std::vector<double> pooled;                   // embed: the hidden states pooled so far [n_embd]
    int32_t n_pooled = 0;                         // embed (mean): the prompt positions in `pooled`
    std::vector<float> embedding;                 // embed: the result, for sequence 0's done event

    bool beam() const { return req.beam.width > 0; }

    request_state(uint64_t i, engine_request&& r, engine_sink&& s, const tokenizer& tok)
        : id(i), req(std::move(r)), sink(std::move(s)) {
        const int32_t n = beam() ? 1 : std::max(1, req.n); // beams fork from the first as the search goes
        for (int32_t k = 0; k < n; ++k) {
            sampling_params p = req.sampling;
            if (p.seed) p.seed = *p.seed + uint64_t(k); // sequence k: seed + k
            seqs.push_back(std::make_unique<seq_state>(k, std::move(p), tok, req.stop));
            if (req.make_processor) seqs.back()->smp.processors().add(req.make_processor());
        }
        n_live = n;
        forked = n == 1;
    }
};

// What the policies ask of the engine's core: sampling a sequence's next token (its event
// sent, the sequence ended where it ends), and events queued until the step's stats are out.
class engine_core {
public:
    virtual ~engine_core() = default;
    // Samples one token of q from `logits`, the tokens before position n_history as its
    // history (all of them: -1); `draft`, the token at n_history already (sampler::none:
    // none), is kept when the sample is that token, else cut with what follows it. True when
    // the draft stands and the sequence goes on.
    virtual bool sample_next(request_state& r, seq_state& q, std::span<const float> logits, int32_t n_history,
                             token_id draft, std::span<const float> draft_q) = 0;
    // A done event, completed with the request's counts, sent once the stats are published.
    virtual void queue_done(const request_state& r, engine_event&& ev) = 0;
};

// The text a sequence's decoder and stop matcher still hold, unless a stop string ended it.
std::string flush_text(stream_decoder& dec, stop_matcher& stops);

} // namespace tandem
