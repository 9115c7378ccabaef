// Offline generation of one sequence: the in-process engine with one request, streaming
// complete UTF-8 text as it goes. (Loading a model: runtime/model_loader.hpp, included here
// for the programs that load and then generate.)
#pragma once

#include "runtime/engine.hpp"
#include "runtime/model.hpp"
#include "runtime/model_loader.hpp"
#include "runtime/sampler.hpp"
#include "runtime/stop_matcher.hpp"

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// An offline run: the one request as the engine takes it (its prompt is generate's argument;
// max_tokens < 0: until EOS or the context is full, and cut to the context either way; with
// beam search, `n` of the beams come back), and what the one-request engine needs besides.
struct generate_params {
    engine_request request{.max_tokens = 128, .draft_tokens = 0};
    int32_t n_ctx = 0;                // 0: the model's training context
    int32_t prefill_chunk = 512;      // tokens per prefill step
    int32_t page_size = 16;
    model* draft_model = nullptr;     // load_draft_model's; runs on its own draft_threads
    int draft_threads = 1;
};

// A finished beam of beam search, best first.
struct beam_result {
    std::vector<token_id> tokens;     // including a final EOS
    std::string text;
    std::string finish_reason;
    double score = 0, cumulative_logprob = 0;
};

struct generate_result {
    std::vector<token_id> prompt_tokens;
    std::vector<token_id> tokens;     // generated, including a final EOS
    std::string text;                 // generated text, stop string excluded
    std::string finish_reason;        // "stop" (EOS or stop string), "length", "cancelled"
    double prefill_s = 0;
    double decode_s = 0;
    int32_t n_decode_steps = 0;
    int32_t n_draft_tokens = 0, n_accepted_tokens = 0; // speculative drafts computed, accepted
    std::vector<beam_result> beams;   // beam search: the beams returned, best first (the first is tokens, text)

    double prefill_tok_s() const { return prefill_s > 0 ? double(prompt_tokens.size()) / prefill_s : 0; }
    double decode_tok_s() const { return decode_s > 0 ? double(n_decode_steps) / decode_s : 0; }
};

// The engine's decode loop (make_local_engine) on `ctx`, with this one request. on_text
// receives each piece of text as soon as it is complete (beam search: the best beam's, when
// the search ends), on the caller's thread; returning false cancels. Throws tandem::error on a
// bad prompt or a failed step.
generate_result generate(const exec_ctx& ctx, model& mdl, const tokenizer& tok, std::vector<token_id> prompt,
                         const generate_params& p,
                         const std::function<bool(std::string_view)>& on_text = {});

} // namespace tandem
