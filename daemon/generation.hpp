// The one internal generation request every API surface translates into (Chat Completions,
// Completions, and the agent APIs), and its plan: the prompts rendered and tokenized, limits
// checked, the output constraint compiled, one engine request per prompt.
#pragma once

#include "daemon/grounding.hpp"
#include "daemon/reply.hpp"
#include "daemon/state.hpp"
#include "runtime/engine.hpp"
#include "runtime/grammar/guide.hpp"
#include "runtime/grammar/tool_call.hpp"
#include "runtime/reasoning.hpp"

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace tandem::daemon {

// The functions a request offers the model and how it may call them.
struct tools_request {
    std::vector<grammar::tool_function> functions;
    std::vector<std::string> defs; // each tool object as JSON text ({"type": "function", ...}), for the chat template
    std::string choice = "auto";   // none, auto, required, or "function" (the one named)
    std::string named;
    bool parallel = true;
    std::string field = "tools";   // the request's field that offered them (errors name it)
    bool active() const { return !functions.empty() && choice != "none"; }
};

// What a request asks of a reasoning model's thinking (runtime/reasoning.hpp). A model
// without reasoning markers asked any of it gets a 400 that names the field.
struct reasoning_request {
    std::optional<bool> enable;       // false: thinking off (the template's enable_thinking)
    std::string enable_field;         // the field that asked ("chat_template_kwargs.enable_thinking")
    int32_t budget = -1;              // >= 0: the close marker is forced after this many thinking tokens
    std::string budget_field;         // the field that asked ("max_reasoning_tokens")
};

// An output constraint, and the request field that asked for it (errors name it).
using found_constraint = std::pair<std::string, grammar::constraint>;

// One completion prompt: text, or token ids as given.
struct prompt_input {
    std::string text;
    std::vector<token_id> ids;
    bool is_text = true;
};

// A generation as the engine will run it, independent of the API it came through. The
// surface's parser fills it and checks what only the surface knows (field names, shapes);
// plan_generation does the rest.
struct generation_request {
    bool chat = false;
    std::vector<chat_message> messages;   // chat: rendered through the model's chat template
    nlohmann::ordered_json template_kwargs; // chat: chat_template_kwargs (null: none)
    std::vector<prompt_input> prompts;    // completions: one choice group per prompt
    tools_request tools;
    reasoning_request reasoning;          // chat: a reasoning model's thinking
    grounding ground;                     // chat: documents to cite (none: no grounding)
    std::optional<found_constraint> constraint; // besides tools (at most one of the two)
    grammar::whitespace ws = grammar::whitespace::bounded; // between JSON tokens, JSON constraints and tools
    engine_request base;                  // sampling, stop strings, max_tokens, priority, drafts, logprobs count
    int32_t n = 1;                        // choices per prompt
    int32_t best_of = 1;                  // sequences per prompt (>= n): the n best are returned, or the beam width
    bool stream = false;
    bool include_usage = false;           // a last chunk with usage
    bool logprobs = false;                // choices carry logprobs
    bool echo = false;                    // completions: the prompt's text starts each choice
    int32_t truncate = 0;                 // > 0: keep each prompt's last tokens (truncate_prompt_tokens)
    std::string prompt_param = "prompt";  // the field errors about the prompt name
};

// A chat request with documents, before they are rendered: when they do not fit, the
// completion handler ranks their passages (daemon/retrieval.hpp) and renders the best that fit.
struct pending_grounding {
    std::vector<chat_message> messages;   // without the documents
    grounding ground;                     // every document, and the citation options
    engine_request base;                  // the request, less its prompt and its grounding processors
    int32_t budget = 0;                   // prompt tokens the documents (or passages) must fit in
    std::string query;                    // the question: the last user message
};

// A passage rendered in place of its document, as the response lists it (code points).
struct passage_used {
    std::string document_id;
    int32_t document_index = 0;
    int64_t start = 0, end = 0;
};

// A planned generation: one engine request per prompt, each reporting n_seqs sequences;
// sequence i of request k is k * n_seqs + i. Each prompt returns n choices: its sequences, or
// with best_of > n (sampling) the n best of them.
struct generation_plan {
    bool chat = false;
    bool stream = false;
    bool include_usage = false;       // stream_options.include_usage
    bool logprobs = false;
    bool beam = false;                // use_beam_search: choices carry score and cumulative_logprob
    std::vector<engine_request> requests;
    std::optional<grammar::tool_syntax> tools; // replies are read as content and calls in this syntax
    std::optional<reasoning_format> reasoning; // chat with a reasoning model: replies split into thinking and content
    reasoning_start reasoning_from = reasoning_start::maybe;
    std::vector<std::string> echo;    // echo: each prompt's text, which its choices start with
    std::vector<document> documents;  // chat with documents (citation_options.mode not "off"): choices carry citations
    bool cites() const { return !documents.empty(); }
    bool strict = false;              // citation_options.mode "strict": choices list their unsupported sentences
    std::optional<pending_grounding> retrieval; // documents too long: no requests until ground_plan
    std::vector<passage_used> passages; // the passages rendered, when retrieved
    int32_t n = 1;                    // choices per prompt
    int32_t n_seqs = 1;               // sequences per prompt (best_of when it ranks them)
    bool truncate = false;            // truncate_prompt_tokens was given: usage reports what it dropped
    std::vector<int32_t> truncated;   // the tokens it dropped from each prompt
    bool ranked() const { return n_seqs > n; }
    size_t n_sequences() const { return requests.size() * size_t(n_seqs); }
};

std::variant<generation_plan, api_error> plan_generation(generation_request req, const model_state& ms,
                                                         const config& cfg);

// The prompt with these documents (or passages) rendered into the pending chat.
std::vector<token_id> grounded_prompt(const pending_grounding& g, const std::vector<document>& docs,
                                      const model_state& ms);
// Completes the plan with its one request: the prompt, the citation observer and strict mode's
// mask over `docs`, which the choices' citations index.
void ground_plan(generation_plan& plan, const pending_grounding& g, std::vector<document> docs,
                 std::vector<token_id> prompt, const model_state& ms);
// The text passages are ranked against: the last user message (else the last message).
std::string question_of(const std::vector<chat_message>& messages);

// A prompt over the limit: a 400 with both numbers and what to change (the prompt, the
// request's truncate_prompt_tokens, or the daemon's config); never cut silently.
api_error prompt_too_long(const std::string& what, size_t n_tokens, const model_state& ms, const std::string& param);

// The error a refused engine submission gets (queue full, too long, shutting down).
api_error submit_error(submit_status s);
// Why the engine refused a request that passed the prompt check as too long: its sequences
// cannot all reach max_tokens in the KV pool, even alone. The numbers, and what to change.
std::string too_long_message(const engine_request& r, const model_state& ms);

} // namespace tandem::daemon
