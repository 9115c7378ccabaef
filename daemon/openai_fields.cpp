// OpenAI's request fields, read into the internal request (daemon/generation.hpp): prompts,
// messages with tool calls, tools and tool_choice, stop strings, logit_bias, output
// constraints (response_format and the vLLM and llama.cpp forms), beam search, documents,
// and Tandem's extensions. Each reader names the place of a field at fault.
#include "daemon/openai_fields.hpp"

#include "runtime/json_limits.hpp"
#include "runtime/tokenizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>

namespace tandem::daemon {
namespace {

bool valid_function_name(const std::string& n) {
    if (n.empty() || n.size() > 64) return false;
    return std::all_of(n.begin(), n.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    });
}

} // namespace

// The prompts of a completions request (or the inputs of an embeddings request, `key`): text,
// or token ids as given (string, [string], [int], [[int]]); ids are checked against the
// vocabulary here, texts are tokenized when the request is planned.
std::variant<std::vector<prompt_input>, api_error> read_prompt_inputs(const json& body, const std::string& key,
                                                                      int32_t n_vocab) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return bad(fmt::format("'{}' is required", key), key);
    std::vector<prompt_input> out;
    auto ids = [&](const json& a, const std::string& where) -> field_error {
        prompt_input p;
        p.is_text = false;
        for (size_t i = 0; i < a.size(); ++i) {
            const json& x = a[i];
            const int64_t id = x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT32_MAX) ? -1 : x.get<int64_t>();
            if (id < 0 || id >= n_vocab)
                return bad(fmt::format("token id {} is out of range (vocabulary of {})", x.dump(), n_vocab),
                           place(where, i));
            p.ids.push_back(token_id(id));
        }
        if (p.ids.empty()) return bad(fmt::format("a token {} must not be empty", key), where);
        out.push_back(std::move(p));
        return std::nullopt;
    };
    const auto text = [](const json& s) { return prompt_input{s.get<std::string>(), {}, true}; };
    const std::string shapes = fmt::format("'{}' must be a string, an array of strings, or token ids", key);
    if (it->is_string()) {
        out.push_back(text(*it));
    } else if (it->is_array() && !it->empty() && all_ints(*it)) {
        TANDEM_TRY(ids(*it, key));
    } else if (it->is_array() && !it->empty()) {
        for (size_t i = 0; i < it->size(); ++i) {
            const json& p = (*it)[i];
            if (p.is_string()) out.push_back(text(p));
            else if (p.is_array() && all_ints(p)) TANDEM_TRY(ids(p, place(key, i)));
            else return bad(shapes, place(key, i));
        }
    } else {
        return bad(shapes, key);
    }
    return out;
}

// truncate_prompt_tokens (vLLM's name): keep the last N tokens of each prompt longer than N
// (1 <= N <= max_prompt_tokens); 0 when the request does not ask.
field_error read_truncation(const json& body, const model_state& ms, int32_t& out) {
    int64_t n = 0;
    if (auto e = read_int(body, "truncate_prompt_tokens", 1, ms.max_prompt_tokens, n)) {
        e->message += fmt::format(" (the tokens of each prompt to keep, its last; at most max_prompt_tokens, {})",
                                  ms.max_prompt_tokens);
        return e;
    }
    out = int32_t(n);
    return std::nullopt;
}

// "model": absent, null, or the one this daemon serves (else 404, as OpenAI answers).
field_error read_model(const json& body) {
    auto it = body.find("model");
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (!it->is_string()) return bad("'model' must be a string", "model");
    // Which model: the model host picked `ms` by this name before the handler ran
    // (session::dispatch; a name it does not know is its 404 model_not_found), by the model's
    // id or another name of it (`org/repo` for the store's `org/repo:Q4_K_M`, Ollama's tag).
    return std::nullopt;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}].
