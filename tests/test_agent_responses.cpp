// tandemd end to end, OpenAI's Responses API on stories260K: output text against Chat
// Completions (greedy), the response.* event stream, function calls and their outputs,
// stored responses continued with previous_response_id and kept per owner, errors by name.
#include "server_fixtures.hpp"

using namespace tandem;
using namespace tandem::test;

namespace {

// The named events of a stream (daemon_client.hpp), `ok` false also when their sequence
// numbers are not 0, 1, 2, ...
std::vector<std::pair<std::string, json>> numbered_events(const std::string& body, bool& ok) {
    auto out = named_events(body, ok);
    for (size_t i = 0; i < out.size(); ++i)
        if (out[i].second.value("sequence_number", -1) != int(i)) ok = false;
    return out;
}

std::string chat_text(const std::string& s, const json& messages, int max_tokens) {
    auto r = post(s, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}});
    REQUIRE(r.status == 200);
    return r.j()["choices"][0]["message"]["content"];
}

std::string output_text(const json& response) {
    std::string s;
    for (const json& item : response["output"])
        if (item["type"] == "message")
            for (const json& part : item["content"]) s += part["text"].get<std::string>();
    return s;
}

} // namespace

TEST_CASE("responses: the output text is Chat Completions' text, whole and streamed") {
    const auto& s = shared_socket();
    const json messages = {{{"role", "system"}, {"content", "Tell a story."}}, {{"role", "user"}, {"content", "Once upon a time"}}};
    const std::string want = chat_text(s, messages, 12);
    const json body = {{"model", "stories260K"}, {"instructions", "Tell a story."}, {"input", "Once upon a time"},
                       {"max_output_tokens", 12}, {"temperature", 0}, {"store", false}};
    auto r = post(s, "/v1/responses", body);
    REQUIRE(r.status == 200);
    const json j = r.j();
    CAPTURE(j.dump());
    CHECK(j["object"] == "response");
    CHECK(j["status"] == "incomplete");
    CHECK(j["incomplete_details"]["reason"] == "max_output_tokens");
    CHECK(output_text(j) == want);
    CHECK(j["usage"]["output_tokens"] == 12);
    CHECK(j["instructions"] == "Tell a story.");
    // not stored: nothing to fetch
    CHECK(request(s, "GET", "/v1/responses/" + j["id"].get<std::string>()).status == 404);

    json st = body;
    st["stream"] = true;
    auto sr = post(s, "/v1/responses", st);
    REQUIRE(sr.status == 200);
    bool ok = false;
    const auto events = numbered_events(sr.body, ok);
    CHECK(ok);
    std::vector<std::string> names;
    std::string text;
    for (const auto& [name, data] : events) {
        if (names.empty() || names.back() != name) names.push_back(name);
        if (name == "response.output_text.delta") text += data["delta"].get<std::string>();
    }
    const std::vector<std::string> order = {"response.created", "response.in_progress", "response.output_item.added",
                                            "response.content_part.added", "response.output_text.delta",
                                            "response.output_text.done", "response.content_part.done",
                                            "response.output_item.done", "response.incomplete"};
    CHECK(names == order);
    CHECK(text == want);
    CHECK(output_text(events.back().second["response"]) == want);
}

