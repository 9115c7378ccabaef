// tandemd end to end, the API: every route and field of the OpenAI surface on stories260K,
// each answer against the offline loop.
#include "server_fixtures.hpp"

#include <fstream>

using namespace tandem;
using namespace tandem::test;

TEST_CASE("health, models, metrics, status") {
    const auto& s = shared_socket();
    auto h = request(s, "GET", "/health");
    CHECK(h.status == 200);
    CHECK(h.j()["status"] == "ok");
    auto m = request(s, "GET", "/v1/models");
    REQUIRE(m.status == 200);
    CHECK(m.j()["data"][0]["id"] == "stories260K");
    CHECK(request(s, "GET", "/v1/models/stories260K").status == 200);
    CHECK(request(s, "GET", "/v1/models/other").status == 404);
    auto st = request(s, "GET", "/v1/tandem/status");
    REQUIRE(st.status == 200);
    CHECK(st.j()["status"] == "ready");
    CHECK(st.j()["kv_pages_total"].get<int>() > 0);
    for (const char* k : {"kv_tokens_stored", "kv_pages_cached", "kv_pages_peak", "prefix_cache_hit_tokens", "preemptions",
                          "worker_restarts", "kv_device_upload_bytes", "kv_device_kept_bytes"})
        CHECK_MESSAGE((st.j().contains(k) && st.j()[k].is_number_integer() && st.j()[k].get<int64_t>() >= 0), k);
    auto met = request(s, "GET", "/metrics");
    REQUIRE(met.status == 200);
    CHECK(met.headers["content-type"].find("text/plain") == 0);
    for (const char* name : {"tandem_requests_running", "tandem_requests_waiting", "tandem_kv_pages_used", "tandem_kv_pages_peak",
                             "tandem_kv_pages_total", "tandem_prefix_cache_hits_total", "tandem_prompt_tokens_total",
                             "tandem_generation_tokens_total", "tandem_time_to_first_token_seconds_count",
                             "tandem_inter_token_latency_seconds_count", "tandem_queue_time_seconds_count",
                             "tandem_kv_tokens_stored", "tandem_kv_pages_cached", "tandem_preemptions_total",
                             "tandem_worker_restarts_total", "tandem_kv_device_upload_bytes_total",
                             "tandem_kv_device_kept_bytes_total", "tandem_speculative_draft_tokens_total",
                             "tandem_speculative_accepted_tokens_total"})
        CHECK_MESSAGE(metric(met.body, name) >= 0, name);
    CHECK(metric(met.body, "tandem_prefix_cache_hits_total") == 0);
}

TEST_CASE("completions at temperature 0 equal the offline loop; usage counts tokens") {
    const auto& s = shared_socket();
    auto r = post(s, "/v1/completions", {{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"max_tokens", 40},
                                         {"temperature", 0}});
    REQUIRE(r.status == 200);
    const json j = r.j();
    CHECK(j["object"] == "text_completion");
    CHECK(j["choices"][0]["text"] == offline_text("Once upon a time", 40));
    CHECK(j["choices"][0]["finish_reason"] == "length");
    CHECK(j["usage"]["completion_tokens"] == 40);
    CHECK(j["usage"]["prompt_tokens"].get<int>() > 0);
    CHECK(j["usage"]["total_tokens"] == j["usage"]["prompt_tokens"].get<int>() + 40);

    // stop strings cut the text; n gives several choices
    auto st = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0},
                                          {"stop", "Lily"}, {"n", 2}});
    REQUIRE(st.status == 200);
    const std::string full = offline_text("Once upon a time", 40);
    REQUIRE(full.find("Lily") != std::string::npos);
    CHECK(st.j()["choices"].size() == 2);
    CHECK(st.j()["choices"][0]["text"] == full.substr(0, full.find("Lily")));
    CHECK(st.j()["choices"][1]["text"] == full.substr(0, full.find("Lily")));
    CHECK(st.j()["choices"][0]["finish_reason"] == "stop");

    // This daemon has speculative decoding off (draft_tokens 0): asking for it is a 400 that says
    // so; "off" is what it does anyway.
    auto spec = post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}, {"speculative", {{"method", "ngram"}}}});
    CHECK(spec.status == 400);
    CHECK(spec.body.find("draft_tokens") != std::string::npos);
    CHECK(post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}, {"speculative", {{"method", "off"}}}})
              .status == 200);
}

TEST_CASE("a field the daemon does not honour is a 400 that names it") {
    const auto& s = shared_socket();
    auto r = post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}, {"unknown_field", {1, 2}}});
    CHECK(r.status == 400);
    CHECK(r.j()["error"]["param"] == "unknown_field");
    auto c = post(s, "/v1/chat/completions",
                  {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}, {"echo", true}});
    CHECK(c.status == 400); // a completions field, not a chat one
    CHECK(c.j()["error"]["param"] == "echo");
    // inside an object too (found by scripts/soak.sh: stream_options' other keys were ignored)
    auto so = post(s, "/v1/completions",
                   {{"prompt", "Once"}, {"max_tokens", 2}, {"stream", true},
                    {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}});
    CHECK(so.status == 400);
    CHECK(so.j()["error"]["param"] == "stream_options.continuous_usage_stats");
    CHECK(so.j()["error"]["message"].get<std::string>().find("(include_usage)") != std::string::npos);
}

