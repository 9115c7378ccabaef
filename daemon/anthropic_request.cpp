// Anthropic's Messages request, translated into the internal request (daemon/anthropic.hpp).
#include "daemon/anthropic.hpp"

#include "daemon/openai_fields.hpp"
#include "runtime/tokenizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace tandem::daemon {
namespace {

// A block's text, or a 400 naming the block for a kind Tandem does not take.
field_error refuse_block(const json& b, const std::string& p) {
    const std::string type = b.value("type", json()).is_string() ? b["type"].get<std::string>() : "";
    if (type.empty()) return bad(fmt::format("'{}.type' is required", p), p + ".type");
    return bad(fmt::format("'{}' of type \"{}\" is not supported: Tandem takes text{} blocks", p, type,
                           p.find("system") == 0 ? "" : ", tool_use and tool_result"),
               p + ".type");
}

// {"type": "text", "text"} (cache_control: prompt caching is not controlled here, a 400).
field_error read_text_block(const json& b, const std::string& p, std::string& out) {
    TANDEM_TRY(check_keys(b, p, {"type", "text"}, false, {"citations"}));
    if (!b.contains("text") || !b["text"].is_string()) return bad(fmt::format("'{}.text' must be a string", p), p + ".text");
    if (!out.empty()) out += "\n";
    out += b["text"].get<std::string>();
    return std::nullopt;
}

// `system`: a string, or text blocks.
field_error read_system(const json& body, std::vector<chat_message>& out) {
    const auto it = body.find("system");
    if (it == body.end() || it->is_null()) return std::nullopt;
    chat_message m{"system", {}, {}, {}};
    if (it->is_string()) {
        m.content = it->get<std::string>();
    } else if (it->is_array()) {
        for (size_t k = 0; k < it->size(); ++k) {
            const json& b = (*it)[k];
            const std::string p = place("system", k);
            if (!b.is_object()) return bad(fmt::format("'{}' must be a content block", p), p);
            if (b.value("type", json()) != "text") return refuse_block(b, p);
            TANDEM_TRY(read_text_block(b, p, m.content));
        }
    } else {
        return bad("'system' must be a string or an array of text blocks", "system");
    }
    out.push_back(std::move(m));
    return std::nullopt;
}

// A tool_result's content: a string or text blocks.
field_error read_result_content(const json& b, const std::string& p, std::string& out) {
    const auto c = b.find("content");
    if (c == b.end() || c->is_null()) return std::nullopt;
    if (c->is_string()) {
        out = c->get<std::string>();
        return std::nullopt;
    }
    if (!c->is_array()) return bad(fmt::format("'{}.content' must be a string or text blocks", p), p + ".content");
    for (size_t k = 0; k < c->size(); ++k) {
        const json& x = (*c)[k];
        const std::string q = place(p + ".content", k);
        if (!x.is_object()) return bad(fmt::format("'{}' must be a content block", q), q);
        if (x.value("type", json()) != "text") return refuse_block(x, q);
        TANDEM_TRY(read_text_block(x, q, out));
    }
    return std::nullopt;
}

// `messages`: user and assistant turns; a user turn's tool_result blocks become tool messages
// (before its text), an assistant turn's tool_use blocks its calls. Thinking blocks sent back
// are dropped, as the templates drop past thinking.
field_error read_anthropic_messages(const json& body, std::vector<chat_message>& out) {
    const auto it = body.find("messages");
    if (it == body.end() || it->is_null()) return bad("'messages' is required", "messages");
    if (!it->is_array() || it->empty()) return bad("'messages' must be a non-empty array", "messages");
    for (size_t i = 0; i < it->size(); ++i) {
        const json& m = (*it)[i];
        const std::string p = place("messages", i);
        if (!m.is_object()) return bad(fmt::format("'{}' must be an object", p), p);
        TANDEM_TRY(check_keys(m, p, {"role", "content"}));
        const json role = m.value("role", json());
        if (role != "user" && role != "assistant")
            return bad(fmt::format("'{}.role' must be \"user\" or \"assistant\"", p), p + ".role");
        const bool user = role == "user";
        bool had_results = false;
        chat_message msg{role.get<std::string>(), {}, {}, {}};
        const auto c = m.find("content");
        if (c == m.end() || c->is_null()) return bad(fmt::format("'{}.content' is required", p), p + ".content");
        if (c->is_string()) {
            msg.content = c->get<std::string>();
            out.push_back(std::move(msg));
            continue;
        }
        if (!c->is_array()) return bad(fmt::format("'{}.content' must be a string or content blocks", p), p + ".content");
        for (size_t k = 0; k < c->size(); ++k) {
            const json& b = (*c)[k];
            const std::string q = place(p + ".content", k);
            if (!b.is_object()) return bad(fmt::format("'{}' must be a content block", q), q);
            const json type = b.value("type", json());
            if (type == "text") {
                TANDEM_TRY(read_text_block(b, q, msg.content));
            } else if (type == "tool_result" && user) {
                TANDEM_TRY(check_keys(b, q, {"type", "tool_use_id", "content", "is_error"}));
                if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
                    return bad(fmt::format("'{}.tool_use_id' must be a string", q), q + ".tool_use_id");
                bool is_error = false;
                TANDEM_TRY(read_bool(b, "is_error", is_error, q));
                chat_message result{"tool", {}, {}, b["tool_use_id"].get<std::string>()};
                TANDEM_TRY(read_result_content(b, q, result.content));
                if (is_error) result.content = "Error: " + result.content;
                out.push_back(std::move(result));
                had_results = true;
            } else if (type == "tool_use" && !user) {
                TANDEM_TRY(check_keys(b, q, {"type", "id", "name", "input"}));
                if (!b.contains("id") || !b["id"].is_string()) return bad(fmt::format("'{}.id' must be a string", q), q + ".id");
                if (!b.contains("name") || !b["name"].is_string())
                    return bad(fmt::format("'{}.name' must be a string", q), q + ".name");
                if (!b.contains("input") || !b["input"].is_object())
                    return bad(fmt::format("'{}.input' must be an object", q), q + ".input");
                msg.tool_calls.push_back({b["id"].get<std::string>(), b["name"].get<std::string>(), b["input"].dump()});
            } else if ((type == "thinking" || type == "redacted_thinking") && !user) {
                continue;
            } else {
                return refuse_block(b, q);
            }
        }
        if (user && msg.content.empty() && had_results) continue; // only results: no empty user turn
        out.push_back(std::move(msg));
    }
    if (out.back().role == "assistant")
        return bad("a last 'messages' turn from the assistant (a prefill to continue) is not supported",
                   place("messages", it->size() - 1));
    return std::nullopt;
}

bool valid_tool_name(const std::string& n) {
    return !n.empty() && n.size() <= 64 && std::all_of(n.begin(), n.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    });
}

