// Beam search as an engine policy: the `width` likeliest continuations of a request searched
// together, each a sequence of its group, over the scheduler's narrow interface (fork, append,
// remove). See engine_request::beam for what a request asks and gets.
#pragma once

#include "runtime/engine_state.hpp"
#include "runtime/scheduler.hpp"

#include <span>
#include <string>

namespace tandem {

class beam_search {
public:
    beam_search(scheduler& sched, const tokenizer& tok, engine_core& core) : sched_(sched), tok_(tok), core_(core) {}

    // Beam q of r has its row: its best continuations (the processed logits' log-softmax: the
    // bias, penalties and grammar apply), twice the width of them, as Hugging Face's search
    // takes. Once every live beam has them and none is in a batch (`busy`: one is), the group
    // steps. Returns true when the search has ended (the request is to finish "stop").
    bool on_row(request_state& r, seq_state& q, std::span<const float> logits, bool busy);

    // The search of r ends: its live beams go, and its best n finished beams are sent, best
    // first, as sequences 0..n-1 (tokens and text as plain decoding would send them). Ended
    // otherwise (cancelled, an error), each of the n gets a done event with the reason.
    void end(request_state& r, const char* reason, const std::string& error);

    // Tokens the searches generated (every beam's), for the engine's count.
    uint64_t n_generated() const { return n_generated_; }

private:
    bool step(request_state& r);
    void add_hypothesis(request_state& r, beam_hypothesis h) const;
    beam_hypothesis hypothesis_of(const request_state& r, const seq_state& q, const char* reason) const;
    beam_hypothesis hypothesis_of(const request_state& r, const seq_state& q, const token_logprob& t, bool eos) const;

    scheduler& sched_;
    const tokenizer& tok_;
    engine_core& core_;
    std::vector<float> row_;     // [n_vocab] the row being processed
    uint64_t n_generated_ = 0;
};

} // namespace tandem