TEST_CASE("a key the daemon does not honour inside a message, part, tool call or tool choice is a 400 naming its path") {
    const auto& s = shared_socket();
    const json user = {{"role", "user"}, {"content", "hi"}};
    const json call = {{"id", "call_1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{}"}}}};
    const json tools = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
    const auto answer = [&](const std::string& route, json body) {
        if (route == "/v1/chat/completions") body["max_tokens"] = 2;
        return post(s, route, body);
    };
    const auto refused = [&](const std::string& route, const json& body, const std::string& param) {
        auto r = answer(route, body);
        CAPTURE(body.dump());
        CHECK(r.status == 400);
        CHECK(r.j()["error"]["param"] == param);
        CHECK(r.j()["error"]["message"].get<std::string>().find("'" + param + "' is not supported (") != std::string::npos);
    };
    const std::string chat = "/v1/chat/completions";
    refused(chat, {{"messages", {{{"role", "user"}, {"content", "hi"}, {"name", "ann"}}}}}, "messages[0].name");
    refused(chat, {{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi"}, {"cache_control", {{"type", "x"}}}}}}}}}},
            "messages[0].content[0].cache_control");
    refused(chat, {{"messages", {user, {{"role", "assistant"}, {"content", "x"}, {"refusal", "no"}}}}}, "messages[1].refusal");
    json extra_call = call;
    extra_call["function"]["strict"] = true;
    refused(chat, {{"messages", {user, {{"role", "assistant"}, {"tool_calls", {extra_call}}}}}},
            "messages[1].tool_calls[0].function.strict");
    refused(chat, {{"messages", {user, {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "x"}, {"name", "f"}}}}},
            "messages[1].name");
    refused(chat, {{"messages", {user}}, {"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}, {"strict", true}}}}}},
            "tool_choice.function.strict");
    refused(chat, {{"messages", {user}}, {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"returns", 1}}}}}}},
            "tools[0].function.returns");
    refused("/tokenize", {{"content", "hi"}, {"with_pieces", true}}, "with_pieces");
    refused("/detokenize", {{"tokens", {1}}, {"special", true}}, "special");
    refused("/v1/tandem/apply-template", {{"messages", {user}}, {"parallel_tool_calls", false}}, "parallel_tool_calls");
    // An assistant reply echoed back whole passes: its empty OpenAI fields, Tandem's citations,
    // and the index a streamed tool call carries.
    json echoed_call = call;
    echoed_call["index"] = 0;
    const json history = {user,
                          {{"role", "assistant"}, {"content", "x"}, {"refusal", nullptr}, {"annotations", json::array()},
                           {"audio", nullptr}, {"citations", json::array()}},
                          {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {echoed_call}}},
                          {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "ok"}}, user};
    CHECK(answer(chat, {{"messages", history}}).status == 200);
    CHECK(answer("/tokenize", {{"text", "hi"}}).status == 200);
    CHECK(answer("/tokenize", {{"text", "hi"}, {"content", "hi"}}).status == 400);
}

