// The Responses request, translated into the internal request; the stored responses
// (daemon/responses.hpp).
#include "daemon/responses.hpp"

#include "daemon/openai_fields.hpp"
#include "runtime/error.hpp"
#include "runtime/tokenizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>

namespace tandem::daemon {
namespace fs = std::filesystem;
namespace {

json message_json(const chat_message& m) {
    json calls = json::array();
    for (const auto& c : m.tool_calls) calls.push_back({{"id", c.id}, {"name", c.name}, {"arguments", c.arguments}});
    return {{"role", m.role}, {"content", m.content}, {"tool_calls", calls}, {"tool_call_id", m.tool_call_id}};
}

chat_message message_of(const json& j) {
    chat_message m{j.value("role", ""), j.value("content", ""), {}, j.value("tool_call_id", "")};
    for (const auto& c : j.value("tool_calls", json::array()))
        m.tool_calls.push_back({c.value("id", ""), c.value("name", ""), c.value("arguments", "")});
    return m;
}

bool valid_id(const std::string& id) {
    if (!id.starts_with("resp-") || id.size() > 64) return false;
    return std::all_of(id.begin(), id.end(), [](char c) { return std::isalnum(uint8_t(c)) || c == '-'; });
}

// A message item's content: a string, or input_text / output_text parts (images and files are
// a 400 naming the part).
field_error read_item_text(const json& c, const std::string& p, std::string& out) {
    if (c.is_string()) {
        out = c.get<std::string>();
        return std::nullopt;
    }
    if (!c.is_array()) return bad(fmt::format("'{}' must be a string or content parts", p), p);
    for (size_t k = 0; k < c.size(); ++k) {
        const json& part = c[k];
        const std::string q = place(p, k);
        const json type = part.is_object() ? part.value("type", json()) : json();
        if (type != "input_text" && type != "output_text")
            return bad(fmt::format("'{}' of type {} is not supported: Tandem takes text (input_text, output_text)", q,
                                   type.dump()),
                       q + ".type");
        TANDEM_TRY(check_keys(part, q, {"type", "text"}, false, {"annotations", "logprobs"}));
        if (!part.value("text", json()).is_string()) return bad(fmt::format("'{}.text' must be a string", q), q + ".text");
        out += part["text"].get<std::string>();
    }
    return std::nullopt;
}

// `input`: a string (one user message) or items: messages, function calls (an assistant's,
// consecutive ones in one turn) and their outputs; reasoning items sent back are dropped.
field_error read_input(const json& body, std::vector<chat_message>& out) {
    const auto it = body.find("input");
    if (it == body.end() || it->is_null()) return bad("'input' is required", "input");
    if (it->is_string()) {
        out.push_back({"user", it->get<std::string>(), {}, {}});
        return std::nullopt;
    }
    if (!it->is_array()) return bad("'input' must be a string or an array of items", "input");
    for (size_t i = 0; i < it->size(); ++i) {
        const json& item = (*it)[i];
        const std::string p = place("input", i);
        if (!item.is_object()) return bad(fmt::format("'{}' must be an object", p), p);
        const json type = item.value("type", json("message"));
        if (type == "message") {
            TANDEM_TRY(check_keys(item, p, {"type", "role", "content"}, false, {"id", "status"}));
            const json role = item.value("role", json());
            if (role != "user" && role != "system" && role != "developer" && role != "assistant")
                return bad(fmt::format("'{}.role' must be user, system, developer or assistant", p), p + ".role");
            chat_message m{role == "developer" ? "system" : role.get<std::string>(), {}, {}, {}};
            if (!item.contains("content")) return bad(fmt::format("'{}.content' is required", p), p + ".content");
            TANDEM_TRY(read_item_text(item["content"], p + ".content", m.content));
            out.push_back(std::move(m));
        } else if (type == "function_call") {
            TANDEM_TRY(check_keys(item, p, {"type", "call_id", "name", "arguments"}, false, {"id", "status"}));
            for (const char* key : {"call_id", "name", "arguments"})
                if (!item.value(key, json()).is_string())
                    return bad(fmt::format("'{}.{}' must be a string", p, key), place(p, key));
            if (out.empty() || out.back().role != "assistant") out.push_back({"assistant", {}, {}, {}}); // (one turn)
            out.back().tool_calls.push_back(
                {item["call_id"].get<std::string>(), item["name"].get<std::string>(), item["arguments"].get<std::string>()});
        } else if (type == "function_call_output") {
            TANDEM_TRY(check_keys(item, p, {"type", "call_id", "output"}, false, {"id", "status"}));
            if (!item.value("call_id", json()).is_string())
                return bad(fmt::format("'{}.call_id' must be a string", p), p + ".call_id");
            chat_message m{"tool", {}, {}, item["call_id"].get<std::string>()};
            if (!item.contains("output")) return bad(fmt::format("'{}.output' is required", p), p + ".output");
            TANDEM_TRY(read_item_text(item["output"], p + ".output", m.content));
            out.push_back(std::move(m));
        } else if (type == "reasoning") {
            continue;
        } else {
            return bad(fmt::format("'{}.type' {} is not supported (message, function_call, function_call_output)", p,
                                   type.dump()),
                       p + ".type");
        }
    }
    if (out.empty()) return bad("'input' must not be empty", "input");
    return std::nullopt;
}

// `tools` (function tools, flat as the Responses API writes them; built-in tools are a 400 by
// name), `tool_choice`, `parallel_tool_calls`: read as Chat Completions' after reshaping.
field_error read_response_tools(const json& body, tools_request& out) {
    json chat = json::object();
    if (const auto it = body.find("tools"); it != body.end() && !it->is_null()) {
        if (!it->is_array()) return bad("'tools' must be an array", "tools");
        chat["tools"] = json::array();
        for (size_t i = 0; i < it->size(); ++i) {
            const json& t = (*it)[i];
            const std::string p = place("tools", i);
            const json type = t.is_object() ? t.value("type", json()) : json();
            if (type != "function")
                return bad(fmt::format("'{}.type' {} is not supported: Tandem runs no built-in tools (function tools "
                                       "only)",
                                       p, type.dump()),
                           p + ".type");
            TANDEM_TRY(check_keys(t, p, {"type", "name", "description", "parameters", "strict"}));
            json fn = t;
            fn.erase("type");
            chat["tools"].push_back({{"type", "function"}, {"function", fn}});
        }
    }
    if (const auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
        if (it->is_object()) {
            if (it->value("type", json()) != "function" || !it->value("name", json()).is_string())
                return bad("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\"}",
                           "tool_choice");
            TANDEM_TRY(check_keys(*it, "tool_choice", {"type", "name"}));
            chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*it)["name"]}}}};
        } else {
            chat["tool_choice"] = *it;
        }
    }
    if (body.contains("parallel_tool_calls")) chat["parallel_tool_calls"] = body["parallel_tool_calls"];
    if (auto e = read_tools(chat, out)) { // (its places are Chat Completions': tools[i].function.name is tools[i].name here)
        std::string& param = e->param;
        if (const size_t at = param.find(".function"); at != std::string::npos) param.erase(at, 9);
        return e;
    }
    return std::nullopt;
}

