// The choices of a generation as the completion handler collects them from engine events:
// text, tool calls read as they stream, citations, logprobs in OpenAI's two formats, counts.
#pragma once

#include "daemon/generation.hpp"
#include "daemon/reply.hpp"
#include "runtime/tokenizer.hpp"

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::daemon {

// Collects one choice's events into the response fields.
struct choice_state {
    std::string text;
    std::string finish_reason;
    std::string error;                // why, when finish_reason is "error"
    std::string stop_string;          // the stop string that ended it, if one did
    int32_t n_prompt = 0;
    int32_t n_cached = 0;             // of n_prompt, from the prefix cache
    int32_t n_generated = 0;
    int32_t n_drafted = 0, n_accepted = 0; // speculative drafts verified, kept
    double score = 0;                 // beam search: the beam's score
    double cumulative_logprob = 0;    // the sum of its tokens' logprobs
    json citations = json::array();   // grounded chat: every citation of the reply so far
    bool done = false;
    bool sent_role = false;           // chat streaming: the first delta carries the role
    json logprobs_content = json::array();                // chat format
    json lp_tokens = json::array(), lp_token_logprobs = json::array(), lp_top = json::array(),
         lp_offsets = json::array();                       // completions format
    // With tools: the reply read as it streams into content and calls.
    struct tool_call {
        std::string id, name, arguments;
    };
    std::optional<grammar::tool_call_parser> parser;
    // A reasoning model's reply: split into its thinking and the rest, which the parser (if
    // any) reads; content is then the reply's text less its thinking.
    std::optional<reasoning_splitter> splitter;
    std::string reasoning;
    int32_t n_reasoning = 0;          // tokens of the reply while it thought
    std::string content;
    std::vector<tool_call> calls;
    // Characters (code points) in `text`, counted on from where the last call stopped:
    // text_offset counts characters, as OpenAI and vLLM do, not bytes.
    int64_t n_chars();
    // Takes a done event's counts and reason.
    void finish(const engine_event& ev);

private:
    size_t n_bytes_counted_ = 0;
    int64_t n_chars_ = 0;
};

// Adds one token event's logprobs to `c` and returns them in the request's format (for a
// streaming chunk).
json add_logprobs(choice_state& c, const engine_event& ev, bool chat, const tokenizer& tok);
// Echo with logprobs (completions): the prompt's text `echo` starts c's text, and its tokens
// their logprobs (the first's null, as nothing predicts it); returns them for a streaming chunk.
json add_prompt_logprobs(choice_state& c, std::span<const prompt_token> prompt, const std::string& echo,
                         const tokenizer& tok);
// The sequences a request returns, in choice order: all of them, or (ranked) each prompt's n
// with the highest mean token logprob, best first.
std::vector<size_t> returned_sequences(const generation_plan& plan, const std::vector<choice_state>& cs);
// Beam search's extension fields of a finished choice (score, cumulative_logprob).
void add_beam_fields(json& choice, const choice_state& c);
// The citations an event closed, added to c; returns them as the API writes them.
json add_citations(choice_state& c, const engine_event& ev, const generation_plan& plan);

// A piece of a chat reply as the client sees it: content, and (with tools) tool-call deltas in
// OpenAI's streaming form ([{"index", "id", "type", "function": {"name", "arguments"}}], the
// id, type and name on a call's first delta), null when there are none.
struct reply_delta {
    std::string content;
    json tool_calls;
    std::string reasoning;            // thinking (reasoning models), never in content
};
// The next piece of choice c's text (`ended`: its last), split from its thinking and read
// through its parser when it has them; thinking, content and calls are added to c.
reply_delta read_reply(choice_state& c, std::string_view text, bool ended);
// The finish reason a client sees: "tool_calls" for a reply that stopped after its calls.
std::string client_finish_reason(const choice_state& c);

// Token counts of all the choices (every sequence's, returned or not; each prompt once), in
// OpenAI's usage object.
json usage_json(const std::vector<choice_state>& cs, const generation_plan& plan);
// The passages a retrieved request rendered: [{document_id, document_index, start, end}].
json passages_json(const generation_plan& plan);

} // namespace tandem::daemon
