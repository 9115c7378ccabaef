// OpenAI's request fields, read into the parts of the internal request (daemon/generation.hpp).
// The Chat Completions and Completions surfaces take them whole; the other surfaces reuse the
// ones whose shape they share (tools, output constraints). Each reader names the place of a
// field at fault; none throws.
#pragma once

#include "daemon/fields.hpp"
#include "daemon/generation.hpp"

#include <string>
#include <variant>
#include <vector>

namespace tandem::daemon {

// The prompts of a completions request (or the inputs of an embeddings request, `key`): text,
// or token ids as given (string, [string], [int], [[int]]).
std::variant<std::vector<prompt_input>, api_error> read_prompt_inputs(const json& body, const std::string& key,
                                                                      int32_t n_vocab);
// truncate_prompt_tokens (vLLM's name): keep the last N tokens of each prompt longer than N
// (1 <= N <= max_prompt_tokens); 0 when the request does not ask.
field_error read_truncation(const json& body, const model_state& ms, int32_t& out);
// "model": absent, null, or a string (the model host picked the model by it: session::dispatch).
field_error read_model(const json& body);
// `messages`: roles system/developer/user/assistant/tool, text content (or text parts),
// assistants' tool_calls, tools' tool_call_id.
field_error read_messages(const json& body, std::vector<chat_message>& out);
// chat_template_kwargs: extra variables for the model's chat template (an object; not the
// ones the request sets itself).
field_error read_template_kwargs(const json& body, nlohmann::ordered_json& out);
// An assistant message's tool_calls at `p`: [{"id", "type": "function", "function": {"name", "arguments"}}].
field_error read_message_calls(const json& calls, const std::string& p, std::vector<chat_tool_call>& out);
// The sampling knobs OpenAI's body and Ollama's `options` share: temperature, top_p, min_p,
// top_k (from top_k_min: OpenAI's -1 is "off"), the repetition penalty under the surface's own
// name, presence and frequency penalties, seed. A knob not given keeps the value `out` holds
// (the surface's default).
field_error read_sampling_knobs(const json& obj, const char* repetition_key, int64_t top_k_min, int32_t n_vocab,
                                sampling_params& out, std::string_view where = {});
// `stop`: a string or up to 16, each at most max_bytes.
field_error read_stop(const json& body, int32_t max_bytes, std::vector<std::string>& out);
// `logit_bias`: {"token id": -100..100}; -100 bans the token.
field_error read_logit_bias(const json& body, int32_t n_vocab, std::vector<std::pair<token_id, float>>& out);
// `tools`, `tool_choice`, `parallel_tool_calls`.
field_error read_tools(const json& body, tools_request& out);
// The extension `speculative: {"method", "num_tokens"}`.
field_error read_speculative(const json& body, const config& cfg, int32_t& draft_tokens, draft_source& drafts);
// A schema given as an object (or true/false), or as JSON text (parsed under the nesting limit).
field_error schema_text(const json& v, const std::string& field, int max_depth, std::string& out);
// `response_format` (text, json_object, json_schema): a constraint added to `found`.
field_error read_response_format(const json& rf, int max_depth, std::vector<found_constraint>& found);
// Guided generation: at most one output constraint, from OpenAI's `response_format`, vLLM's
// `structured_outputs` (or its older `guided_*` fields), or llama.cpp's `json_schema` and
// `grammar`.
field_error read_constraint(const json& body, int max_depth, std::optional<found_constraint>& out);
// use_beam_search (a search of width best_of), length_penalty and early_stopping.
field_error read_beam(const json& body, int64_t width, beam_params& out);
// `documents` and `citation_options` (chat), at most max_bytes of documents.
field_error read_grounding(const json& body, int64_t max_bytes, grounding& out);

} // namespace tandem::daemon