// `tools` (client tools: name, description, input_schema; server tools are a 400 by type) and
// `tool_choice` (auto, any, tool, none; disable_parallel_tool_use).
field_error read_anthropic_tools(const json& body, tools_request& out) {
    out.field = "tools";
    if (const auto it = body.find("tools"); it != body.end() && !it->is_null()) {
        if (!it->is_array()) return bad("'tools' must be an array", "tools");
        std::set<std::string> names;
        for (size_t i = 0; i < it->size(); ++i) {
            const json& t = (*it)[i];
            const std::string p = place("tools", i);
            if (!t.is_object()) return bad(fmt::format("'{}' must be an object", p), p);
            if (const auto type = t.find("type"); type != t.end() && !type->is_null() && *type != "custom")
                return bad(fmt::format("'{}.type' \"{}\" is not supported: Tandem runs no server tools (client tools "
                                       "only: name, description, input_schema)",
                                       p, type->is_string() ? type->get<std::string>() : type->dump()),
                           p + ".type");
            TANDEM_TRY(check_keys(t, p, {"type", "name", "description", "input_schema"}));
            const std::string name = t.value("name", json()).is_string() ? t["name"].get<std::string>() : "";
            if (!valid_tool_name(name)) return bad(fmt::format("'{}.name' must be 1 to 64 of a-z, A-Z, 0-9, _ and -", p), p + ".name");
            if (!names.insert(name).second) return bad(fmt::format("two tools are named '{}'", name), p + ".name");
            if (t.contains("description") && !t["description"].is_string())
                return bad(fmt::format("'{}.description' must be a string", p), p + ".description");
            const auto schema = t.find("input_schema");
            if (schema == t.end() || !schema->is_object())
                return bad(fmt::format("'{}.input_schema' must be a JSON Schema object", p), p + ".input_schema");
            out.functions.push_back({name, schema->dump()});
            json fn = {{"name", name}};
            if (t.contains("description")) fn["description"] = t["description"];
            fn["parameters"] = *schema;
            out.defs.push_back(json{{"type", "function"}, {"function", fn}}.dump());
        }
    }
    const auto it = body.find("tool_choice");
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (!it->is_object() || !it->value("type", json()).is_string())
        return bad("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}", "tool_choice");
    const std::string type = (*it)["type"].get<std::string>();
    if (type == "tool") TANDEM_TRY(check_keys(*it, "tool_choice", {"type", "name", "disable_parallel_tool_use"}));
    else TANDEM_TRY(check_keys(*it, "tool_choice", {"type", "disable_parallel_tool_use"}));
    bool serial = false;
    TANDEM_TRY(read_bool(*it, "disable_parallel_tool_use", serial, "tool_choice"));
    out.parallel = !serial;
    if (type == "auto" || type == "none") {
        out.choice = type;
    } else if (type == "any") {
        out.choice = "required";
    } else if (type == "tool") {
        if (!it->value("name", json()).is_string()) return bad("'tool_choice.name' must be a string", "tool_choice.name");
        out.choice = "function";
        out.named = (*it)["name"].get<std::string>();
        if (std::none_of(out.functions.begin(), out.functions.end(), [&](const auto& f) { return f.name == out.named; }))
            return bad(fmt::format("'tool_choice.name' names '{}', which is not in 'tools'", out.named), "tool_choice.name");
    } else {
        return bad(fmt::format("'tool_choice.type' \"{}\" is not supported (auto, any, tool, none)", type), "tool_choice.type");
    }
    if (out.functions.empty() && (type == "any" || type == "tool"))
        return bad(fmt::format("'tool_choice' \"{}\" needs 'tools'", type), "tool_choice");
    return std::nullopt;
}

