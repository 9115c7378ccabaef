// tandemd end to end, Ollama's API under /api/ on stories260K: chat and generate (NDJSON by
// default) against the same request through Chat Completions and Completions (greedy), the
// options mapped, embeddings against /v1/embeddings, the model routes, errors as Ollama's.
#include "server_fixtures.hpp"

using namespace tandem;
using namespace tandem::test;

namespace {

// NDJSON lines; `ok` false when one does not parse.
std::vector<json> ndjson(const std::string& body, bool& ok) {
    std::vector<json> out;
    ok = !body.empty() && body.back() == '\n';
    size_t pos = 0;
    while (pos < body.size()) {
        const size_t nl = body.find('\n', pos);
        const std::string line = body.substr(pos, nl - pos);
        pos = nl == std::string::npos ? body.size() : nl + 1;
        json j = json::parse(line, nullptr, false);
        if (j.is_discarded()) ok = false;
        out.push_back(j);
    }
    return out;
}

const json user_turn = {{{"role", "user"}, {"content", "Once upon a time"}}};
const json greedy = {{"temperature", 0}, {"num_predict", 12}};

std::string chat_text(const std::string& s, const json& messages, int max_tokens) {
    auto r = post(s, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}});
    REQUIRE(r.status == 200);
    return r.j()["choices"][0]["message"]["content"];
}

} // namespace