TEST_CASE("responses: function calls and their outputs; stored responses continue, per owner, and are deleted") {
    const auto& s = shared_socket();
    const json tools = {{{"type", "function"}, {"name", "get_weather"},
                         {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}, {"maxLength", 12}}}}},
                                         {"required", {"city"}}}}}};
    auto r = post(s, "/v1/responses", {{"input", "Weather in Paris?"}, {"tools", tools}, {"tool_choice", "required"},
                                       {"parallel_tool_calls", false}, {"max_output_tokens", 120}, {"temperature", 0}});
    REQUIRE(r.status == 200);
    const json j = r.j();
    CAPTURE(j.dump());
    REQUIRE(j["status"] == "completed");
    const json call = j["output"].back();
    REQUIRE(call["type"] == "function_call");
    CHECK(call["name"] == "get_weather");
    CHECK(json::parse(call["arguments"].get<std::string>())["city"].is_string());

    // stored (the default): fetched, continued with the call's output, the continuation's prompt
    // the same conversation through Chat Completions
    const std::string id = j["id"];
    auto got = request(s, "GET", "/v1/responses/" + id);
    REQUIRE(got.status == 200);
    CHECK(got.j()["output"] == j["output"]);
    auto next = post(s, "/v1/responses", {{"previous_response_id", id}, {"tools", tools}, {"max_output_tokens", 6},
                                          {"temperature", 0}, {"store", false},
                                          {"input", {{{"type", "function_call_output"}, {"call_id", call["call_id"]},
                                                      {"output", "18 C"}}}}});
    REQUIRE(next.status == 200);
    const json oa_tools = {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", tools[0]["parameters"]}}}}};
    const json history = {{{"role", "user"}, {"content", "Weather in Paris?"}},
                          {{"role", "assistant"}, {"content", nullptr},
                           {"tool_calls", {{{"id", call["call_id"]}, {"type", "function"},
                                            {"function", {{"name", "get_weather"}, {"arguments", call["arguments"]}}}}}}},
                          {{"role", "tool"}, {"tool_call_id", call["call_id"]}, {"content", "18 C"}}};
    auto oa = post(s, "/v1/chat/completions", {{"messages", history}, {"tools", oa_tools}, {"max_tokens", 6}, {"temperature", 0}});
    REQUIRE(oa.status == 200);
    CHECK(next.j()["usage"]["input_tokens"] == oa.j()["usage"]["prompt_tokens"]);
    CHECK(output_text(next.j()) == oa.j()["choices"][0]["message"]["content"]);

    // the same conversation sent as items gives the same reply
    auto items = post(s, "/v1/responses",
                      {{"tools", tools}, {"max_output_tokens", 6}, {"temperature", 0}, {"store", false},
                       {"input", {{{"role", "user"}, {"content", "Weather in Paris?"}},
                                  {{"type", "function_call"}, {"call_id", call["call_id"]}, {"name", "get_weather"},
                                   {"arguments", call["arguments"]}},
                                  {{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "18 C"}}}}});
    REQUIRE(items.status == 200);
    CHECK(output_text(items.j()) == output_text(next.j()));

    CHECK(request(s, "DELETE", "/v1/responses/" + id).status == 200);
    CHECK(request(s, "GET", "/v1/responses/" + id).status == 404);
    auto gone = post(s, "/v1/responses", {{"previous_response_id", id}, {"input", "hi"}});
    CHECK(gone.status == 404);
    CHECK(gone.j()["error"]["param"] == "previous_response_id");
}

TEST_CASE("responses: built-in tools, images and what else Tandem does not do are 400s by name") {
    const auto& s = shared_socket();
    const auto refused = [&](json body, const std::string& param) {
        if (!body.contains("input")) body["input"] = "hi";
        auto r = post(s, "/v1/responses", body);
        CAPTURE(r.body);
        CHECK(r.status == 400);
        CHECK(r.j()["error"]["param"] == param);
    };
    refused({{"tools", {{{"type", "web_search"}}}}}, "tools[0].type");
    refused({{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}, {"image_url", "x"}}}}}}}},
            "input[0].content[0].type");
    refused({{"background", true}}, "background");
    refused({{"reasoning", {{"effort", "low"}}}}, "reasoning.effort");
    refused({{"text", {{"format", {{"type", "json_schema"}, {"name", "x"}, {"schema", 3}}}}}}, "text.format.schema");
    refused({{"frequency_penalty", 1}}, "frequency_penalty");
    refused({{"truncation", "auto"}}, "truncation");
}

TEST_CASE("responses: stored ones expire after responses_ttl_h") {
    daemon_process d;
    d.start(scratch().file("ttl.sock"), {"--set", "responses_ttl_h=1"});
    REQUIRE(d.wait_ready());
    auto r = post(d.sock, "/v1/responses", {{"input", "Once"}, {"max_output_tokens", 2}});
    REQUIRE(r.status == 200);
    const std::string id = r.j()["id"];
    CHECK(request(d.sock, "GET", "/v1/responses/" + id).status == 200);
    // made two hours ago: gone
    const std::string file = d.state_dir + "/responses/" + id + ".json";
    REQUIRE(std::filesystem::exists(file));
    std::filesystem::last_write_time(file, std::filesystem::file_time_type::clock::now() - std::chrono::hours(2));
    CHECK(request(d.sock, "GET", "/v1/responses/" + id).status == 404);
    CHECK(!std::filesystem::exists(file));
    CHECK(post(d.sock, "/v1/responses", {{"input", "Once"}, {"previous_response_id", id}}).status == 404);
    d.stop();
}