// `thinking`: {"type": "enabled", "budget_tokens"} bounds a reasoning model's thinking,
// {"type": "disabled"} turns it off (nothing to turn off on a model that does not reason).
field_error read_thinking(const json& body, const model_state& ms, reasoning_request& out) {
    const auto it = body.find("thinking");
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (!it->is_object() || !it->value("type", json()).is_string())
        return bad("'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}", "thinking");
    const std::string type = (*it)["type"].get<std::string>();
    if (type == "disabled") {
        TANDEM_TRY(check_keys(*it, "thinking", {"type"}));
        if (ms.reasoning) {
            out.enable = false;
            out.enable_field = "thinking";
        }
        return std::nullopt;
    }
    if (type != "enabled")
        return bad(fmt::format("'thinking.type' \"{}\" is not supported (enabled, disabled)", type), "thinking.type");
    TANDEM_TRY(check_keys(*it, "thinking", {"type", "budget_tokens"}));
    out.enable = true;
    out.enable_field = "thinking";
    int64_t budget = -1;
    TANDEM_TRY(read_int(*it, "budget_tokens", 0, ms.max_tokens_limit, budget, "thinking"));
    if (budget >= 0) {
        out.budget = int32_t(budget);
        out.budget_field = "thinking.budget_tokens";
    }
    return std::nullopt;
}

} // namespace

