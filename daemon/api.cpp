// Request validation and response JSON of the OpenAI-compatible API (no exceptions: every
// client mistake is an api_error value).
#include "daemon/api.hpp"

#include "runtime/grammar/guide.hpp"
#include "runtime/grammar/tool_call.hpp"
#include "runtime/json_limits.hpp"
#include "runtime/log.hpp"
#include "runtime/tokenizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <ctime>
#include <limits>
#include <random>
#include <set>

namespace tandem::daemon {
namespace {

api_error bad(std::string msg, std::string param = {}) {
    api_error e;
    e.message = std::move(msg);
    e.param = std::move(param);
    return e;
}

// The place of `key` in the object at `where` ("" for the body): "stream_options.include_usage".
std::string place(std::string_view where, std::string_view key) {
    return where.empty() ? std::string(key) : fmt::format("{}.{}", where, key);
}

// Optional fields of the object j at `where`: absent or null leave `out` as it is; a value of
// the wrong type or out of range is a 400 that names its place.
std::optional<api_error> read_number(const json& j, const char* key, double lo, double hi, double& out,
                                     std::string_view where = {}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    const std::string q = place(where, key);
    if (!it->is_number()) return bad(fmt::format("'{}' must be a number", q), q);
    const double v = it->get<double>();
    if (!(v >= lo && v <= hi)) return bad(fmt::format("'{}' must be between {} and {}", q, lo, hi), q);
    out = v;
    return std::nullopt;
}

// An integer, or a number with an integral value (4.0, as JSON encoders of floats write it).
std::optional<api_error> read_int(const json& j, const char* key, int64_t lo, int64_t hi, int64_t& out,
                                  std::string_view where = {}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    const std::string q = place(where, key);
    const auto out_of_range = [&] { return bad(fmt::format("'{}' must be between {} and {}", q, lo, hi), q); };
    int64_t v = 0;
    if (it->is_number_float()) {
        const double d = it->get<double>();
        if (d != std::floor(d)) return bad(fmt::format("'{}' must be an integer", q), q);
        if (!(d >= -0x1p63 && d < 0x1p63)) return out_of_range();
        v = int64_t(d);
    } else if (it->is_number_integer()) {
        if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(hi)) return out_of_range();
        v = it->get<int64_t>();
    } else {
        return bad(fmt::format("'{}' must be an integer", q), q);
    }
    if (v < lo || v > hi) return out_of_range();
    out = v;
    return std::nullopt;
}

std::optional<api_error> read_bool(const json& j, const char* key, bool& out, std::string_view where = {}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    const std::string q = place(where, key);
    if (!it->is_boolean()) return bad(fmt::format("'{}' must be a boolean", q), q);
    out = it->get<bool>();
    return std::nullopt;
}

// The keys of the object j, found at `where` ("messages[2]", "tools[0].function"), must be
// among `known`: any other is a 400 naming it ("'messages[2].name' is not supported (role,
// content, ...)"), so nothing nested is silently ignored either. A key in `asks_nothing` (or,
// when null_passes, any key whose value is null or an empty array) passes: it asks for nothing.
std::optional<api_error> check_keys(const json& j, const std::string& where, std::initializer_list<std::string_view> known,
                                    bool null_passes = false, std::initializer_list<std::string_view> asks_nothing = {}) {
    for (const auto& item : j.items()) { // (clang 14: a lambda cannot capture a structured binding)
        const std::string& key = item.key();
        const json& value = item.value();
        const auto is = [&](std::string_view k) { return k == key; };
        if (std::any_of(known.begin(), known.end(), is) || std::any_of(asks_nothing.begin(), asks_nothing.end(), is))
            continue;
        if (null_passes && (value.is_null() || (value.is_array() && value.empty()))) continue;
        std::string list;
        for (const std::string_view k : known) list += fmt::format("{}{}", list.empty() ? "" : ", ", k);
        const std::string q = where.empty() ? key : where + "." + key;
        return bad(fmt::format("'{}' is not supported ({})", q, list), q);
    }
    return std::nullopt;
}

bool all_ints(const json& a) {
    for (const auto& x : a)
        if (!x.is_number_integer()) return false;
    return true;
}

// The prompts of a completions request (or the inputs of an embeddings request, `key`) as
// token ids (string, [string], [int], [[int]]).
std::variant<std::vector<std::vector<token_id>>, api_error> read_prompts(const json& body, const tokenizer& tok,
                                                                          const std::string& key = "prompt") {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return bad(fmt::format("'{}' is required", key), key);
    std::vector<std::vector<token_id>> out;
    auto ids = [&](const json& a) -> std::optional<api_error> {
        std::vector<token_id> v;
        for (const auto& x : a) {
            const int64_t id = x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT32_MAX) ? -1 : x.get<int64_t>();
            if (id < 0 || id >= tok.n_vocab())
                return bad(fmt::format("token id {} is out of range (vocabulary of {})", x.dump(), tok.n_vocab()),
                           key);
            v.push_back(token_id(id));
        }
        if (v.empty()) return bad(fmt::format("a token {} must not be empty", key), key);
        out.push_back(std::move(v));
        return std::nullopt;
    };
    if (it->is_string()) {
        out.push_back(tok.encode(it->get<std::string>(), true, false));
    } else if (it->is_array() && !it->empty() && all_ints(*it)) {
        if (auto e = ids(*it)) return *e;
    } else if (it->is_array() && !it->empty()) {
        for (const auto& p : *it) {
            if (p.is_string()) out.push_back(tok.encode(p.get<std::string>(), true, false));
            else if (p.is_array() && all_ints(p)) {
                if (auto e = ids(p)) return *e;
            } else
                return bad(fmt::format("'{}' must be a string, an array of strings, or token ids", key), key);
        }
    } else {
        return bad(fmt::format("'{}' must be a string, an array of strings, or token ids", key), key);
    }
    for (auto& p : out)
        if (p.empty()) p.push_back(tok.bos() >= 0 ? tok.bos() : 0); // "" with no BOS still needs a token
    return out;
}

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        if (auto e_ = (expr)) return *e_;                                                          \
    } while (0)

// A prompt over the limit: a 400 with both numbers and what to change (the prompt, the
// request's truncate_prompt_tokens, or the daemon's config); never cut silently.
api_error prompt_too_long(const std::string& what, size_t n_tokens, const model_state& ms, const std::string& param) {
    const int32_t n_train = ms.bundle.cfg.n_ctx_train;
    std::string limit, change;
    if (ms.max_prompt_tokens < ms.n_ctx - 1) { // the config's own limit binds
        limit = fmt::format("max_prompt_tokens in tandemd.conf; the context is {}", ms.n_ctx);
        change = "raise max_prompt_tokens in tandemd.conf";
    } else if (ms.n_ctx < n_train) {
        limit = fmt::format("n_ctx {} less one", ms.n_ctx);
        change = fmt::format("raise n_ctx in tandemd.conf (the model's training context is {})", n_train);
    } else {
        limit = fmt::format("n_ctx {}, the model's training context, less one", ms.n_ctx);
    }
    api_error e = bad(fmt::format("{} has {} tokens, more than the {} this daemon accepts ({}): shorten it, send "
                                  "'truncate_prompt_tokens' (1 to {}) to keep its last tokens{}",
                                  what, n_tokens, ms.max_prompt_tokens, limit, ms.max_prompt_tokens,
                                  change.empty() ? "" : ", or " + change),
                      param);
    e.code = "context_length_exceeded";
    return e;
}

