// tandemd end to end, Anthropic's Messages API (POST /v1/messages, count_tokens) on
// stories260K: each reply's text against the same request through Chat Completions (greedy),
// the event stream's order, stop reasons, tool use, and errors in Anthropic's shape.
#include "server_fixtures.hpp"

using namespace tandem;
using namespace tandem::test;

namespace {

const json user_turn = {{{"role", "user"}, {"content", "Once upon a time"}}};

// The same conversation through Chat Completions, greedy.
json chat_reply(const std::string& s, const json& messages, int max_tokens, const json& extra = json::object()) {
    json body = {{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
    for (const auto& [k, v] : extra.items()) body[k] = v;
    auto r = post(s, "/v1/chat/completions", body);
    REQUIRE(r.status == 200);
    return r.j();
}

// The same conversation with OpenAI tools, as text: a tool in the order Anthropic's tools are
// shown to the template (type, then function: name, parameters), which this suite's sorted
// json would turn around (another prompt, so another reply).
json chat_reply_with_tools(const std::string& s, const json& messages, int max_tokens, const json& schema,
                           const std::string& more = "") {
    const std::string body = R"({"messages":)" + messages.dump() + R"(,"max_tokens":)" + std::to_string(max_tokens) +
                             R"(,"temperature":0,"tools":[{"type":"function","function":{"name":"get_weather","parameters":)" +
                             schema.dump() + "}}]" + more + "}";
    auto r = request(s, "POST", "/v1/chat/completions", body);
    REQUIRE(r.status == 200);
    return r.j();
}

json messages_body(const json& messages, int max_tokens) {
    return {{"model", "stories260K"}, {"max_tokens", max_tokens}, {"temperature", 0}, {"messages", messages}};
}

} // namespace

TEST_CASE("messages: the reply's text is Chat Completions' text; usage, stop reasons, count_tokens") {
    const auto& s = shared_socket();
    const json chat = chat_reply(s, user_turn, 12);
    auto r = post(s, "/v1/messages", messages_body(user_turn, 12));
    REQUIRE(r.status == 200);
    const json m = r.j();
    CAPTURE(m.dump());
    CHECK(m["type"] == "message");
    CHECK(m["role"] == "assistant");
    CHECK(m["model"] == "stories260K");
    CHECK(m["id"].get<std::string>().starts_with("msg"));
    REQUIRE(m["content"].size() == 1);
    CHECK(m["content"][0]["type"] == "text");
    CHECK(m["content"][0]["text"] == chat["choices"][0]["message"]["content"]);
    CHECK(m["stop_reason"] == (chat["choices"][0]["finish_reason"] == "length" ? "max_tokens" : "end_turn"));
    CHECK(m["stop_sequence"].is_null());
    CHECK(m["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]);
    CHECK(m["usage"]["output_tokens"] == chat["usage"]["completion_tokens"]);

    // count_tokens: the prompt's tokens, as the reply's usage counts them
    auto n = post(s, "/v1/messages/count_tokens", {{"model", "stories260K"}, {"messages", user_turn}});
    REQUIRE(n.status == 200);
    CHECK(n.j()["input_tokens"] == m["usage"]["input_tokens"]);

    // system as a string and as text blocks: the same prompt
    json sys = messages_body(user_turn, 6);
    sys["system"] = "You tell stories.";
    json blocks = sys;
    blocks["system"] = json::array({{{"type", "text"}, {"text", "You tell stories."}}});
    auto a = post(s, "/v1/messages", sys), b = post(s, "/v1/messages", blocks);
    REQUIRE(a.status == 200);
    REQUIRE(b.status == 200);
    CHECK(a.j()["content"] == b.j()["content"]);
    CHECK(a.j()["usage"]["input_tokens"] == b.j()["usage"]["input_tokens"]);
    json with_system = user_turn;
    with_system.insert(with_system.begin(), json{{"role", "system"}, {"content", "You tell stories."}});
    CHECK(a.j()["content"][0]["text"] == chat_reply(s, with_system, 6)["choices"][0]["message"]["content"]);

    // a stop sequence from the reply's own text: stop_reason names it, the text ends before it
    const std::string full = m["content"][0]["text"];
    const size_t cut = full.find(' ', 3);
    REQUIRE(cut != std::string::npos);
    const std::string word = full.substr(cut, 3);
    json stop = messages_body(user_turn, 12);
    stop["stop_sequences"] = {"zzzz", word};
    auto st = post(s, "/v1/messages", stop);
    REQUIRE(st.status == 200);
    CHECK(st.j()["stop_reason"] == "stop_sequence");
    CHECK(st.j()["stop_sequence"] == word);
    CHECK(st.j()["content"][0]["text"] == full.substr(0, full.find(word)));
}

TEST_CASE("messages streamed: Anthropic's events in order, the text Chat Completions' text") {
    const auto& s = shared_socket();
    const json chat = chat_reply(s, user_turn, 12);
    json body = messages_body(user_turn, 12);
    body["stream"] = true;
    auto r = post(s, "/v1/messages", body);
    REQUIRE(r.status == 200);
    CHECK(r.headers["content-type"].find("text/event-stream") == 0);
    bool ok = false;
    const auto events = named_events(r.body, ok);
    CHECK(ok);
    std::vector<std::string> names;
    std::string text;
    for (const auto& [name, data] : events) {
        if (names.empty() || names.back() != name) names.push_back(name);
        if (name == "content_block_delta") {
            CHECK(data["index"] == 0);
            CHECK(data["delta"]["type"] == "text_delta");
            text += data["delta"]["text"].get<std::string>();
        }
    }
    const std::vector<std::string> want = {"message_start", "ping", "content_block_start", "content_block_delta",
                                           "content_block_stop", "message_delta", "message_stop"};
    CHECK(names == want);
    CHECK(text == chat["choices"][0]["message"]["content"]);
    REQUIRE(events.size() >= 4);
    CHECK(events[0].second["message"]["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]);
    const json& delta = events[events.size() - 2].second;
    CHECK(delta["delta"]["stop_reason"] == "max_tokens");
    CHECK(delta["usage"]["output_tokens"] == chat["usage"]["completion_tokens"]);
}

TEST_CASE("messages with tools: tool_use blocks, input_json_delta, the result sent back") {
    const auto& s = shared_socket();
    const json schema = {{"type", "object"},
                         {"properties", {{"city", {{"type", "string"}, {"maxLength", 12}}}}},
                         {"required", {"city"}}};
    // (no description: this suite's json sorts keys, and the template shows a tool's keys in
    // the order the request gave them; Anthropic's tools are shown as name, then parameters)
    const json tools = {{{"name", "get_weather"}, {"input_schema", schema}}};
    json body = messages_body(user_turn, 250);
    body["tools"] = tools;
    body["tool_choice"] = {{"type", "any"}, {"disable_parallel_tool_use", true}};
    auto r = post(s, "/v1/messages", body);
    REQUIRE(r.status == 200);
    const json m = r.j();
    CAPTURE(m.dump());
    REQUIRE(m["stop_reason"] == "tool_use");
    const json use = m["content"].back();
    CHECK(use["type"] == "tool_use");
    CHECK(use["name"] == "get_weather");
    REQUIRE(use["input"].is_object());
    CHECK(use["input"]["city"].is_string());

    // the same call through Chat Completions
    const json chat =
        chat_reply_with_tools(s, user_turn, 250, schema, R"(,"tool_choice":"required","parallel_tool_calls":false)");
    const json call = chat["choices"][0]["message"]["tool_calls"][0]["function"];
    CHECK(json::parse(call["arguments"].get<std::string>()) == use["input"]);

    // streamed: a tool_use block whose input_json_delta pieces add up to the input
    body["stream"] = true;
    auto st = post(s, "/v1/messages", body);
    REQUIRE(st.status == 200);
    bool ok = false;
    std::string partial;
    bool started = false;
    for (const auto& [name, data] : named_events(st.body, ok)) {
        if (name == "content_block_start" && data["content_block"]["type"] == "tool_use") {
            started = true;
            CHECK(data["content_block"]["name"] == "get_weather");
            CHECK(data["content_block"]["input"] == json::object());
        }
        if (name == "content_block_delta" && data["delta"]["type"] == "input_json_delta")
            partial += data["delta"]["partial_json"].get<std::string>();
        if (name == "message_delta") CHECK(data["delta"]["stop_reason"] == "tool_use");
    }
    CHECK(ok);
    CHECK(started);
    CHECK(json::parse(partial) == use["input"]);

    // the round trip: the call and its result, as a client sends them back
    json history = user_turn;
    history.push_back({{"role", "assistant"}, {"content", m["content"]}});
    history.push_back({{"role", "user"},
                       {"content", {{{"type", "tool_result"}, {"tool_use_id", use["id"]}, {"content", "18 C"}}}}});
    json next = messages_body(history, 8);
    next["tools"] = tools;
    auto followed = post(s, "/v1/messages", next);
    CHECK(followed.status == 200);
    // and Chat Completions renders the same history to the same prompt
    json oa_history = user_turn;
    oa_history.push_back({{"role", "assistant"}, {"content", nullptr},
                          {"tool_calls", {{{"id", use["id"]}, {"type", "function"},
                                           {"function", {{"name", "get_weather"}, {"arguments", use["input"].dump()}}}}}}});
    oa_history.push_back({{"role", "tool"}, {"tool_call_id", use["id"]}, {"content", "18 C"}});
    const json oa = chat_reply_with_tools(s, oa_history, 8, schema);
    CHECK(followed.j()["usage"]["input_tokens"] == oa["usage"]["prompt_tokens"]);
    CHECK(followed.j()["content"][0]["text"] == oa["choices"][0]["message"]["content"]);
}

TEST_CASE("messages: what Tandem does not do is a 400 in Anthropic's shape that names it") {
    const auto& s = shared_socket();
    const auto refused = [&](json body, const std::string& named, int status = 400) {
        auto r = post(s, "/v1/messages", body);
        CAPTURE(body.dump());
        CAPTURE(r.body);
        CHECK(r.status == status);
        const json j = r.j();
        CHECK(j["type"] == "error");
        CHECK(j["error"]["type"] == (status == 404 ? "not_found_error" : "invalid_request_error"));
        CHECK(j["error"]["message"].get<std::string>().find(named) != std::string::npos);
    };
    json base = messages_body(user_turn, 4);
    json b = base;
    b.erase("max_tokens");
    refused(b, "max_tokens");
    b = base;
    b["frequency_penalty"] = 1;
    refused(b, "frequency_penalty");
    b = base;
    b["model"] = "claude-opus-4";
    refused(b, "claude-opus-4", 404);
    b = base;
    b["messages"] = {{{"role", "user"},
                      {"content", {{{"type", "image"}, {"source", {{"type", "base64"}, {"data", "AA=="}}}}}}}};
    refused(b, "messages[0].content[0]");
    b = base;
    b["system"] = {{{"type", "text"}, {"text", "x"}, {"cache_control", {{"type", "ephemeral"}}}}};
    refused(b, "system[0].cache_control");
    b = base;
    b["tools"] = {{{"type", "bash_20250124"}, {"name", "bash"}}};
    refused(b, "tools[0].type");
    b = base;
    b["messages"] = {user_turn[0], {{"role", "assistant"}, {"content", "The"}}};
    refused(b, "messages[1]");
    b = base;
    b["temperature"] = 1.5;
    refused(b, "temperature");
    b = base;
    b["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
    refused(b, "thinking"); // stories260K does not reason
    auto bad_json = request(s, "POST", "/v1/messages", "{");
    CHECK(bad_json.status == 400);
    CHECK(bad_json.j()["type"] == "error");
    // count_tokens takes no max_tokens
    auto n = post(s, "/v1/messages/count_tokens", base);
    CHECK(n.status == 400);
    CHECK(n.j()["error"]["message"].get<std::string>().find("max_tokens") != std::string::npos);
}

TEST_CASE("errors before the route keep the path's API shape") {
    const auto& s = shared_socket();
    auto m = request(s, "GET", "/v1/messages");
    CHECK(m.status == 405);
    CHECK(m.j()["type"] == "error");
    CHECK(m.j()["error"]["type"] == "invalid_request_error");
    auto o = request(s, "POST", "/api/nothing-here", "{}");
    CHECK(o.status == 404);
    CHECK(o.j()["error"].is_string());
}