field_error read_message_calls(const json& calls, const std::string& p, std::vector<chat_tool_call>& out) {
    if (!calls.is_array()) return bad(p + " must be an array", p);
    for (size_t k = 0; k < calls.size(); ++k) {
        const json& c = calls[k];
        const std::string q = fmt::format("{}[{}]", p, k);
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
            return bad(q + " must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}", q);
        TANDEM_TRY(check_keys(c, q, {"id", "type", "function"}, false, {"index"})); // index: a streamed delta's, echoed
        TANDEM_TRY(check_keys(c["function"], q + ".function", {"name", "arguments"}));
        if (c.contains("type") && c["type"] != "function")
            return bad(q + ".type must be \"function\"", q + ".type");
        const json& fn = c["function"];
        if (!fn.contains("name") || !fn["name"].is_string()) return bad(q + ".function.name must be a string", q + ".function.name");
        const auto id = c.find("id");
        if (id != c.end() && !id->is_null() && !id->is_string()) return bad(q + ".id must be a string", q + ".id");
        chat_tool_call call{id != c.end() && id->is_string() ? id->get<std::string>() : "", fn["name"].get<std::string>(),
                            "{}"};
        if (const auto a = fn.find("arguments"); a != fn.end() && !a->is_null()) {
            if (a->is_string()) call.arguments = a->get<std::string>();
            else if (a->is_object()) call.arguments = a->dump();
            else return bad(q + ".function.arguments must be a JSON string", q + ".function.arguments");
        }
        out.push_back(std::move(call));
    }
    return std::nullopt;
}

field_error read_template_kwargs(const json& body, nlohmann::ordered_json& out) {
    const auto it = body.find("chat_template_kwargs");
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (!it->is_object())
        return bad("'chat_template_kwargs' must be an object of the template's variables (e.g. enable_thinking)",
                   "chat_template_kwargs");
    static const char* const reserved[] = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"};
    for (const char* k : reserved)
        if (it->contains(k))
            return bad(fmt::format("'chat_template_kwargs.{}' is set by the request itself", k),
                       std::string("chat_template_kwargs.") + k);
    out = nlohmann::ordered_json::parse(it->dump());
    return std::nullopt;
}

field_error read_messages(const json& body, std::vector<chat_message>& out) {
    auto it = body.find("messages");
    if (it == body.end() || it->is_null()) return bad("'messages' is required", "messages");
    if (!it->is_array() || it->empty()) return bad("'messages' must be a non-empty array", "messages");
    for (size_t i = 0; i < it->size(); ++i) {
        const json& m = (*it)[i];
        const std::string p = fmt::format("messages[{}]", i);
        if (!m.is_object()) return bad(p + " must be an object", p);
        auto r = m.find("role");
        if (r == m.end() || !r->is_string()) return bad(p + ".role must be a string", p + ".role");
        const std::string role = r->get<std::string>();
        if (role != "system" && role != "user" && role != "assistant" && role != "developer" && role != "tool")
            return bad(fmt::format("{}.role '{}' is not supported (system, developer, user, assistant, tool)", p, role),
                       p + ".role");
        // An assistant message may be a reply echoed back whole: its citations describe what was
        // said, and OpenAI's reply fields pass when empty (refusal, annotations, audio: null).
        if (role == "assistant")
            TANDEM_TRY(check_keys(m, p, {"role", "content", "tool_calls", "reasoning_content"}, true,
                                  {"citations", "unsupported"}));
        else if (role == "tool")
            TANDEM_TRY(check_keys(m, p, {"role", "content", "tool_call_id"}));
        else
            TANDEM_TRY(check_keys(m, p, {"role", "content"}));
        chat_message cm{role == "developer" ? "system" : role, {}, {}, {}};
        if (role == "tool") {
            const auto id = m.find("tool_call_id");
            if (id == m.end() || !id->is_string())
                return bad(p + ".tool_call_id must be a string (the id of the call this is the result of)",
                           p + ".tool_call_id");
            cm.tool_call_id = id->get<std::string>();
        }
        if (const auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
            if (role != "assistant") return bad(p + ".tool_calls is only for assistant messages", p + ".tool_calls");
            TANDEM_TRY(read_message_calls(*calls, p + ".tool_calls", cm.tool_calls));
        }
        if (const auto r = m.find("reasoning_content"); r != m.end() && !r->is_null()) {
            if (!r->is_string()) return bad(p + ".reasoning_content must be a string", p + ".reasoning_content");
            cm.reasoning_content = r->get<std::string>(); // for templates that show earlier reasoning
        }
        auto c = m.find("content");
        if (c == m.end() || c->is_null()) {
            if (role != "assistant") return bad(p + ".content is required", p + ".content");
        } else if (c->is_string()) {
            cm.content = c->get<std::string>();
        } else if (c->is_array()) { // content parts: text only
            for (size_t k = 0; k < c->size(); ++k) {
                const json& part = (*c)[k];
                if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
                    !part["text"].is_string())
                    return bad(p + ".content parts must be {\"type\": \"text\", \"text\": ...}", p + ".content");
                TANDEM_TRY(check_keys(part, fmt::format("{}.content[{}]", p, k), {"type", "text"}));
                cm.content += part["text"].get<std::string>();
            }
        } else {
            return bad(p + ".content must be a string or an array of text parts", p + ".content");
        }
        out.push_back(std::move(cm));
    }
    return std::nullopt;
}