TEST_CASE("embeddings: OpenAI's shape, the engine's unit vectors, a list equal to its items alone; base64; errors name what") {
    const auto& s = shared_socket();
    const std::string a = "Once upon a time, there was a little girl named Lily.", b = "The dog ran to the park.";
    auto one = post(s, "/v1/embeddings", {{"model", "stories260K"}, {"input", a}});
    REQUIRE(one.status == 200);
    const json j = one.j();
    CHECK(j["object"] == "list");
    CHECK(j["model"] == "stories260K");
    REQUIRE(j["data"].size() == 1);
    CHECK(j["data"][0]["object"] == "embedding");
    CHECK(j["data"][0]["index"] == 0);
    const json& va = j["data"][0]["embedding"];
    REQUIRE(va.size() == 64); // stories260K's n_embd
    double norm = 0;
    for (const auto& x : va) norm += x.get<double>() * x.get<double>();
    CHECK(std::abs(norm - 1) < 1e-5);
    CHECK(max_diff(va, offline_embedding(a)) < 1e-5);
    const int n_a = int(request(s, "POST", "/tokenize", json{{"content", a}}.dump()).j()["count"].get<int>());
    CHECK(j["usage"]["prompt_tokens"] == n_a);
    CHECK(j["usage"]["total_tokens"] == n_a);

    // a list: one vector each, in order, as each alone; token ids embed as their text does
    const auto ids = request(s, "POST", "/tokenize", json{{"content", b}}.dump()).j()["tokens"];
    auto list = post(s, "/v1/embeddings", {{"input", json::array({b, a})}});
    REQUIRE(list.status == 200);
    REQUIRE(list.j()["data"].size() == 2);
    CHECK(list.j()["data"][1]["index"] == 1);
    CHECK(max_diff(list.j()["data"][1]["embedding"], offline_embedding(a)) < 1e-5);
    CHECK(max_diff(list.j()["data"][0]["embedding"], offline_embedding(b)) < 1e-5);
    CHECK(max_diff(list.j()["data"][0]["embedding"], offline_embedding(a)) > 1e-2);
    auto tok = post(s, "/v1/embeddings", {{"input", json::array({ids})}});
    REQUIRE(tok.status == 200);
    CHECK(max_diff(tok.j()["data"][0]["embedding"], offline_embedding(b)) < 1e-5);

    // more inputs than the engine queues at once (max_waiting 64 + 16 running): fed a window at a time
    json many = json::array();
    for (int i = 0; i < 300; ++i) many.push_back(i % 2 ? a : b);
    auto lots = post(s, "/v1/embeddings", {{"input", many}});
    REQUIRE(lots.status == 200);
    REQUIRE(lots.j()["data"].size() == 300);
    CHECK(lots.j()["data"][299]["index"] == 299);
    CHECK(max_diff(lots.j()["data"][299]["embedding"], offline_embedding(a)) < 1e-5);
    CHECK(max_diff(lots.j()["data"][200]["embedding"], offline_embedding(b)) < 1e-5);

    // base64: the float32 array's little-endian bytes
    auto b64 = post(s, "/v1/embeddings", {{"input", a}, {"encoding_format", "base64"}});
    REQUIRE(b64.status == 200);
    const std::string enc = b64.j()["data"][0]["embedding"].get<std::string>();
    REQUIRE(enc.size() == 344); // ceil(256 / 3) * 4
    std::vector<uint8_t> bytes;
    const std::string digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i + 3 < enc.size(); i += 4) {
        uint32_t n = 0;
        int pad = 0;
        for (size_t k = 0; k < 4; ++k) {
            const char ch = enc[i + k];
            pad += ch == '=';
            n = n << 6 | uint32_t(ch == '=' ? 0 : digits.find(ch));
        }
        for (int k = 0; k < 3 - pad; ++k) bytes.push_back(uint8_t(n >> (16 - 8 * k)));
    }
    REQUIRE(bytes.size() == 256);
    std::vector<float> floats(64);
    std::memcpy(floats.data(), bytes.data(), bytes.size());
    CHECK(max_diff(va, floats) == 0.0);

    // what it does not do is a 400 that names it
    const std::pair<json, std::string> bad_requests[] = {
        {{{"input", a}, {"dimensions", 32}}, "dimensions"},
        {{{"input", a}, {"encoding_format", "int8"}}, "encoding_format"},
        {{{"input", ""}}, "input"},
        {{{"input", json::array({a, ""})}}, "input"},
        {{{"input", json::array()}}, "input"},
        {{{"input", 5}}, "input"},
        {{{"input", a}, {"truncate", true}}, "truncate"},
        {json::object(), "input"},
    };
    for (const auto& req : bad_requests) {
        auto r = post(s, "/v1/embeddings", req.first);
        CAPTURE(req.first.dump());
        CHECK(r.status == 400);
        CHECK(r.j()["error"]["param"] == req.second);
    }
    CHECK(post(s, "/v1/embeddings", {{"input", a}, {"dimensions", 64}}).status == 200);
    std::string long_text;
    for (int i = 0; i < 800; ++i) long_text += "Lily saw a dog. ";
    auto too_long = post(s, "/v1/embeddings", {{"input", long_text}});
    CHECK(too_long.status == 400);
    CHECK(too_long.j()["error"]["code"] == "context_length_exceeded");
    CHECK(post(s, "/v1/embeddings", {{"input", a}, {"model", "other"}}).status == 404);
    CHECK(request(s, "GET", "/v1/embeddings").status == 405);

    // tandem embed: one vector a line, from the daemon or offline (-m), the same as the API's
    for (const bool offline : {false, true}) {
        CAPTURE(offline);
        std::vector<std::string> args{"embed", b, a};
        if (offline) args.insert(args.end(), {"-m", model_path("stories260K.gguf"), "-t", "1"});
        else args.insert(args.end(), {"--socket", s});
        const auto r = run_tandem(args);
        INFO(r.err);
        REQUIRE(r.rc == 0);
        std::istringstream lines(r.out);
        std::vector<json> got;
        for (std::string line; std::getline(lines, line);) got.push_back(json::parse(line));
        REQUIRE(got.size() == 2);
        CHECK(max_diff(got[0], offline_embedding(b)) < 1e-5);
        CHECK(max_diff(got[1], offline_embedding(a)) < 1e-5);
    }
    const auto piped = run_tandem({"embed", "--json", "--socket", s}, a + "\n\n" + b + "\n"); // stdin: a text a line
    REQUIRE(piped.rc == 0);
    const json pj = json::parse(piped.out);
    REQUIRE(pj["data"].size() == 2);
    CHECK(max_diff(pj["data"][1]["embedding"], offline_embedding(b)) < 1e-5);
    CHECK(run_tandem({"embed", "--socket", s}, "").rc == 2);           // no text
    CHECK(run_tandem({"embed", "--socket", s, long_text}).rc == 4);    // the daemon's 400
}

TEST_CASE("embeddings: a model whose hidden states are wider than its vocabulary has none: a 400 that says so") {
    const std::string path = scratch().file("wide.gguf");
    const auto syn = run_tandem({"synth", "-o", path, "--dim", "512", "--vocab", "300", "--heads", "8", "--layers", "1",
                                 "--ff", "64", "--ctx", "256"});
    INFO(syn.err);
    REQUIRE(syn.rc == 0);
    daemon_process d;
    d.sock = scratch().file("wide.sock");
    d.spawn({"--model", path, "--socket", d.sock, "--threads", "1", "--log", "warn", "--set", "kv_pool=" + d.sock + ".kv"});
    REQUIRE(d.wait_ready());
    auto r = post(d.sock, "/v1/embeddings", {{"input", "hello"}});
    CHECK(r.status == 400);
    CHECK(r.j()["error"]["code"] == "embeddings_unavailable");
    CHECK(post(d.sock, "/v1/completions", {{"prompt", "hello"}, {"max_tokens", 2}}).status == 200); // it still generates
    CHECK(d.stop() == 0);
}