TEST_CASE("ollama chat: one object or NDJSON lines, the text Chat Completions' text") {
    const auto& s = shared_socket();
    const std::string want = chat_text(s, user_turn, 12);
    auto r = post(s, "/api/chat", {{"model", "stories260K"}, {"messages", user_turn}, {"options", greedy}, {"stream", false}});
    REQUIRE(r.status == 200);
    const json j = r.j();
    CAPTURE(j.dump());
    CHECK(j["model"] == "stories260K:latest");
    CHECK(j["message"]["role"] == "assistant");
    CHECK(j["message"]["content"] == want);
    CHECK(j["done"] == true);
    CHECK(j["done_reason"] == "length");
    CHECK(j["eval_count"] == 12);
    CHECK(j["prompt_eval_count"].get<int>() > 0);
    CHECK(j["total_duration"].get<int64_t>() > 0);
    CHECK(j["created_at"].get<std::string>().ends_with("Z"));

    // streams by default, as Ollama does: NDJSON lines, the last done with the counts
    auto st = post(s, "/api/chat", {{"model", "stories260K:latest"}, {"messages", user_turn}, {"options", greedy}});
    REQUIRE(st.status == 200);
    CHECK(st.headers["content-type"] == "application/x-ndjson");
    bool ok = false;
    const auto lines = ndjson(st.body, ok);
    CHECK(ok);
    REQUIRE(lines.size() >= 2);
    std::string text;
    for (size_t i = 0; i < lines.size(); ++i) {
        CHECK(lines[i]["done"] == (i + 1 == lines.size()));
        text += lines[i]["message"]["content"].get<std::string>();
    }
    CHECK(text == want);
    CHECK(lines.back()["eval_count"] == 12);

    // a history with a tool call and its result renders as Chat Completions renders it
    const json tools = {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}};
    json history = user_turn;
    history.push_back({{"role", "assistant"}, {"content", ""},
                       {"tool_calls", {{{"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}}}}});
    history.push_back({{"role", "tool"}, {"content", "18 C"}, {"tool_name", "get_weather"}});
    auto t = post(s, "/api/chat", {{"model", "stories260K"}, {"messages", history}, {"tools", tools}, {"stream", false},
                                   {"options", {{"temperature", 0}, {"num_predict", 4}}}});
    CHECK(t.status == 200);
}

TEST_CASE("ollama generate: the prompt as a user turn, or raw as a completion") {
    const auto& s = shared_socket();
    auto r = post(s, "/api/generate", {{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"options", greedy}, {"stream", false}});
    REQUIRE(r.status == 200);
    CHECK(r.j()["response"] == chat_text(s, user_turn, 12));
    CHECK(r.j()["done"] == true);

    auto raw = post(s, "/api/generate", {{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"raw", true},
                                         {"options", greedy}});
    REQUIRE(raw.status == 200);
    bool ok = false;
    std::string text;
    for (const json& l : ndjson(raw.body, ok)) text += l["response"].get<std::string>();
    CHECK(ok);
    CHECK(text == offline_text("Once upon a time", 12));

    // no prompt: the model is loaded, done at once
    auto load = post(s, "/api/generate", {{"model", "stories260K"}});
    REQUIRE(load.status == 200);
    CHECK(load.j()["done_reason"] == "load");

    // format "json": the reply is JSON (or cut by num_predict)
    auto fj = post(s, "/api/generate", {{"model", "stories260K"}, {"prompt", "A"}, {"format", "json"}, {"stream", false},
                                        {"options", {{"temperature", 0}, {"num_predict", 60}}}});
    REQUIRE(fj.status == 200);
    if (fj.j()["done_reason"] == "stop") CHECK(json::parse(fj.j()["response"].get<std::string>(), nullptr, false).is_object());
}

TEST_CASE("ollama embeddings, models, version; what it does not do") {
    const auto& s = shared_socket();
    auto e = post(s, "/api/embed", {{"model", "stories260K"}, {"input", {"Once upon a time", "Lily"}}});
    REQUIRE(e.status == 200);
    auto oa = post(s, "/v1/embeddings", {{"input", {"Once upon a time", "Lily"}}});
    REQUIRE(oa.status == 200);
    REQUIRE(e.j()["embeddings"].size() == 2);
    CHECK(e.j()["embeddings"][1] == oa.j()["data"][1]["embedding"]);
    auto old = post(s, "/api/embeddings", {{"model", "stories260K"}, {"prompt", "Lily"}});
    REQUIRE(old.status == 200);
    CHECK(old.j()["embedding"] == oa.j()["data"][1]["embedding"]);
    // options (sampling, context) do not apply to an embedding: named, not dropped; a keep_alive
    // that is no duration is refused here as on the other routes (0, which unloads the model
    // after the request, is test_server_models')
    auto opt = post(s, "/api/embeddings", {{"model", "stories260K"}, {"prompt", "Lily"}, {"options", {{"num_ctx", 64}}}});
    CHECK(opt.status == 400);
    CHECK(opt.j()["error"].get<std::string>().find("options.num_ctx") != std::string::npos);
    CHECK(post(s, "/api/embeddings", {{"model", "stories260K"}, {"prompt", "Lily"}, {"keep_alive", "soon"}}).status == 400);
    CHECK(post(s, "/api/embed", {{"model", "stories260K"}, {"input", "Lily"}, {"keep_alive", "5m"}}).status == 200);

    auto tags = request(s, "GET", "/api/tags");
    REQUIRE(tags.status == 200);
    CHECK(tags.j()["models"][0]["name"] == "stories260K:latest");
    CHECK(tags.j()["models"][0]["details"]["format"] == "gguf");
    auto ps = request(s, "GET", "/api/ps");
    REQUIRE(ps.status == 200);
    CHECK(ps.j()["models"][0]["name"] == "stories260K:latest");
    auto show = post(s, "/api/show", {{"model", "stories260K"}});
    REQUIRE(show.status == 200);
    CHECK(show.j()["details"]["family"] == "llama");
    CHECK(show.j()["capabilities"][0] == "completion");
    auto v = request(s, "GET", "/api/version");
    REQUIRE(v.status == 200);
    CHECK(v.j()["version"].is_string());

    const auto refused = [&](const std::string& route, const json& body, const std::string& named, int status = 400) {
        auto r = post(s, route, body);
        CAPTURE(r.body);
        CHECK(r.status == status);
        REQUIRE(r.j()["error"].is_string());
        CHECK(r.j()["error"].get<std::string>().find(named) != std::string::npos);
    };
    refused("/api/chat", {{"model", "stories260K"}, {"messages", user_turn}, {"options", {{"mirostat", 2}}}}, "options.mirostat");
    refused("/api/chat", {{"model", "stories260K"}, {"messages", {{{"role", "user"}, {"content", "x"}, {"images", {"AA=="}}}}}},
            "messages[0].images");
    refused("/api/chat", {{"model", "llama3"}, {"messages", user_turn}}, "llama3", 404);
    refused("/api/chat", {{"model", "stories260K"}, {"messages", user_turn}, {"think", true}}, "think");
    refused("/api/chat", {{"model", "stories260K"}, {"messages", user_turn}, {"keep_alive", "5 minutes"}}, "keep_alive");
    refused("/api/chat", {{"model", "stories260K"}, {"messages", user_turn}, {"options", {{"num_ctx", 1 << 20}}}},
            "options.num_ctx");
    refused("/api/generate", {{"model", "stories260K"}, {"prompt", "x"}, {"suffix", "y"}}, "suffix");
    refused("/api/pull", {{"model", "llama3"}}, "/api/pull", 501);
}