field_error read_sampling_knobs(const json& obj, const char* repetition_key, int64_t top_k_min, int32_t n_vocab,
                                sampling_params& out, std::string_view where) {
    double temperature = out.temperature, top_p = out.top_p, min_p = out.min_p, rep = out.repetition_penalty,
           presence = out.presence_penalty, frequency = out.frequency_penalty;
    int64_t top_k = out.top_k, seed = 0;
    TANDEM_TRY(read_number(obj, "temperature", 0, 2, temperature, where));
    TANDEM_TRY(read_number(obj, "top_p", 0, 1, top_p, where));
    TANDEM_TRY(read_number(obj, "min_p", 0, 1, min_p, where));
    TANDEM_TRY(read_number(obj, repetition_key, 0.01, 10, rep, where));
    TANDEM_TRY(read_number(obj, "presence_penalty", -2, 2, presence, where));
    TANDEM_TRY(read_number(obj, "frequency_penalty", -2, 2, frequency, where));
    TANDEM_TRY(read_int(obj, "top_k", top_k_min, n_vocab, top_k, where));
    const bool has_seed = obj.contains("seed") && !obj["seed"].is_null();
    TANDEM_TRY(read_int(obj, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), seed,
                        where));
    out.temperature = float(temperature);
    out.top_p = float(top_p);
    out.min_p = float(min_p);
    out.top_k = int32_t(top_k);
    out.repetition_penalty = float(rep);
    out.presence_penalty = float(presence);
    out.frequency_penalty = float(frequency);
    if (has_seed) out.seed = uint64_t(seed); // (a request of n sequences: sequence i samples with seed + i)
    return std::nullopt;
}

field_error read_stop(const json& body, int32_t max_bytes, std::vector<std::string>& out) {
    auto it = body.find("stop");
    if (it == body.end() || it->is_null()) return std::nullopt;
    const auto take = [&](const json& s, const std::string& where) -> std::optional<api_error> {
        if (!s.is_string()) return bad("'stop' must be a string or an array of up to 16 strings", where);
        if (int64_t(s.get_ref<const std::string&>().size()) > max_bytes)
            return bad(fmt::format("a stop string may have at most {} bytes (max_stop_bytes in tandemd.conf)", max_bytes),
                       where);
        out.push_back(s.get<std::string>());
        return std::nullopt;
    };
    if (it->is_string()) return take(*it, "stop");
    if (!it->is_array() || it->size() > 16) return bad("'stop' must be a string or an array of up to 16 strings", "stop");
    for (size_t i = 0; i < it->size(); ++i) TANDEM_TRY(take((*it)[i], fmt::format("stop[{}]", i)));
    return std::nullopt;
}