// truncate_prompt_tokens (vLLM's name): keep the last N tokens of each prompt longer than N
// (1 <= N <= max_prompt_tokens); 0 when the request does not ask.
std::optional<api_error> read_truncation(const json& body, const model_state& ms, int32_t& out) {
    int64_t n = 0;
    if (auto e = read_int(body, "truncate_prompt_tokens", 1, ms.max_prompt_tokens, n)) {
        e->message += fmt::format(" (the tokens of each prompt to keep, its last; at most max_prompt_tokens, {})",
                                  ms.max_prompt_tokens);
        return e;
    }
    out = int32_t(n);
    return std::nullopt;
}

// Applies truncate_prompt_tokens n (> 0) to each prompt: its last n tokens, as they are (a BOS
// at the start is not added back). Returns the tokens dropped from each.
std::vector<int32_t> truncate_prompts(std::vector<std::vector<token_id>>& prompts, int32_t n) {
    std::vector<int32_t> dropped;
    for (auto& p : prompts) {
        const int32_t cut = std::max<int32_t>(0, int32_t(p.size()) - n);
        p.erase(p.begin(), p.begin() + cut);
        dropped.push_back(cut);
    }
    return dropped;
}

// "model": absent, null, or the one this daemon serves (else 404, as OpenAI answers).
std::optional<api_error> read_model(const json& body, const model_state& ms) {
    auto it = body.find("model");
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (!it->is_string()) return bad("'model' must be a string", "model");
    if (it->get<std::string>() == ms.id) return std::nullopt;
    api_error e =
        bad(fmt::format("The model '{}' does not exist; this daemon serves '{}'", it->get<std::string>(), ms.id), "model");
    e.status = 404;
    e.code = "model_not_found";
    return e;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}].
std::optional<api_error> read_message_calls(const json& calls, const std::string& p, std::vector<chat_tool_call>& out) {
    if (!calls.is_array()) return bad(p + " must be an array", p);
    for (size_t k = 0; k < calls.size(); ++k) {
        const json& c = calls[k];
        const std::string q = fmt::format("{}[{}]", p, k);
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
            return bad(q + " must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}", q);
        TRY(check_keys(c, q, {"id", "type", "function"}, false, {"index"})); // index: a streamed delta's, echoed
        TRY(check_keys(c["function"], q + ".function", {"name", "arguments"}));
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

std::optional<api_error> read_messages(const json& body, std::vector<chat_message>& out) {
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
            TRY(check_keys(m, p, {"role", "content", "tool_calls"}, true, {"citations", "unsupported"}));
        else if (role == "tool")
            TRY(check_keys(m, p, {"role", "content", "tool_call_id"}));
        else
            TRY(check_keys(m, p, {"role", "content"}));
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
            TRY(read_message_calls(*calls, p + ".tool_calls", cm.tool_calls));
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
                TRY(check_keys(part, fmt::format("{}.content[{}]", p, k), {"type", "text"}));
                cm.content += part["text"].get<std::string>();
            }
        } else {
            return bad(p + ".content must be a string or an array of text parts", p + ".content");
        }
        out.push_back(std::move(cm));
    }
    return std::nullopt;
}

std::optional<api_error> read_stop(const json& body, int32_t max_bytes, std::vector<std::string>& out) {
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
    for (size_t i = 0; i < it->size(); ++i) TRY(take((*it)[i], fmt::format("stop[{}]", i)));
    return std::nullopt;
}

std::optional<api_error> read_logit_bias(const json& body, int32_t n_vocab,
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

// Tool calling's request fields: the functions offered (`tools`), `tool_choice` and
// `parallel_tool_calls`.
struct tools_request {
    std::vector<grammar::tool_function> functions;
    std::vector<std::string> defs; // each tool object as JSON text, for the chat template
    std::string choice = "auto";   // none, auto, required, or "function" (the one named)
    std::string named;
    bool parallel = true;
    bool active() const { return !functions.empty() && choice != "none"; }
};

bool valid_function_name(const std::string& n) {
    if (n.empty() || n.size() > 64) return false;
    return std::all_of(n.begin(), n.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    });
}

