// The Responses API's replies (daemon/responses.hpp): the response object with its output
// items (reasoning, message, function_call), streamed as response.* events; stored when the
// request asked (store, the default).
#include "daemon/responses.hpp"

#include <fmt/format.h>

#include <ctime>
#include <random>

namespace tandem::daemon {
namespace {

std::string item_id(std::string_view prefix) {
    static constexpr std::string_view hex = "0123456789abcdef";
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::string id(prefix);
    for (int i = 0; i < 24; ++i) id.push_back(hex[rng() % 16]);
    return id;
}

class responses_encoder final : public encoder {
public:
    explicit responses_encoder(responses_context ctx) : ctx_(std::move(ctx)), created_(int64_t(std::time(nullptr))) {}

    std::string open(completion_view& v) override {
        json r = response(v, "in_progress", json::array(), nullptr);
        std::string out = event("response.created", {{"response", r}}); // (in order: each takes the next number)
        out += event("response.in_progress", {{"response", r}});
        return out;
    }

    std::string step(completion_view& v, size_t, const choice_step& s) override {
        if (!v.plan.stream) return {};
        std::string out;
        const reply_delta& d = s.delta;
        if (!d.reasoning.empty()) {
            out += begin(kind::reasoning);
            reasoning_ += d.reasoning;
            out += event("response.reasoning_text.delta",
                         {{"item_id", id_}, {"output_index", index_}, {"content_index", 0}, {"delta", d.reasoning}});
        }
        if (!d.content.empty()) {
            out += begin(kind::message);
            text_ += d.content;
            out += event("response.output_text.delta", {{"item_id", id_},
                                                        {"output_index", index_},
                                                        {"content_index", 0},
                                                        {"delta", d.content},
                                                        {"logprobs", json::array()}});
        }
        if (d.tool_calls.is_array())
            for (const json& call : d.tool_calls) {
                const json fn = call.value("function", json::object());
                if (call.contains("id")) {
                    out += end();
                    call_id_ = call["id"].get<std::string>();
                    name_ = fn.value("name", "");
                    out += begin(kind::call);
                }
                const std::string args = fn.value("arguments", "");
                if (args.empty()) continue;
                arguments_ += args;
                out += event("response.function_call_arguments.delta",
                             {{"item_id", id_}, {"output_index", index_}, {"delta", args}});
            }
        return out;
    }

    std::string finish(completion_view& v, size_t i, const choice_step& s) override {
        if (!v.plan.stream) return {};
        std::string out = step(v, i, s); // (before the item ends)
        out += end();
        return out;
    }

    std::string close(completion_view& v) override {
        const json r = finished(v);
        return event(r["status"] == "completed" ? "response.completed" : "response.incomplete", {{"response", r}});
    }

    json whole(completion_view& v) override { return finished(v); }

private:
    enum class kind : uint8_t { none, reasoning, message, call };

    std::string event(std::string_view type, json data) {
        json j = {{"type", std::string(type)}, {"sequence_number", seq_++}};
        for (const auto& [k, x] : data.items()) j[k] = x;
        return fmt::format("event: {}\ndata: {}\n\n", type, dump(j));
    }

    json item(kind k, bool done) const {
        const char* status = done ? "completed" : "in_progress";
        if (k == kind::reasoning) {
            json content = json::array();
            if (done) content.push_back({{"type", "reasoning_text"}, {"text", reasoning_}});
            return {{"type", "reasoning"}, {"id", id_}, {"summary", json::array()}, {"content", content}};
        }
        if (k == kind::message) {
            json content = json::array();
            if (done) content.push_back({{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}});
            return {{"type", "message"}, {"id", id_}, {"status", status}, {"role", "assistant"}, {"content", content}};
        }
        return {{"type", "function_call"},
                {"id", id_},
                {"call_id", call_id_},
                {"name", name_},
                {"arguments", done ? arguments_ : std::string()},
                {"status", status}};
    }