field_error read_logit_bias(const json& body, int32_t n_vocab,
                                         std::vector<std::pair<token_id, float>>& out) {
    auto it = body.find("logit_bias");
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (!it->is_object()) return bad("'logit_bias' must be an object of token id -> bias", "logit_bias");
    for (const auto& [k, v] : it->items()) {
        char* end = nullptr;
        const long id = std::strtol(k.c_str(), &end, 10);
        if (k.empty() || *end != '\0' || id < 0 || id >= n_vocab)
            return bad(fmt::format("logit_bias key '{}' is not a token id of this model", k), "logit_bias");
        if (!v.is_number() || !(v.get<double>() >= -100 && v.get<double>() <= 100))
            return bad("logit_bias values must be numbers from -100 to 100", "logit_bias");
        const double b = v.get<double>();
        // OpenAI: -100 bans the token, 100 forces it
        out.emplace_back(token_id(id), b <= -100 ? -std::numeric_limits<float>::infinity() : float(b));
    }
    return std::nullopt;
}

field_error read_tools(const json& body, tools_request& out) {
    if (const auto it = body.find("tools"); it != body.end() && !it->is_null()) {
        if (!it->is_array()) return bad("'tools' must be an array of {\"type\": \"function\", \"function\": {...}}", "tools");
        std::set<std::string> names;
        for (size_t i = 0; i < it->size(); ++i) {
            const json& t = (*it)[i];
            const std::string p = fmt::format("tools[{}]", i);
            if (!t.is_object() || t.value("type", json()) != "function" || !t.contains("function") ||
                !t["function"].is_object())
                return bad(p + " must be {\"type\": \"function\", \"function\": {\"name\", ...}}", p);
            TANDEM_TRY(check_keys(t, p, {"type", "function"}));
            const json& fn = t["function"];
            TANDEM_TRY(check_keys(fn, p + ".function", {"name", "description", "parameters", "strict"}));
            const std::string name = fn.value("name", json()).is_string() ? fn["name"].get<std::string>() : "";
            if (!valid_function_name(name))
                return bad(p + ".function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -", p + ".function.name");
            if (!names.insert(name).second) return bad(fmt::format("two tools are named '{}'", name), p + ".function.name");
            if (fn.contains("description") && !fn["description"].is_string())
                return bad(p + ".function.description must be a string", p + ".function.description");
            if (fn.contains("strict") && !fn["strict"].is_boolean())
                return bad(p + ".function.strict must be a boolean", p + ".function.strict");
            std::string params;
            if (const auto ps = fn.find("parameters"); ps != fn.end() && !ps->is_null()) {
                if (!ps->is_object()) return bad(p + ".function.parameters must be a JSON Schema object", p + ".function.parameters");
                params = ps->dump();
            }
            out.functions.push_back({name, std::move(params)});
            out.defs.push_back(t.dump());
        }
    }
    if (const auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
        if (it->is_string()) {
            out.choice = it->get<std::string>();
            if (out.choice != "none" && out.choice != "auto" && out.choice != "required")
                return bad(fmt::format("'tool_choice' \"{}\" is not supported (none, auto, required, or "
                                       "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}})",
                                       out.choice),
                           "tool_choice");
        } else if (it->is_object() && it->value("type", json()) == "function" && it->contains("function") &&
                   (*it)["function"].is_object() && (*it)["function"].value("name", json()).is_string()) {
            TANDEM_TRY(check_keys(*it, "tool_choice", {"type", "function"}));
            TANDEM_TRY(check_keys((*it)["function"], "tool_choice.function", {"name"}));
            out.choice = "function";
            out.named = (*it)["function"]["name"].get<std::string>();
            if (std::none_of(out.functions.begin(), out.functions.end(), [&](const auto& f) { return f.name == out.named; }))
                return bad(fmt::format("'tool_choice' names '{}', which is not in 'tools'", out.named), "tool_choice");
        } else {
            return bad("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}",
                       "tool_choice");
        }
        if (out.functions.empty() && out.choice != "none" && out.choice != "auto")
            return bad(fmt::format("'tool_choice' \"{}\" needs 'tools'", out.choice), "tool_choice");
    }
    TANDEM_TRY(read_bool(body, "parallel_tool_calls", out.parallel));
    return std::nullopt;
}