TEST_CASE("guided generation: response_format, structured_outputs, llama.cpp's fields; errors name what") {
    const auto& s = shared_socket();
    const json schema = {{"type", "object"},
                         {"properties", {{"name", {{"type", "string"}, {"maxLength", 10}}},
                                         {"n", {{"type", "integer"}, {"minimum", 1}, {"maximum", 9}}}}},
                         {"required", {"name", "n"}}};
    const json rf = {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", schema}, {"strict", true}}}};
    for (uint64_t seed = 1; seed <= 4; ++seed) {
        auto r = post(s, "/v1/chat/completions",
                      {{"messages", {{{"role", "user"}, {"content", "Give me a record"}}}}, {"max_tokens", 200},
                       {"temperature", 1}, {"seed", seed}, {"response_format", rf}});
        REQUIRE(r.status == 200);
        const json out = json::parse(r.j()["choices"][0]["message"]["content"].get<std::string>());
        CHECK(out["name"].is_string());
        CHECK(out["name"].get<std::string>().size() <= 40); // 10 code points, at most 4 bytes each
        CHECK(out["n"].get<int>() >= 1);
        CHECK(out["n"].get<int>() <= 9);
        CHECK(r.j()["choices"][0]["finish_reason"] == "stop");
    }
    // Streamed: the deltas add up to the same kind of object.
    auto st = post(s, "/v1/completions",
                   {{"prompt", "Once"}, {"max_tokens", 100}, {"seed", 3}, {"stream", true},
                    {"structured_outputs", {{"choice", {"yes", "no", "maybe"}}}}});
    REQUIRE(st.status == 200);
    const std::string text = stream_text(sse_events(st.body), false);
    CHECK((text == "yes" || text == "no" || text == "maybe"));
    auto rx = post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 30}, {"seed", 2}, {"grammar", "root ::= [0-9]{2} \"-\" [a-z]{3}"}});
    REQUIRE(rx.status == 200);
    const std::string g = rx.j()["choices"][0]["text"];
    CHECK(g.size() == 6);
    CHECK(g[2] == '-');
    auto obj = post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 200}, {"seed", 5},
                                           {"response_format", {{"type", "json_object"}}}});
    REQUIRE(obj.status == 200);
    if (obj.j()["choices"][0]["finish_reason"] == "stop")
        CHECK(json::parse(obj.j()["choices"][0]["text"].get<std::string>()).is_object());

    const auto refused = [&](const json& body, const std::string& param, const std::string& says) {
        json b = body;
        b["prompt"] = "Once";
        auto r = post(s, "/v1/completions", b);
        CAPTURE(body.dump());
        CHECK(r.status == 400);
        CHECK(r.j()["error"]["param"] == param);
        CHECK(r.j()["error"]["message"].get<std::string>().find(says) != std::string::npos);
    };
    refused({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "array"}, {"uniqueItems", true}}}}}}}},
            "response_format", "uniqueItems");
    refused({{"response_format", {{"type", "json_object"}}}, {"grammar", "root ::= \"x\""}}, "grammar", "one output constraint");
    refused({{"structured_outputs", {{"regex", "(a)\\1"}}}}, "structured_outputs.regex", "backreference");
    refused({{"structured_outputs", {{"structural_tag", "x"}}}}, "structured_outputs.structural_tag", "not supported");
    refused({{"response_format", {{"type", "xml"}}}}, "response_format.type", "xml");
    refused({{"json_schema", "not a schema"}}, "json_schema", "JSON Schema");
}

namespace {

// A streamed reply's tool calls put together as a client does: by index, the id, type and
// name from the first delta, the arguments concatenated.
json streamed_calls(const std::vector<json>& events) {
    json calls = json::array();
    for (const auto& e : events)
        for (const auto& c : e["choices"])
            for (const auto& d : c["delta"].value("tool_calls", json::array())) {
                const size_t i = d["index"].get<size_t>();
                if (i == calls.size()) {
                    REQUIRE(d.contains("id"));
                    calls.push_back({{"id", d["id"]}, {"type", d["type"]},
                                     {"function", {{"name", d["function"]["name"]}, {"arguments", ""}}}});
                }
                REQUIRE(i < calls.size());
                if (d["function"].contains("arguments"))
                    calls[i]["function"]["arguments"] =
                        calls[i]["function"]["arguments"].get<std::string>() + d["function"]["arguments"].get<std::string>();
            }
    return calls;
}

} // namespace

