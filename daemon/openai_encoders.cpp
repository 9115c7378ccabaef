// OpenAI's Chat Completions and Completions as encoders (daemon/encoder.hpp): chunks, the
// usage chunk and [DONE], the whole chat.completion / text_completion object.
#include "daemon/encoder.hpp"

#include <ctime>

namespace tandem::daemon {
namespace {
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
        if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
        if (!text.empty() || (finish_reason.empty() && d.tool_calls.is_null() && d.reasoning.empty()))
            delta["content"] = text;
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
            ch["message"] = {{"role", "assistant"}, {"content", plan.reasoning ? c.content : c.text}};
        } else {
            ch["text"] = c.text;
        }
        if (plan.reasoning && !c.reasoning.empty()) ch["message"]["reasoning_content"] = c.reasoning;
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

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

class openai_encoder final : public encoder {
public:
    explicit openai_encoder(bool chat) : chat_(chat) {}

    std::string step(completion_view& v, size_t i, const choice_step& s) override {
        choice_state& c = v.choices[i];
        json lp = nullptr;
        if (s.ev && v.plan.logprobs) lp = add_logprobs(c, *s.ev, chat_, v.tok); // (kept for the whole response too)
        if (!v.plan.stream) return {};
        const reply_delta& d = s.delta;
        if (!s.echo && d.content.empty() && d.reasoning.empty() && d.tool_calls.is_null() && !v.plan.logprobs &&
            s.citations.empty())
            return {};
        json chunk = stream_chunk(v.id, v.model, chat_, int(i), c, d, lp, "", v.plan.include_usage);
        if (!s.citations.empty()) chunk["choices"][0]["delta"]["citations"] = s.citations;
        return sse(chunk);
    }

    std::string prompt_scored(completion_view& v, size_t i, const engine_event& ev, const std::string& echo) override {
        const json lp = add_prompt_logprobs(v.choices[i], ev.prompt, echo, v.tok);
        if (!v.plan.stream) return {};
        const reply_delta d{echo, nullptr};
        return sse(stream_chunk(v.id, v.model, chat_, int(i), v.choices[i], d, lp, "", v.plan.include_usage));
    }

    std::string finish(completion_view& v, size_t i, const choice_step& s) override {
        if (!v.plan.stream) return {};
        choice_state& c = v.choices[i];
        const generation_plan& plan = v.plan;
        json last = stream_chunk(v.id, v.model, chat_, int(i), c, s.delta, nullptr, client_finish_reason(c),
                                 plan.include_usage);
        json& choice = last["choices"][0];
        if (plan.beam) add_beam_fields(choice, c);
        if (c.finish_reason == "error" && !c.error.empty())
            last["error"] = {{"message", "the engine failed while generating: " + c.error}, {"type", "server_error"}};
        if (!s.citations.empty()) choice["delta"]["citations"] = s.citations;
        if (plan.cites()) choice["citations"] = c.citations; // all of them
        if (plan.strict) choice["unsupported"] = unsupported_sentences(c.text, c.citations);
        if (!plan.passages.empty()) last["passages"] = passages_json(plan);
        if (plan.truncate) // (a stream without include_usage has no usage to say it in)
            choice["truncated_prompt_tokens"] = plan.truncated[i / size_t(plan.n_seqs)];
        return sse(last);
    }

    std::string close(completion_view& v) override {
        std::string out;
        if (v.plan.include_usage)
            out = sse(json{{"id", v.id},
                           {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
                           {"created", int64_t(std::time(nullptr))},
                           {"model", v.model},
                           {"choices", json::array()},
                           {"usage", usage_json(v.choices, v.plan)}});
        return out + "data: [DONE]\n\n";
    }

    json whole(completion_view& v) override { return final_response(v.id, v.model, v.plan, v.choices); }

private:
    bool chat_;
};

} // namespace

std::unique_ptr<encoder> make_openai_encoder(bool chat) { return std::make_unique<openai_encoder>(chat); }

} // namespace tandem::daemon