std::optional<api_error> read_tools(const json& body, tools_request& out) {
    if (const auto it = body.find("tools"); it != body.end() && !it->is_null()) {
        if (!it->is_array()) return bad("'tools' must be an array of {\"type\": \"function\", \"function\": {...}}", "tools");
        std::set<std::string> names;
        for (size_t i = 0; i < it->size(); ++i) {
            const json& t = (*it)[i];
            const std::string p = fmt::format("tools[{}]", i);
            if (!t.is_object() || t.value("type", json()) != "function" || !t.contains("function") ||
                !t["function"].is_object())
                return bad(p + " must be {\"type\": \"function\", \"function\": {\"name\", ...}}", p);
            TRY(check_keys(t, p, {"type", "function"}));
            const json& fn = t["function"];
            TRY(check_keys(fn, p + ".function", {"name", "description", "parameters", "strict"}));
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
            TRY(check_keys(*it, "tool_choice", {"type", "function"}));
            TRY(check_keys((*it)["function"], "tool_choice.function", {"name"}));
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
    TRY(read_bool(body, "parallel_tool_calls", out.parallel));
    return std::nullopt;
}

} // namespace

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_body(const api_error& e) {
    json j = {{"error",
               {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
    return dump(j);
}

reply reply::of(const api_error& e) { return {e.status, "application/json", error_body(e), e.retry_after_s}; }
reply reply::of_json(const json& j, int status) { return {status, "application/json", dump(j), 0}; }

// The extension `speculative: {"method": "ngram" | "draft" | "off", "num_tokens": k}`: this
// request's drafts (prompt lookup, or the daemon's draft model), at most the daemon's
// draft_tokens (which sizes the decode steps).
std::optional<api_error> read_speculative(const json& body, const config& cfg, int32_t& draft_tokens,
                                          draft_source& drafts) {
    auto it = body.find("speculative");
    if (it == body.end() || it->is_null()) return std::nullopt; // the daemon's draft_tokens and drafts
    if (!it->is_object()) return bad("'speculative' must be an object", "speculative");
    TRY(check_keys(*it, "speculative", {"method", "num_tokens"}));
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
    TRY(read_int(*it, "num_tokens", 1, limit, k, "speculative"));
    draft_tokens = int32_t(k);
    drafts = method == "draft" ? draft_source::model : draft_source::ngram;
    return std::nullopt;
}

// Guided generation: at most one output constraint, from OpenAI's `response_format`, vLLM's
// `structured_outputs` (or its older `guided_*` fields), or llama.cpp's `json_schema` and
// `grammar`. Each found is (the field that gave it, the constraint).
using found_constraint = std::pair<std::string, grammar::constraint>;

// A schema given as an object (or true/false), or as JSON text (parsed under the body's
// nesting limit: the text is not checked with the body).
std::optional<api_error> schema_text(const json& v, const std::string& field, int max_depth, std::string& out) {
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
        if (!parsed) return bad(fmt::format("'{}' is a string that is {}", field, why), field);
    }
    return bad(fmt::format("'{}' must be a JSON Schema (an object)", field), field);
}

std::optional<api_error> read_response_format(const json& rf, int max_depth, std::vector<found_constraint>& found) {
    if (!rf.is_object()) return bad("'response_format' must be an object", "response_format");
    const auto type = rf.find("type");
    if (type == rf.end() || !type->is_string())
        return bad("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"", "response_format.type");
    if (*type == "json_schema") TRY(check_keys(rf, "response_format", {"type", "json_schema"}));
    else TRY(check_keys(rf, "response_format", {"type"}));
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
    TRY(check_keys(*js, "response_format.json_schema", {"name", "schema", "strict", "description"}));
    grammar::constraint c{grammar::constraint::kind::json_schema, ""};
    TRY(schema_text((*js)["schema"], "response_format.json_schema.schema", max_depth, c.text));
    found.push_back({"response_format", std::move(c)});
    return std::nullopt;
}

// One structured-outputs form, `key` of `field` (json, regex, choice, grammar, json_object).
std::optional<api_error> read_structured(const std::string& field, const std::string& key, const json& v,
                                         int max_depth, std::vector<found_constraint>& found) {
    using kind = grammar::constraint::kind;
    grammar::constraint c;
    if (key == "json") {
        c.k = kind::json_schema;
        TRY(schema_text(v, field, max_depth, c.text));
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

std::optional<api_error> read_constraint(const json& body, int max_depth, std::optional<found_constraint>& out) {
    std::vector<found_constraint> found;
    const auto given = [&](const char* key) {
        const auto it = body.find(key);
        return it != body.end() && !it->is_null() ? &*it : nullptr;
    };
    if (const json* rf = given("response_format")) TRY(read_response_format(*rf, max_depth, found));
    if (const json* so = given("structured_outputs")) {
        if (!so->is_object()) return bad("'structured_outputs' must be an object", "structured_outputs");
        for (const auto& [key, value] : so->items())
            if (!value.is_null()) TRY(read_structured("structured_outputs." + key, key, value, max_depth, found));
    }
    for (const char* key : {"json", "regex", "choice", "grammar"})
        if (const json* v = given(fmt::format("guided_{}", key).c_str()))
            TRY(read_structured(fmt::format("guided_{}", key), key, *v, max_depth, found));
    if (const json* v = given("json_schema")) TRY(read_structured("json_schema", "json", *v, max_depth, found));
    if (const json* v = given("grammar")) TRY(read_structured("grammar", "grammar", *v, max_depth, found));
    if (found.size() > 1)
        return bad(fmt::format("one output constraint per request: '{}' and '{}' are both given", found[0].first,
                               found[1].first),
                   found[1].first);
    if (!found.empty()) out = std::move(found[0]);
    return std::nullopt;
}

// use_beam_search (a search of width best_of), length_penalty and early_stopping (true, false
// or "never"), which only beam search takes.
std::optional<api_error> read_beam(const json& body, int64_t width, beam_params& out) {
    bool on = false;
    TRY(read_bool(body, "use_beam_search", on));
    if (!on) {
        for (const char* key : {"length_penalty", "early_stopping"})
            if (body.contains(key) && !body[key].is_null())
                return bad(fmt::format("'{}' applies only to beam search ('use_beam_search': true)", key), key);
        return std::nullopt;
    }
    out.width = int32_t(width);
    double lp = 1;
    TRY(read_number(body, "length_penalty", -10, 10, lp));
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
std::optional<api_error> read_grounding(const json& body, int64_t max_bytes, grounding& out) {
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
        TRY(check_keys(docs[i], p, {"text", "id", "title"}));
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
    TRY(check_keys(o, "citation_options", {"mode", "min_tokens"}));
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
    TRY(read_int(o, "min_tokens", 1, 256, min_tokens, "citation_options"));
    out.min_tokens = int32_t(min_tokens);
    return std::nullopt;
}

// Every field a generation request may carry; any other is a 400 that names it, so nothing a
// client asks for is silently ignored.
std::optional<api_error> check_fields(const json& body, bool chat) {
    static const std::set<std::string, std::less<>> common{
        "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stream", "stream_options", "stop",
        "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs", "user",
        "ignore_eos", "priority", "speculative", "best_of", "response_format", "structured_outputs", "guided_json",
        "guided_regex", "guided_choice", "guided_grammar", "json_schema", "grammar", "functions", "function_call",
        "use_beam_search", "length_penalty", "early_stopping", "truncate_prompt_tokens"};
    static const std::set<std::string, std::less<>> chat_only{"messages",          "max_completion_tokens",
                                                              "top_logprobs",      "tools",
                                                              "tool_choice",       "parallel_tool_calls",
                                                              "documents",         "citation_options"};
    static const std::set<std::string, std::less<>> completion_only{"prompt", "echo", "suffix"};
    for (const auto& [key, value] : body.items())
        if (!common.contains(key) && !(chat ? chat_only : completion_only).contains(key))
            return bad(fmt::format("'{}' is not supported", key), key);
    return std::nullopt;
}

std::variant<generation_plan, api_error> parse_generation(const json& body, bool chat, const model_state& ms,
                                                          const config& cfg) {
    if (!body.is_object()) return bad("the request body must be a JSON object");
    TRY(check_fields(body, chat));
    const tokenizer& tok = *ms.bundle.tok;
    generation_plan plan;
    plan.chat = chat;

    TRY(read_model(body, ms));
    for (const char* unsupported : {"suffix", "functions", "function_call"})
        if (auto it = body.find(unsupported); it != body.end() && !it->is_null() && !(it->is_array() && it->empty()))
            return bad(fmt::format("'{}' is not supported{}", unsupported,
                                   std::string_view(unsupported) == "suffix" ? "" : " (the deprecated form: use 'tools')"),
                       unsupported);
    bool echo = false;
    TRY(read_bool(body, "echo", echo));

    TRY(read_bool(body, "stream", plan.stream));
    if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
        if (!it->is_object()) return bad("'stream_options' must be an object", "stream_options");
        TRY(check_keys(*it, "stream_options", {"include_usage"}));
        TRY(read_bool(*it, "include_usage", plan.include_usage, "stream_options"));
    }

    // prompts
    std::vector<std::vector<token_id>> prompts;
    std::vector<std::string> stops;
    tools_request tools;
    std::optional<pending_grounding> grounded; // chat with documents
    if (chat) {
        std::vector<chat_message> messages;
        TRY(read_messages(body, messages));
        TRY(read_tools(body, tools));
        grounding ground;
        TRY(read_grounding(body, cfg.max_document_bytes, ground));
        if (!ground.documents.empty()) {
            if (tools.active()) return bad("'documents' and 'tools' cannot be used together yet", "documents");
            grounded.emplace();
            grounded->messages = messages;
            grounded->ground = std::move(ground);
            prompts.push_back(grounded_prompt(*grounded, grounded->ground.documents, ms)); // all of them, if they fit
        } else {
            // tool_choice "none": the model is not told of the tools, so it writes a message
            const std::string text =
                ms.tmpl.render(messages, true, tools.active() ? std::span(tools.defs) : std::span<const std::string>{});
            prompts.push_back(tok.encode(text, false, true));
        }
        stops = ms.tmpl.stop_strings();
    } else {
        auto p = read_prompts(body, tok);
        if (auto* e = std::get_if<api_error>(&p)) return *e;
        prompts = std::move(std::get<0>(p));
    }
    int32_t truncate = 0;
    TRY(read_truncation(body, ms, truncate));
    if (truncate > 0) {
        if (grounded) // (documents that do not fit are retrieved from instead: a cut prompt would lose them)
            return bad("'truncate_prompt_tokens' does not apply with 'documents': documents that do not fit the "
                       "context are retrieved from (passages)",
                       "truncate_prompt_tokens");
        plan.truncated = truncate_prompts(prompts, truncate);
        plan.truncate = true;
    }
    for (size_t k = 0; k < prompts.size(); ++k)
        if (int32_t(prompts[k].size()) > ms.max_prompt_tokens && !grounded) // (documents too long are retrieved from)
            return prompt_too_long(chat              ? std::string("the prompt (the messages in the chat template)")
                                   : prompts.size() > 1 ? fmt::format("prompt {}", k)
                                                        : std::string("the prompt"),
                                   prompts[k].size(), ms, chat ? "messages" : "prompt");

    // sampling and limits
    engine_request base;
    int64_t max_tokens = chat ? ms.max_tokens_limit : 16; // OpenAI's defaults: 16, chat until the end
    if (!echo && body.contains("max_tokens") && body["max_tokens"] == 0)
        return bad("'max_tokens' 0 needs 'echo': true (which scores the prompt)", "max_tokens");
    TRY(read_int(body, "max_tokens", echo ? 0 : 1, ms.max_tokens_limit, max_tokens)); // echo and 0: the prompt scored
    if (chat) TRY(read_int(body, "max_completion_tokens", 1, ms.max_tokens_limit, max_tokens));
    base.max_tokens = int32_t(max_tokens);
    double temperature = 1, top_p = 1, min_p = 0, rep = 1, presence = 0, frequency = 0;
    int64_t top_k = 0, seed = 0, n = 1;
    TRY(read_number(body, "temperature", 0, 2, temperature));
    TRY(read_number(body, "top_p", 0, 1, top_p));
    TRY(read_number(body, "min_p", 0, 1, min_p));
    TRY(read_number(body, "repetition_penalty", 0.01, 10, rep));
    TRY(read_number(body, "presence_penalty", -2, 2, presence));
    TRY(read_number(body, "frequency_penalty", -2, 2, frequency));
    TRY(read_int(body, "top_k", -1, tok.n_vocab(), top_k));
    TRY(read_int(body, "n", 1, std::numeric_limits<int32_t>::max(), n));
    int64_t best_of = n;
    TRY(read_int(body, "best_of", 1, std::numeric_limits<int32_t>::max(), best_of));
    for (const auto& [key, v] : {std::pair{"n", n}, std::pair{"best_of", best_of}})
        if (v > cfg.max_n)
            return bad(fmt::format("'{}' ({}) is over this daemon's limit of {} sequences a prompt (max_n in "
                                   "tandemd.conf; a beam search's width is best_of, or n)",
                                   key, v, cfg.max_n),
                       key);
    if (best_of < n)
        return bad(fmt::format("'best_of' ({}) must be at least 'n' ({})", best_of, n), "best_of");
    beam_params beam;
    TRY(read_beam(body, best_of, beam));
    if (beam.width == 0 && best_of > n && plan.stream)
        return bad("'best_of' greater than 'n' cannot stream: the best are known only at the end", "best_of");
    bool has_seed = body.contains("seed") && !body["seed"].is_null();
    TRY(read_int(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), seed));
    TRY(read_bool(body, "ignore_eos", base.ignore_eos));
    int64_t priority = 0;
    TRY(read_int(body, "priority", -1000, 1000, priority));
    base.priority = int32_t(priority);
    TRY(read_speculative(body, cfg, base.draft_tokens, base.drafts));
    TRY(read_stop(body, cfg.max_stop_bytes, base.stop));
    TRY(read_logit_bias(body, tok.n_vocab(), base.sampling.logit_bias));
    if (beam.width > 0) { // beam search is deterministic: no sampling knobs, nothing to verify
        const std::pair<const char*, bool> sampling[] = {
            {"temperature", temperature > 0}, {"top_p", top_p < 1}, {"top_k", top_k > 0}, {"min_p", min_p > 0}};
        for (const auto& [key, set] : sampling)
            if (body.contains(key) && set)
                return bad(fmt::format("'{}' does not apply to beam search, which is deterministic (leave it out, or "
                                       "give temperature 0)",
                                       key),
                           key);
        temperature = 0;
        if (body.contains("speculative") && !body["speculative"].is_null() && base.draft_tokens != 0)
            return bad("speculative decoding does not apply to beam search", "speculative");
    }

    // logprobs: completions take an int (0..20), chat a bool plus top_logprobs
    if (chat) {
        int64_t top = 0;
        TRY(read_bool(body, "logprobs", plan.logprobs));
        TRY(read_int(body, "top_logprobs", 0, 20, top));
        if (body.contains("top_logprobs") && !body["top_logprobs"].is_null() && !plan.logprobs)
            return bad("'top_logprobs' needs 'logprobs': true", "top_logprobs");
        base.n_top_logprobs = plan.logprobs ? int32_t(top) : -1;
    } else {
        int64_t lp = -1;
        TRY(read_int(body, "logprobs", 0, 20, lp));
        plan.logprobs = lp >= 0;
        base.n_top_logprobs = int32_t(lp);
    }

    base.sampling.temperature = float(temperature);
    base.sampling.top_p = float(top_p);
    base.sampling.min_p = float(min_p);
    base.sampling.top_k = int32_t(top_k);
    base.sampling.repetition_penalty = float(rep);
    base.sampling.presence_penalty = float(presence);
    base.sampling.frequency_penalty = float(frequency);
    for (const auto& s : stops) base.stop.push_back(s);

    std::optional<found_constraint> constraint;
    TRY(read_constraint(body, cfg.max_json_depth, constraint));
    std::string trigger; // tool_choice auto: free text until the model opens a call
    bool anchored = false;
    if (tools.active()) {
        if (constraint)
            return bad(fmt::format("'{}' and 'tools' cannot be used together (with tool_choice \"none\" they can)",
                                   constraint->first),
                       constraint->first);
        const grammar::tool_syntax syntax = ms.tmpl.tool_syntax();
        std::vector<grammar::tool_function> offered;
        for (const auto& f : tools.functions)
            if (tools.choice != "function" || f.name == tools.named) offered.push_back(f);
        constraint = found_constraint{
            "tools", {grammar::constraint::kind::tools,
                      grammar::tools_constraint_text(syntax, offered, tools.parallel && tools.choice != "function")}};
        if (tools.choice == "auto") {
            trigger = grammar::layout_of(syntax).trigger;
            anchored = grammar::layout_of(syntax).anchored;
        }
        plan.tools = tool_plan{syntax};
    }
    if (grounded && grounded->ground.strict && constraint) // quotes masked to document text: the one processor a request may add
        return bad(fmt::format("'{}' and strict citations cannot be used together", constraint->first),
                   constraint->first);
    if (constraint) {
        try {
            const auto budget = std::chrono::milliseconds(cfg.grammar_compile_ms);
            base.make_processor = [guides = ms.guides.get(), cache = ms.guides->get(constraint->second, budget), trigger,
                                   anchored] { return guides->make_processor(cache, trigger, anchored); };
        } catch (const grammar::grammar_error& e) {
            api_error err = bad(fmt::format("'{}' cannot be used: {}", constraint->first, e.what()), constraint->first);
            err.code = "invalid_constraint";
            return err;
        }
    }

    plan.n = int32_t(n);
    plan.beam = beam.width > 0;
    plan.n_seqs = plan.beam ? int32_t(n) : int32_t(best_of); // beams come back ranked by the engine
    base.n = plan.n_seqs;
    base.beam = beam;
    // echo with logprobs scores the prompt (and with max_tokens 0 is only that)
    base.score_prompt = echo && (plan.logprobs || max_tokens == 0);
    if (has_seed) base.sampling.seed = uint64_t(seed); // sequence i samples with seed + i
    if (grounded) {
        // The documents are retrieved from when, rendered whole, they leave the reply less than
        // min(max_tokens, a quarter of the context).
        grounded->base = std::move(base);
        grounded->budget = std::min(ms.max_prompt_tokens, ms.n_ctx - std::min<int32_t>(int32_t(max_tokens), ms.n_ctx / 4));
        grounded->query = question_of(grounded->messages);
        if (int32_t(prompts[0].size()) <= grounded->budget) {
            const std::vector<document> docs = grounded->ground.documents;
            ground_plan(plan, *grounded, docs, std::move(prompts[0]), ms);
        } else {
            plan.retrieval = std::move(grounded);
        }
        return plan;
    }
    for (const auto& p : prompts) {
        engine_request r = base;
        r.prompt = p;
        if (echo) plan.echo.push_back(tok.decode(p));
        plan.requests.push_back(std::move(r));
    }
    return plan;
}

std::variant<embedding_plan, api_error> parse_embeddings(const json& body, const model_state& ms, const config& cfg) {
    if (!body.is_object()) return bad("the request body must be a JSON object");
    TRY(check_keys(body, "", {"model", "input", "encoding_format", "dimensions", "user", "priority",
                              "truncate_prompt_tokens"}));
    const tokenizer& tok = *ms.bundle.tok;
    TRY(read_model(body, ms));
    if (auto e = embeddings_unavailable(ms)) return *e;
    embedding_plan plan;
    if (auto it = body.find("input"); it != body.end()) { // (nothing to embed: OpenAI refuses it too)
        const auto empty = [](const json& x) { return x == ""; };
        if (empty(*it) || (it->is_array() && std::any_of(it->begin(), it->end(), empty)))
            return bad("an 'input' must not be an empty string", "input");
    }
    auto inputs = read_prompts(body, tok, "input");
    if (auto* e = std::get_if<api_error>(&inputs)) return *e;
    plan.inputs = std::move(std::get<0>(inputs));
    constexpr size_t max_inputs = 2048; // OpenAI's limit
    if (plan.inputs.size() > max_inputs)
        return bad(fmt::format("'input' has {} items; at most {} are accepted", plan.inputs.size(), max_inputs), "input");
    int32_t truncate = 0;
    TRY(read_truncation(body, ms, truncate));
    if (truncate > 0) {
        plan.truncate = true;
        for (const int32_t n : truncate_prompts(plan.inputs, truncate)) plan.n_truncated += n;
    }
    for (size_t i = 0; i < plan.inputs.size(); ++i)
        if (int32_t(plan.inputs[i].size()) > ms.max_prompt_tokens)
            return prompt_too_long(fmt::format("input {}", i), plan.inputs[i].size(), ms, "input");
    // The reply holds inputs x n_embd numbers as text (a short body could ask for gigabytes).
    if (const int64_t n = int64_t(plan.inputs.size()) * ms.bundle.cfg.n_embd; n > cfg.max_embedding_floats)
        return bad(fmt::format("'input' has {} items of {} dimensions each: {} numbers, more than the {} one reply "
                               "holds (max_embedding_floats in tandemd.conf); send fewer inputs a request",
                               plan.inputs.size(), ms.bundle.cfg.n_embd, n, cfg.max_embedding_floats),
                   "input");
    if (auto it = body.find("encoding_format"); it != body.end() && !it->is_null()) {
        if (*it != "float" && *it != "base64")
            return bad("'encoding_format' must be \"float\" or \"base64\"", "encoding_format");
        plan.base64 = *it == "base64";
    }
    const int64_t n_embd = ms.bundle.cfg.n_embd;
    int64_t dims = n_embd;
    TRY(read_int(body, "dimensions", 1, std::numeric_limits<int32_t>::max(), dims));
    if (dims != n_embd) // a model not trained for shorter vectors (Matryoshka) has no meaningful prefix
        return bad(fmt::format("this model's embeddings have {} dimensions; 'dimensions' can only be {}", n_embd, n_embd),
                   "dimensions");
    if (auto it = body.find("user"); it != body.end() && !it->is_null() && !it->is_string())
        return bad("'user' must be a string", "user");
    int64_t priority = 0;
    TRY(read_int(body, "priority", -1000, 1000, priority));
    plan.priority = int32_t(priority);
    return plan;
}

namespace {

// RFC 4648 base64 of raw bytes (OpenAI's encoding_format "base64": the float32 array's bytes).
std::string base64(std::span<const uint8_t> in) {
    static constexpr char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    out.reserve((in.size() + 2) / 3 * 4);
    for (size_t i = 0; i < in.size(); i += 3) {
        const uint32_t n = uint32_t(in[i]) << 16 | (i + 1 < in.size() ? uint32_t(in[i + 1]) << 8 : 0) |
                           (i + 2 < in.size() ? uint32_t(in[i + 2]) : 0);
        out += digits[n >> 18 & 63];
        out += digits[n >> 12 & 63];
        out += i + 1 < in.size() ? digits[n >> 6 & 63] : '=';
        out += i + 2 < in.size() ? digits[n & 63] : '=';
    }
    return out;
}

} // namespace

json embeddings_response(const embedding_plan& plan, const std::vector<std::vector<float>>& vectors,
                         const std::string& model) {
    static_assert(std::endian::native == std::endian::little, "base64 embeddings are little-endian float32");
    json data = json::array();
    int64_t n_tokens = 0;
    for (size_t i = 0; i < vectors.size(); ++i) {
        json v = plan.base64 ? json(base64({reinterpret_cast<const uint8_t*>(vectors[i].data()),
                                            vectors[i].size() * sizeof(float)}))
                             : json(vectors[i]);
        data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::move(v)}});
        n_tokens += int64_t(plan.inputs[i].size());
    }
    json usage = {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}};
    if (plan.truncate) usage["truncated_prompt_tokens"] = plan.n_truncated;
    return json{{"object", "list"}, {"data", std::move(data)}, {"model", model}, {"usage", std::move(usage)}};
}

std::optional<api_error> embeddings_unavailable(const model_state& ms) {
    const model_config& c = ms.bundle.cfg;
    if (c.n_embd <= c.n_vocab) return std::nullopt;
    api_error e{400,
                fmt::format("this model's hidden states ({} floats) are wider than its output rows ({} logits), which "
                            "carry them: it has no embeddings here",
                            c.n_embd, c.n_vocab),
                "invalid_request_error", "", "embeddings_unavailable"};
    return e;
}

api_error submit_error(submit_status s) {
    if (s == submit_status::queue_full)
        return {429, "the daemon is at capacity; try again shortly", "server_error", "", "server_busy", 1};
    if (s == submit_status::too_long)
        return {400, "the prompt and max_tokens do not fit in the context or the KV cache", "invalid_request_error",
                "max_tokens", "context_length_exceeded"};
    return {503, "the daemon is shutting down", "server_error", "", "shutting_down", 5};
}

std::vector<token_id> grounded_prompt(const pending_grounding& g, const std::vector<document>& docs,
                                     const model_state& ms) {
    std::vector<chat_message> messages = g.messages;
    add_documents(docs, messages);
    return ms.bundle.tok->encode(ms.tmpl.render(messages, true, {}), false, true);
}

void ground_plan(generation_plan& plan, const pending_grounding& g, std::vector<document> docs,
                 std::vector<token_id> prompt, const model_state& ms) {
    engine_request r = g.base;
    r.prompt = std::move(prompt);
    if (g.ground.strict) {
        std::vector<std::string> texts;
        for (const document& d : docs) texts.push_back(d.text);
        // built once (its table of tokens that open a quote too); each sequence gets a copy
        std::shared_ptr<const logits_processor> strict =
            make_strict_quotes(std::make_shared<const document_index>(texts, true), ms.guides->vocab());
        r.make_processor = [strict] { return strict->clone(); };
        plan.strict = true;
    }
    if (g.ground.cite) {
        grounding shown = g.ground;
        shown.documents = docs;
        r.observer = make_citation_observer(shown);
        plan.documents = std::move(docs);
    }
    plan.requests.push_back(std::move(r));
}

std::string question_of(const std::vector<chat_message>& messages) {
    for (auto it = messages.rbegin(); it != messages.rend(); ++it)
        if (it->role == "user") return it->content;
    return messages.empty() ? std::string() : messages.back().content;
}

#undef TRY

json add_prompt_logprobs(choice_state& c, std::span<const prompt_token> prompt, const std::string& echo,
                         const tokenizer& tok) {
    // Offsets: where each token's text starts in echo, which is the concatenated pieces less
    // the space prefix that decoding strips (so a stripped token starts at the text's start).
    const int64_t base = c.n_chars();
    stream_decoder dec(tok);
    std::string pieces;
    std::vector<size_t> starts;
    for (const prompt_token& t : prompt) {
        starts.push_back(pieces.size());
        pieces += dec.push(t.id);
    }
    pieces += dec.flush();
    const size_t stripped = pieces.size() >= echo.size() ? pieces.size() - echo.size() : 0;
    const auto chars = [](std::string_view s) {
        return int64_t(std::count_if(s.begin(), s.end(), [](char ch) { return (uint8_t(ch) & 0xC0) != 0x80; }));
    };
    json lp = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
               {"text_offset", json::array()}};
    for (size_t j = 0; j < prompt.size(); ++j) {
        const prompt_token& t = prompt[j];
        json top = nullptr;
        if (j > 0 && !t.top.empty()) {
            top = json::object();
            for (const auto& a : t.top) top[tok.piece(a.id)] = a.logprob;
        }
        const size_t at = std::max(starts[j], stripped) - stripped;
        const int64_t offset = base + chars(std::string_view(echo).substr(0, std::min(at, echo.size())));
        lp["tokens"].push_back(tok.piece(t.id));
        lp["token_logprobs"].push_back(std::isnan(t.logprob) ? json(nullptr) : json(t.logprob));
        lp["top_logprobs"].push_back(top);
        lp["text_offset"].push_back(offset);
        c.lp_tokens.push_back(lp["tokens"].back());
        c.lp_token_logprobs.push_back(lp["token_logprobs"].back());
        c.lp_top.push_back(top);
        c.lp_offsets.push_back(offset);
    }
    c.text += echo;
    return lp;
}

