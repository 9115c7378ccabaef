// The HTTP API's JSON side: request validation into engine requests, responses, errors.
#pragma once

#include "daemon/grounding.hpp"
#include "daemon/state.hpp"
#include "runtime/engine.hpp"
#include "runtime/grammar/tool_call.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace tandem::daemon {

using json = nlohmann::ordered_json; // keys in the order the client wrote them (schemas: properties in order)

// An OpenAI-style error: {"error": {"message", "type", "param", "code"}} with its status.
struct api_error {
    int status = 400;
    std::string message;
    std::string type = "invalid_request_error";
    std::string param;
    std::string code;
    int retry_after_s = 0;            // > 0: a Retry-After header
};

std::string error_body(const api_error& e);

// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string dump(const json& j);

// A plain reply: status, content type and body, plus an optional Retry-After (and, on a
// 405, the Allow header's methods).
struct reply {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    int retry_after_s = 0;
    std::string allow;
    std::string file;                 // not empty: the body is this file's bytes, sent from the disk
    bool model_loading = false; // a 503 for want of the model: the session may hold the request until it loads

    static reply of(const api_error& e);
    static reply of_json(const json& j, int status = 200);
};

// A chat request that offered tools (tool_choice other than "none"): its replies are read as
// content and tool calls in the family's syntax.
struct tool_plan {
    grammar::tool_syntax syntax = grammar::tool_syntax::hermes;
};

// A validated /v1/completions or /v1/chat/completions request: one engine request per prompt,
// each reporting n_seqs sequences; sequence i of request k is k * n_seqs + i. Each prompt
// returns n choices: its sequences, or with best_of > n (sampling) the n best of them.
// A chat request with documents, before they are rendered: when they do not fit, the session
// ranks their passages (daemon/retrieval.hpp) and renders the best that fit the budget.
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

struct generation_plan {
    bool chat = false;
    bool stream = false;
    bool include_usage = false;       // stream_options.include_usage
    bool logprobs = false;
    bool beam = false;                // use_beam_search: choices carry score and cumulative_logprob
    std::vector<engine_request> requests;
    std::optional<tool_plan> tools;
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

std::variant<generation_plan, api_error> parse_generation(const json& body, bool chat, const model_state& ms,
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

// An embeddings request (POST /v1/embeddings), parsed: each input's tokens, embedded with the
// model's pooling (runtime/model_config.hpp pooling_type).
struct embedding_plan {
    std::vector<std::vector<token_id>> inputs;
    bool base64 = false;              // encoding_format "base64": each vector's little-endian float32 bytes
    int32_t priority = 0;
    bool truncate = false;            // truncate_prompt_tokens was given
    int64_t n_truncated = 0;          // the input tokens it dropped, all inputs together
};

std::variant<embedding_plan, api_error> parse_embeddings(const json& body, const model_state& ms, const config& cfg);

// {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}.
json embeddings_response(const embedding_plan& plan, const std::vector<std::vector<float>>& vectors,
                         const std::string& model);

// Why this model has no embeddings (its hidden states do not fit the rows that carry them,
// n_embd > n_vocab: no real model), or nullopt.
std::optional<api_error> embeddings_unavailable(const model_state& ms);

// The error a refused engine submission gets (queue full, too long, shutting down).
api_error submit_error(submit_status s);

// Collects one choice's events into the response fields.
struct choice_state {
    std::string text;
    std::string finish_reason;
    std::string error;                // why, when finish_reason is "error"
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
    std::string content;
    std::vector<tool_call> calls;
    // Characters (code points) in `text`, counted on from where the last call stopped:
    // text_offset counts characters, as OpenAI and vLLM do, not bytes.
    int64_t n_chars();

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
};
// The next piece of choice c's text (`ended`: its last), read through its parser when it has
// one; content and calls are added to c.
reply_delta read_reply(choice_state& c, std::string_view text, bool ended);
// The finish reason a client sees: "tool_calls" for a reply that stopped after its calls.
std::string client_finish_reason(const choice_state& c);

// A streaming chunk for choice `index` with `d` (and `logprobs`, or null); `usage_null`
// (include_usage) adds "usage": null, which only the last chunk fills. Completions send
// d.content as the text.
json stream_chunk(const std::string& id, const std::string& model, bool chat, int index, choice_state& c,
                  const reply_delta& d, const json& logprobs, const std::string& finish_reason,
                  bool usage_null = false);
json usage_json(const std::vector<choice_state>& cs, const generation_plan& plan);
// The passages a retrieved request rendered: [{document_id, document_index, start, end}].
json passages_json(const generation_plan& plan);
json final_response(const std::string& id, const std::string& model, const generation_plan& plan,
                    const std::vector<choice_state>& cs);

// Everything but the generation routes: health, models, metrics, status, tokenize,
// detokenize, apply-template, and the errors for unknown routes and wrong methods (405 with
// Allow; HEAD is allowed wherever GET is, the session sends its reply without the body).
// nullopt means "a generation route": the session drives it.
std::optional<reply> handle_simple(const std::string& method, const std::string& target, const std::string& body,
                                   daemon_state& st);

// The JSON object of a request body, or a 400 (not JSON, not an object, or nested deeper
// than max_depth: runtime/json_limits.hpp).
std::variant<json, api_error> parse_request_body(std::string_view body, int max_depth);

// The reply to a request whose handler threw: a field of the wrong type read unchecked
// (nlohmann's type_error) is a 400, anything else a 500; both say what happened, and the
// daemon's log has the route.
reply reply_for_exception(std::exception_ptr e, std::string_view method, std::string_view target);

// The route name used in metrics labels (unknown targets collapse to "other").
std::string route_label(const std::string& target);

} // namespace tandem::daemon
