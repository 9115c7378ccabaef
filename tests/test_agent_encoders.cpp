// The agent surfaces' encoders fed a reasoning reply with a tool call, as the completion
// handler feeds them (daemon/encoder.hpp): Anthropic's thinking, text and tool_use blocks and
// their events, the Responses API's reasoning, message and function_call items, Ollama's
// thinking; the thinking never in the text. (The daemon suites force thinking only through
// Chat Completions' logit_bias, which these surfaces lack.)
#include "daemon/anthropic.hpp"
#include "daemon/ollama.hpp"
#include "daemon/responses.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

using namespace tandem;
using namespace tandem::daemon;

namespace {

struct feed {
    const tokenizer& tok() {
        static model_bundle b = load_model(test::model_path("stories260K.gguf"));
        return *b.tok;
    }
    generation_plan plan;
    std::vector<choice_state> cs{1};
    std::string id = "x-1", model = "m";
    std::string out;

    explicit feed(bool stream) {
        plan.chat = true;
        plan.stream = stream;
        plan.tools = grammar::tool_syntax::hermes;
        plan.reasoning = reasoning_format{};
        engine_request r;
        r.prompt = {1, 2, 3};
        plan.requests.push_back(r);
        cs[0].parser.emplace(*plan.tools);
        cs[0].splitter.emplace(*plan.reasoning, reasoning_start::maybe);
    }

    // The reply in pieces, then its end, through `enc`.
    void run(encoder& enc, const std::vector<std::string>& pieces) {
        completion_view v{id, model, plan, cs, tok()};
        if (plan.stream) out += enc.open(v);
        for (const std::string& p : pieces) {
            const reply_delta d = read_reply(cs[0], p, false);
            const choice_step s{nullptr, d, json::array(), false};
            out += enc.step(v, 0, s);
        }
        const reply_delta d = read_reply(cs[0], "", true);
        engine_event done;
        done.done = true;
        done.finish_reason = "stop";
        done.n_prompt = 3;
        done.n_generated = int32_t(pieces.size());
        cs[0].finish(done);
        const choice_step s{&done, d, json::array(), false};
        out += enc.finish(v, 0, s);
        if (plan.stream) out += enc.close(v);
        else whole = enc.whole(v);
    }
    json whole;
};

const std::vector<std::string> the_reply = {"<thi", "nk>\nI should", " call it.</th", "ink>\n\nSure. <tool_call>\n{\"name\": ",
                                        "\"get_weather\", \"arguments\": {\"city\": \"Pa", "ris\"}}\n</tool_call>"};

// event: NAME / data: {...} frames.
std::vector<std::pair<std::string, json>> frames(const std::string& body) {
    std::vector<std::pair<std::string, json>> out;
    size_t pos = 0;
    while (pos < body.size()) {
        const size_t end = body.find("\n\n", pos);
        REQUIRE(end != std::string::npos);
        const std::string f = body.substr(pos, end - pos);
        pos = end + 2;
        const size_t nl = f.find('\n');
        REQUIRE(f.rfind("event: ", 0) == 0);
        out.emplace_back(f.substr(7, nl - 7), json::parse(f.substr(nl + 7)));
    }
    return out;
}

} // namespace

TEST_CASE("anthropic: thinking, text and tool_use blocks, whole and as events") {
    feed w(false);
    auto enc = make_anthropic_encoder({});
    w.run(*enc, the_reply);
    const json& c = w.whole["content"];
    CAPTURE(w.whole.dump());
    REQUIRE(c.size() == 3);
    CHECK(c[0]["type"] == "thinking");
    CHECK(c[0]["thinking"] == "I should call it.");
    CHECK(c[1]["type"] == "text");
    CHECK(c[1]["text"] == "Sure.");
    CHECK(c[2]["type"] == "tool_use");
    CHECK(c[2]["input"] == json{{"city", "Paris"}});
    CHECK(w.whole["stop_reason"] == "tool_use");

    feed s(true);
    auto senc = make_anthropic_encoder({});
    s.run(*senc, the_reply);
    std::string thinking, text, input;
    std::vector<std::string> blocks;
    int open = -1;
    for (const auto& [name, data] : frames(s.out)) {
        CHECK(data["type"] == name);
        if (name == "content_block_start") {
            CHECK(open == -1);
            open = data["index"];
            CHECK(open == int(blocks.size()));
            blocks.push_back(data["content_block"]["type"]);
        }
        if (name == "content_block_delta") {
            CHECK(data["index"] == open);
            const json& d = data["delta"];
            if (d["type"] == "thinking_delta") thinking += d["thinking"].get<std::string>();
            if (d["type"] == "text_delta") text += d["text"].get<std::string>();
            if (d["type"] == "input_json_delta") input += d["partial_json"].get<std::string>();
        }
        if (name == "content_block_stop") {
            CHECK(data["index"] == open);
            open = -1;
        }
        if (name == "message_delta") CHECK(data["delta"]["stop_reason"] == "tool_use");
    }
    CHECK(open == -1);
    CHECK(blocks == std::vector<std::string>{"thinking", "text", "tool_use"});
    CHECK(thinking == "I should call it.");
    CHECK(text == "Sure.");
    CHECK(json::parse(input) == json{{"city", "Paris"}});
}

TEST_CASE("responses: reasoning, message and function_call items, whole and as events") {
    feed w(false);
    responses_context ctx;
    ctx.store = false;
    auto enc = make_responses_encoder(ctx);
    w.run(*enc, the_reply);
    const json& out = w.whole["output"];
    CAPTURE(w.whole.dump());
    REQUIRE(out.size() == 3);
    CHECK(out[0]["type"] == "reasoning");
    CHECK(out[0]["content"][0]["text"] == "I should call it.");
    CHECK(out[1]["content"][0]["text"] == "Sure.");
    CHECK(out[2]["type"] == "function_call");
    CHECK(out[2]["arguments"] == "{\"city\": \"Paris\"}");
    CHECK(w.whole["usage"]["output_tokens_details"]["reasoning_tokens"].get<int>() > 0);

    feed s(true);
    auto senc = make_responses_encoder(ctx);
    s.run(*senc, the_reply);
    const auto f = frames(s.out);
    REQUIRE(!f.empty());
    for (size_t i = 0; i < f.size(); ++i) CHECK(f[i].second["sequence_number"] == int(i));
    CHECK(f.back().first == "response.completed");
    CHECK(f.back().second["response"]["output"].size() == 3);
    std::string reasoning, text;
    for (const auto& [name, data] : f) {
        if (name == "response.reasoning_text.delta") reasoning += data["delta"].get<std::string>();
        if (name == "response.output_text.delta") text += data["delta"].get<std::string>();
    }
    CHECK(reasoning == "I should call it.");
    CHECK(text == "Sure.");
}

TEST_CASE("ollama: the thinking apart, the call whole on the last line") {
    feed w(false);
    auto enc = make_ollama_encoder(false, std::chrono::steady_clock::now());
    w.run(*enc, the_reply);
    CAPTURE(w.whole.dump());
    CHECK(w.whole["message"]["thinking"] == "I should call it.");
    CHECK(w.whole["message"]["content"] == "Sure.");
    CHECK(w.whole["message"]["tool_calls"][0]["function"]["arguments"] == json{{"city", "Paris"}});
    CHECK(w.whole["done"] == true);
}