json add_logprobs(choice_state& c, const engine_event& ev, bool chat, const tokenizer& tok) {
    const std::string piece = tok.piece(ev.id);
    auto bytes_of = [](const std::string& s) {
        json b = json::array();
        for (unsigned char ch : s) b.push_back(int(ch));
        return b;
    };
    if (chat) {
        json top = json::array();
        for (const auto& t : ev.top) {
            const std::string p = tok.piece(t.id);
            top.push_back({{"token", p}, {"logprob", t.logprob}, {"bytes", bytes_of(p)}});
        }
        json entry = {{"token", piece}, {"logprob", ev.logprob}, {"bytes", bytes_of(piece)}, {"top_logprobs", top}};
        c.logprobs_content.push_back(entry);
        return json{{"content", json::array({entry})}};
    }
    json top = json::object();
    for (const auto& t : ev.top) top[tok.piece(t.id)] = t.logprob;
    c.lp_tokens.push_back(piece);
    c.lp_token_logprobs.push_back(ev.logprob);
    c.lp_top.push_back(ev.top.empty() ? json(nullptr) : top);
    c.lp_offsets.push_back(c.n_chars());
    return json{{"tokens", json::array({piece})},
                {"token_logprobs", json::array({ev.logprob})},
                {"top_logprobs", json::array({c.lp_top.back()})},
                {"text_offset", json::array({c.lp_offsets.back()})}};
}

