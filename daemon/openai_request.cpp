// The Chat Completions and Completions request bodies (daemon/openai_request.hpp).
#include "daemon/openai_request.hpp"

#include "daemon/openai_fields.hpp"
#include "runtime/tokenizer.hpp"

#include <fmt/format.h>

#include <limits>
#include <set>

namespace tandem::daemon {
namespace {

// Every field a generation request may carry; any other is a 400 that names it, so nothing a
// client asks for is silently ignored.
field_error check_fields(const json& body, bool chat) {
    static const std::set<std::string, std::less<>> common{
        "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stream", "stream_options", "stop",
        "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs", "user",
        "ignore_eos", "priority", "speculative", "best_of", "response_format", "structured_outputs", "guided_json",
        "guided_regex", "guided_choice", "guided_grammar", "json_schema", "grammar", "functions", "function_call",
        "use_beam_search", "length_penalty", "early_stopping", "truncate_prompt_tokens", "whitespace"};
    static const std::set<std::string, std::less<>> chat_only{"messages",          "max_completion_tokens",
                                                              "top_logprobs",      "tools",
                                                              "tool_choice",       "parallel_tool_calls",
                                                              "documents",         "citation_options",
                                                              "chat_template_kwargs", "reasoning_effort",
                                                              "max_reasoning_tokens"};
    static const std::set<std::string, std::less<>> completion_only{"prompt", "echo", "suffix"};
    for (const auto& [key, value] : body.items())
        if (!common.contains(key) && !(chat ? chat_only : completion_only).contains(key))
            return bad(fmt::format("'{}' is not supported", key), key);
    return std::nullopt;
}

// The sampling fields, n, best_of, beam search and logprobs into `req`.
field_error read_sampling(const json& body, bool chat, const model_state& ms, const config& cfg,
                          generation_request& req) {
    const tokenizer& tok = *ms.bundle.tok;
    engine_request& base = req.base;
    sampling_params& knobs = base.sampling; // (OpenAI's defaults: sampling_params')
    TANDEM_TRY(read_sampling_knobs(body, "repetition_penalty", -1, tok.n_vocab(), knobs));
    int64_t n = 1;
    TANDEM_TRY(read_int(body, "n", 1, std::numeric_limits<int32_t>::max(), n));
    int64_t best_of = n;
    TANDEM_TRY(read_int(body, "best_of", 1, std::numeric_limits<int32_t>::max(), best_of));
    if (best_of < n) return bad(fmt::format("'best_of' ({}) must be at least 'n' ({})", best_of, n), "best_of");
    req.n = int32_t(n); // (plan_generation refuses more than max_n by name)
    req.best_of = int32_t(best_of);
    TANDEM_TRY(read_beam(body, req.best_of, base.beam));
    if (base.beam.width == 0 && best_of > n && req.stream)
        return bad("'best_of' greater than 'n' cannot stream: the best are known only at the end", "best_of");
    TANDEM_TRY(read_bool(body, "ignore_eos", base.ignore_eos));
    int64_t priority = 0;
    TANDEM_TRY(read_int(body, "priority", -1000, 1000, priority));
    base.priority = int32_t(priority);
    TANDEM_TRY(read_speculative(body, cfg, base.draft_tokens, base.drafts));
    TANDEM_TRY(read_stop(body, cfg.max_stop_bytes, base.stop));
    TANDEM_TRY(read_logit_bias(body, tok.n_vocab(), base.sampling.logit_bias));
    if (base.beam.width > 0) { // beam search is deterministic: no sampling knobs, nothing to verify
        const std::pair<const char*, bool> sampling[] = {
            {"temperature", knobs.temperature > 0}, {"top_p", knobs.top_p < 1}, {"top_k", knobs.top_k > 0},
            {"min_p", knobs.min_p > 0}};
        for (const auto& [key, set] : sampling)
            if (body.contains(key) && set)
                return bad(fmt::format("'{}' does not apply to beam search, which is deterministic (leave it out, or "
                                       "give temperature 0)",
                                       key),
                           key);
        knobs.temperature = 0;
        if (body.contains("speculative") && !body["speculative"].is_null() && base.draft_tokens != 0)
            return bad("speculative decoding does not apply to beam search", "speculative");
    }
    // logprobs: completions take an int (0..20), chat a bool plus top_logprobs
    if (chat) {
        int64_t top = 0;
        TANDEM_TRY(read_bool(body, "logprobs", req.logprobs));
        TANDEM_TRY(read_int(body, "top_logprobs", 0, 20, top));
        if (body.contains("top_logprobs") && !body["top_logprobs"].is_null() && !req.logprobs)
            return bad("'top_logprobs' needs 'logprobs': true", "top_logprobs");
        base.n_top_logprobs = req.logprobs ? int32_t(top) : -1;
    } else {
        int64_t lp = -1;
        TANDEM_TRY(read_int(body, "logprobs", 0, 20, lp));
        req.logprobs = lp >= 0;
        base.n_top_logprobs = int32_t(lp);
    }
    return std::nullopt;
}

// A reasoning model's options: chat_template_kwargs.enable_thinking, the extension
// max_reasoning_tokens; reasoning_effort only where a template reads it (none of the families
// here: a 400 that says what to send instead).
field_error read_reasoning(const json& body, const model_state& ms, reasoning_request& out) {
    if (const auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
        // (every key goes to the template: read_template_kwargs; enable_thinking also tells
        // where the reply's thinking starts)
        if (!it->is_object()) return bad("'chat_template_kwargs' must be an object", "chat_template_kwargs");
        if (const auto e = it->find("enable_thinking"); e != it->end() && !e->is_null()) {
            bool on = true;
            TANDEM_TRY(read_bool(*it, "enable_thinking", on, "chat_template_kwargs"));
            out.enable = on;
            out.enable_field = "chat_template_kwargs.enable_thinking";
        }
    }
    if (const auto it = body.find("reasoning_effort"); it != body.end() && !it->is_null())
        return bad(fmt::format("'reasoning_effort' is not supported: {}; bound the thinking with "
                               "'max_reasoning_tokens' or turn it off with chat_template_kwargs.enable_thinking",
                               ms.reasoning ? "this model's chat template has no reasoning effort"
                                            : "this model does not reason"),
                   "reasoning_effort");
    int64_t budget = -1;
    TANDEM_TRY(read_int(body, "max_reasoning_tokens", 0, ms.max_tokens_limit, budget));
    if (budget >= 0) {
        out.budget = int32_t(budget);
        out.budget_field = "max_reasoning_tokens";
    }
    return std::nullopt;
}

} // namespace

std::variant<generation_request, api_error> parse_openai_generation(const json& body, bool chat, const model_state& ms,
                                                                    const config& cfg) {
    if (!body.is_object()) return bad("the request body must be a JSON object");
    TANDEM_TRY(check_fields(body, chat));
    generation_request req;
    req.chat = chat;
    req.prompt_param = chat ? "messages" : "prompt";
    TANDEM_TRY(read_model(body));
    for (const char* unsupported : {"suffix", "functions", "function_call"})
        if (auto it = body.find(unsupported); it != body.end() && !it->is_null() && !(it->is_array() && it->empty()))
            return bad(fmt::format("'{}' is not supported{}", unsupported,
                                   std::string_view(unsupported) == "suffix" ? "" : " (the deprecated form: use 'tools')"),
                       unsupported);
    TANDEM_TRY(read_bool(body, "echo", req.echo));
    TANDEM_TRY(read_bool(body, "stream", req.stream));
    if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
        if (!it->is_object()) return bad("'stream_options' must be an object", "stream_options");
        TANDEM_TRY(check_keys(*it, "stream_options", {"include_usage"}));
        TANDEM_TRY(read_bool(*it, "include_usage", req.include_usage, "stream_options"));
    }
    if (chat) {
        TANDEM_TRY(read_messages(body, req.messages));
        TANDEM_TRY(read_template_kwargs(body, req.template_kwargs));
        TANDEM_TRY(read_tools(body, req.tools));
        TANDEM_TRY(read_reasoning(body, ms, req.reasoning));
        TANDEM_TRY(read_grounding(body, cfg.max_document_bytes, req.ground));
    } else {
        auto prompts = read_prompt_inputs(body, "prompt", ms.bundle.tok->n_vocab());
        if (auto* e = std::get_if<api_error>(&prompts)) return *e;
        req.prompts = std::move(std::get<0>(prompts));
    }
    TANDEM_TRY(read_truncation(body, ms, req.truncate));