TEST_CASE("tool calling: tool_calls in the reply and streamed as deltas; histories with calls; errors name what") {
    const auto& s = shared_socket();
    const json tools = json::array(
        {{{"type", "function"},
          {"function", {{"name", "get_weather"}, {"description", "Weather now"},
                        {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}, {"maxLength", 12}}}}},
                                        {"required", {"city"}}}}}}},
         {{"type", "function"}, {"function", {{"name", "get_time"}}}}});
    const json ask = {{{"role", "user"}, {"content", "Weather in Paris?"}}};
    int n_called = 0;
    for (uint64_t seed = 1; seed <= 3; ++seed) {
        json body = {{"messages", ask}, {"tools", tools}, {"tool_choice", "required"}, {"parallel_tool_calls", false},
                     {"max_tokens", 120}, {"temperature", 1}, {"seed", seed}};
        auto r = post(s, "/v1/chat/completions", body);
        REQUIRE(r.status == 200);
        const json choice = r.j()["choices"][0];
        CAPTURE(choice.dump());
        if (choice["finish_reason"] != "tool_calls") {
            CHECK(choice["finish_reason"] == "length");
            continue;
        }
        ++n_called;
        CHECK(choice["message"]["content"].is_null());
        const json calls = choice["message"]["tool_calls"];
        REQUIRE(calls.size() == 1);
        CHECK(calls[0]["id"].get<std::string>().starts_with("call_"));
        CHECK(calls[0]["type"] == "function");
        const std::string name = calls[0]["function"]["name"];
        CHECK((name == "get_weather" || name == "get_time"));
        const json args = json::parse(calls[0]["function"]["arguments"].get<std::string>());
        REQUIRE(args.is_object());
        if (name == "get_weather") CHECK(args["city"].is_string());

        // Streamed with the same seed: the deltas add up to the same call.
        body["stream"] = true;
        auto st = post(s, "/v1/chat/completions", body);
        REQUIRE(st.status == 200);
        const auto events = sse_events(st.body);
        const json got = streamed_calls(events);
        REQUIRE(got.size() == 1);
        CHECK(got[0]["function"] == calls[0]["function"]);
        CHECK(events.back()["choices"][0]["finish_reason"] == "tool_calls");
    }
    CHECK(n_called >= 1);

    // A named function; a history with a call and its result; auto.
    auto named = post(s, "/v1/chat/completions",
                      {{"messages", ask}, {"tools", tools}, {"max_tokens", 120}, {"seed", 4},
                       {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}});
    REQUIRE(named.status == 200);
    if (named.j()["choices"][0]["finish_reason"] == "tool_calls")
        CHECK(named.j()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_time");
    json history = ask;
    history.push_back({{"role", "assistant"}, {"content", nullptr},
                       {"tool_calls", {{{"id", "call_1"}, {"type", "function"},
                                        {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}}}});
    history.push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18 C"}});
    auto followed = post(s, "/v1/chat/completions", {{"messages", history}, {"tools", tools}, {"max_tokens", 8}});
    CHECK(followed.status == 200);
    auto shown = post(s, "/v1/tandem/apply-template", {{"messages", history}, {"tools", tools}});
    REQUIRE(shown.status == 200);
    CHECK(shown.j()["prompt"].get<std::string>().find("<tool_response>\n18 C\n</tool_response>") != std::string::npos);

    const auto refused = [&](json body, const std::string& param, const std::string& says) {
        if (!body.contains("messages")) body["messages"] = ask;
        auto r = post(s, "/v1/chat/completions", body);
        CAPTURE(body.dump());
        CHECK(r.status == 400);
        CHECK(r.j()["error"]["param"] == param);
        CHECK(r.j()["error"]["message"].get<std::string>().find(says) != std::string::npos);
    };
    refused({{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}, "tool_choice", "nope");
    refused({{"tool_choice", "required"}}, "tool_choice", "needs 'tools'");
    refused({{"tools", tools}, {"tool_choice", "sometimes"}}, "tool_choice", "sometimes");
    refused({{"tools", {{{"type", "function"}, {"function", {{"name", "a b"}}}}}}}, "tools[0].function.name", "a-z");
    refused({{"tools", {tools[1], tools[1]}}}, "tools[1].function.name", "get_time");
    refused({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"returns", 1}}}}}}}, "tools[0].function.returns", "returns");
    refused({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "array"}}}}}}}}},
            "tools", "object");
    refused({{"tools", tools}, {"response_format", {{"type", "json_object"}}}}, "response_format", "'tools'");
    refused({{"messages", {ask[0], {{"role", "tool"}, {"content", "x"}}}}}, "messages[1].tool_call_id", "tool_call_id");
    refused({{"functions", {{{"name", "f"}}}}}, "functions", "use 'tools'");
    auto completions = post(s, "/v1/completions", {{"prompt", "Once"}, {"tools", tools}});
    CHECK(completions.status == 400);
    CHECK(completions.j()["error"]["param"] == "tools");
}

TEST_CASE("seeded sampling is reproducible; choice i of n uses seed + i") {
    const auto& s = shared_socket();
    const json base = {{"prompt", "Once upon a time"}, {"max_tokens", 30}, {"temperature", 0.9}, {"top_k", 40}};
    json a = base, b = base, two = base;
    a["seed"] = 42;
    b["seed"] = 43;
    two["seed"] = 42;
    two["n"] = 2;
    const auto ra = post(s, "/v1/completions", a), ra2 = post(s, "/v1/completions", a);
    const auto rb = post(s, "/v1/completions", b), rtwo = post(s, "/v1/completions", two);
    REQUIRE(ra.status == 200);
    REQUIRE(rtwo.status == 200);
    CHECK(ra.j()["choices"][0]["text"] == ra2.j()["choices"][0]["text"]);
    CHECK(rtwo.j()["choices"][0]["text"] == ra.j()["choices"][0]["text"]);
    CHECK(rtwo.j()["choices"][1]["text"] == rb.j()["choices"][0]["text"]);
}