    // Opens an output item of kind k unless one is open (a call always opens anew).
    std::string begin(kind k) {
        if (open_ == k && k != kind::call) return {};
        std::string out = end();
        open_ = k;
        id_ = item_id(k == kind::reasoning ? "rs_" : k == kind::message ? "msg_" : "fc_");
        text_.clear();
        reasoning_.clear();
        arguments_.clear();
        out += event("response.output_item.added", {{"output_index", index_}, {"item", item(k, false)}});
        if (k == kind::message)
            out += event("response.content_part.added",
                         {{"item_id", id_},
                          {"output_index", index_},
                          {"content_index", 0},
                          {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
        return out;
    }

    std::string end() {
        if (open_ == kind::none) return {};
        std::string out;
        if (open_ == kind::reasoning)
            out += event("response.reasoning_text.done",
                         {{"item_id", id_}, {"output_index", index_}, {"content_index", 0}, {"text", reasoning_}});
        if (open_ == kind::message) {
            out += event("response.output_text.done",
                         {{"item_id", id_}, {"output_index", index_}, {"content_index", 0}, {"text", text_},
                          {"logprobs", json::array()}});
            out += event("response.content_part.done",
                         {{"item_id", id_},
                          {"output_index", index_},
                          {"content_index", 0},
                          {"part", {{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}}}});
        }
        if (open_ == kind::call)
            out += event("response.function_call_arguments.done",
                         {{"item_id", id_}, {"output_index", index_}, {"arguments", arguments_}});
        const json done = item(open_, true);
        out += event("response.output_item.done", {{"output_index", index_}, {"item", done}});
        streamed_.push_back(done);
        ++index_;
        open_ = kind::none;
        return out;
    }

    json response(const completion_view& v, const char* status, json output, const json& usage) const {
        json r = {{"id", v.id},
                  {"object", "response"},
                  {"created_at", created_},
                  {"status", status},
                  {"error", nullptr},
                  {"incomplete_details", nullptr},
                  {"model", v.model},
                  {"output", std::move(output)},
                  {"usage", usage}};
        for (const auto& [k, x] : ctx_.settings.items()) r[k] = x;
        return r;
    }

    // The finished response (the streamed items, or built whole), stored when asked.
    json finished(completion_view& v) {
        const choice_state& c = v.choices[0];
        json output = json::array();
        if (v.plan.stream) {
            output = streamed_;
        } else {
            const auto add = [&](kind k) {
                id_ = item_id(k == kind::reasoning ? "rs_" : k == kind::message ? "msg_" : "fc_");
                output.push_back(item(k, true));
            };
            reasoning_ = c.reasoning;
            text_ = c.content;
            if (!reasoning_.empty()) add(kind::reasoning);
            if (!text_.empty() || c.calls.empty()) add(kind::message);
            for (const auto& call : c.calls) {
                call_id_ = call.id;
                name_ = call.name;
                arguments_ = call.arguments;
                add(kind::call);
            }
        }
        const int64_t cached = c.n_cached;
        const json usage = {{"input_tokens", c.n_prompt},
                            {"input_tokens_details", {{"cached_tokens", cached}}},
                            {"output_tokens", c.n_generated},
                            {"output_tokens_details", {{"reasoning_tokens", c.n_reasoning}}},
                            {"total_tokens", c.n_prompt + c.n_generated}};
        const bool cut = c.finish_reason == "length";
        json r = response(v, cut ? "incomplete" : "completed", output, usage);
        if (cut) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
        if (ctx_.store && ctx_.store_to && c.finish_reason != "error") {
            // The conversation through this reply: what the next request continues.
            std::vector<chat_message> messages = ctx_.messages;
            chat_message reply{"assistant", c.content, {}, {}};
            for (const auto& call : c.calls) reply.tool_calls.push_back({call.id, call.name, call.arguments});
            messages.push_back(std::move(reply));
            ctx_.store_to->put(v.id, ctx_.owner, messages, r);
        }
        return r;
    }

    responses_context ctx_;
    int64_t created_;
    int64_t seq_ = 0;
    kind open_ = kind::none;
    int index_ = 0;
    std::string id_, text_, reasoning_, arguments_, call_id_, name_;
    json streamed_ = json::array();
};

} // namespace

std::unique_ptr<encoder> make_responses_encoder(responses_context ctx) {
    return std::make_unique<responses_encoder>(std::move(ctx));
}

} // namespace tandem::daemon
