// Ollama's chat and generate requests, translated into the internal request (daemon/ollama.hpp).
#include "daemon/ollama.hpp"

#include "daemon/openai_fields.hpp"
#include "runtime/tokenizer.hpp"

#include <fmt/format.h>

#include <limits>

namespace tandem::daemon {
namespace {

// "model": required (the model host picked the model by it before the handler ran: a name it
// does not know is its 404).
field_error read_ollama_model(const json& body) {
    const auto it = body.find("model");
    if (it == body.end() || !it->is_string()) return bad("'model' is required", "model");
    return std::nullopt;
}

// `options`: Ollama's sampling and length options, mapped onto the request; the ones
// Tandem does not honour are 400s naming them. Ollama's defaults: temperature 0.8, top_k 40,
// top_p 0.9; num_predict -1 (until the model stops or the context is full).
field_error read_options(const json& body, const model_state& ms, const config& cfg, engine_request& base) {
    base.sampling.temperature = 0.8f;
    base.sampling.top_p = 0.9f;
    base.sampling.top_k = 40;
    int64_t num_predict = -1, num_ctx = 0;
    if (const auto it = body.find("options"); it != body.end() && !it->is_null()) {
        if (!it->is_object()) return bad("'options' must be an object", "options");
        const json& o = *it;
        TANDEM_TRY(check_keys(o, "options",
                              {"num_predict", "num_ctx", "temperature", "top_k", "top_p", "min_p", "repeat_penalty",
                               "presence_penalty", "frequency_penalty", "seed", "stop"}));
        TANDEM_TRY(read_sampling_knobs(o, "repeat_penalty", 0, ms.bundle.tok->n_vocab(), base.sampling, "options"));
        TANDEM_TRY(read_int(o, "num_predict", -2, ms.max_tokens_limit, num_predict, "options"));
        if (num_predict == 0) return bad("'options.num_predict' must not be 0 (-1: until the end)", "options.num_predict");
        TANDEM_TRY(read_int(o, "num_ctx", 1, std::numeric_limits<int32_t>::max(), num_ctx, "options"));
        if (num_ctx > ms.n_ctx)
            return bad(fmt::format("'options.num_ctx' {} is more than this daemon's context of {} (n_ctx in "
                                   "tandemd.conf; the context is the daemon's, not a request's)",
                                   num_ctx, ms.n_ctx),
                       "options.num_ctx");
        if (const auto stop = o.find("stop"); stop != o.end() && !stop->is_null()) {
            const json wrapped = {{"stop", *stop}}; // (OpenAI's shape: a string or up to 16)
            if (auto e = read_stop(wrapped, cfg.max_stop_bytes, base.stop)) {
                e->param = "options." + e->param;
                e->message = "'options.stop': " + e->message;
                return e;
            }
        }
    }
    base.max_tokens = num_predict < 0 ? ms.max_tokens_limit : int32_t(num_predict);
    return std::nullopt;
}

// `format`: "json" (any JSON object) or a JSON Schema, through the same compiler.
field_error read_format(const json& body, int max_depth, std::optional<found_constraint>& out) {
    const auto it = body.find("format");
    if (it == body.end() || it->is_null() || *it == "") return std::nullopt;
    if (*it == "json") {
        out = found_constraint{"format", {grammar::constraint::kind::json_object, ""}};
        return std::nullopt;
    }
    if (!it->is_object()) return bad("'format' must be \"json\" or a JSON Schema object", "format");
    grammar::constraint c{grammar::constraint::kind::json_schema, ""};
    TANDEM_TRY(schema_text(*it, "format", max_depth, c.text));
    out = found_constraint{"format", std::move(c)};
    return std::nullopt;
}

// `think`: true or false (levels need a template with a reasoning effort: none here).
field_error read_think(const json& body, reasoning_request& out) {
    const auto it = body.find("think");
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (it->is_string())
        return bad(fmt::format("'think' \"{}\" is not supported: this model's template has no reasoning levels (true "
                               "or false)",
                               it->get<std::string>()),
                   "think");
    if (!it->is_boolean()) return bad("'think' must be true or false", "think");
    out.enable = it->get<bool>();
    out.enable_field = "think";
    return std::nullopt;
}

// Chat messages: roles system, user, assistant, tool; assistants' tool_calls with object
// arguments; images are a 400.
field_error read_ollama_messages(const json& body, std::vector<chat_message>& out) {
    const auto it = body.find("messages");
    if (it == body.end() || it->is_null()) return bad("'messages' is required", "messages");
    if (!it->is_array()) return bad("'messages' must be an array", "messages");
    for (size_t i = 0; i < it->size(); ++i) {
        const json& m = (*it)[i];
        const std::string p = place("messages", i);
        if (!m.is_object()) return bad(fmt::format("'{}' must be an object", p), p);
        if (const auto im = m.find("images"); im != m.end() && !im->is_null() && !(im->is_array() && im->empty()))
            return bad(fmt::format("'{}.images' is not supported: this model takes text only", p), p + ".images");
        TANDEM_TRY(check_keys(m, p, {"role", "content", "tool_calls", "tool_name", "thinking"}, true));
        const json role = m.value("role", json());
        if (role != "system" && role != "user" && role != "assistant" && role != "tool")
            return bad(fmt::format("'{}.role' must be system, user, assistant or tool", p), p + ".role");
        chat_message cm{role.get<std::string>(), {}, {}, {}};
        TANDEM_TRY(read_string(m, "content", cm.content, p));
        if (role == "tool") TANDEM_TRY(read_string(m, "tool_name", cm.tool_call_id, p));
        if (const auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
            if (role != "assistant" || !calls->is_array())
                return bad(fmt::format("'{}.tool_calls' is an assistant's array of calls", p), p + ".tool_calls");
            for (size_t k = 0; k < calls->size(); ++k) {
                const json& c = (*calls)[k];
                const std::string q = place(p + ".tool_calls", k);
                const json fn = c.is_object() ? c.value("function", json()) : json();
                if (!fn.is_object() || !fn.value("name", json()).is_string())
                    return bad(fmt::format("'{}' must be {{\"function\": {{\"name\", \"arguments\"}}}}", q), q);
                const json args = fn.value("arguments", json::object());
                cm.tool_calls.push_back({fmt::format("call_{}_{}", i, k), fn["name"].get<std::string>(),
                                         args.is_string() ? args.get<std::string>() : args.dump()});
            }
        }
        out.push_back(std::move(cm));
    }
    if (out.empty()) return bad("'messages' must not be empty", "messages");
    return std::nullopt;
}

} // namespace

field_error read_keep_alive(const json& body) {
    const auto it = body.find("keep_alive");
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (it->is_number()) return std::nullopt; // seconds (negative: for good, 0: unloaded after the request)
    if (!it->is_string() || !parse_keep_alive(it->get<std::string>()))
        return bad("'keep_alive' must be a duration (\"5m\", \"10s\", \"-1\") or a number of seconds", "keep_alive");
    return std::nullopt;
}

std::variant<generation_request, api_error> parse_ollama(const json& body, const model_state& ms, const config& cfg,
                                                         bool generate) {
    if (!body.is_object()) return bad("the request body must be a JSON object");
    if (generate) {
        for (const char* key : {"suffix", "template", "context", "images"})
            if (const auto it = body.find(key);
                it != body.end() && !it->is_null() && *it != "" && !(it->is_array() && it->empty()))
                return bad(fmt::format("'{}' is not supported{}", key,
                                       std::string_view(key) == "images" ? ": this model takes text only" : ""),
                           key);
        TANDEM_TRY(check_keys(body, "",
                              {"model", "prompt", "system", "stream", "raw", "format", "options", "think", "keep_alive"},
                              false, {"suffix", "template", "context", "images"}));
    } else {
        TANDEM_TRY(check_keys(body, "", {"model", "messages", "tools", "stream", "format", "options", "think",
                                         "keep_alive"}));
    }
    TANDEM_TRY(read_ollama_model(body));
    TANDEM_TRY(read_keep_alive(body));
    generation_request req;
    req.stream = true;
    TANDEM_TRY(read_bool(body, "stream", req.stream));
    if (generate) {
        std::string prompt, system;
        bool raw = false;
        TANDEM_TRY(read_string(body, "prompt", prompt));
        TANDEM_TRY(read_string(body, "system", system));
        TANDEM_TRY(read_bool(body, "raw", raw));
        if (raw) {
            if (!system.empty()) return bad("'system' has no meaning with 'raw': true", "system");
            req.prompts.push_back(prompt_input{prompt, {}, true});
        } else {
            req.chat = true;
            req.prompt_param = "prompt";
            if (!system.empty()) req.messages.push_back({"system", system, {}, {}});
            req.messages.push_back({"user", prompt, {}, {}});
        }
    } else {
        req.chat = true;
        TANDEM_TRY(read_ollama_messages(body, req.messages));
        TANDEM_TRY(read_tools(body, req.tools));
    }
    TANDEM_TRY(read_options(body, ms, cfg, req.base));
    TANDEM_TRY(read_format(body, cfg.max_json_depth, req.constraint));
    if (req.chat) TANDEM_TRY(read_think(body, req.reasoning));
    else if (body.contains("think") && !body["think"].is_null()) return bad("'think' has no meaning with 'raw': true", "think");
    return req;
}

} // namespace tandem::daemon