// `text.format`: text, json_object, or json_schema {"name", "schema", "strict"} (flat).
field_error read_text_format(const json& body, int max_depth, std::optional<found_constraint>& out) {
    const auto it = body.find("text");
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (!it->is_object()) return bad("'text' must be an object", "text");
    TANDEM_TRY(check_keys(*it, "text", {"format"}));
    const auto f = it->find("format");
    if (f == it->end() || f->is_null()) return std::nullopt;
    if (!f->is_object()) return bad("'text.format' must be an object", "text.format");
    json rf = {{"type", f->value("type", json())}};
    if (rf["type"] == "json_schema") {
        TANDEM_TRY(check_keys(*f, "text.format", {"type", "name", "schema", "strict", "description"}));
        json js = *f;
        js.erase("type");
        rf["json_schema"] = js;
    } else {
        TANDEM_TRY(check_keys(*f, "text.format", {"type"}));
    }
    std::vector<found_constraint> found;
    if (auto e = read_response_format(rf, max_depth, found)) {
        std::string& param = e->param;
        param = "text.format" + param.substr(std::min(param.size(), std::string("response_format").size()));
        if (const size_t at = param.find(".json_schema"); at != std::string::npos) param.erase(at, 12);
        return e;
    }
    if (!found.empty()) out = found_constraint{"text.format", std::move(found[0].second)};
    return std::nullopt;
}

} // namespace