TEST_CASE("chat completions render the template; tokenize, detokenize, apply-template") {
    const auto& s = shared_socket();
    const json messages = json::array({{{"role", "system"}, {"content", "You tell stories."}},
                                       {{"role", "user"}, {"content", "Tell me about a cat."}}});
    auto t = post(s, "/v1/tandem/apply-template", {{"messages", messages}});
    REQUIRE(t.status == 200);
    CHECK(t.j()["prompt"].get<std::string>().find("Tell me about a cat.") != std::string::npos);
    const json ids = t.j()["tokens"];

    auto chat = post(s, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", 30}, {"temperature", 0}});
    REQUIRE(chat.status == 200);
    const json cj = chat.j();
    CHECK(cj["object"] == "chat.completion");
    CHECK(cj["choices"][0]["message"]["role"] == "assistant");
    CHECK_FALSE(cj["choices"][0].contains("text")); // a completions field, not a chat one
    CHECK(cj["usage"]["prompt_tokens"] == ids.size());
    // the same tokens as a completions prompt give the same text (plain template: no stop hit)
    auto comp = post(s, "/v1/completions", {{"prompt", ids}, {"max_tokens", 30}, {"temperature", 0},
                                            {"stop", t.j()["stop"]}});
    REQUIRE(comp.status == 200);
    CHECK(comp.j()["choices"][0]["text"] == cj["choices"][0]["message"]["content"]);

    auto tok = post(s, "/tokenize", {{"content", "Once upon a time"}});
    REQUIRE(tok.status == 200);
    auto de = post(s, "/detokenize", {{"tokens", tok.j()["tokens"]}});
    REQUIRE(de.status == 200);
    CHECK(de.j()["content"] == "Once upon a time");
}

TEST_CASE("streaming: SSE chunks then [DONE], same text as the plain reply, usage when asked") {
    const auto& s = shared_socket();
    auto r = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 30}, {"temperature", 0},
                                         {"stream", true}, {"stream_options", {{"include_usage", true}}}});
    REQUIRE(r.status == 200);
    CHECK(r.headers["content-type"] == "text/event-stream");
    bool done = false, ok = false;
    auto ev = sse_events(r.body, &done, &ok);
    CHECK(done);
    CHECK(ok);
    REQUIRE(ev.size() >= 3);
    CHECK(stream_text(ev, false) == offline_text("Once upon a time", 30));
    CHECK(ev.back()["choices"].empty());
    CHECK(ev.back()["usage"]["completion_tokens"] == 30);
    CHECK(ev[ev.size() - 2]["choices"][0]["finish_reason"] == "length");
    for (size_t i = 0; i + 2 < ev.size(); ++i) CHECK(ev[i]["choices"][0]["finish_reason"].is_null());

    auto c = post(s, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                              {"max_tokens", 20}, {"temperature", 0}, {"stream", true}});
    REQUIRE(c.status == 200);
    auto cev = sse_events(c.body, &done, &ok);
    CHECK(done);
    CHECK(ok);
    REQUIRE(!cev.empty());
    CHECK(cev[0]["object"] == "chat.completion.chunk");
    CHECK(cev[0]["choices"][0]["delta"]["role"] == "assistant");
    auto plain = post(s, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                                  {"max_tokens", 20}, {"temperature", 0}});
    CHECK(stream_text(cev, true) == plain.j()["choices"][0]["message"]["content"]);
}

TEST_CASE("logprobs: completions (int) and chat (bool + top_logprobs)") {
    const auto& s = shared_socket();
    auto r = post(s, "/v1/completions",
                  {{"prompt", "Once upon a time"}, {"max_tokens", 10}, {"temperature", 0}, {"logprobs", 3}});
    REQUIRE(r.status == 200);
    const json lp = r.j()["choices"][0]["logprobs"];
    REQUIRE(lp["tokens"].size() == 10);
    CHECK(lp["token_logprobs"].size() == 10);
    CHECK(lp["text_offset"].size() == 10);
    std::string joined;
    for (size_t i = 0; i < 10; ++i) {
        const double chosen = lp["token_logprobs"][i];
        CHECK(chosen <= 0);
        REQUIRE(lp["top_logprobs"][i].size() == 3);
        double best = -1e30;
        for (const auto& [k, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
        CHECK(chosen == doctest::Approx(best)); // greedy picks the most likely
        joined += lp["tokens"][i].get<std::string>();
    }
    CHECK(joined == r.j()["choices"][0]["text"]);

    auto c = post(s, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                              {"max_tokens", 5}, {"temperature", 0}, {"logprobs", true},
                                              {"top_logprobs", 2}});
    REQUIRE(c.status == 200);
    const json content = c.j()["choices"][0]["logprobs"]["content"];
    REQUIRE(content.size() == 5);
    CHECK(content[0]["top_logprobs"].size() == 2);
    CHECK(content[0].contains("bytes"));
    CHECK(post(s, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                           {"top_logprobs", 2}})
              .status == 400);
}