namespace {

// "call_" and 24 letters and digits, as OpenAI's; Mistral's templates want exactly 9.
std::string new_call_id(grammar::tool_syntax syntax) {
    static constexpr std::string_view alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    thread_local std::mt19937_64 rng{std::random_device{}()};
    const bool mistral = syntax == grammar::tool_syntax::mistral;
    std::string id = mistral ? "" : "call_";
    for (int i = 0; i < (mistral ? 9 : 24); ++i) id.push_back(alnum[rng() % alnum.size()]);
    return id;
}

} // namespace

reply_delta read_reply(choice_state& c, std::string_view text, bool ended) {
    reply_delta d;
    if (!c.parser) {
        d.content = text;
        return d;
    }
    std::vector<grammar::tool_call_parser::event> events;
    c.parser->feed(text, events);
    if (ended) c.parser->finish(events);
    for (auto& ev : events) {
        using kind = grammar::tool_call_parser::event::kind;
        if (ev.k == kind::content) {
            d.content += ev.text;
            continue;
        }
        if (ev.k == kind::call) {
            c.calls.push_back({new_call_id(c.parser->syntax()), ev.text, ""});
            if (d.tool_calls.is_null()) d.tool_calls = json::array();
            d.tool_calls.push_back({{"index", ev.index},
                                    {"id", c.calls.back().id},
                                    {"type", "function"},
                                    {"function", {{"name", ev.text}, {"arguments", ""}}}});
            continue;
        }
        c.calls[size_t(ev.index)].arguments += ev.text;
        if (d.tool_calls.is_null()) d.tool_calls = json::array();
        if (!d.tool_calls.empty() && d.tool_calls.back()["index"] == ev.index)
            d.tool_calls.back()["function"]["arguments"] =
                d.tool_calls.back()["function"].value("arguments", "") + ev.text;
        else
            d.tool_calls.push_back({{"index", ev.index}, {"function", {{"arguments", ev.text}}}});
    }
    c.content += d.content;
    return d;
}

