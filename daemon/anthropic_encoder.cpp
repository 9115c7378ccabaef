// Anthropic's Messages replies (daemon/anthropic.hpp): the message object with its content
// blocks (thinking, text, tool_use), stop_reason and usage; streamed as Anthropic's events
// (message_start, ping, content_block_start / _delta / _stop, message_delta, message_stop).
#include "daemon/anthropic.hpp"

#include <algorithm>

namespace tandem::daemon {
namespace {

std::string event(std::string_view name, const json& data) {
    return "event: " + std::string(name) + "\ndata: " + dump(data) + "\n\n";
}

// A call's arguments as the input object (arguments the grammar closed are valid JSON).
json input_of(const std::string& arguments) {
    json j = json::parse(arguments, nullptr, false);
    return j.is_object() ? j : json::object();
}

class anthropic_encoder final : public encoder {
public:
    explicit anthropic_encoder(std::vector<std::string> stops) : stops_(std::move(stops)) {}

    std::string open(completion_view& v) override {
        const int64_t n_prompt = v.plan.requests.empty() ? 0 : int64_t(v.plan.requests[0].prompt.size());
        json message = {{"id", v.id},
                        {"type", "message"},
                        {"role", "assistant"},
                        {"content", json::array()},
                        {"model", v.model},
                        {"stop_reason", nullptr},
                        {"stop_sequence", nullptr},
                        {"usage", {{"input_tokens", n_prompt}, {"output_tokens", 0}}}};
        return event("message_start", {{"type", "message_start"}, {"message", message}}) +
               event("ping", {{"type", "ping"}});
    }

    std::string step(completion_view& v, size_t, const choice_step& s) override {
        if (!v.plan.stream) return {};
        std::string out;
        const reply_delta& d = s.delta;
        if (!d.reasoning.empty()) {
            out += start_block(block::thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
            out += delta({{"type", "thinking_delta"}, {"thinking", d.reasoning}});
        }
        if (!d.content.empty()) {
            out += start_block(block::text, {{"type", "text"}, {"text", ""}});
            out += delta({{"type", "text_delta"}, {"text", d.content}});
        }
        if (d.tool_calls.is_array())
            for (const json& call : d.tool_calls) {
                const json& fn = call.value("function", json::object());
                if (call.contains("id")) {
                    out += stop_block();
                    out += start_block(block::tool, {{"type", "tool_use"},
                                                     {"id", call["id"]},
                                                     {"name", fn.value("name", "")},
                                                     {"input", json::object()}});
                }
                const std::string args = fn.value("arguments", "");
                if (!args.empty()) out += delta({{"type", "input_json_delta"}, {"partial_json", args}});
            }
        return out;
    }

    std::string finish(completion_view& v, size_t i, const choice_step& s) override {
        if (!v.plan.stream) return {};
        std::string out = step(v, i, s); // (before the block stops)
        out += stop_block();
        return out;
    }

    std::string close(completion_view& v) override {
        const choice_state& c = v.choices[0];
        const auto [reason, sequence] = stop_reason(c);
        std::string out = event("message_delta", {{"type", "message_delta"},
                                                  {"delta", {{"stop_reason", reason}, {"stop_sequence", sequence}}},
                                                  {"usage", {{"output_tokens", c.n_generated}}}});
        out += event("message_stop", {{"type", "message_stop"}});
        return out;
    }

    json whole(completion_view& v) override {
        const choice_state& c = v.choices[0];
        json content = json::array();
        if (!c.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", c.reasoning}, {"signature", ""}});
        if (!c.content.empty() || c.calls.empty()) content.push_back({{"type", "text"}, {"text", c.content}});
        for (const auto& call : c.calls)
            content.push_back({{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", input_of(call.arguments)}});
        const auto [reason, sequence] = stop_reason(c);
        return {{"id", v.id},
                {"type", "message"},
                {"role", "assistant"},
                {"content", content},
                {"model", v.model},
                {"stop_reason", reason},
                {"stop_sequence", sequence},
                {"usage", {{"input_tokens", c.n_prompt}, {"output_tokens", c.n_generated}}}};
    }

    reply error(const api_error& e) override { return anthropic_error(e); }

private:
    enum class block : uint8_t { none, thinking, text, tool };

    std::pair<json, json> stop_reason(const choice_state& c) const {
        if (!c.calls.empty() && c.finish_reason == "stop") return {"tool_use", nullptr};
        if (c.finish_reason == "length") return {"max_tokens", nullptr};
        if (!c.stop_string.empty() && std::find(stops_.begin(), stops_.end(), c.stop_string) != stops_.end())
            return {"stop_sequence", c.stop_string};
        return {"end_turn", nullptr};
    }

    // Opens a block of `kind` unless one is open (a tool_use block always opens anew).
    std::string start_block(block kind, const json& content_block) {
        if (open_ == kind && kind != block::tool) return {};
        std::string out = stop_block();
        open_ = kind;
        return out + event("content_block_start",
                           {{"type", "content_block_start"}, {"index", index_}, {"content_block", content_block}});
    }

    std::string delta(const json& d) {
        return event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", d}});
    }

    std::string stop_block() {
        if (open_ == block::none) return {};
        open_ = block::none;
        return event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_++}});
    }

    std::vector<std::string> stops_;
    block open_ = block::none;
    int index_ = 0;
};

std::string anthropic_error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

} // namespace

std::unique_ptr<encoder> make_anthropic_encoder(std::vector<std::string> stops) {
    return std::make_unique<anthropic_encoder>(std::move(stops));
}

reply anthropic_error(const api_error& e) {
    reply r = reply::of(e); // (status, Retry-After)
    std::string message = e.message;
    if (!e.param.empty() && message.find(e.param) == std::string::npos) message += " (" + e.param + ")";
    r.body = dump(json{{"type", "error"}, {"error", {{"type", anthropic_error_type(e.status)}, {"message", message}}}});
    return r;
}

} // namespace tandem::daemon