std::variant<generation_request, api_error> parse_anthropic(const json& body, const model_state& ms,
                                                            const config& cfg, bool count_only) {
    if (!body.is_object()) return bad("the request body must be a JSON object");
    static const std::set<std::string, std::less<>> unsupported{"container", "mcp_servers", "service_tier",
                                                                "context_management"};
    for (const auto& [key, v] : body.items())
        if (unsupported.contains(key) && !v.is_null())
            return bad(fmt::format("'{}' is not supported", key), key);
    if (count_only)
        TANDEM_TRY(check_keys(body, "", {"model", "messages", "system", "tools", "tool_choice", "thinking"}, false,
                              {"container", "mcp_servers", "service_tier", "context_management"}));
    else
        TANDEM_TRY(check_keys(body, "",
                              {"model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p",
                               "top_k", "tools", "tool_choice", "thinking", "metadata", "stream"},
                              false, {"container", "mcp_servers", "service_tier", "context_management"}));
    if (!body.contains("model") || !body["model"].is_string()) return bad("'model' is required", "model");
    TANDEM_TRY(read_model(body));
    generation_request req;
    req.chat = true;
    req.prompt_param = "messages";
    TANDEM_TRY(read_system(body, req.messages));
    TANDEM_TRY(read_anthropic_messages(body, req.messages));
    TANDEM_TRY(read_anthropic_tools(body, req.tools));
    TANDEM_TRY(read_thinking(body, ms, req.reasoning));
    if (count_only) return req;

    if (!body.contains("max_tokens") || body["max_tokens"].is_null()) return bad("'max_tokens' is required", "max_tokens");
    int64_t max_tokens = 0;
    TANDEM_TRY(read_int(body, "max_tokens", 1, ms.max_tokens_limit, max_tokens));
    req.base.max_tokens = int32_t(max_tokens);
    double temperature = 1, top_p = 1;
    int64_t top_k = 0;
    TANDEM_TRY(read_number(body, "temperature", 0, 1, temperature));
    TANDEM_TRY(read_number(body, "top_p", 0, 1, top_p));
    TANDEM_TRY(read_int(body, "top_k", 0, ms.bundle.tok->n_vocab(), top_k));
    req.base.sampling.temperature = float(temperature);
    req.base.sampling.top_p = float(top_p);
    req.base.sampling.top_k = int32_t(top_k);
    if (const auto it = body.find("stop_sequences"); it != body.end() && !it->is_null()) {
        if (!it->is_array() || it->size() > 16)
            return bad("'stop_sequences' must be an array of at most 16 strings", "stop_sequences");
        for (size_t i = 0; i < it->size(); ++i) {
            const json& s = (*it)[i];
            if (!s.is_string() || s.get_ref<const std::string&>().empty() ||
                int64_t(s.get_ref<const std::string&>().size()) > cfg.max_stop_bytes)
                return bad(fmt::format("'{}' must be a non-empty string of at most {} bytes", place("stop_sequences", i),
                                       cfg.max_stop_bytes),
                           place("stop_sequences", i));
            req.base.stop.push_back(s.get<std::string>());
        }
    }
    if (const auto it = body.find("metadata"); it != body.end() && !it->is_null()) {
        if (!it->is_object()) return bad("'metadata' must be an object", "metadata");
        TANDEM_TRY(check_keys(*it, "metadata", {"user_id"}));
        std::string user;
        TANDEM_TRY(read_string(*it, "user_id", user, "metadata"));
    }
    TANDEM_TRY(read_bool(body, "stream", req.stream));
    return req;
}

} // namespace tandem::daemon