response_store::response_store(std::string dir, std::chrono::seconds ttl) : dir_(std::move(dir)), ttl_(ttl) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) fail("{}: cannot make it: {}", dir_, ec.message());
    fs::permissions(dir_, fs::perms::owner_all, ec);
}

std::string response_store::path(const std::string& id) const { return dir_ + "/" + id + ".json"; }

bool response_store::expired(const std::string& file) const {
    std::error_code ec;
    const auto t = fs::last_write_time(file, ec);
    return !ec && fs::file_time_type::clock::now() - t > ttl_;
}

void response_store::sweep() {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_, ec))
        if (e.path().extension() == ".json" && expired(e.path().string())) fs::remove(e.path(), ec);
}

std::optional<response_store::stored> response_store::find(const std::string& id, const principal& who) const {
    if (!valid_id(id)) return std::nullopt;
    std::lock_guard lock(mu_);
    if (expired(path(id))) {
        std::error_code ec;
        fs::remove(path(id), ec);
        return std::nullopt;
    }
    std::ifstream in(path(id));
    if (!in) return std::nullopt;
    const json j = json::parse(in, nullptr, false);
    if (!j.is_object() || !who.may_see(j.value("owner", ""))) return std::nullopt;
    stored s;
    for (const json& m : j.value("messages", json::array())) s.messages.push_back(message_of(m));
    s.response = j.value("response", json::object());
    return s;
}

void response_store::put(const std::string& id, const std::string& owner, const std::vector<chat_message>& messages,
                         const json& response) {
    json j = {{"owner", owner}, {"messages", json::array()}, {"response", response}};
    for (const auto& m : messages) j["messages"].push_back(message_json(m));
    std::lock_guard lock(mu_);
    if (n_puts_++ % 64 == 0) sweep(); // (a directory scan: not on every put)
    const std::string tmp = path(id) + ".tmp";
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << dump(j);
        if (!out) return;
    }
    std::error_code ec;
    fs::rename(tmp, path(id), ec);
}

bool response_store::remove(const std::string& id, const principal& who) {
    if (!find(id, who)) return false;
    std::lock_guard lock(mu_);
    std::error_code ec;
    return fs::remove(path(id), ec);
}