// The extension `speculative: {"method": "ngram" | "draft" | "off", "num_tokens": k}`: this
// request's drafts (prompt lookup, or the daemon's draft model), at most the daemon's
// draft_tokens (which sizes the decode steps).
field_error read_speculative(const json& body, const config& cfg, int32_t& draft_tokens,
                                          draft_source& drafts) {
    auto it = body.find("speculative");
    if (it == body.end() || it->is_null()) return std::nullopt; // the daemon's draft_tokens and drafts
    if (!it->is_object()) return bad("'speculative' must be an object", "speculative");
    TANDEM_TRY(check_keys(*it, "speculative", {"method", "num_tokens"}));
    std::string method = cfg.draft_model.empty() ? "ngram" : "draft";
    if (auto m = it->find("method"); m != it->end() && !m->is_null()) {
        if (!m->is_string()) return bad("'speculative.method' must be a string", "speculative.method");
        method = m->get<std::string>();
    }
    if (method == "off") {
        if (it->contains("num_tokens"))
            return bad("'speculative.num_tokens' has no meaning with method \"off\"", "speculative.num_tokens");
        draft_tokens = 0;
        return std::nullopt;
    }
    if (method == "draft" && cfg.draft_model.empty())
        return bad("'speculative.method' \"draft\" needs a draft model: none is loaded (draft_model in tandemd.conf)",
                   "speculative.method");
    if (method != "ngram" && method != "draft")
        return bad(fmt::format("'speculative.method' must be \"ngram\", \"draft\" or \"off\", not \"{}\"", method),
                   "speculative.method");
    const int32_t limit = cfg.speculative_tokens();
    if (limit == 0)
        return bad("speculative decoding is off in this daemon (draft_tokens = 0 in tandemd.conf)", "speculative");
    int64_t k = limit;
    TANDEM_TRY(read_int(*it, "num_tokens", 1, limit, k, "speculative"));
    draft_tokens = int32_t(k);
    drafts = method == "draft" ? draft_source::model : draft_source::ngram;
    return std::nullopt;
}

// A schema given as an object (or true/false), or as JSON text (parsed under the body's
// nesting limit: the text is not checked with the body).
field_error schema_text(const json& v, const std::string& field, int max_depth, std::string& out) {
    if (v.is_object() || v.is_boolean()) {
        out = v.dump();
        return std::nullopt;
    }
    if (v.is_string()) {
        std::string why;
        const std::optional<json> parsed = parse_json_limited<json>(v.get<std::string>(), max_depth, why);
        if (parsed && (parsed->is_object() || parsed->is_boolean())) {
            out = parsed->dump();
            return std::nullopt;
        }
        if (!parsed && why.starts_with("nested")) return bad(fmt::format("'{}' is a string that is {}", field, why), field);
    }
    return bad(fmt::format("'{}' must be a JSON Schema (an object)", field), field);
}