TEST_CASE("beam search over the API: best first with scores, as the offline search; streamed at the end; errors say why") {
    const auto& s = shared_socket();
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"use_beam_search", true}, {"n", 2},
                       {"best_of", 4}, {"length_penalty", 0.5}, {"early_stopping", "never"}};
    auto r = post(s, "/v1/completions", body);
    REQUIRE(r.status == 200);
    const json ch = r.j()["choices"];
    REQUIRE(ch.size() == 2);
    // The offline search (the same engine path in-process) with the same width and knobs.
    static model_bundle b = load_model(model_path("stories260K.gguf"));
    cpu::thread_pool pool(1);
    generate_params p;
    p.request.max_tokens = 12;
    p.request.beam = {4, 0.5f, beam_params::stopping::never};
    p.request.n = 2;
    const generate_result off =
        generate(exec_ctx{backend::cpu, &pool}, *b.mdl, *b.tok, b.tok->encode("Once upon a time", true, false), p);
    REQUIRE(off.beams.size() == 2);
    for (size_t k = 0; k < 2; ++k) {
        CAPTURE(k);
        CHECK(ch[k]["index"] == k);
        CHECK(ch[k]["text"] == off.beams[k].text);
        CHECK(ch[k]["score"].get<double>() == doctest::Approx(off.beams[k].score));
        CHECK(ch[k]["cumulative_logprob"].get<double>() == doctest::Approx(off.beams[k].cumulative_logprob));
    }
    CHECK(ch[0]["score"].get<double>() >= ch[1]["score"].get<double>());

    // Streamed: the same choices, sent when the search ends; the last chunk of each has its score.
    json sb = body;
    sb["stream"] = true;
    auto st = post(s, "/v1/completions", sb);
    REQUIRE(st.status == 200);
    bool done = false;
    const auto events = sse_events(st.body, &done);
    CHECK(done);
    int n_scored = 0;
    for (const auto& e : events)
        for (const auto& c : e["choices"]) n_scored += c.contains("score");
    CHECK(n_scored == 2);
    for (int k = 0; k < 2; ++k) CHECK(stream_text(events, false, k) == ch[size_t(k)]["text"]);

    // Chat: the same fields.
    auto c = post(s, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Tell a story"}}}},
                                              {"max_tokens", 8}, {"use_beam_search", true}, {"n", 3}});
    REQUIRE(c.status == 200);
    const json cc = c.j()["choices"];
    REQUIRE(cc.size() == 3);
    for (const auto& x : cc) {
        CHECK(x["message"]["content"].is_string());
        CHECK(x["cumulative_logprob"].get<double>() < 0);
    }

    // Guided beams: each beam's processors fork with it, and banned tokens are never proposed,
    // so every beam is one of the choices (beams are token sequences: two may spell one text).
    const std::vector<std::string> options{"a cat", "a dog", "the sun"};
    auto g = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 16}, {"use_beam_search", true},
                                         {"n", 3}, {"structured_outputs", {{"choice", options}}}});
    REQUIRE(g.status == 200);
    const json gc = g.j()["choices"];
    REQUIRE(gc.size() == 3);
    for (const auto& x : gc) {
        CHECK(std::find(options.begin(), options.end(), x["text"].get<std::string>()) != options.end());
        CHECK(x["finish_reason"] == "stop");
    }

    // Wrong combinations: a 400 that names the field and says why.
    const auto refused = [&](json extra, const std::string& param, const std::string& says) {
        json q = body;
        for (const auto& [k, v] : extra.items()) q[k] = v;
        auto e = post(s, "/v1/completions", q);
        CAPTURE(extra.dump());
        CHECK(e.status == 400);
        CHECK(e.j()["error"]["param"] == param);
        CHECK(e.j()["error"]["message"].get<std::string>().find(says) != std::string::npos);
    };
    refused({{"temperature", 0.7}}, "temperature", "deterministic");
    refused({{"top_p", 0.9}}, "top_p", "deterministic");
    refused({{"n", 5}}, "best_of", "at least 'n'");
    refused({{"best_of", 9}}, "best_of", "max_n");
    refused({{"early_stopping", "sometimes"}}, "early_stopping", "\"never\"");
    refused({{"use_beam_search", false}}, "length_penalty", "only to beam search");
    CHECK(post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 4}, {"use_beam_search", true}, {"temperature", 0}})
              .status == 200);
}