    // limits: OpenAI's defaults are 16 tokens, chat until the end
    int64_t max_tokens = chat ? ms.max_tokens_limit : 16;
    if (!req.echo && body.contains("max_tokens") && body["max_tokens"] == 0)
        return bad("'max_tokens' 0 needs 'echo': true (which scores the prompt)", "max_tokens");
    TANDEM_TRY(read_int(body, "max_tokens", req.echo ? 0 : 1, ms.max_tokens_limit, max_tokens)); // echo and 0: scored only
    if (chat) TANDEM_TRY(read_int(body, "max_completion_tokens", 1, ms.max_tokens_limit, max_tokens));
    req.base.max_tokens = int32_t(max_tokens);
    TANDEM_TRY(read_sampling(body, chat, ms, cfg, req));
    TANDEM_TRY(read_constraint(body, cfg.max_json_depth, req.constraint));
    // The extension `whitespace`: between JSON tokens of a JSON constraint or a tool call,
    // "bounded" (the default: a line break and up to 20 spaces or tabs) or "compact" (none).
    std::string ws = "bounded";
    TANDEM_TRY(read_string(body, "whitespace", ws));
    if (ws != "bounded" && ws != "compact")
        return bad(fmt::format("'whitespace' must be \"bounded\" or \"compact\", not \"{}\"", ws), "whitespace");
    req.ws = ws == "compact" ? grammar::whitespace::compact : grammar::whitespace::bounded;
    return req;
}

std::variant<generation_plan, api_error> parse_generation(const json& body, bool chat, const model_state& ms,
                                                          const config& cfg) {
    auto req = parse_openai_generation(body, chat, ms, cfg);
    if (auto* e = std::get_if<api_error>(&req)) return *e;
    return plan_generation(std::move(std::get<generation_request>(req)), ms, cfg);
}

} // namespace tandem::daemon
