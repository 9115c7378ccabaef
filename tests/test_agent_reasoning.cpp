// tandemd end to end, reasoning: a synthetic model with a Qwen3-like chat template and
// <think> tokens, its reply forced through the markers (a logit bias opens the thinking,
// max_reasoning_tokens closes it). The thinking comes back as reasoning_content, whole and
// streamed, and never in content; turning it off and the options' errors; Ollama's and
// Anthropic's forms of the same.
#include "server_fixtures.hpp"

#include "runtime/synth.hpp"
#include "runtime/tokenizer.hpp"

#include <fstream>

using namespace tandem;
using namespace tandem::test;

namespace {

// Qwen3's template in short: ChatML turns, thinking markers, enable_thinking.
constexpr const char* qwen3_like = R"({%- for message in messages %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %})";

struct reasoning_daemon {
    scratch_dir dir{"reasoning"};
    daemon_process d;
    token_id think = -1;
    reasoning_daemon() {
        synth_params p = synth_preset("tiny");
        p.added_tokens = {"<|im_start|>", "<|im_end|>", "<think>", "</think>"};
        p.chat_template = qwen3_like;
        const std::string model = dir.file("qwen3-like.gguf");
        synth_write(p, model);
        const model_bundle b = load_model(model);
        think = *b.tok->find("<think>");
        d.sock = dir.file("r.sock");
        d.spawn({"--model", model, "--socket", d.sock, "--threads", "1", "--log", "warn", "--set",
                 "kv_pool=" + d.sock + ".kv"});
        REQUIRE(d.wait_ready());
    }
    ~reasoning_daemon() { d.stop(); }
};

reasoning_daemon& daemon() {
    static reasoning_daemon r;
    return r;
}

const json user_turn = {{{"role", "user"}, {"content", "What is 2+2?"}}};

json forced(int budget, int max_tokens) {
    return {{"messages", user_turn},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"logit_bias", {{std::to_string(daemon().think), 100}}},
            {"max_reasoning_tokens", budget}};
}

} // namespace

TEST_CASE("the thinking is reasoning_content, whole and streamed, never content") {
    const std::string& s = daemon().d.sock;
    auto r = post(s, "/v1/chat/completions", forced(4, 16));
    REQUIRE(r.status == 200);
    const json j = r.j();
    CAPTURE(j.dump());
    const json msg = j["choices"][0]["message"];
    REQUIRE(msg.contains("reasoning_content"));
    CHECK(!msg["reasoning_content"].get<std::string>().empty());
    const std::string content = msg["content"];
    CHECK(content.find("<think>") == std::string::npos);
    CHECK(content.find("</think>") == std::string::npos);
    CHECK(msg["reasoning_content"].get<std::string>().find("think>") == std::string::npos);
    // the open marker, four thinking tokens and the close marker
    CHECK(j["usage"]["completion_tokens_details"]["reasoning_tokens"] == 6);

    json body = forced(4, 16);
    body["stream"] = true;
    auto st = post(s, "/v1/chat/completions", body);
    REQUIRE(st.status == 200);
    std::string reasoning, streamed;
    for (const json& e : sse_events(st.body))
        for (const json& c : e["choices"]) {
            if (c["delta"].contains("reasoning_content")) reasoning += c["delta"]["reasoning_content"].get<std::string>();
            if (c["delta"].contains("content")) streamed += c["delta"]["content"].get<std::string>();
        }
    CHECK(reasoning == msg["reasoning_content"]);
    CHECK(streamed == content);

    // Ollama's form: message.thinking; the same text
    auto o = post(s, "/api/chat", {{"model", "qwen3-like"}, {"messages", user_turn}, {"stream", false}, {"think", true},
                                   {"options", {{"temperature", 0}, {"num_predict", 6}}}});
    REQUIRE(o.status == 200);
    CHECK(o.j()["message"]["content"].get<std::string>().find("think>") == std::string::npos);
}

TEST_CASE("thinking turned off renders the template's empty thinking; options a model cannot take are 400s") {
    const std::string& s = daemon().d.sock;
    json on = {{"messages", user_turn}, {"max_tokens", 4}, {"temperature", 0}};
    json off = on;
    off["chat_template_kwargs"] = {{"enable_thinking", false}};
    auto a = post(s, "/v1/chat/completions", on), b = post(s, "/v1/chat/completions", off);
    REQUIRE(a.status == 200);
    REQUIRE(b.status == 200);
    CHECK(b.j()["usage"]["prompt_tokens"].get<int>() > a.j()["usage"]["prompt_tokens"].get<int>());
    CHECK(!b.j()["choices"][0]["message"].contains("reasoning_content"));
    auto shown = post(s, "/v1/messages/count_tokens", {{"model", "qwen3-like"}, {"messages", user_turn},
                                                       {"thinking", {{"type", "disabled"}}}});
    REQUIRE(shown.status == 200);
    CHECK(shown.j()["input_tokens"] == b.j()["usage"]["prompt_tokens"]);
    // Anthropic's thinking, bounded: accepted here (the model has markers)
    auto m = post(s, "/v1/messages", {{"model", "qwen3-like"}, {"messages", user_turn}, {"max_tokens", 8},
                                      {"thinking", {{"type", "enabled"}, {"budget_tokens", 2}}}});
    CHECK(m.status == 200);

    json effort = on;
    effort["reasoning_effort"] = "low";
    auto e = post(s, "/v1/chat/completions", effort);
    CHECK(e.status == 400);
    CHECK(e.j()["error"]["param"] == "reasoning_effort");

    // stories260K has no thinking markers: every reasoning option is a 400 naming it
    const auto& plain = shared_socket();
    auto k = post(plain, "/v1/chat/completions", off);
    CHECK(k.status == 400);
    CHECK(k.j()["error"]["param"] == "chat_template_kwargs.enable_thinking");
    json budget = on;
    budget["max_reasoning_tokens"] = 8;
    auto n = post(plain, "/v1/chat/completions", budget);
    CHECK(n.status == 400);
    CHECK(n.j()["error"]["param"] == "max_reasoning_tokens");
}