TEST_CASE("best_of samples more than it returns; echo returns the prompt, with logprobs the prompt's; max_tokens 0 scores it") {
    const auto& s = shared_socket();
    // best_of 3, n 1: the returned choice is the one of the three (seeds s, s+1, s+2) with the
    // highest mean token logprob; usage counts all three.
    const json base = {{"prompt", "Once upon a time"}, {"max_tokens", 10}, {"seed", 7}, {"ignore_eos", true}};
    json all = base;
    all["n"] = 3;
    all["logprobs"] = 0;
    auto a = post(s, "/v1/completions", all);
    REQUIRE(a.status == 200);
    const json aj = a.j();
    size_t best = 0;
    double best_mean = -1e30;
    for (size_t k = 0; k < 3; ++k) {
        double sum = 0;
        for (const auto& x : aj["choices"][k]["logprobs"]["token_logprobs"]) sum += x.get<double>();
        if (sum / 10 > best_mean) {
            best_mean = sum / 10;
            best = k;
        }
    }
    CHECK(best != 0); // (seed 7: the first is not the best, so ranking is seen to happen)
    json one = base;
    one["best_of"] = 3;
    auto r = post(s, "/v1/completions", one);
    REQUIRE(r.status == 200);
    REQUIRE(r.j()["choices"].size() == 1);
    CHECK(r.j()["choices"][0]["index"] == 0);
    CHECK(r.j()["choices"][0]["text"] == aj["choices"][best]["text"]);
    CHECK(r.j()["usage"]["completion_tokens"] == 30);
    one["stream"] = true;
    CHECK(post(s, "/v1/completions", one).status == 400); // the best are known only at the end

    // echo: the prompt's text first; with logprobs its tokens too, the first with none.
    auto e = post(s, "/v1/completions",
                  {{"prompt", "Once upon a time"}, {"max_tokens", 5}, {"temperature", 0}, {"echo", true}});
    REQUIRE(e.status == 200);
    CHECK(e.j()["choices"][0]["text"] == "Once upon a time" + offline_text("Once upon a time", 5));
    auto tk = post(s, "/tokenize", {{"content", "Once upon a time"}, {"add_special", true}});
    REQUIRE(tk.status == 200);
    const size_t n_prompt = tk.j()["tokens"].size();
    REQUIRE(n_prompt > 2);
    json scored = {{"prompt", "Once upon a time"}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 2}};
    auto sc = post(s, "/v1/completions", scored);
    REQUIRE(sc.status == 200);
    const json lp = sc.j()["choices"][0]["logprobs"];
    CHECK(sc.j()["choices"][0]["text"] == "Once upon a time");
    CHECK(sc.j()["usage"]["completion_tokens"] == 0);
    REQUIRE(lp["tokens"].size() == n_prompt);
    CHECK(lp["token_logprobs"][0].is_null());
    CHECK(lp["top_logprobs"][0].is_null());
    for (size_t i = 1; i < n_prompt; ++i) {
        CHECK(lp["token_logprobs"][i].get<double>() < 0);
        CHECK(lp["top_logprobs"][i].size() == 2);
        CHECK(lp["text_offset"][i].get<int>() >= lp["text_offset"][i - 1].get<int>());
    }
    // The prompt's scores are the model's: "upon" after "Once" is likelier than after "Twice".
    scored["prompt"] = "Twice upon a time";
    auto other = post(s, "/v1/completions", scored);
    REQUIRE(other.status == 200);
    CHECK(other.j()["choices"][0]["logprobs"]["token_logprobs"].back().get<double>() !=
          lp["token_logprobs"].back().get<double>());
    // Streamed, echo and logprobs: the same text.
    json stream = {{"prompt", "Once upon a time"}, {"max_tokens", 5}, {"temperature", 0}, {"echo", true},
                   {"logprobs", 1}, {"stream", true}, {"n", 2}};
    auto ss = post(s, "/v1/completions", stream);
    REQUIRE(ss.status == 200);
    const auto events = sse_events(ss.body);
    for (int k = 0; k < 2; ++k) CHECK(stream_text(events, false, k) == e.j()["choices"][0]["text"]);
    CHECK(post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 0}}).status == 400); // 0 needs echo
}


TEST_CASE("chat_template: the config's template file renders apply-template and chats as Jinja2 renders it") {
    const std::string name = "Qwen3-Coder";
    const std::string tmpl = std::string(TANDEM_SHARED_DIR) + "/data/templates/" + name + ".jinja";
    std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/tests/data/templates/" + name + ".json");
    REQUIRE(in);
    const json doc = json::parse(in);
    daemon_process d;
    d.start(scratch().file("tmpl.sock"), {"--chat-template", tmpl});
    REQUIRE(d.wait_ready());
    int n_checked = 0;
    for (const auto& c : doc["cases"]) {
        const std::string cname = c["name"].get<std::string>();
        if (cname != "system_user" && cname != "multi_turn" && cname != "user_only_no_prompt" && cname != "thinking_off")
            continue;
        CAPTURE(cname);
        const json& ctx = c["context"];
        json body = {{"messages", ctx["messages"]}, {"add_generation_prompt", ctx["add_generation_prompt"]}};
        if (ctx.contains("enable_thinking")) body["chat_template_kwargs"] = {{"enable_thinking", ctx["enable_thinking"]}};
        auto r = post(d.sock, "/v1/tandem/apply-template", body);
        REQUIRE(r.status == 200);
        CHECK(r.j()["renderer"] == "jinja");
        CHECK(r.j()["prompt"] == c["expected"]);
        ++n_checked;
    }
    CHECK(n_checked == 4);
    auto chat = post(d.sock, "/v1/chat/completions",
                     {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 3},
                      {"chat_template_kwargs", {{"enable_thinking", false}}}});
    CHECK(chat.status == 200);
    auto bad = post(d.sock, "/v1/chat/completions",
                    {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"chat_template_kwargs", {{"tools", 1}}}});
    CHECK(bad.status == 400);
    CHECK(bad.j()["error"]["param"] == "chat_template_kwargs.tools");
    CHECK(d.stop() == 0);
    // an unreadable template file: tandemd does not start
    const auto r = run_built("tandemd", {"--model", model_path("stories260K.gguf"), "--socket", scratch().file("none.sock"),
                                "--set", "chat_template=/nonexistent/x.jinja"});
    CHECK(r.rc != 0);
    CHECK(r.err.find("chat_template: cannot read /nonexistent/x.jinja") != std::string::npos);
}