std::string client_finish_reason(const choice_state& c) {
    return !c.calls.empty() && c.finish_reason == "stop" ? "tool_calls" : c.finish_reason;
}

json stream_chunk(const std::string& id, const std::string& model, bool chat, int index, choice_state& c,
                  const reply_delta& d, const json& logprobs, const std::string& finish_reason,
                  bool usage_null) {
    const std::string& text = d.content;
    json choice = {{"index", index},
                   {"logprobs", logprobs},
                   {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
    if (chat) {
        json delta = json::object();
        if (!c.sent_role) {
            delta["role"] = "assistant";
            c.sent_role = true;
        }
        if (!text.empty() || (finish_reason.empty() && d.tool_calls.is_null())) delta["content"] = text;
        if (!d.tool_calls.is_null()) delta["tool_calls"] = d.tool_calls;
        choice["delta"] = delta;
    } else {
        choice["text"] = text;
    }
    json chunk = {{"id", id},
                  {"object", chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", int64_t(std::time(nullptr))},
                  {"model", model},
                  {"choices", json::array({choice})}};
    if (usage_null) chunk["usage"] = nullptr; // OpenAI: with include_usage, every chunk but the last
    return chunk;
}

int64_t choice_state::n_chars() {
    for (; n_bytes_counted_ < text.size(); ++n_bytes_counted_)
        if ((static_cast<unsigned char>(text[n_bytes_counted_]) & 0xC0) != 0x80) ++n_chars_; // not a continuation byte
    return n_chars_;
}

std::vector<size_t> returned_sequences(const generation_plan& plan, const std::vector<choice_state>& cs) {
    std::vector<size_t> out;
    const size_t m = size_t(plan.n_seqs);
    for (size_t k = 0; k < plan.requests.size(); ++k) {
        std::vector<size_t> group(m);
        for (size_t i = 0; i < m; ++i) group[i] = k * m + i;
        if (plan.ranked()) // OpenAI's best_of: the highest log probability per token
            std::stable_sort(group.begin(), group.end(), [&](size_t a, size_t b) {
                const auto mean = [&](size_t i) { return cs[i].cumulative_logprob / std::max(1, cs[i].n_generated); };
                return mean(a) > mean(b);
            });
        out.insert(out.end(), group.begin(), group.begin() + plan.n);
    }
    return out;
}

json add_citations(choice_state& c, const engine_event& ev, const generation_plan& plan) {
    json out = json::array();
    for (const citation& x : ev.citations) out.push_back(citation_json(x, plan.documents));
    for (const json& x : out) c.citations.push_back(x);
    return out;
}

void add_beam_fields(json& choice, const choice_state& c) {
    choice["score"] = c.score;
    choice["cumulative_logprob"] = c.cumulative_logprob;
}

json usage_json(const std::vector<choice_state>& cs, const generation_plan& plan) {
    int64_t prompt = 0, cached = 0, completion = 0, drafted = 0, accepted = 0;
    for (size_t i = 0; i < cs.size(); ++i) { // every sequence's tokens count, returned or not
        if (i % size_t(plan.n_seqs) == 0) { // each prompt once
            prompt += cs[i].n_prompt;
            cached += cs[i].n_cached;
        }
        completion += cs[i].n_generated;
        drafted += cs[i].n_drafted;
        accepted += cs[i].n_accepted;
    }
    json u{{"prompt_tokens", prompt},
           {"completion_tokens", completion},
           {"total_tokens", prompt + completion},
           {"prompt_tokens_details", {{"cached_tokens", cached}}}};
    if (plan.truncate) { // truncate_prompt_tokens: the prompt tokens it dropped (each prompt once)
        int64_t dropped = 0;
        for (const int32_t n : plan.truncated) dropped += n;
        u["truncated_prompt_tokens"] = dropped;
    }
    // Speculative drafts, in the fields OpenAI reports predicted outputs with.
    if (drafted > 0)
        u["completion_tokens_details"] = {{"accepted_prediction_tokens", accepted},
                                          {"rejected_prediction_tokens", drafted - accepted}};
    return u;
}

json final_response(const std::string& id, const std::string& model, const generation_plan& plan,
                    const std::vector<choice_state>& cs) {
    json choices = json::array();
    const std::vector<size_t> returned = returned_sequences(plan, cs);
    for (size_t i = 0; i < returned.size(); ++i) {
        const choice_state& c = cs[returned[i]];
        json lp = nullptr;
        if (plan.logprobs) {
            if (plan.chat)
                lp = json{{"content", c.logprobs_content}};
            else
                lp = json{{"tokens", c.lp_tokens},
                          {"token_logprobs", c.lp_token_logprobs},
                          {"top_logprobs", c.lp_top},
                          {"text_offset", c.lp_offsets}};
        }
        json ch = {{"index", i}, {"logprobs", lp}, {"finish_reason", client_finish_reason(c)}};
        if (plan.chat && c.parser) {
            json msg = {{"role", "assistant"},
                        {"content", c.content.empty() && !c.calls.empty() ? json(nullptr) : json(c.content)}};
            if (!c.calls.empty()) {
                msg["tool_calls"] = json::array();
                for (const auto& call : c.calls)
                    msg["tool_calls"].push_back({{"id", call.id},
                                                 {"type", "function"},
                                                 {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
            }
            ch["message"] = std::move(msg);
        } else if (plan.chat) {
            ch["message"] = {{"role", "assistant"}, {"content", c.text}};
        } else {
            ch["text"] = c.text;
        }
        if (plan.cites()) ch["message"]["citations"] = c.citations;
        if (plan.strict) ch["message"]["unsupported"] = unsupported_sentences(c.text, c.citations);
        if (plan.beam) add_beam_fields(ch, c);
        choices.push_back(ch);
    }
    json out = {{"id", id},
                {"object", plan.chat ? "chat.completion" : "text_completion"},
                {"created", int64_t(std::time(nullptr))},
                {"model", model},
                {"choices", choices},
                {"usage", usage_json(cs, plan)}};
    if (!plan.passages.empty()) out["passages"] = passages_json(plan);
    return out;
}

json passages_json(const generation_plan& plan) {
    json out = json::array();
    for (const passage_used& p : plan.passages)
        out.push_back({{"document_id", p.document_id},
                       {"document_index", p.document_index},
                       {"start", p.start},
                       {"end", p.end}});
    return out;
}

reply reply_for_exception(std::exception_ptr e, std::string_view method, std::string_view target) {
    api_error err{500, "the daemon failed on this request (see its log)", "server_error"};
    try {
        std::rethrow_exception(e);
    } catch (const nlohmann::json::type_error& x) { // a value of the wrong type, read before it was checked
        err = bad(fmt::format("a field of the request has the wrong type ({})", x.what()));
    } catch (const std::exception& x) {
        err.message = fmt::format("the daemon failed on this request: {}", x.what());
    } catch (...) {
    }
    const std::string path(target.substr(0, target.find('?')));
    logger("server")->error("{} {}: {} ({})", method, path, err.message, err.status);
    return reply::of(err);
}

std::string route_label(const std::string& target) {
    static const char* known[] = {"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models", "/health", "/metrics",
                                  "/tokenize", "/detokenize", "/v1/tandem/apply-template", "/v1/tandem/status"};
    const std::string path = target.substr(0, target.find('?'));
    for (const char* k : known)
        if (path == k) return k;
    if (path.starts_with("/v1/models/")) return "/v1/models";
    if (path == "/v1/files" || path.starts_with("/v1/files/")) return "/v1/files";
    if (path == "/v1/batches" || path.starts_with("/v1/batches/")) return "/v1/batches";
    return "other";
}

namespace {

api_error loading_error() {
    api_error e;
    e.status = 503;
    e.type = "server_error";
    e.code = "model_loading";
    e.message = "the model is still loading; try again shortly";
    e.retry_after_s = 2;
    return e;
}

reply loading_reply() {
    reply r = reply::of(loading_error());
    r.model_loading = true;
    return r;
}

json model_card(const model_state& ms, const daemon_state& st) {
    const auto& c = ms.bundle.cfg;
    return json{{"id", ms.id},
                {"object", "model"},
                {"created", int64_t(st.started_unix)},
                {"owned_by", "tandem"},
                {"meta",
                 {{"path", ms.path},
                  {"arch", c.arch},
                  {"n_ctx", ms.n_ctx},
                  {"n_ctx_train", c.n_ctx_train},
                  {"n_vocab", c.n_vocab},
                  {"n_layer", c.n_layer},
                  {"n_embd", c.n_embd},
                  {"chat_template", std::string(name_of(ms.tmpl.family()))}}}};
}

} // namespace

std::variant<json, api_error> parse_request_body(std::string_view body, int max_depth) {
    std::string why, where;
    std::optional<json> j = parse_json_limited<json>(body, max_depth, why, &where);
    if (!j) {
        api_error e = bad(fmt::format("the request body is {}", why), where);
        if (why.starts_with("nested")) {
            e.message += " (max_json_depth in tandemd.conf)";
            e.code = "json_too_deep";
        }
        return e;
    }
    if (!j->is_object()) return bad("the request body must be a JSON object");
    return std::move(*j);
}

std::optional<reply> handle_simple(const std::string& method, const std::string& target, const std::string& body,
                                   daemon_state& st) {
    const std::string path = target.substr(0, target.find('?'));
    auto only = [&](const std::string_view m) -> std::optional<reply> {
        const bool get = m == "GET";
        if (method == m || (get && method == "HEAD")) return std::nullopt;
        api_error e = bad(fmt::format("{} {} is not allowed; use {}", method, path, m));
        e.status = 405;
        reply r = reply::of(e);
        r.allow = get ? "GET, HEAD" : std::string(m);
        return r;
    };
    const model_state* ms = st.ms.get();

    if (path == "/health") {
        if (auto r = only("GET")) return r;
        if (st.stopping) return reply{503, "application/json", R"({"status":"stopping"})", 5};
        if (!ms) return reply{503, "application/json", R"({"status":"loading"})", 2};
        return reply{200, "application/json", R"({"status":"ok"})", 0};
    }
    if (path == "/metrics") {
        if (auto r = only("GET")) return r;
        engine_stats es;
        if (ms) es = ms->eng->stats();
        std::string text = st.met.render(ms ? &es : nullptr);
        if (ms && ms->guides) render_guide_metrics(text, ms->guides->stats());
        return reply{200, "text/plain; version=0.0.4; charset=utf-8", std::move(text), 0};
    }
    if (path == "/v1/models" || path.starts_with("/v1/models/")) {
        if (auto r = only("GET")) return r;
        if (!ms) return loading_reply();
        if (path == "/v1/models") return reply::of_json({{"object", "list"}, {"data", json::array({model_card(*ms, st)})}});
        if (path.substr(11) == ms->id) return reply::of_json(model_card(*ms, st));
        api_error e = bad(fmt::format("The model '{}' does not exist", path.substr(11)), "model");
        e.status = 404;
        e.code = "model_not_found";
        return reply::of(e);
    }
    if (path == "/v1/tandem/status") {
        if (auto r = only("GET")) return r;
        const auto tot = st.met.totals();
        json j = {{"status", st.stopping ? "stopping" : ms ? "ready" : "loading"},
                  {"uptime_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - st.started).count()},
                  {"requests_total", tot.n_requests},
                  {"prompt_tokens_total", tot.n_prompt_tokens},
                  {"completion_tokens_total", tot.n_completion_tokens}};
        if (ms) {
            const engine_stats es = ms->eng->stats();
            j["model"] = model_card(*ms, st);
            j["placement"] = {{"policy", st.cfg.placement},
                              {"prefill", ms->prefill_device},
                              {"decode", ms->decode_device},
                              {"workers", st.cfg.workers}};
            j["threads"] = ms->threads;
            j["running"] = es.n_running;
            j["waiting"] = es.n_waiting;
            j["kv_pages_used"] = es.n_pages_used;
            j["kv_pages_peak"] = es.n_pages_peak;
            j["kv_pages_total"] = es.n_pages_total;
            j["kv_page_size"] = es.page_size;
            j["kv_tokens_stored"] = es.n_kv_tokens;
            j["kv_pages_cached"] = es.n_pages_cached;
            if (ms->pool) // the shared pool's file (worker processes): where its memory is, and how much
                j["kv_pool"] = {{"path", ms->pool->path()}, {"bytes", ms->pool->bytes()}, {"persist", !ms->unlink_pool}};
            j["prefix_cache_hit_tokens"] = es.n_prefix_hits;
            j["preemptions"] = es.n_preemptions;
            j["worker_restarts"] = es.n_worker_restarts;
            j["kv_device_upload_bytes"] = es.n_kv_upload_bytes;
            j["kv_device_kept_bytes"] = es.n_kv_kept_bytes;
            j["speculative"] = {{"draft_tokens", st.cfg.speculative_tokens()},
                                {"method", st.cfg.speculative_tokens() == 0 ? "off"
                                           : st.cfg.draft_model.empty()     ? "ngram"
                                                                            : "draft"},
                                {"draft_model", st.cfg.draft_model.empty() ? json(nullptr) : json(st.cfg.draft_model)},
                                {"draft_device", es.draft_device.empty() ? json(nullptr) : json(es.draft_device)},
                                {"drafted_tokens", es.n_draft_tokens},
                                {"accepted_tokens", es.n_accepted_tokens}};
            j["limits"] = {{"max_running", st.cfg.max_running},
                           {"max_waiting", st.cfg.max_waiting},
                           {"max_prompt_tokens", ms->max_prompt_tokens},
                           {"max_tokens", ms->max_tokens_limit},
                           {"max_body_bytes", st.cfg.max_body_bytes}};
        }
        return reply::of_json(j);
    }
    if (path == "/tokenize" || path == "/detokenize" || path == "/v1/tandem/apply-template") {
        if (auto r = only("POST")) return r;
        if (!ms) return loading_reply();
        auto parsed = parse_request_body(body, st.cfg.max_json_depth);
        if (auto* e = std::get_if<api_error>(&parsed)) return reply::of(*e);
        const json& j = std::get<json>(parsed);
        const tokenizer& tok = *ms->bundle.tok;
        const auto refused = [&](std::initializer_list<std::string_view> known) -> std::optional<reply> {
            if (!j.is_object()) return reply::of(bad("the request body must be a JSON object"));
            if (auto e = check_keys(j, "", known)) return reply::of(*e);
            return std::nullopt;
        };
        if (path == "/tokenize") {
            if (auto r = refused({"content", "text", "add_special", "parse_special"})) return r;
            if (j.contains("content") && j.contains("text"))
                return reply::of(bad("give 'content' or 'text', not both", "text"));
            auto it = j.find("content");
            if (it == j.end()) it = j.find("text");
            if (it == j.end() || !it->is_string()) return reply::of(bad("'content' must be a string", "content"));
            bool add_special = true, parse_special = false;
            if (auto e = read_bool(j, "add_special", add_special)) return reply::of(*e);
            if (auto e = read_bool(j, "parse_special", parse_special)) return reply::of(*e);
            const auto ids = tok.encode(it->get<std::string>(), add_special, parse_special);
            return reply::of_json({{"tokens", ids}, {"count", ids.size()}});
        }
        if (path == "/detokenize") {
            if (auto r = refused({"tokens"})) return r;
            auto it = j.find("tokens");
            if (it == j.end() || !it->is_array() || !all_ints(*it))
                return reply::of(bad("'tokens' must be an array of token ids", "tokens"));
            std::vector<token_id> ids;
            for (const auto& x : *it) {
                const int64_t id = x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT32_MAX) ? -1 : x.get<int64_t>();
                if (id < 0 || id >= tok.n_vocab())
                    return reply::of(bad(fmt::format("token id {} is out of range", x.dump()), "tokens"));
                ids.push_back(token_id(id));
            }
            return reply::of_json({{"content", tok.decode(ids)}});
        }
        if (auto r = refused({"messages", "tools", "tool_choice", "add_generation_prompt"})) return r;
        std::vector<chat_message> messages;
        if (auto e = read_messages(j, messages)) return reply::of(*e);
        tools_request tools;
        if (auto e = read_tools(j, tools)) return reply::of(*e);
        bool add_gen = true;
        if (auto e = read_bool(j, "add_generation_prompt", add_gen)) return reply::of(*e);
        const std::string text = ms->tmpl.render(messages, add_gen,
                                                 tools.active() ? std::span(tools.defs) : std::span<const std::string>{});
        return reply::of_json({{"prompt", text},
                               {"tokens", tok.encode(text, false, true)},
                               {"template", std::string(name_of(ms->tmpl.family()))},
                               {"stop", ms->tmpl.stop_strings()}});
    }
    if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/v1/embeddings") {
        if (auto r = only("POST")) return r;
        if (st.stopping) {
            api_error e = loading_error();
            e.message = "the daemon is shutting down";
            e.code = "shutting_down";
            e.retry_after_s = 5;
            return reply::of(e);
        }
        if (!ms) return loading_reply();
        return std::nullopt; // the session streams it
    }
    api_error e = bad(fmt::format("no route {} {}", method, path));
    e.status = 404;
    e.code = "unknown_url";
    return reply::of(e);
}

} // namespace tandem::daemon