field_error read_response_format(const json& rf, int max_depth, std::vector<found_constraint>& found) {
    if (!rf.is_object()) return bad("'response_format' must be an object", "response_format");
    const auto type = rf.find("type");
    if (type == rf.end() || !type->is_string())
        return bad("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"", "response_format.type");
    if (*type == "json_schema") TANDEM_TRY(check_keys(rf, "response_format", {"type", "json_schema"}));
    else TANDEM_TRY(check_keys(rf, "response_format", {"type"}));
    if (*type == "text") return std::nullopt;
    if (*type == "json_object") {
        found.push_back({"response_format", {grammar::constraint::kind::json_object, ""}});
        return std::nullopt;
    }
    if (*type != "json_schema")
        return bad(fmt::format("'response_format.type' \"{}\" is not supported (text, json_object, json_schema)",
                               type->get<std::string>()),
                   "response_format.type");
    const auto js = rf.find("json_schema");
    if (js == rf.end() || !js->is_object() || !js->contains("schema"))
        return bad("'response_format.json_schema' must be an object with a 'schema'", "response_format.json_schema");
    TANDEM_TRY(check_keys(*js, "response_format.json_schema", {"name", "schema", "strict", "description"}));
    grammar::constraint c{grammar::constraint::kind::json_schema, ""};
    TANDEM_TRY(schema_text((*js)["schema"], "response_format.json_schema.schema", max_depth, c.text));
    // strict (OpenAI's): an object writes the keys its schema names, no others the schema
    // would tolerate (every text still valid under it; runtime/grammar closed_objects)
    bool strict = false;
    TANDEM_TRY(read_bool(*js, "strict", strict, "response_format.json_schema"));
    c.closed_objects = strict;
    found.push_back({"response_format", std::move(c)});
    return std::nullopt;
}

// One structured-outputs form, `key` of `field` (json, regex, choice, grammar, json_object).
field_error read_structured(const std::string& field, const std::string& key, const json& v,
                                         int max_depth, std::vector<found_constraint>& found) {
    using kind = grammar::constraint::kind;
    grammar::constraint c;
    if (key == "json") {
        c.k = kind::json_schema;
        TANDEM_TRY(schema_text(v, field, max_depth, c.text));
    } else if (key == "regex" || key == "grammar") {
        if (!v.is_string()) return bad(fmt::format("'{}' must be a string", field), field);
        c.k = key == "regex" ? kind::regex : kind::gbnf;
        c.text = v.get<std::string>();
    } else if (key == "choice") {
        if (!v.is_array() || v.empty() || !std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_string(); }))
            return bad(fmt::format("'{}' must be a non-empty array of strings", field), field);
        c.k = kind::choice;
        c.text = v.dump();
    } else if (key == "json_object") {
        if (!v.is_boolean()) return bad(fmt::format("'{}' must be a boolean", field), field);
        if (!v.get<bool>()) return std::nullopt;
        c.k = kind::json_object;
    } else {
        return bad(fmt::format("'{}' is not supported (json, regex, choice, grammar, json_object)", field), field);
    }
    found.push_back({field, std::move(c)});
    return std::nullopt;
}

field_error read_constraint(const json& body, int max_depth, std::optional<found_constraint>& out) {
    std::vector<found_constraint> found;
    const auto given = [&](const char* key) {
        const auto it = body.find(key);
        return it != body.end() && !it->is_null() ? &*it : nullptr;
    };
    if (const json* rf = given("response_format")) TANDEM_TRY(read_response_format(*rf, max_depth, found));
    if (const json* so = given("structured_outputs")) {
        if (!so->is_object()) return bad("'structured_outputs' must be an object", "structured_outputs");
        for (const auto& [key, value] : so->items())
            if (!value.is_null()) TANDEM_TRY(read_structured("structured_outputs." + key, key, value, max_depth, found));
    }
    for (const char* key : {"json", "regex", "choice", "grammar"})
        if (const json* v = given(fmt::format("guided_{}", key).c_str()))
            TANDEM_TRY(read_structured(fmt::format("guided_{}", key), key, *v, max_depth, found));
    if (const json* v = given("json_schema")) TANDEM_TRY(read_structured("json_schema", "json", *v, max_depth, found));
    if (const json* v = given("grammar")) TANDEM_TRY(read_structured("grammar", "grammar", *v, max_depth, found));
    if (found.size() > 1)
        return bad(fmt::format("one output constraint per request: '{}' and '{}' are both given", found[0].first,
                               found[1].first),
                   found[1].first);
    if (!found.empty()) out = std::move(found[0]);
    return std::nullopt;
}