std::variant<generation_request, api_error> parse_responses(const json& body, const model_state& ms,
                                                            const config& cfg, const response_store* store,
                                                            const principal& who, responses_context& ctx) {
    if (!body.is_object()) return bad("the request body must be a JSON object");
    static const std::set<std::string, std::less<>> refused{"background", "include", "prompt", "service_tier",
                                                            "top_logprobs", "conversation", "max_tool_calls"};
    for (const auto& [key, v] : body.items())
        if (refused.contains(key) && !v.is_null() && v != false && !(v.is_array() && v.empty()))
            return bad(fmt::format("'{}' is not supported", key), key);
    TANDEM_TRY(check_keys(body, "",
                          {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
                           "reasoning", "max_output_tokens", "temperature", "top_p", "stream", "store",
                           "previous_response_id", "metadata", "user", "truncation"},
                          false,
                          {"background", "include", "prompt", "service_tier", "top_logprobs", "conversation",
                           "max_tool_calls"}));
    TANDEM_TRY(read_model(body));
    generation_request req;
    req.chat = true;
    req.prompt_param = "input";
    TANDEM_TRY(read_string(body, "previous_response_id", ctx.previous_id));
    if (!ctx.previous_id.empty()) {
        std::optional<response_store::stored> prev = store ? store->find(ctx.previous_id, who) : std::nullopt;
        if (!prev) {
            api_error e = bad(fmt::format("Previous response with id '{}' not found.", ctx.previous_id),
                              "previous_response_id");
            e.status = 404;
            return e;
        }
        req.messages = std::move(prev->messages);
        std::erase_if(req.messages, [](const chat_message& m) { return m.role == "system"; }); // (instructions do not carry over)
    }
    std::string instructions;
    TANDEM_TRY(read_string(body, "instructions", instructions));
    std::vector<chat_message> input;
    TANDEM_TRY(read_input(body, input));
    if (!instructions.empty()) req.messages.insert(req.messages.begin(), chat_message{"system", instructions, {}, {}});
    for (auto& m : input) req.messages.push_back(std::move(m));
    TANDEM_TRY(read_response_tools(body, req.tools));
    TANDEM_TRY(read_text_format(body, cfg.max_json_depth, req.constraint));
    if (const auto it = body.find("reasoning"); it != body.end() && !it->is_null()) {
        if (!it->is_object()) return bad("'reasoning' must be an object", "reasoning");
        TANDEM_TRY(check_keys(*it, "reasoning", {"effort", "summary"}, true));
        if (it->contains("effort") && !(*it)["effort"].is_null())
            return bad(fmt::format("'reasoning.effort' is not supported: {}",
                                   ms.reasoning ? "this model's chat template has no reasoning effort"
                                                : "this model does not reason"),
                       "reasoning.effort");
        if (it->contains("summary") && !(*it)["summary"].is_null())
            return bad("'reasoning.summary' is not supported: the reasoning comes back whole", "reasoning.summary");
    }
    if (const auto it = body.find("truncation"); it != body.end() && !it->is_null() && *it != "disabled")
        return bad("'truncation' must be \"disabled\": a prompt over the limit is a 400, never cut", "truncation");
    if (const auto it = body.find("metadata"); it != body.end() && !it->is_null() && !it->is_object())
        return bad("'metadata' must be an object", "metadata");
    std::string user;
    TANDEM_TRY(read_string(body, "user", user));
    int64_t max_tokens = ms.max_tokens_limit;
    TANDEM_TRY(read_int(body, "max_output_tokens", 1, ms.max_tokens_limit, max_tokens));
    req.base.max_tokens = int32_t(max_tokens);
    double temperature = 1, top_p = 1;
    TANDEM_TRY(read_number(body, "temperature", 0, 2, temperature));
    TANDEM_TRY(read_number(body, "top_p", 0, 1, top_p));
    req.base.sampling.temperature = float(temperature);
    req.base.sampling.top_p = float(top_p);
    TANDEM_TRY(read_bool(body, "stream", req.stream));
    TANDEM_TRY(read_bool(body, "store", ctx.store));

    ctx.messages = req.messages;
    ctx.owner = who.owner;
    ctx.settings = {{"instructions", instructions.empty() ? json(nullptr) : json(instructions)},
                    {"max_output_tokens", body.contains("max_output_tokens") ? body["max_output_tokens"] : json(nullptr)},
                    {"metadata", body.value("metadata", json::object())},
                    {"parallel_tool_calls", req.tools.parallel},
                    {"previous_response_id", ctx.previous_id.empty() ? json(nullptr) : json(ctx.previous_id)},
                    {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
                    {"store", ctx.store},
                    {"temperature", temperature},
                    {"text", body.value("text", json{{"format", {{"type", "text"}}}})},
                    {"tool_choice", body.value("tool_choice", json("auto"))},
                    {"tools", body.value("tools", json::array())},
                    {"top_p", top_p},
                    {"truncation", "disabled"},
                    {"user", user.empty() ? json(nullptr) : json(user)}};
    return req;
}

} // namespace tandem::daemon