// use_beam_search (a search of width best_of), length_penalty and early_stopping (true, false
// or "never"), which only beam search takes.
field_error read_beam(const json& body, int64_t width, beam_params& out) {
    bool on = false;
    TANDEM_TRY(read_bool(body, "use_beam_search", on));
    if (!on) {
        for (const char* key : {"length_penalty", "early_stopping"})
            if (body.contains(key) && !body[key].is_null())
                return bad(fmt::format("'{}' applies only to beam search ('use_beam_search': true)", key), key);
        return std::nullopt;
    }
    out.width = int32_t(width);
    double lp = 1;
    TANDEM_TRY(read_number(body, "length_penalty", -10, 10, lp));
    out.length_penalty = float(lp);
    if (auto it = body.find("early_stopping"); it != body.end() && !it->is_null()) {
        if (it->is_boolean())
            out.early_stopping = it->get<bool>() ? beam_params::stopping::early : beam_params::stopping::heuristic;
        else if (*it == "never")
            out.early_stopping = beam_params::stopping::never;
        else
            return bad("'early_stopping' must be true, false or \"never\"", "early_stopping");
    }
    return std::nullopt;
}

// documents (chat): [{"text", "id"?, "title"?}] (ids default to the index), and
// citation_options: {"mode": "fast" | "strict" | "off", "min_tokens"}.
field_error read_grounding(const json& body, int64_t max_bytes, grounding& out) {
    int64_t n_bytes = 0;
    const auto given = [&](const char* key) { return body.contains(key) && !body[key].is_null(); };
    if (!given("documents")) {
        if (given("citation_options")) return bad("'citation_options' needs 'documents'", "citation_options");
        return std::nullopt;
    }
    const json& docs = body["documents"];
    if (!docs.is_array()) return bad("'documents' must be an array of objects", "documents");
    for (size_t i = 0; i < docs.size(); ++i) {
        const std::string p = fmt::format("documents[{}]", i);
        if (!docs[i].is_object()) return bad(p + " must be an object", p);
        document d;
        d.id = std::to_string(i);
        TANDEM_TRY(check_keys(docs[i], p, {"text", "id", "title"}));
        for (const auto& [key, v] : docs[i].items()) {
            const std::string q = p + "." + key;
            if (!v.is_string()) return bad(fmt::format("'{}' must be a string", q), q);
            (key == "text" ? d.text : key == "id" ? d.id : d.title) = v.get<std::string>();
        }
        if (!docs[i].contains("text")) return bad(fmt::format("'{}.text' is required", p), p + ".text");
        n_bytes += int64_t(d.text.size() + d.id.size() + d.title.size());
        if (n_bytes > max_bytes) {
            api_error e = bad(fmt::format("'documents' hold more than {} bytes (max_document_bytes in tandemd.conf)",
                                          max_bytes),
                              "documents");
            e.code = "documents_too_large";
            return e;
        }
        out.documents.push_back(std::move(d));
    }
    if (!given("citation_options")) return std::nullopt;
    const json& o = body["citation_options"];
    if (!o.is_object()) return bad("'citation_options' must be an object", "citation_options");
    TANDEM_TRY(check_keys(o, "citation_options", {"mode", "min_tokens"}));
    if (o.contains("mode") && !o["mode"].is_null()) {
        const json& m = o["mode"];
        if (m != "fast" && m != "strict" && m != "off")
            return bad("'citation_options.mode' must be \"fast\", \"strict\" or \"off\"", "citation_options.mode");
        out.cite = m != "off";
        out.strict = m == "strict";
    }
    if (!out.cite && o.contains("min_tokens") && !o["min_tokens"].is_null())
        return bad("'citation_options.min_tokens' has no meaning with mode \"off\"", "citation_options.min_tokens");
    int64_t min_tokens = out.min_tokens;
    TANDEM_TRY(read_int(o, "min_tokens", 1, 256, min_tokens, "citation_options"));
    out.min_tokens = int32_t(min_tokens);
    return std::nullopt;
}

} // namespace tandem::daemon
